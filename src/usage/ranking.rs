//! The app ranking: requests and tokens per app and model, counted in
//! process and written to the store about once a second, so a request
//! adds no round trip for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use super::app::App;
use crate::clock::{Clock, Period, SystemClock};
use crate::store::SharedStore;
use crate::store::{AppUsage, StoreError, is_valid_app_usage};

/// The scope of the whole gateway's ranking (no account id is `*`).
pub const PUBLIC_SCOPE: &str = "*";

/// The most apps an answer ranks.
pub const MAX_RANKED_APPS: usize = 100;

/// Rows waiting to be written past which new ones are dropped (and
/// logged): a store down for long must not grow memory without bound.
const MAX_PENDING_ROWS: usize = 100_000;

/// Rows written to the store in one call.
const ROWS_PER_WRITE: usize = 500;

/// Counts each request's app for the ranking, in the whole gateway and in
/// its account, and writes the counts to the store in the background
/// every [`flush_interval`](Self::flush_interval) (1 s by default). The
/// counts of the last interval are lost if the process dies; usage and
/// money never depend on them.
#[derive(Clone)]
pub struct AppRanking {
    inner: Arc<Inner>,
}

struct Inner {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    flush_interval: Duration,
    pending: Mutex<HashMap<RowKey, Counts>>,
    flusher_started: AtomicBool,
    /// One flush at a time, so rows put back after a failure keep order.
    flushing: tokio::sync::Mutex<()>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct RowKey {
    scope: String,
    app: String,
    model: String,
}

#[derive(Clone, Debug, Default)]
struct Counts {
    details: String,
    requests: u64,
    tokens: u64,
}

impl std::fmt::Debug for AppRanking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppRanking")
            .field("flush_interval", &self.inner.flush_interval)
            .finish_non_exhaustive()
    }
}

impl AppRanking {
    /// Counts kept in `store`, by the system clock, written each second.
    pub fn new(store: SharedStore) -> Self {
        Self::build(store, Arc::new(SystemClock), Duration::from_secs(1))
    }

    fn build(store: SharedStore, clock: Arc<dyn Clock>, flush_interval: Duration) -> Self {
        AppRanking {
            inner: Arc::new(Inner {
                store,
                clock,
                flush_interval,
                pending: Mutex::new(HashMap::new()),
                flusher_started: AtomicBool::new(false),
                flushing: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The clock that decides which day, week and month a count is in.
    pub fn clock(self, clock: Arc<dyn Clock>) -> Self {
        let interval = self.inner.flush_interval;
        Self::build(Arc::clone(&self.inner.store), clock, interval)
    }

    /// How often counts are written to the store (at least 10 ms).
    pub fn flush_interval(self, interval: Duration) -> Self {
        let clock = Arc::clone(&self.inner.clock);
        Self::build(
            Arc::clone(&self.inner.store),
            clock,
            interval.max(Duration::from_millis(10)),
        )
    }

    /// Counts one request of `app` with `model` and `tokens`, in the whole
    /// gateway and in `account`.
    pub(crate) fn count(&self, account: &str, app: &App, model: &str, tokens: u64) {
        let details = json!({"url": app.url, "title": app.title}).to_string();
        {
            let mut pending = lock(&self.inner.pending);
            for scope in [PUBLIC_SCOPE, account] {
                let key = RowKey {
                    scope: scope.to_owned(),
                    app: app.id.clone(),
                    model: model.to_owned(),
                };
                if pending.len() >= MAX_PENDING_ROWS && !pending.contains_key(&key) {
                    tracing::warn!(app = %app.id, "app ranking: too many counts waiting for the store; this one is dropped");
                    continue;
                }
                let counts = pending.entry(key).or_default();
                counts.details.clone_from(&details);
                counts.requests = counts.requests.saturating_add(1);
                counts.tokens = counts.tokens.saturating_add(tokens);
            }
        }
        self.start_flusher();
    }

    /// Writes the counts waiting now. On an error they wait for the next
    /// flush.
    pub async fn flush(&self) -> Result<(), StoreError> {
        flush(&self.inner).await
    }

    fn start_flusher(&self) {
        if self.inner.flusher_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.flusher_started.store(false, Ordering::Release);
            return;
        };
        // A weak handle: the task ends once the ranking is dropped.
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let interval = self.inner.flush_interval;
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(inner) = weak.upgrade() else { return };
                if let Err(error) = flush(&inner).await {
                    tracing::warn!(%error, "app ranking: counts not written; retrying with the next flush");
                }
            }
        });
    }

