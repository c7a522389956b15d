//! Alerts through the whole gateway over real sockets: two instances
//! sharing a real redis-server (and one on MemoryStore), a loopback SMTP
//! server and a loopback webhook receiver. Many requests at once drive an
//! account's balance below its thresholds and a key past its shares; each
//! crossing is one e-mail and one signed webhook, whichever instance saw
//! it, and a top-up arms the balance thresholds again.

use crate::common;
use crate::mock;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::gateway::{chat, key_of};
use common::http_server::serve;
use common::redis_server::RedisServer;
use common::settle::settled;
use common::smtp::SmtpServer;
use futures_util::future::join_all;
use hmac::{Hmac, Mac};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use modelgate::alerts::Alerts;
use modelgate::clock::{Period, SystemClock};
use modelgate::credit::PendingSettlements;
use modelgate::keys::{KeyDirectory, KeyHash, NewAccount, SharedStore};
use modelgate::proxy::{GatewayConfig, GatewayPlan, Upstream, build_gateway};
use modelgate::store::{KeyLimit, MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig};
use serde_json::{Value, json};
use sha2::Sha256;

const WEBHOOK_SECRET: &str = "alerts-test-webhook-secret-0123";
const OWNER: &str = "owner@example.com";
/// Long enough for any delivery on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(30);

fn credits(amount: i64) -> i64 {
    amount * NANOS_PER_CREDIT
}

/// Costs 9 credits (the mock's 2 prompt tokens and 7 words, a credit a
/// token) and holds 56 while in flight.
fn paid() -> Value {
    json!({"model": "openai/gpt-4o-mini", "max_tokens": 16,
           "messages": [{"role": "user", "content": "Hi there"}]})
}

/// One webhook request as received.
#[derive(Clone, Debug)]
struct Hook {
    timestamp: String,
    signature: String,
    body: Bytes,
}

/// A loopback webhook receiver that answers 204 and records each request.
async fn receiver() -> (SocketAddr, Arc<Mutex<Vec<Hook>>>) {
    let hooks = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&hooks);
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let recorded = Arc::clone(&recorded);
        async move {
            let header = |name: &str| {
                request
                    .headers()
                    .get(name)
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or("")
                    .to_owned()
            };
            let (timestamp, signature) = (
                header("x-modelgate-timestamp"),
                header("x-modelgate-signature"),
            );
            let body = request.into_body().collect().await.unwrap().to_bytes();
            recorded.lock().unwrap().push(Hook {
                timestamp,
                signature,
                body,
            });
            Ok::<_, Infallible>(
                Response::builder()
                    .status(204)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        }
    });
    (serve(service).await, hooks)
}

/// Checked apart from the crate's own function.
fn signature_holds(hook: &Hook) -> bool {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(WEBHOOK_SECRET.as_bytes()).unwrap();
    mac.update(hook.timestamp.as_bytes());
    mac.update(b".");
    mac.update(&hook.body);
    hook.signature == format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

struct Setup {
    addresses: Vec<SocketAddr>,
    alerts: Vec<Alerts>,
    settlements: Vec<PendingSettlements>,
    smtp: SmtpServer,
    hooks: Arc<Mutex<Vec<Hook>>>,
    store: SharedStore,
    key: String,
    email: Option<String>,
    _secret_file: tempfile::NamedTempFile,
}

/// One gateway per store (all one account's), alerting below 950 and 920
/// credits and at 20% and 25% of the key's monthly 400-credit limit.
async fn setup(stores: Vec<SharedStore>, email: Option<&str>) -> Setup {
    let smtp = SmtpServer::start().await;
    let (hook_address, hooks) = receiver().await;
    let secret_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret_file.path(), WEBHOOK_SECRET).unwrap();
    let config = json!({
        "pricing": {"default": {"prompt_per_million": 1000000, "completion_per_million": 1000000}},
        "rate_limits": {"account": {"gcra": {"requests": 60000, "period_seconds": 60, "burst": 6000}}},
        "retry": {"max_attempts": 1},
        "email": {"smtp": smtp.url(), "from": "modelgate <alerts@example.com>"},
        "alerts": {"balance_below": [950, 920], "key_limit_percent": [20, 25],
                   "webhook": {"url": format!("http://{hook_address}/hooks/alerts"),
                               "secret": {"file": secret_file.path()}}}
    })
    .to_string();
    let config = GatewayConfig::from_json(&config).unwrap();
    let plan = GatewayPlan::new(&config).unwrap();
    let base = mock::start(mock::MockConfig::default()).await;
    let mut addresses = Vec::new();
    let mut alerts = Vec::new();
    let mut settlements = Vec::new();
    for store in &stores {
        let upstream = Upstream::new(&config.upstream_config(Some(&base)).unwrap()).unwrap();
        let gateway = build_gateway(
            &plan,
            store.clone(),
            upstream,
            Arc::new(SystemClock),
            Duration::from_secs(1),
        );
        alerts.push(gateway.alerts.expect("an alerts section gives alerts"));
        settlements.push(gateway.settlements);
        addresses.push(serve(gateway.service).await);
    }
    let store = stores[0].clone();
    KeyDirectory::new(store.clone())
        .create_account(NewAccount {
            id: "acme".into(),
            name: "Acme".into(),
            email: email.map(str::to_owned),
        })
        .await
        .unwrap();
    store.top_up("acme", credits(1000)).await.unwrap();
    let limit = KeyLimit {
        limit_nanos: credits(400),
        reset: Some(Period::Month),
        include_byok: false,
    };
    let key = key_of(&store, "acme", Some(limit)).await;
    Setup {
        addresses,
        alerts,
        settlements,
        smtp,
        hooks,
        store,
        key,
        email: email.map(str::to_owned),
        _secret_file: secret_file,
    }
}

