//! A request the upstream had but did not answer in time is not free: its
//! client gets the 504 (or 502) at once, and the gateway reads the answer
//! that comes late and charges what it reports (`late_answer`), or, with
//! none by the deadline or a connection that fails, the request's hold
//! (`unanswered`); once per attempt, a fallback's first attempt included.
//! Over real HTTP through the whole gateway, on MemoryStore, SQLite and a
//! real redis-server.

use crate::common;
use crate::mock;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::gateway::{instance, key_of};
use common::redis_server::RedisServer;
use common::settle::key_settled;
use common::wait::{PATIENCE, wait_for, wait_until};
use modelgate::credit::MESSAGE_OVERHEAD_TOKENS;
use modelgate::keys::SharedStore;
use modelgate::store::{
    MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig, SqliteStore, SqliteStoreConfig,
};
use serde_json::{Value, json};

/// A bound of 600 tokens on a prompt of "Hi there" (8 bytes, one message):
/// at a credit a token, the hold is what those can cost.
const MAX_TOKENS: u64 = 600;
const PROMPT: &str = "Hi there";
const HOLD_NANOS: i64 =
    (PROMPT.len() as i64 + 2 * MESSAGE_OVERHEAD_TOKENS as i64 + MAX_TOKENS as i64)
        * NANOS_PER_CREDIT;

/// A credit a token; the upstream's headers waited for 300 ms, its late
/// answer for `late_seconds`, at most `max_late` at once.
fn config(late_seconds: u64, max_late: usize) -> String {
    json!({
        "pricing": {"default": {"prompt_per_million": 1_000_000, "completion_per_million": 1_000_000}},
        "upstream": {"response_header_timeout_ms": 300, "late_answer_seconds": late_seconds,
                     "max_late_answers": max_late},
    })
    .to_string()
}

/// Runs `test` on a MemoryStore, a SQLite file, then a real redis-server.
async fn on_every_store<F, Fut>(test: F)
where
    F: Fn(SharedStore) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    test(Arc::new(MemoryStore::new())).await;
    let directory = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(
        directory.path().join("store.db"),
        SqliteStoreConfig::default(),
    )
    .unwrap();
    test(Arc::new(sqlite)).await;
    let server = RedisServer::start();
    let redis = RedisStore::connect(&server.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    test(Arc::new(redis)).await;
}

/// What a client sees of one chat request.
#[derive(Debug)]
struct Reply {
    status: u16,
    generation_id: Option<String>,
    body: Value,
}