    /// The ranking of `scope` in the `period` containing now: apps by
    /// tokens, most first, each with its models, as the API answers it.
    pub async fn ranking(&self, scope: &str, period: Period) -> Result<Value, StoreError> {
        let now = self.inner.clock.now();
        let rows = self.inner.store.app_usage(scope, period, now).await?;
        Ok(ranking_json(rows, period, now))
    }
}

async fn flush(inner: &Inner) -> Result<(), StoreError> {
    let _one_at_a_time = inner.flushing.lock().await;
    let taken = std::mem::take(&mut *lock(&inner.pending));
    if taken.is_empty() {
        return Ok(());
    }
    let mut by_scope: HashMap<String, Vec<AppUsage>> = HashMap::new();
    for (key, counts) in taken {
        let row = AppUsage {
            app: key.app,
            details: counts.details,
            model: key.model,
            requests: counts.requests,
            tokens: counts.tokens,
        };
        // One bad row must never cost the others in its write.
        if !is_valid_app_usage(&row) {
            tracing::warn!(app = %row.app, "app ranking: a count the store would refuse is dropped");
            continue;
        }
        by_scope.entry(key.scope).or_default().push(row);
    }
    let now = inner.clock.now();
    let mut failure = None;
    for (scope, rows) in by_scope {
        for chunk in rows.chunks(ROWS_PER_WRITE) {
            if failure.is_none() {
                match inner.store.add_app_usage(&scope, chunk, now).await {
                    Ok(()) => continue,
                    Err(error) if error.is_unavailable() => failure = Some(error),
                    Err(error) => {
                        // Refused as invalid: writing again would not help.
                        tracing::warn!(%error, "app ranking: counts refused by the store and dropped");
                        continue;
                    }
                }
            }
            put_back(inner, &scope, chunk);
        }
    }
    failure.map_or(Ok(()), Err)
}