impl Setup {
    /// Bursts of 8 requests at once, spread over the instances, until
    /// the balance is below `balance_below` credits and the key has used
    /// at least `used_at_least` credits; refusals (a key limit full of
    /// holds) are allowed, anything else fails.
    async fn drive(&self, balance_below: i64, used_at_least: i64) {
        let hash = KeyHash::of(&self.key).to_hex();
        for _ in 0..100 {
            let balance = self.store.account_balance("acme").await.unwrap();
            let usage = self
                .store
                .key_usage("acme", &hash, chrono::Utc::now())
                .await
                .unwrap();
            if balance.balance_nanos < credits(balance_below)
                && usage.month_nanos >= credits(used_at_least)
            {
                return;
            }
            let replies = join_all((0..8).map(|index| {
                let address = self.addresses[index % self.addresses.len()];
                let key = self.key.clone();
                async move { chat(address, &key, &paid()).await }
            }))
            .await;
            for (status, body) in replies {
                assert!(status == 200 || status == 402, "{status} {body}");
            }
            // The settlements land before the next look.
            settled(self.store.as_ref(), "acme", &hash, chrono::Utc::now()).await;
        }
        panic!("the balance never fell below {balance_below} credits");
    }

    /// Waits until every alert the requests so far can cause is out: each
    /// settlement recorded (the key holds nothing), each settlement's task
    /// over on every instance (its alert check queued: a settlement is
    /// tracked before it is sent, and tells the alerts before its task
    /// ends), then every instance's checks made and notices delivered.
    async fn settle(&self) {
        let hash = KeyHash::of(&self.key).to_hex();
        settled(self.store.as_ref(), "acme", &hash, chrono::Utc::now()).await;
        for settlements in &self.settlements {
            let unrecorded = settlements.flush(PATIENCE).await;
            assert!(unrecorded.is_empty(), "{unrecorded:?}");
        }
        for alerts in &self.alerts {
            tokio::time::timeout(PATIENCE, alerts.idle())
                .await
                .expect("alerts go out");
        }
    }

    /// Each e-mail's subject, counted.
    fn subjects(&self) -> HashMap<String, usize> {
        let mut subjects = HashMap::new();
        for message in self.smtp.messages() {
            assert_eq!(message.recipients, vec![OWNER.to_owned()]);
            *subjects
                .entry(message.header("subject").unwrap_or_default())
                .or_default() += 1;
        }
        subjects
    }

    /// Each webhook event as (type, what was crossed), counted; every
    /// signature checked and every id distinct.
    fn events(&self) -> HashMap<(String, String), usize> {
        let hooks = self.hooks.lock().unwrap().clone();
        let mut ids = HashSet::new();
        let mut events = HashMap::new();
        for hook in hooks {
            assert!(signature_holds(&hook), "{hook:?}");
            let event: Value = serde_json::from_slice(&hook.body).unwrap();
            assert!(ids.insert(event["id"].to_string()), "repeated id: {event}");
            let data = &event["data"];
            assert_eq!(data["account"], "acme");
            assert_eq!(data["email"], json!(self.email));
            let crossed = match event["type"].as_str().unwrap() {
                "balance.below" => {
                    assert!(
                        data["balance"].as_f64().unwrap() < data["threshold"].as_f64().unwrap(),
                        "{event}"
                    );
                    data["threshold"].to_string()
                }
                "key.limit_percent" => {
                    assert_eq!(data["limit"], 400);
                    assert_eq!(data["period"], "monthly");
                    assert_eq!(data["key_name"], "client");
                    let share = data["usage"].as_f64().unwrap() * 100.0 / 400.0;
                    assert!(share >= data["percent"].as_f64().unwrap(), "{event}");
                    data["percent"].to_string()
                }
                other => panic!("unexpected event type {other}: {event}"),
            };
            *events
                .entry((event["type"].as_str().unwrap().to_owned(), crossed))
                .or_default() += 1;
        }
        events
    }
}

