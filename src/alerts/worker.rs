//! [`Alerts`]: queues the settled requests' accounts and keys, and checks
//! them in one background task.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};

use super::marker::{ALERTS_COLLECTION, MARKER_TTL, balance_marker, key_marker};
use super::rules::{AlertRules, past_percent};
use crate::clock::Clock;
use crate::keys::credits::nanos_to_json;
use crate::keys::{KeyDirectory, KeyHash};
use crate::notify::{Alert, AlertNotice, Notifier};
use crate::store::{Expect, KeyLimit, PutOptions, PutOutcome, RecordStoreExt, WriteOutcome};
use crate::telemetry;

/// The most settled requests waiting to be checked, by default; past it a
/// check is dropped (counted as `check_dropped`): the next settlement of
/// the account checks it again.
pub const DEFAULT_MAX_QUEUED_CHECKS: usize = 10_000;

/// The most accounts checked in one round; the queue's rest waits for the
/// next.
const MAX_ACCOUNTS_PER_ROUND: usize = 256;

/// The most markers an instance remembers; past it the memo starts afresh
/// (a forgotten marker costs one store write, never a second notice).
const MAX_REMEMBERED_MARKERS: usize = 20_000;

/// How much of a key's hash a notice shows, as leak notices do.
const HASH_PREFIX_CHARS: usize = 12;

/// One settled request to check.
struct Check {
    account: String,
    key_hash: String,
    key_limit: Option<KeyLimit>,
}

/// Checks balances and key limits after settlements and sends each
/// crossing's notice once across instances (see [`crate::alerts`]).
/// Cheap to clone: clones share the queue and the task.
#[derive(Clone)]
pub struct Alerts {
    inner: Arc<Inner>,
}

struct Inner {
    rules: AlertRules,
    directory: KeyDirectory,
    clock: Arc<dyn Clock>,
    notifier: Notifier,
    queue: mpsc::Sender<Check>,
    /// Taken by the task when the first check starts it.
    receiver: Mutex<Option<mpsc::Receiver<Check>>>,
    started: AtomicBool,
    /// Checks queued and not yet done: `idle` waits for 0.
    waiting: watch::Sender<usize>,
}

impl fmt::Debug for Alerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Alerts")
            .field("rules", &self.inner.rules)
            .field("notifier", &self.inner.notifier)
            .field("waiting", &*self.inner.waiting.borrow())
            .finish_non_exhaustive()
    }
}

impl Alerts {
    /// Alerts by `rules`, reading balances, usage and markers from the
    /// directory's store at its clock, and sending through `notifier`
    /// (its e-mail settings and the alert webhook).
    pub fn new(rules: AlertRules, directory: KeyDirectory, notifier: Notifier) -> Self {
        Self::with_max_queued_checks(rules, directory, notifier, DEFAULT_MAX_QUEUED_CHECKS)
    }

    /// The same, with at most `checks` (at least 1) waiting.
    pub fn with_max_queued_checks(
        rules: AlertRules,
        directory: KeyDirectory,
        notifier: Notifier,
        checks: usize,
    ) -> Self {
        let (queue, receiver) = mpsc::channel(checks.max(1));
        Alerts {
            inner: Arc::new(Inner {
                rules,
                clock: directory.clock().clone(),
                directory,
                notifier,
                queue,
                receiver: Mutex::new(Some(receiver)),
                started: AtomicBool::new(false),
                waiting: watch::Sender::new(0),
            }),
        }
    }