/// Rows not written wait for the next flush, added to any counted since.
fn put_back(inner: &Inner, scope: &str, rows: &[AppUsage]) {
    let mut pending = lock(&inner.pending);
    for row in rows {
        let key = RowKey {
            scope: scope.to_owned(),
            app: row.app.clone(),
            model: row.model.clone(),
        };
        if pending.len() >= MAX_PENDING_ROWS && !pending.contains_key(&key) {
            continue;
        }
        let counts = pending.entry(key).or_default();
        if counts.details.is_empty() {
            counts.details.clone_from(&row.details);
        }
        counts.requests = counts.requests.saturating_add(row.requests);
        counts.tokens = counts.tokens.saturating_add(row.tokens);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `rows` with each app reduced to its address's host (and port): its id
/// the host, its `url` the origin (`https://host[:port]`), no title; rows
/// of one host and model added together. Apps known only by a title are
/// left out: the title is all there is of them.
pub(crate) fn by_host(rows: Vec<AppUsage>) -> Vec<AppUsage> {
    let mut hosts: HashMap<(String, String), AppUsage> = HashMap::new();
    for row in rows {
        let url = serde_json::from_str::<Value>(&row.details)
            .ok()
            .and_then(|details| details.get("url")?.as_str().map(str::to_owned))
            .and_then(|url| url.parse::<http::Uri>().ok());
        // The address was kept as the WHATWG parser wrote it (host in
        // lower case, a default port dropped): its authority is the host.
        let (Some(scheme), Some(authority)) = (
            url.as_ref().and_then(|url| url.scheme_str()),
            url.as_ref().and_then(|url| url.authority()),
        ) else {
            continue;
        };
        if authority.as_str().contains('@') {
            continue; // never written so; a name or password is not shown
        }
        let id = authority.as_str().to_owned();
        let origin = format!("{scheme}://{id}");
        let merged = hosts
            .entry((id.clone(), row.model.clone()))
            .or_insert_with(|| AppUsage {
                details: json!({"url": origin, "title": Value::Null}).to_string(),
                app: id,
                model: row.model,
                requests: 0,
                tokens: 0,
            });
        merged.requests = merged.requests.saturating_add(row.requests);
        merged.tokens = merged.tokens.saturating_add(row.tokens);
    }
    hosts.into_values().collect()
}

/// Rows grouped by app and ranked by tokens (then requests, then id, so
/// the order is stable), at most [`MAX_RANKED_APPS`].
pub(crate) fn ranking_json(rows: Vec<AppUsage>, period: Period, now: DateTime<Utc>) -> Value {
    struct Ranked {
        details: Value,
        requests: u64,
        tokens: u64,
        models: Vec<(String, u64, u64)>,
    }
    let mut apps: HashMap<String, Ranked> = HashMap::new();
    for row in rows {
        let app = apps.entry(row.app).or_insert_with(|| Ranked {
            details: serde_json::from_str(&row.details).unwrap_or(Value::Null),
            requests: 0,
            tokens: 0,
            models: Vec::new(),
        });
        app.requests = app.requests.saturating_add(row.requests);
        app.tokens = app.tokens.saturating_add(row.tokens);
        app.models.push((row.model, row.requests, row.tokens));
    }
    let mut ranked: Vec<(String, Ranked)> = apps.into_iter().collect();
    ranked.sort_by(|(a_id, a), (b_id, b)| {
        (b.tokens, b.requests)
            .cmp(&(a.tokens, a.requests))
            .then_with(|| a_id.cmp(b_id))
    });
    ranked.truncate(MAX_RANKED_APPS);
    let apps: Vec<Value> = ranked
        .into_iter()
        .enumerate()
        .map(|(index, (id, mut app))| {
            app.models
                .sort_by(|a, b| (b.2, b.1).cmp(&(a.2, a.1)).then_with(|| a.0.cmp(&b.0)));
            json!({
                "rank": index + 1,
                "id": id,
                "url": app.details.get("url").cloned().unwrap_or(Value::Null),
                "title": app.details.get("title").cloned().unwrap_or(Value::Null),
                "requests": app.requests,
                "tokens": app.tokens,
                "models": app.models.into_iter().map(|(model, requests, tokens)| json!({
                    "model": model,
                    "requests": requests,
                    "tokens": tokens,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "period": match period {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        },
        "starts_at": period.start_of(now).to_rfc3339_opts(SecondsFormat::Secs, true),
        "ends_at": period.end_of(now).to_rfc3339_opts(SecondsFormat::Secs, true),
        "apps": apps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::MemoryStore;
    use chrono::TimeZone;

    fn app(id: &str) -> App {
        App {
            id: id.into(),
            url: Some(format!("https://{id}/")),
            title: Some(id.to_uppercase()),
        }
    }

    #[tokio::test]
    async fn counts_reach_the_store_per_scope_and_rank_by_tokens() {
        counts_reach_the_store_per_scope_and_rank_by_tokens_in(Arc::new(MemoryStore::new())).await;
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn counts_reach_a_sqlite_store_per_scope_and_rank_by_tokens() {
        let directory = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(
            directory.path().join("modelgate.db"),
            crate::store::SqliteStoreConfig::default(),
        )
        .unwrap();
        counts_reach_the_store_per_scope_and_rank_by_tokens_in(Arc::new(store)).await;
    }

    async fn counts_reach_the_store_per_scope_and_rank_by_tokens_in(store: SharedStore) {
        let clock = Arc::new(ManualClock::new(
            Utc.with_ymd_and_hms(2024, 3, 5, 12, 0, 0).unwrap(),
        ));
        let ranking = AppRanking::new(Arc::clone(&store))
            .clock(clock.clone())
            .flush_interval(Duration::from_secs(3600));
        ranking.count("acct", &app("a.example"), "m1", 10);
        ranking.count("acct", &app("a.example"), "m2", 30);
        ranking.count("other", &app("b.example"), "m1", 35);
        ranking.flush().await.unwrap();
        let public = ranking.ranking(PUBLIC_SCOPE, Period::Day).await.unwrap();
        let apps = public["apps"].as_array().unwrap();
        assert_eq!(apps[0]["id"], "a.example");
        assert_eq!(apps[0]["tokens"], 40);
        assert_eq!(apps[0]["requests"], 2);
        assert_eq!(apps[0]["models"][0]["model"], "m2");
        assert_eq!(apps[0]["title"], "A.EXAMPLE");
        assert_eq!(apps[1]["id"], "b.example");
        assert_eq!(apps[1]["rank"], 2);
        assert_eq!(public["starts_at"], "2024-03-05T00:00:00Z");
        let own = ranking.ranking("acct", Period::Month).await.unwrap();
        assert_eq!(own["apps"].as_array().unwrap().len(), 1);
        // Nothing waits once flushed; a second flush writes nothing more.
        ranking.flush().await.unwrap();
        let again = ranking.ranking(PUBLIC_SCOPE, Period::Day).await.unwrap();
        assert_eq!(again["apps"][0]["tokens"], 40);
    }

    #[test]
    fn by_host_keeps_hosts_only_and_adds_their_paths_up() {
        let now = Utc.with_ymd_and_hms(2024, 3, 5, 12, 0, 0).unwrap();
        let row = |app: &str, details: Value, model: &str, tokens: u64| AppUsage {
            app: app.into(),
            details: details.to_string(),
            model: model.into(),
            requests: 1,
            tokens,
        };
        let rows = vec![
            row(
                "chat.example.com/acme/secret-project",
                json!({"url": "https://chat.example.com/acme/secret-project", "title": "Acme's plan"}),
                "m1",
                10,
            ),
            row(
                "chat.example.com/globex",
                json!({"url": "https://chat.example.com/globex", "title": "Globex"}),
                "m1",
                5,
            ),
            row(
                "tool.example.org:8443/x",
                json!({"url": "https://tool.example.org:8443/x", "title": null}),
                "m2",
                1,
            ),
            row(
                "title:Local Tool",
                json!({"url": null, "title": "Local Tool"}),
                "m1",
                50,
            ),
            row("broken", json!("not an object"), "m1", 50),
        ];
        let ranked = ranking_json(by_host(rows), Period::Day, now);
        let apps = ranked["apps"].as_array().unwrap();
        assert_eq!(apps.len(), 2, "{ranked}");
        assert_eq!(apps[0]["id"], "chat.example.com");
        assert_eq!(apps[0]["url"], "https://chat.example.com");
        assert_eq!(apps[0]["title"], Value::Null);
        assert_eq!(
            (apps[0]["requests"].as_u64(), apps[0]["tokens"].as_u64()),
            (Some(2), Some(15))
        );
        assert_eq!(apps[0]["models"].as_array().unwrap().len(), 1);
        assert_eq!(apps[1]["id"], "tool.example.org:8443");
        assert_eq!(apps[1]["url"], "https://tool.example.org:8443");
        let text = ranked.to_string();
        for hidden in ["secret-project", "globex", "Acme", "Local Tool", "/x"] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }
    }

    proptest::proptest! {
        #[test]
        fn by_host_never_shows_a_path_or_title(
            host in "[a-z]{1,10}\\.(com|org)",
            path in "(/[a-z0-9]{1,8}){1,3}",
            title in "[A-Za-z ]{1,20}",
        ) {
            let url = format!("https://{host}{path}");
            let rows = vec![AppUsage {
                app: format!("{host}{path}"),
                details: json!({"url": url, "title": title}).to_string(),
                model: "m".into(),
                requests: 1,
                tokens: 1,
            }];
            let hosts = by_host(rows);
            proptest::prop_assert_eq!(hosts.len(), 1);
            proptest::prop_assert_eq!(&hosts[0].app, &host);
            let details: Value = serde_json::from_str(&hosts[0].details).unwrap();
            let origin = format!("https://{host}");
            proptest::prop_assert_eq!(details["url"].as_str(), Some(origin.as_str()));
            proptest::prop_assert_eq!(&details["title"], &Value::Null);
        }
    }

    #[test]
    fn ranking_is_bounded_and_stable() {
        let now = Utc.with_ymd_and_hms(2024, 3, 5, 12, 0, 0).unwrap();
        let rows = (0..MAX_RANKED_APPS + 10)
            .map(|index| AppUsage {
                app: format!("app{index:03}"),
                details: "not json".into(),
                model: "m".into(),
                requests: 1,
                tokens: 5,
            })
            .collect();
        let ranked = ranking_json(rows, Period::Week, now);
        let apps = ranked["apps"].as_array().unwrap();
        assert_eq!(apps.len(), MAX_RANKED_APPS);
        assert_eq!(apps[0]["id"], "app000");
        assert_eq!(apps[0]["url"], Value::Null);
        assert_eq!(ranked["starts_at"], "2024-03-04T00:00:00Z");
    }
}