fn counted(entries: &[(&str, &str, usize)]) -> HashMap<(String, String), usize> {
    entries
        .iter()
        .map(|(kind, crossed, count)| (((*kind).to_owned(), (*crossed).to_owned()), *count))
        .collect()
}

fn subjects(entries: &[(&str, usize)]) -> HashMap<String, usize> {
    entries
        .iter()
        .map(|(subject, count)| ((*subject).to_owned(), *count))
        .collect()
}

async fn exactly_once_per_crossing(stores: Vec<SharedStore>) {
    let setup = setup(stores, Some(OWNER)).await;
    // Below 920 takes 9 requests; 25% of 400 (100 credits) takes 12.
    setup.drive(920, 100).await;
    setup.settle().await;
    assert_eq!(
        setup.events(),
        counted(&[
            ("balance.below", "950", 1),
            ("balance.below", "920", 1),
            ("key.limit_percent", "20", 1),
            ("key.limit_percent", "25", 1),
        ])
    );
    let balance_950 = "Your modelgate balance is below 950 credits";
    let balance_920 = "Your modelgate balance is below 920 credits";
    let key_20 = "Your modelgate API key \"client\" has used 20% of its limit";
    let key_25 = "Your modelgate API key \"client\" has used 25% of its limit";
    assert_eq!(
        setup.subjects(),
        subjects(&[(balance_950, 1), (balance_920, 1), (key_20, 1), (key_25, 1)])
    );
    let text = setup
        .smtp
        .messages()
        .iter()
        .map(|m| m.body().to_owned())
        .collect::<String>();
    assert!(text.contains("top up"), "{text}");
    assert!(text.contains("raise or lift the limit"), "{text}");

    // More requests while below: nothing new.
    let before = setup.store.account_balance("acme").await.unwrap();
    setup
        .drive(before.balance_nanos / NANOS_PER_CREDIT, 0)
        .await;
    setup.settle().await;
    assert_eq!(setup.events().values().sum::<usize>(), 4);

    // A top-up arms the balance's thresholds again: each crossing once more.
    setup.store.top_up("acme", credits(100)).await.unwrap();
    let after = setup.store.account_balance("acme").await.unwrap();
    setup
        .drive(after.balance_nanos / NANOS_PER_CREDIT - 1, 0)
        .await;
    setup.drive(920, 0).await;
    setup.settle().await;
    assert_eq!(
        setup.events(),
        counted(&[
            ("balance.below", "950", 2),
            ("balance.below", "920", 2),
            ("key.limit_percent", "20", 1),
            ("key.limit_percent", "25", 1),
        ])
    );
    assert_eq!(
        setup.subjects(),
        subjects(&[(balance_950, 2), (balance_920, 2), (key_20, 1), (key_25, 1)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_exactly_once_with_two_instances_on_redis_and_a_loopback_smtp_server() {
    let server = RedisServer::start();
    let mut stores: Vec<SharedStore> = Vec::new();
    for _ in 0..2 {
        stores.push(Arc::new(
            RedisStore::connect(&server.url(), RedisStoreConfig::default())
                .await
                .unwrap(),
        ));
    }
    exactly_once_per_crossing(stores).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_exactly_once_on_memory_with_one_instance() {
    exactly_once_per_crossing(vec![Arc::new(MemoryStore::new())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_without_an_address_is_alerted_by_webhook_only() {
    let setup = setup(vec![Arc::new(MemoryStore::new())], None).await;
    setup.drive(920, 100).await;
    setup.settle().await;
    assert_eq!(
        setup.events(),
        counted(&[
            ("balance.below", "950", 1),
            ("balance.below", "920", 1),
            ("key.limit_percent", "20", 1),
            ("key.limit_percent", "25", 1),
        ])
    );
    assert!(setup.smtp.messages().is_empty());
    assert_eq!(setup.smtp.connections(), 0, "no e-mail was even tried");
}