    /// Queues a check of `account` and of the key `key_hash` (hex) with its
    /// `key_limit`, after a settlement: returns at once and never panics.
    /// Without a tokio runtime, or with the queue full, the check is
    /// dropped and counted.
    pub fn settled(&self, account: &str, key_hash: &str, key_limit: Option<KeyLimit>) {
        if self.inner.rules.is_empty() {
            return;
        }
        let check = Check {
            account: account.to_owned(),
            key_hash: key_hash.to_owned(),
            key_limit,
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            telemetry::alert_outcome("check_dropped");
            return;
        };
        self.inner.waiting.send_modify(|count| *count += 1);
        if self.inner.queue.try_send(check).is_err() {
            self.inner
                .waiting
                .send_modify(|count| *count = count.saturating_sub(1));
            telemetry::alert_outcome("check_dropped");
            tracing::debug!(account, "alert check dropped: the queue is full");
            return;
        }
        // Started by the first check, so building needs no runtime; the
        // flag spares every later settlement the lock.
        if self.inner.started.load(Ordering::Acquire) {
            return;
        }
        let receiver = self
            .inner
            .receiver
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(receiver) = receiver {
            self.inner.started.store(true, Ordering::Release);
            runtime.spawn(Arc::clone(&self.inner).run(receiver));
        }
    }

    /// Resolves once every queued check is done and its notices are
    /// delivered or given up: for tests and a graceful shutdown.
    pub async fn idle(&self) {
        let mut waiting = self.inner.waiting.subscribe();
        // The sender lives in `self`: the channel cannot close meanwhile.
        let _ = waiting.wait_for(|count| *count == 0).await;
        self.inner.notifier.idle().await;
    }
}

impl Inner {
    /// Takes what is queued, an account once per round, and checks each.
    async fn run(self: Arc<Self>, mut receiver: mpsc::Receiver<Check>) {
        let mut memo = HashSet::new();
        while let Some(first) = receiver.recv().await {
            // Per account, each key with its latest limit.
            let mut round: HashMap<String, HashMap<String, Option<KeyLimit>>> = HashMap::new();
            let mut taken = 0;
            let mut next = Some(first);
            while let Some(check) = next.take() {
                taken += 1;
                round
                    .entry(check.account)
                    .or_default()
                    .insert(check.key_hash, check.key_limit);
                if round.len() < MAX_ACCOUNTS_PER_ROUND {
                    next = receiver.try_recv().ok();
                }
            }
            for (account, keys) in &round {
                self.check_account(account, keys, &mut memo).await;
            }
            if memo.len() > MAX_REMEMBERED_MARKERS {
                memo.clear();
            }
            self.waiting
                .send_modify(|count| *count = count.saturating_sub(taken));
        }
    }

    async fn check_account(
        &self,
        account: &str,
        keys: &HashMap<String, Option<KeyLimit>>,
        memo: &mut HashSet<String>,
    ) {
        let store = self.directory.store();
        let now = self.clock.now();
        if !self.rules.balance_below_nanos().is_empty() {
            match store.account_balance(account).await {
                // An account that never bought credits has no balance to
                // watch (its requests are BYOK or free).
                Ok(balance) if balance.purchased_nanos > 0 => {
                    for &threshold in self.rules.balance_below_nanos() {
                        if balance.balance_nanos >= threshold {
                            continue;
                        }
                        let marker = balance_marker(account, threshold, balance.purchased_nanos);
                        let alert = Alert::BalanceBelow {
                            threshold: nanos_to_json(threshold),
                            balance: nanos_to_json(balance.balance_nanos),
                        };
                        self.claim(account, None, marker, alert, now, memo).await;
                    }
                }
                Ok(_) => {}
                Err(error) => failed(account, "account_balance", &error),
            }
        }
        if self.rules.key_limit_percent().is_empty() {
            return;
        }
        for (key_hash, limit) in keys {
            let Some(limit) = limit.filter(|limit| limit.limit_nanos > 0) else {
                continue;
            };
            let usage = match store.key_usage(account, key_hash, now).await {
                Ok(usage) => usage,
                Err(error) => {
                    failed(account, "key_usage", &error);
                    continue;
                }
            };
            let used = usage.in_period(limit.reset, limit.include_byok);
            let period_start = limit.reset.map(|period| period.start_of(now));
            for &percent in self.rules.key_limit_percent() {
                if !past_percent(used, limit.limit_nanos, percent) {
                    continue;
                }
                let marker = key_marker(key_hash, percent, period_start, limit.limit_nanos);
                let alert = Alert::KeyLimitPercent {
                    key_name: String::new(),
                    key_hash_prefix: key_hash.chars().take(HASH_PREFIX_CHARS).collect(),
                    percent,
                    usage: nanos_to_json(used),
                    limit: nanos_to_json(limit.limit_nanos),
                    period: limit.reset.map(|period| period.as_str().to_owned()),
                    period_start,
                };
                self.claim(account, Some(key_hash), marker, alert, now, memo)
                    .await;
            }
        }
    }