async fn chat(address: SocketAddr, key: &str, model: &str, stream: bool) -> Reply {
    let body = json!({"model": model, "max_tokens": MAX_TOKENS, "stream": stream,
                      "messages": [{"role": "user", "content": PROMPT}]});
    let reply = reqwest::Client::new()
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = reply.status().as_u16();
    let generation_id = reply
        .headers()
        .get("x-generation-id")
        .map(|value| value.to_str().unwrap().to_owned());
    let text = reply.text().await.unwrap();
    Reply {
        status,
        generation_id,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

async fn funded_key(store: &SharedStore) -> String {
    store
        .top_up("acme", 10_000 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    key_of(store, "acme", None).await
}

/// Every generation record of the account, read from the store (polling
/// the API would spend the account's rate on the usage routes).
async fn records(store: &SharedStore) -> Vec<Value> {
    store
        .recent_generations("acme", 100, chrono::Utc::now())
        .await
        .unwrap()
        .iter()
        .map(|record| serde_json::from_slice(record).unwrap())
        .collect()
}

/// The generation record `id`, once it is written (at its settlement).
async fn record(store: &SharedStore, id: &str) -> Value {
    wait_for(PATIENCE, || async {
        let records = records(store).await;
        records
            .iter()
            .find(|record| record["id"] == id)
            .cloned()
            .ok_or_else(|| format!("the record {id} among {records:?}"))
    })
    .await
}

fn cost_nanos(record: &Value) -> i64 {
    (record["total_cost"].as_f64().unwrap() * NANOS_PER_CREDIT as f64).round() as i64
}

/// A 504 that says the request may be charged, and where to look.
fn assert_timed_out_and_told(reply: &Reply) {
    assert_eq!(reply.status, 504, "{reply:?}");
    assert_eq!(
        reply.body["error"]["metadata"]["upstream_failure"],
        "timeout"
    );
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("charged") && message.contains("X-Generation-Id"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstreams_answer_after_the_504_is_charged_once_as_a_late_answer() {
    on_every_store(|store| async move {
        let slow = mock::start(mock::MockConfig {
            latency: Duration::from_millis(1500),
            ..mock::MockConfig::default()
        })
        .await;
        let address = instance(store.clone(), &slow, &config(60, 16)).await;
        let key = funded_key(&store).await;
        let mut charged = 0;
        for stream in [false, true] {
            let reply = chat(address, &key, "openai/gpt-4o-mini", stream).await;
            assert_timed_out_and_told(&reply);
            let id = reply.generation_id.expect("the record to look at is named");
            let record = record(&store, &id).await;
            assert_eq!(record["cost_basis"], "late_answer", "{record}");
            assert_eq!(record["streamed"], stream, "{record}");
            let cost = cost_nanos(&record);
            let tokens = record["tokens_prompt"].as_i64().unwrap()
                + record["tokens_completion"].as_i64().unwrap();
            assert!(tokens > 0, "{record}");
            assert_eq!(cost, tokens * NANOS_PER_CREDIT, "its usage: {record}");
            charged += cost;
            let usage = key_settled(&store, &key, chrono::Utc::now()).await;
            assert_eq!(usage.total_nanos, charged, "charged once");
        }
        assert_eq!(records(&store).await.len(), 2, "one record each");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_answers_is_charged_the_hold_after_the_deadline() {
    on_every_store(|store| async move {
        let silent = mock::start(mock::MockConfig {
            latency: Duration::from_secs(3600),
            ..mock::MockConfig::default()
        })
        .await;
        let address = instance(store.clone(), &silent, &config(1, 16)).await;
        let key = funded_key(&store).await;
        // Answered while the upstream is still silent.
        let reply = chat(address, &key, "openai/gpt-4o-mini", false).await;
        assert_timed_out_and_told(&reply);
        let record = record(&store, &reply.generation_id.unwrap()).await;
        assert_eq!(record["cost_basis"], "unanswered", "{record}");
        assert_eq!(cost_nanos(&record), HOLD_NANOS, "{record}");
        let usage = key_settled(&store, &key, chrono::Utc::now()).await;
        assert_eq!(usage.total_nanos, HOLD_NANOS, "charged once");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_reset_after_the_request_was_sent_is_charged_the_hold() {
    on_every_store(|store| async move {
        // At once: a 502; after the header timeout: a 504, then the reset.
        for latency in [Duration::ZERO, Duration::from_millis(800)] {
            let resetting = mock::start(mock::MockConfig {
                latency,
                reset_chats: true,
                ..mock::MockConfig::default()
            })
            .await;
            let address = instance(store.clone(), &resetting, &config(60, 16)).await;
            let key = funded_key(&store).await;
            let reply = chat(address, &key, "openai/gpt-4o-mini", false).await;
            let expected = if latency.is_zero() { 502 } else { 504 };
            assert_eq!(reply.status, expected, "{reply:?}");
            assert!(
                reply.body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("charged"),
                "{reply:?}"
            );
            let record = record(&store, &reply.generation_id.unwrap()).await;
            assert_eq!(record["cost_basis"], "unanswered", "{latency:?}: {record}");
            assert_eq!(cost_nanos(&record), HOLD_NANOS, "{record}");
            let usage = key_settled(&store, &key, chrono::Utc::now()).await;
            assert_eq!(usage.total_nanos, HOLD_NANOS, "charged once");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_after_a_timeout_charges_both_attempts() {
    on_every_store(|store| async move {
        let slow = mock::start(mock::MockConfig {
            latency: Duration::from_millis(1500),
            ..mock::MockConfig::default()
        })
        .await;
        let fast = mock::start(mock::MockConfig::default()).await;
        let config = json!({
            "pricing": {"default": {"prompt_per_million": 1_000_000, "completion_per_million": 1_000_000}},
            "providers": {
                "slow": {"base_url": slow, "response_header_timeout_ms": 300, "late_answer_seconds": 60},
                "fast": {"base_url": fast},
            },
            "fallbacks": {"slow/model": ["fast/model"]},
        })
        .to_string();
        let address = instance(store.clone(), &fast, &config).await;
        let key = funded_key(&store).await;
        let reply = chat(address, &key, "slow/model", false).await;
        assert_eq!(reply.status, 200, "the fallback answered: {reply:?}");
        let answered = record(&store, &reply.generation_id.unwrap()).await;
        assert_eq!(answered["cost_basis"], "usage", "{answered}");
        // The first attempt's record, once its late answer is read.
        let both = wait_for(PATIENCE, || async {
            let records = records(&store).await;
            match records.len() {
                2 => Ok(records),
                _ => Err(format!("two records: {records:?}")),
            }
        })
        .await;
        let first = both
            .iter()
            .find(|record| record["id"] != answered["id"])
            .unwrap();
        assert_eq!(first["cost_basis"], "late_answer", "{first}");
        assert_eq!(first["model"], "slow/model", "{first}");
        let usage = key_settled(&store, &key, chrono::Utc::now()).await;
        assert_eq!(
            usage.total_nanos,
            cost_nanos(first) + cost_nanos(&answered),
            "each attempt charged once"
        );
        assert!(cost_nanos(first) > 0 && cost_nanos(&answered) > 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_of_late_answers_a_timed_out_request_is_charged_its_hold_at_once() {
    on_every_store(|store| async move {
        let silent = mock::start(mock::MockConfig {
            latency: Duration::from_secs(3600),
            ..mock::MockConfig::default()
        })
        .await;
        // One late answer at a time, waited for an hour.
        let address = instance(store.clone(), &silent, &config(3600, 1)).await;
        let key = funded_key(&store).await;
        let first = chat(address, &key, "openai/gpt-4o-mini", false).await;
        assert_timed_out_and_told(&first);
        let second = chat(address, &key, "openai/gpt-4o-mini", false).await;
        assert_eq!(second.status, 504, "{second:?}");
        // Charged while the first still waits for its answer.
        let record = record(&store, &second.generation_id.unwrap()).await;
        assert_eq!(record["cost_basis"], "unanswered", "{record}");
        assert_eq!(cost_nanos(&record), HOLD_NANOS, "{record}");
        let hash = modelgate::auth::KeyHash::of(&key).to_hex();
        let usage = store
            .key_usage("acme", &hash, chrono::Utc::now())
            .await
            .unwrap();
        assert_eq!(
            (usage.total_nanos, usage.reserved_nanos),
            (HOLD_NANOS, HOLD_NANOS),
            "the first is still held, the second charged"
        );
        assert_eq!(records(&store).await.len(), 1);
    })
    .await;
}

/// A late answer that takes longer than the request's hold lasts: the hold
/// is renewed while the answer is read, so it never lapses (a lapse would
/// charge the whole hold to the key meanwhile), and the answer is charged
/// once, for what it used. On a real redis-server, where a second
/// instance's call would see a lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_longer_than_the_hold_keeps_its_hold_renewed() {
    let server = RedisServer::start();
    let store: SharedStore = Arc::new(
        RedisStore::connect(&server.url(), RedisStoreConfig::default())
            .await
            .unwrap(),
    );
    let slow = mock::start(mock::MockConfig {
        latency: Duration::from_millis(8500),
        ..mock::MockConfig::default()
    })
    .await;
    // Holds of 3 s, renewed every second while their request runs.
    let config = json!({
        "pricing": {"default": {"prompt_per_million": 1_000_000, "completion_per_million": 1_000_000}},
        "upstream": {"response_header_timeout_ms": 300, "late_answer_seconds": 60},
        "credit": {"reservation_ttl_seconds": 3},
    })
    .to_string();
    let address = instance(store.clone(), &slow, &config).await;
    let key = funded_key(&store).await;
    let sent = chrono::Utc::now();
    let reply = chat(address, &key, "openai/gpt-4o-mini", false).await;
    assert_timed_out_and_told(&reply);
    // Two lifetimes of the hold later, still no answer: held, not lapsed.
    let past = sent + chrono::Duration::milliseconds(6500);
    wait_until(PATIENCE, "two of the hold's lifetimes", || async {
        chrono::Utc::now() >= past
    })
    .await;
    let hash = modelgate::auth::KeyHash::of(&key).to_hex();
    let usage = store
        .key_usage("acme", &hash, chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(usage.total_nanos, 0, "no lapse charged: {usage:?}");
    assert_eq!(usage.reserved_nanos, HOLD_NANOS, "still held: {usage:?}");
    let record = record(&store, &reply.generation_id.unwrap()).await;
    assert_eq!(record["cost_basis"], "late_answer", "{record}");
    let cost = cost_nanos(&record);
    assert!(cost < HOLD_NANOS, "its usage, not its hold: {record}");
    let usage = key_settled(&store, &key, chrono::Utc::now()).await;
    assert_eq!(usage.total_nanos, cost, "charged once");
}
