//! "Sent" means the upstream received the request: what a request costs
//! when its upstream cannot be reached, or answers with an error, and its
//! client leaves while a retry waits; over real HTTP through the whole
//! gateway, on MemoryStore and on a real redis-server.

use crate::common;
use crate::mock;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::gateway::{instance, key_of};
use common::http_server::RefusingPort;
use common::redis_server::RedisServer;
use common::settle::key_settled;
use modelgate::keys::SharedStore;
use modelgate::store::{MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig};
use serde_json::{Value, json};

/// One credit a token, three attempts, each wait before a retry cut to
/// [`RETRY_WAIT`] (a backoff of 1 s and more, or an upstream's 1 s
/// `Retry-After`, would only make the test longer).
const CONFIG: &str = r#"{
    "pricing": {"default": {"prompt_per_million": 1000000, "completion_per_million": 1000000}},
    "retry": {"max_attempts": 3, "max_wait_ms": 600}
}"#;
const RETRY_WAIT: Duration = Duration::from_millis(600);

/// The account's balance, in credits: room for one request bounded at
/// [`MAX_TOKENS`] and its prompt, never two.
const BALANCE_CREDITS: i64 = 1000;
const MAX_TOKENS: u64 = 600;

/// How many retries the gateways of this test process have begun to wait
/// for (`modelgate_upstream_retries_total`): a retry is counted once its
/// request is marked as at no upstream, so a client leaving after that
/// owes nothing. The first call installs the process's recorder (each
/// test runs in a process of its own; none other here installs one).
fn retries_begun() -> u64 {
    static RECORDER: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    let handle = RECORDER.get_or_init(|| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).expect("no other metrics recorder in this process");
        handle
    });
    handle
        .render()
        .lines()
        .find_map(|line| line.strip_prefix("modelgate_upstream_retries_total "))
        .map_or(0, |count| count.trim().parse::<f64>().unwrap() as u64)
}

/// Runs `test` on a MemoryStore, then on a real redis-server.
async fn on_every_store<F, Fut>(test: F)
where
    F: Fn(SharedStore) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    test(Arc::new(MemoryStore::new())).await;
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

/// A chat request bounded at [`MAX_TOKENS`]; `None` when the client gave
/// up after `patience` (its connection closed, the request dropped).
async fn chat(address: SocketAddr, key: &str, patience: Duration) -> Option<Reply> {
    let body = json!({"model": "openai/gpt-4o-mini", "max_tokens": MAX_TOKENS,
                      "messages": [{"role": "user", "content": "Hi there"}]});
    let sent = reqwest::Client::new()
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(patience)
        .send()
        .await;
    let reply = match sent {
        Ok(reply) => reply,
        Err(error) if error.is_timeout() => return None,
        Err(error) => panic!("{error}"),
    };
    let status = reply.status().as_u16();
    let generation_id = reply
        .headers()
        .get("x-generation-id")
        .map(|value| value.to_str().unwrap().to_owned());
    let body = reply.json().await.unwrap_or(Value::Null);
    Some(Reply {
        status,
        generation_id,
        body,
    })
}

/// A funded account's new key.
async fn funded_key(store: &SharedStore) -> String {
    store
        .top_up("acme", BALANCE_CREDITS * NANOS_PER_CREDIT)
        .await
        .unwrap();
    key_of(store, "acme", None).await
}

/// Once every hold of `key` is released: nothing was charged, the balance
/// is whole, and the key has no generation record.
async fn assert_charged_nothing(store: &SharedStore, address: SocketAddr, key: &str, what: &str) {
    let usage = key_settled(store, key, chrono::Utc::now()).await;
    assert_eq!(usage.total_nanos, 0, "{what}: {usage:?}");
    let balance = store.account_balance("acme").await.unwrap();
    assert_eq!(
        balance.balance_nanos,
        BALANCE_CREDITS * NANOS_PER_CREDIT,
        "{what}"
    );
    let records: Value = reqwest::Client::new()
        .get(format!("http://{address}/api/v1/generations"))
        .header("authorization", format!("Bearer {key}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(records["data"], json!([]), "{what}: {records}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_while_connects_fail_and_retries_wait_pays_nothing() {
    on_every_store(|store| async move {
        let refusing = RefusingPort::bind();
        let address = instance(store.clone(), &refusing.base_url(), CONFIG).await;
        let key = funded_key(&store).await;
        // Refused at once, then the first wait (0.6 s): the client leaves
        // during it, half-way.
        let gone = chat(address, &key, RETRY_WAIT / 2).await;
        assert!(gone.is_none(), "{gone:?}");
        assert_charged_nothing(&store, address, &key, "left during the wait").await;

        // Its hold is gone: a request needing more than half the balance
        // is admitted, and when no attempt connects, answered 502 for
        // nothing, without a record to name.
        let reply = chat(address, &key, Duration::from_secs(30)).await.unwrap();
        assert_eq!(reply.status, 502, "{reply:?}");
        assert_eq!(
            reply.body["error"]["metadata"]["upstream_failure"],
            "connect"
        );
        assert_eq!(reply.generation_id, None, "no record: nothing was sent");
        assert_charged_nothing(&store, address, &key, "every attempt refused").await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_while_a_retry_waits_after_a_503_pays_nothing() {
    on_every_store(|store| async move {
        // Every request answered 503 with `Retry-After: 1`.
        let failing = mock::start(mock::MockConfig {
            fail_first: u64::MAX,
            error_status: 503,
            ..mock::MockConfig::default()
        })
        .await;
        let retries_before = retries_begun();
        let address = instance(store.clone(), &failing, CONFIG).await;
        let key = funded_key(&store).await;
        // The client leaves once the gateway has had the first attempt's
        // 503 and waits to retry. (The upstream having received the
        // attempt is not enough: a client leaving before its answer came
        // back leaves a request sent and unanswered, rightly charged its
        // hold.)
        let leaving = tokio::spawn({
            let key = key.clone();
            async move { chat(address, &key, Duration::from_secs(30)).await }
        });
        common::wait::wait_until(
            common::wait::PATIENCE,
            "the first attempt's 503 and the wait for the retry",
            || async { retries_begun() > retries_before },
        )
        .await;
        leaving.abort();
        assert!(
            leaving.await.unwrap_err().is_cancelled(),
            "left during the wait"
        );
        assert_charged_nothing(&store, address, &key, "left after a 503").await;

        // Answered after a 503 and a wait: charged once, for its usage,
        // with one record.
        let recovering = mock::start(mock::MockConfig {
            fail_first: 1,
            error_status: 503,
            ..mock::MockConfig::default()
        })
        .await;
        let address = instance(store.clone(), &recovering, CONFIG).await;
        let reply = chat(address, &key, Duration::from_secs(30)).await.unwrap();
        assert_eq!(reply.status, 200, "{reply:?}");
        let id = reply.generation_id.expect("a record's id");
        let usage = key_settled(&store, &key, chrono::Utc::now()).await;
        let tokens = &reply.body["usage"];
        let used = tokens["prompt_tokens"].as_i64().unwrap()
            + tokens["completion_tokens"].as_i64().unwrap();
        assert_eq!(usage.total_nanos, used * NANOS_PER_CREDIT);
        let records: Value = reqwest::Client::new()
            .get(format!("http://{address}/api/v1/generations"))
            .header("authorization", format!("Bearer {key}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let records = records["data"].as_array().unwrap();
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0]["id"], id.as_str());
    })
    .await;
}