    /// Creates `marker` in the store if absent; only the instance whose
    /// write creates it sends the notice (naming `key`, when it is a key's).
    async fn claim(
        &self,
        account: &str,
        key: Option<&str>,
        marker: String,
        mut alert: Alert,
        now: DateTime<Utc>,
        memo: &mut HashSet<String>,
    ) {
        if memo.contains(&marker) {
            return;
        }
        let record = serde_json::json!({ "account": account, "claimed_at": now });
        let outcome = self
            .directory
            .store()
            .put_json_at(
                ALERTS_COLLECTION,
                &marker,
                &record,
                Expect::Absent,
                PutOptions::expiring(MARKER_TTL),
                now,
            )
            .await;
        match outcome {
            Ok(PutOutcome::Write(WriteOutcome::Written { .. })) => {}
            Ok(PutOutcome::Write(WriteOutcome::Conflict { .. })) => {
                memo.insert(marker);
                telemetry::alert_outcome("claimed_elsewhere");
                return;
            }
            Ok(PutOutcome::Full { .. }) => {
                // No cap was asked for: a store fault; tried again later.
                telemetry::alert_outcome("check_failed");
                tracing::warn!(account, "alert marker refused as full without a cap");
                return;
            }
            Err(error) => {
                failed(account, "put_record", &error);
                return;
            }
        }
        let email = match self.directory.account(account).await {
            Ok(record) => record.and_then(|record| record.email),
            Err(error) => {
                tracing::warn!(%error, account, "the account could not be read; its owner is not e-mailed this alert");
                None
            }
        };
        if let Alert::KeyLimitPercent {
            key_name,
            key_hash_prefix,
            ..
        } = &mut alert
            && let Some(hash) = key.and_then(KeyHash::from_hex)
        {
            match self.directory.get(&hash).await {
                Ok(Some(record)) => *key_name = record.value.name,
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, account, key = %&key_hash_prefix[..key_hash_prefix.len().min(8)], "the key could not be read; its alert names it by hash prefix only")
                }
            }
        }
        // The same id from every instance: a receiver can drop a repeat.
        let id = hex::encode(&Sha256::digest(marker.as_bytes())[..16]);
        memo.insert(marker);
        telemetry::alert_outcome("claimed");
        self.notifier.alert(AlertNotice {
            id,
            account: account.to_owned(),
            email,
            alert,
            detected_at: now,
        });
    }
}

/// Logs and counts a check the store failed; the next settlement of the
/// account checks again.
fn failed(account: &str, operation: &str, error: &crate::store::StoreError) {
    telemetry::alert_outcome("check_failed");
    tracing::warn!(%error, account, operation, "alert check failed");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Period};
    use crate::store::{LedgerStore, MemoryStore, NANOS_PER_CREDIT, RecordStore, Settlement};
    use chrono::TimeZone;
    use serde_json::json;

    const ACCOUNT: &str = "acct";
    const KEY: &str = "3f9a0c1b2d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";

    /// Records `credits` of the key's usage at `now`, as a settlement does.
    async fn spend(store: &MemoryStore, credits: i64, now: DateTime<Utc>) {
        let settlement = Settlement {
            account: ACCOUNT.into(),
            key: KEY.into(),
            reservation_id: hex::encode(crate::random::bytes::<8>()),
            hold_granted: false,
            cost_nanos: credits * NANOS_PER_CREDIT,
            byok: false,
            record: None,
        };
        store.settle(&settlement, now).await.unwrap();
    }

    async fn markers(store: &MemoryStore, now: DateTime<Utc>) -> Vec<String> {
        let mut ids: Vec<String> = store
            .list_records_at(ALERTS_COLLECTION, 0, 100, now)
            .await
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        ids
    }

    #[test]
    fn each_crossing_is_claimed_once_across_instances_remembered_and_armed_by_a_new_period() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let metrics = recorder.handle();
        // A local recorder and a current-thread runtime: the task counts
        // on this thread.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                let store = Arc::new(MemoryStore::new());
                let march = Utc.with_ymd_and_hms(2025, 3, 10, 12, 0, 0).unwrap();
                let clock = Arc::new(ManualClock::new(march));
                let directory = KeyDirectory::builder(store.clone())
                    .clock(clock.clone())
                    .build();
                let rules = AlertRules::from_json(&[json!(50)], &[json!(50)]).unwrap();
                let [first, second] = [(), ()]
                    .map(|_| Alerts::new(rules.clone(), directory.clone(), Notifier::disabled()));
                let limit = Some(KeyLimit {
                    limit_nanos: 100 * NANOS_PER_CREDIT,
                    reset: Some(Period::Month),
                    include_byok: false,
                });
                store.top_up(ACCOUNT, 100 * NANOS_PER_CREDIT).await.unwrap();
                // 40 credits left, 60% of the key's limit used.
                spend(&store, 60, march).await;
                for _ in 0..3 {
                    first.settled(ACCOUNT, KEY, limit);
                    second.settled(ACCOUNT, KEY, limit);
                    first.idle().await;
                    second.idle().await;
                }
                let march_start = Period::Month.start_of(march).timestamp();
                assert_eq!(
                    markers(&store, march).await,
                    vec![
                        format!(
                            "balance/{ACCOUNT}/{}/{}",
                            50 * NANOS_PER_CREDIT,
                            100 * NANOS_PER_CREDIT
                        ),
                        format!("key/{KEY}/50/{march_start}/{}", 100 * NANOS_PER_CREDIT),
                    ]
                );

                // April: the key's usage starts again; 60 more is a new
                // crossing of its 50%. The top-up keeps the balance above 50.
                let april = Utc.with_ymd_and_hms(2025, 4, 2, 8, 0, 0).unwrap();
                clock.set(april);
                store.top_up(ACCOUNT, 100 * NANOS_PER_CREDIT).await.unwrap();
                spend(&store, 60, april).await;
                first.settled(ACCOUNT, KEY, limit);
                second.settled(ACCOUNT, KEY, limit);
                first.idle().await;
                second.idle().await;
                let april_start = Period::Month.start_of(april).timestamp();
                assert_eq!(markers(&store, april).await.len(), 3);
                assert!(markers(&store, april).await.contains(&format!(
                    "key/{KEY}/50/{april_start}/{}",
                    100 * NANOS_PER_CREDIT
                )));

                // A key without a limit, or a queue that is full, checks
                // nothing more and never waits.
                let small =
                    Alerts::with_max_queued_checks(rules, directory, Notifier::disabled(), 1);
                small.settled(ACCOUNT, KEY, None);
                small.settled(ACCOUNT, KEY, None);
                small.idle().await;
                assert_eq!(markers(&store, april).await.len(), 3);
            });
        });
        let text = metrics.render();
        for expected in [
            // One instance claimed each crossing, the other found it
            // claimed once and then remembered it: no more store writes.
            r#"modelgate_alerts_total{outcome="claimed"} 3"#,
            r#"modelgate_alerts_total{outcome="claimed_elsewhere"} 3"#,
            r#"modelgate_alerts_total{outcome="check_dropped"} 1"#,
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
        assert!(!text.contains("check_failed"), "{text}");
    }
}
