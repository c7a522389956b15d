//! No settlement lost, no request kept waiting on a sick store: the proxy
//! as a process on a real redis-server, with streams in flight through a
//! slow upstream. SIGTERM lets every stream
//! finish and every cost land before the process exits; a stream still
//! open after `shutdown_grace_seconds` is ended with a last error event
//! and charged its prompt and what it streamed; Redis stopped
//! mid-stream and back 10 s later (its data kept) still gets every cost,
//! once; Redis restarted from files older than a stream's admission (its
//! hold lost) still gets the stream's cost, once. A killed instance's hold
//! lapses and the next admission, on another instance, charges it first.
//! Charges are read back through a store connection of their own,
//! as a second instance would. A frozen Redis (SIGSTOP) is answered fast
//! under the failure policy once the store's breaker opens, and the same
//! gateway answers again after SIGCONT.

use crate::common;
use crate::mock;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::examples::ProxyProcess;
use common::redis_server::RedisServer;
use futures::future::join_all;
use modelgate::auth::KeyHash;
use modelgate::store::{LedgerStore, RedisStore, RedisStoreConfig, NANOS_PER_CREDIT};
use serde_json::json;

const STREAMS: usize = 20;

/// The proxy on `redis_url` in front of `upstream`, configured by `config`.
fn start_proxy(
    redis_url: &str,
    upstream: &str,
    config: &std::path::Path,
    admin_key: &str,
) -> ProxyProcess {
    let mut command = Command::new(common::examples::binary("proxy"));
    command
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--redis", redis_url, "--upstream", upstream, "--config"])
        .arg(config)
        .env("MODELGATE_ADMIN_KEY", admin_key);
    ProxyProcess::spawn(command)
}

struct Setup {
    proxy: ProxyProcess,
    key: String,
    received: std::sync::Arc<std::sync::atomic::AtomicU64>,
    _config: tempfile::TempDir,
}

/// A proxy on `server` in front of a mock whose streams take about two
/// seconds, a key, and an account with credits.
async fn setup(server: &RedisServer) -> Setup {
    setup_with(server, json!({})).await
}

/// [`setup`] with `credit` as the config's `credit` section.
async fn setup_with(server: &RedisServer, credit: serde_json::Value) -> Setup {
    let (base, received) = mock::start_counted(mock::MockConfig {
        event_delay: Duration::from_millis(200),
        ..mock::MockConfig::default()
    })
    .await;
    let directory = tempfile::tempdir().unwrap();
    let config = directory.path().join("gateway.json");
    let price = json!({"prompt_per_million": 1000000, "completion_per_million": 1000000});
    std::fs::write(
        &config,
        json!({"pricing": {"default": price}, "credit": credit}).to_string(),
    )
    .unwrap();
    let admin_key = modelgate::auth::ApiKey::generate();
    let proxy = start_proxy(&server.url(), &base, &config, admin_key.expose());
    let client = reqwest::Client::new();
    let key = proxy.create_key(admin_key.expose(), "streams").await;
    let response = client
        .post(format!("{}/api/v1/accounts/default/credits", proxy.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({"amount": 10000}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    Setup {
        proxy,
        key,
        received,
        _config: directory,
    }
}

/// `STREAMS` streams at once; each one's status and whole text.
async fn streams(address: &str, key: &str) -> Vec<(u16, String)> {
    let client = reqwest::Client::new();
    join_all((0..STREAMS).map(|_| {
        let client = client.clone();
        async move {
            let reply = client
                .post(format!("{address}/api/v1/chat/completions"))
                .bearer_auth(key)
                .json(
                    &json!({"model": "openai/gpt-4o-mini", "stream": true, "max_tokens": 16,
                              "messages": [{"role": "user", "content": "Hi there"}]}),
                )
                .send()
                .await
                .unwrap();
            let status = reply.status().as_u16();
            (status, reply.text().await.unwrap_or_default())
        }
    }))
    .await
}

async fn wait_for(received: &std::sync::atomic::AtomicU64, count: u64) {
    while received.load(Ordering::SeqCst) < count {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the key was charged, and still holds, read through a connection of
/// this test's own.
async fn charged(server: &RedisServer, key: &str) -> (i64, i64) {
    // The test's own reading: patient, so that a machine busy with other
    // tests does not fail it.
    let config = RedisStoreConfig {
        call_timeout: Duration::from_secs(5),
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&server.url(), config).await.unwrap();
    let usage = store
        .key_usage("default", &KeyHash::of(key).to_hex(), chrono::Utc::now())
        .await
        .unwrap();
    (usage.total_nanos, usage.reserved_nanos)
}

/// How many reservation ids Redis remembers: each settlement leaves its
/// marker (for `SETTLEMENT_MEMORY`), so one per request settled, however
/// often its settlement was retried.
async fn remembered_ids(server: &RedisServer) -> usize {
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:ids")
        .query_async(&mut connection)
        .await
        .unwrap();
    let mut count = 0;
    for key in keys {
        // Settled ids are scored by minus when they are forgotten.
        let members: usize = redis::cmd("ZCOUNT")
            .arg(&key)
            .arg("-inf")
            .arg("(0")
            .query_async(&mut connection)
            .await
            .unwrap();
        count += members;
    }
    count
}

/// Each stream costs 2 prompt and 7 completion tokens at a credit each.
const STREAM_COST_NANOS: i64 = 9 * NANOS_PER_CREDIT;

fn assert_complete(replies: &[(u16, String)]) {
    for (status, text) in replies {
        assert_eq!(*status, 200, "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_every_stream_finish_and_records_every_cost() {
    let server = RedisServer::start();
    let mut setup = setup(&server).await;
    let address = setup.proxy.address.clone();
    let key = setup.key.clone();
    let running = tokio::spawn(async move { streams(&address, &key).await });
    wait_for(&setup.received, STREAMS as u64).await;
    setup.proxy.terminate();
    let replies = running.await.unwrap();
    assert_complete(&replies);
    assert_eq!(setup.proxy.wait(Duration::from_secs(60)), Some(0));
    assert_eq!(
        charged(&server, &setup.key).await,
        (STREAMS as i64 * STREAM_COST_NANOS, 0),
        "every stream charged once, no hold left"
    );
    assert_eq!(remembered_ids(&server).await, STREAMS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_for_ten_seconds_mid_stream_loses_no_cost() {
    let mut server = RedisServer::start_persistent();
    let setup = setup(&server).await;
    let address = setup.proxy.address.clone();
    let key = setup.key.clone();
    let running = tokio::spawn(async move { streams(&address, &key).await });
    wait_for(&setup.received, STREAMS as u64).await;
    // Every stream was admitted; Redis goes away before any can settle.
    server.stop();
    let replies = running.await.unwrap();
    assert_complete(&replies);
    tokio::time::sleep(Duration::from_secs(10)).await;
    server.start_again();
    // The retries find it back: every cost lands, exactly once.
    let mut last = (0, 0);
    for _ in 0..300 {
        last = charged(&server, &setup.key).await;
        if last == (STREAMS as i64 * STREAM_COST_NANOS, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last, (STREAMS as i64 * STREAM_COST_NANOS, 0));
    // And no retry records one twice later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(charged(&server, &setup.key).await, last);
    assert_eq!(remembered_ids(&server).await, STREAMS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_past_the_holds_lifetime_still_loses_no_cost() {
    // Holds of 3 s, Redis away for 10 s: every hold expires before any
    // settlement can land. They lapse, and the settlements retried once
    // Redis is back take them, each once.
    let mut server = RedisServer::start_persistent();
    let setup = setup_with(&server, json!({"reservation_ttl_seconds": 3})).await;
    let address = setup.proxy.address.clone();
    let key = setup.key.clone();
    let running = tokio::spawn(async move { streams(&address, &key).await });
    wait_for(&setup.received, STREAMS as u64).await;
    server.stop();
    let replies = running.await.unwrap();
    assert_complete(&replies);
    tokio::time::sleep(Duration::from_secs(10)).await;
    server.start_again();
    let mut last = (0, 0);
    for _ in 0..400 {
        last = charged(&server, &setup.key).await;
        if last == (STREAMS as i64 * STREAM_COST_NANOS, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last, (STREAMS as i64 * STREAM_COST_NANOS, 0));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(charged(&server, &setup.key).await, last);
    assert_eq!(remembered_ids(&server).await, STREAMS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_answers_fast_under_the_policy_and_recovers_without_a_restart() {
    use common::gateway::{chat, instance, key_of};
    let server = RedisServer::start();
    let store: modelgate::keys::SharedStore = std::sync::Arc::new(
        RedisStore::connect(&server.url(), RedisStoreConfig::default())
            .await
            .unwrap(),
    );
    let base = mock::start(mock::MockConfig::default()).await;
    let config =
        r#"{"pricing": {"default": {"prompt_per_million": 1, "completion_per_million": 1}}}"#;
    let address = instance(store.clone(), &base, config).await;
    store.top_up("acme", 100 * NANOS_PER_CREDIT).await.unwrap();
    let key = key_of(&store, "acme", None).await;
    let body = json!({"model": "openai/gpt-4o-mini", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "Hi there"}]});
    // The key is cached: only the admission goes to Redis.
    assert_eq!(chat(address, &key, &body).await.0, 200);
    server.freeze();
    let mut latencies_ms = Vec::new();
    for _ in 0..20 {
        let started = std::time::Instant::now();
        let (status, reply) = chat(address, &key, &body).await;
        latencies_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        // CreditGuard fails closed: 503, the store named.
        assert_eq!(status, 503, "{reply}");
    }
    println!("frozen Redis, 20 sequential requests, ms: {latencies_ms:.1?}");
    // The first few waited for the call timeout (500 ms); once the breaker
    // opened, the rest were refused without waiting for Redis.
    let slow = latencies_ms.iter().filter(|ms| **ms >= 400.0).count();
    assert!(slow <= 4, "{slow} requests waited: {latencies_ms:.1?}");
    server.thaw();
    let mut answered = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if chat(address, &key, &body).await.0 == 200 {
            answered = true;
            break;
        }
    }
    assert!(answered, "the same gateway answers again after SIGCONT");
}

/// An upstream whose streams send one chunk of two bytes every 200 ms and
/// no usage until their end: 5 chunks and usage (3 prompt tokens) for a
/// prompt saying "short", 225 chunks (45 s) for any other. Counts the
/// requests it receives.
async fn slow_upstream() -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use axum::body::Body;
    use axum::routing::post;

    let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = received.clone();
    let chat = move |body: axum::body::Bytes| {
        let received = counted.clone();
        async move {
            received.fetch_add(1, Ordering::SeqCst);
            let text = String::from_utf8_lossy(&body);
            let chunks: u64 = if text.contains("short") {
                5
            } else if text.contains("eight seconds") {
                40
            } else {
                225
            };
            let events = futures::stream::unfold(0u64, move |sent| async move {
                let event = match sent {
                    _ if sent < chunks => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        json!({"object": "chat.completion.chunk",
                               "choices": [{"index": 0, "delta": {"content": "ab"}}]})
                        .to_string()
                    }
                    _ if sent == chunks => json!({"object": "chat.completion.chunk", "choices": [],
                        "usage": {"prompt_tokens": 3, "completion_tokens": chunks}})
                    .to_string(),
                    _ if sent == chunks + 1 => "[DONE]".to_owned(),
                    _ => return None,
                };
                let frame = axum::body::Bytes::from(format!("data: {event}\n\n"));
                Some((Ok::<_, std::convert::Infallible>(frame), sent + 1))
            });
            http::Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(events))
                .unwrap()
        }
    };
    let app = axum::Router::new().route("/v1/chat/completions", post(chat));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, received)
}

/// A streamed chat request saying `prompt`: its status and whole text.
async fn stream_saying(address: &str, key: &str, prompt: &str) -> (u16, String) {
    let reply = reqwest::Client::new()
        .post(format!("{address}/api/v1/chat/completions"))
        .bearer_auth(key)
        .json(
            &json!({"model": "openai/gpt-4o-mini", "stream": true, "max_tokens": 300,
                      "messages": [{"role": "user", "content": prompt}]}),
        )
        .send()
        .await
        .unwrap();
    let status = reply.status().as_u16();
    (status, reply.text().await.unwrap_or_default())
}

/// A record's `total_cost` (credits) in nano-credits.
fn record_cost_nanos(record: &serde_json::Value) -> i64 {
    (record["total_cost"].as_f64().unwrap() * NANOS_PER_CREDIT as f64).round() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_stream_past_the_grace_and_charges_what_it_streamed() {
    let server = RedisServer::start();
    let (upstream, received) = slow_upstream().await;
    let directory = tempfile::tempdir().unwrap();
    let config = directory.path().join("gateway.json");
    let price = json!({"prompt_per_million": 1000000, "completion_per_million": 1000000});
    std::fs::write(
        &config,
        json!({"pricing": {"default": price}, "shutdown_grace_seconds": 2}).to_string(),
    )
    .unwrap();
    let admin_key = modelgate::auth::ApiKey::generate();
    let mut proxy = start_proxy(&server.url(), &upstream, &config, admin_key.expose());
    let key = proxy.create_key(admin_key.expose(), "shutdown").await;
    let funded = reqwest::Client::new()
        .post(format!("{}/api/v1/accounts/default/credits", proxy.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({"amount": 10000}))
        .send()
        .await
        .unwrap();
    assert!(funded.status().is_success());

    let long = tokio::spawn({
        let (address, key) = (proxy.address.clone(), key.clone());
        async move { stream_saying(&address, &key, "a long story").await }
    });
    wait_for(&received, 1).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    // About a second long: it ends within the grace.
    let short = tokio::spawn({
        let (address, key) = (proxy.address.clone(), key.clone());
        async move { stream_saying(&address, &key, "short").await }
    });
    wait_for(&received, 2).await;
    let terminated = std::time::Instant::now();
    proxy.terminate();

    let (status, text) = short.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the short stream ends whole: {text}"
    );
    let (status, text) = long.await.unwrap();
    assert_eq!(status, 200, "{text}");
    let ended_at = terminated.elapsed();
    assert!(
        ended_at >= Duration::from_millis(1900) && ended_at < Duration::from_secs(5),
        "the long stream ends at the grace's end, not before nor at its own: {ended_at:?}"
    );
    let last = text
        .trim_end()
        .rsplit("\n\n")
        .next()
        .unwrap()
        .strip_prefix("data: ")
        .unwrap_or_else(|| panic!("a last event: {text}"));
    let last: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(
        last["error"]["metadata"]["reason"], "shutting_down",
        "{text}"
    );
    assert_eq!(last["error"]["code"], 503);
    let streamed_chunks = text.matches("\"content\":\"ab\"").count() as u64;
    assert!(
        streamed_chunks >= 10,
        "about 3 s of chunks: {streamed_chunks}"
    );
    assert_eq!(
        proxy.wait(Duration::from_secs(8)),
        Some(0),
        "exits within the grace and a few seconds"
    );

    let store = RedisStore::connect(&server.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    let records: Vec<serde_json::Value> = store
        .recent_generations("default", 10, chrono::Utc::now())
        .await
        .unwrap()
        .iter()
        .map(|record| serde_json::from_slice(record).unwrap())
        .collect();
    assert_eq!(records.len(), 2, "one record each: {records:?}");
    let record_of = |basis: &str| {
        records
            .iter()
            .find(|record| record["cost_basis"] == basis)
            .unwrap_or_else(|| panic!("a record by {basis}: {records:?}"))
    };
    let short_record = record_of("usage");
    assert_eq!(record_cost_nanos(short_record), 8 * NANOS_PER_CREDIT);
    let long_record = record_of("streamed");
    let prompt_tokens = long_record["tokens_prompt"].as_u64().unwrap();
    let completion_tokens = long_record["tokens_completion"].as_u64().unwrap();
    assert!(prompt_tokens >= 1, "{long_record}");
    assert!(
        completion_tokens >= streamed_chunks,
        "at least what the client read: {long_record}"
    );
    assert_eq!(
        record_cost_nanos(long_record),
        (prompt_tokens + completion_tokens) as i64 * NANOS_PER_CREDIT,
        "its prompt and what it streamed, at a credit a token"
    );
    assert_eq!(
        charged(&server, &key).await,
        (
            record_cost_nanos(short_record) + record_cost_nanos(long_record),
            0
        ),
        "each charged once, as its record says; no hold left"
    );
}

/// A proxy on `server` whose holds last `hold_seconds` unless renewed, in
/// front of the slow upstream, with a key and an account of `credits`.
async fn short_holds(
    server: &RedisServer,
    hold_seconds: u64,
    credits: u64,
) -> (
    ProxyProcess,
    String,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
    tempfile::TempDir,
) {
    let (upstream, received) = slow_upstream().await;
    let directory = tempfile::tempdir().unwrap();
    let config = directory.path().join("gateway.json");
    let price = json!({"prompt_per_million": 1000000, "completion_per_million": 1000000});
    std::fs::write(
        &config,
        json!({"pricing": {"default": price},
               "credit": {"reservation_ttl_seconds": hold_seconds}})
        .to_string(),
    )
    .unwrap();
    let admin_key = modelgate::auth::ApiKey::generate();
    let proxy = start_proxy(&server.url(), &upstream, &config, admin_key.expose());
    let key = proxy.create_key(admin_key.expose(), "holds").await;
    let funded = reqwest::Client::new()
        .post(format!("{}/api/v1/accounts/default/credits", proxy.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({ "amount": credits }))
        .send()
        .await
        .unwrap();
    assert!(funded.status().is_success());
    (proxy, key, received, directory)
}

async fn balance_nanos(server: &RedisServer) -> i64 {
    let store = RedisStore::connect(&server.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    store
        .account_balance("default")
        .await
        .unwrap()
        .balance_nanos
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_its_hold_keeps_it_renewed() {
    // 3 s holds, an 8 s stream: its hold is renewed while it runs, so a
    // second request is refused for the balance it holds, and the stream
    // is charged once, its real cost, at its end.
    let server = RedisServer::start();
    let (proxy, key, received, _config) = short_holds(&server, 3, 500).await;
    let long = tokio::spawn({
        let (address, key) = (proxy.address.clone(), key.clone());
        async move { stream_saying(&address, &key, "eight seconds").await }
    });
    wait_for(&received, 1).await;
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let (used, held) = charged(&server, &key).await;
    assert_eq!(used, 0, "nothing charged while it streams");
    assert!(
        held > 250 * NANOS_PER_CREDIT,
        "past its first lifetime, its hold is still held: {held}"
    );
    let second = stream_saying(&proxy.address, &key, "short").await;
    assert_eq!(second.0, 402, "{}", second.1);
    let (status, text) = long.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let cost = 43 * NANOS_PER_CREDIT;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while charged(&server, &key).await != (cost, 0) {
        assert!(std::time::Instant::now() < deadline, "never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(balance_nanos(&server).await, 500 * NANOS_PER_CREDIT - cost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_s_hold_lapses_charged_in_full_with_a_record_saying_so() {
    let server = RedisServer::start();
    let (proxy, key, received, _config) = short_holds(&server, 3, 1000).await;
    let (reply, generation) = long_story(&proxy.address, &key).await;
    wait_for(&received, 1).await;
    let (_, held) = charged(&server, &key).await;
    assert!(held > 0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    kill_9(&proxy);
    drop(reply);
    // Renewed no more: a lifetime after its last renewal, it lapses, and
    // the first call that finds it (here a usage read, as a second
    // instance would make) charges it in full, once.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for _ in 0..2 {
        assert_eq!(charged(&server, &key).await, (held, 0));
        assert_eq!(balance_nanos(&server).await, 1000 * NANOS_PER_CREDIT - held);
    }
    let store = RedisStore::connect(&server.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    let record = generation_record(&store, &generation).await;
    assert_eq!(record["id"], generation);
    assert_eq!(record["cost_basis"], "lapsed");
    assert_eq!(record["lapsed"], true);
    assert_eq!(record_cost_nanos(&record), held);
}

/// Copies the files of directory `from` (one level, as Redis's
/// `appendonlydir/` is) into `to`, created if missing.
fn copy_files(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Waits (up to `bound`) until the key's usage and holds read `expected`.
async fn wait_until_charged(
    server: &RedisServer,
    key: &str,
    expected: (i64, i64),
    bound: Duration,
) {
    let deadline = std::time::Instant::now() + bound;
    loop {
        let now_charged = charged(server, key).await;
        if now_charged == expected {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "charged {now_charged:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_from_an_older_aof_still_charges_the_stream_once() {
    // Redis restarts from files older than a stream's admission (a restore,
    // a crash with lazy fsync, a failover to a replica behind): its hold is
    // gone. Its settlement finds neither hold nor marker, and charges its
    // cost all the same, once.
    let mut server = RedisServer::start_persistent();
    let (proxy, key, received, _config) = short_holds(&server, 60, 500).await;
    let aof = server.data_dir().join("appendonlydir");
    let older = tempfile::tempdir().unwrap();
    // Every write is in the files before it is answered (appendfsync
    // always): the account is funded in this copy, and nothing is held.
    copy_files(&aof, older.path());
    let long = tokio::spawn({
        let (address, key) = (proxy.address.clone(), key.clone());
        async move { stream_saying(&address, &key, "eight seconds").await }
    });
    wait_for(&received, 1).await;
    let (used, held) = charged(&server, &key).await;
    assert_eq!(used, 0);
    assert!(held > 0, "the stream holds");

    server.stop();
    std::fs::remove_dir_all(&aof).unwrap();
    copy_files(older.path(), &aof);
    server.start_again();
    assert_eq!(charged(&server, &key).await, (0, 0), "its hold is lost");
    assert_eq!(balance_nanos(&server).await, 500 * NANOS_PER_CREDIT);

    let (status, text) = long.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // 3 prompt and 40 completion tokens, at a credit each.
    let cost = 43 * NANOS_PER_CREDIT;
    wait_until_charged(&server, &key, (cost, 0), Duration::from_secs(30)).await;
    assert_eq!(balance_nanos(&server).await, 500 * NANOS_PER_CREDIT - cost);
    // Nothing lapses nor settles again later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(charged(&server, &key).await, (cost, 0));
    assert_eq!(balance_nanos(&server).await, 500 * NANOS_PER_CREDIT - cost);
    let store = RedisStore::connect(&server.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    let records = store
        .recent_generations("default", 10, chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(records.len(), 1, "one record: {records:?}");
    let record: serde_json::Value = serde_json::from_slice(&records[0]).unwrap();
    assert_eq!(record_cost_nanos(&record), cost, "{record}");
    assert_eq!(remembered_ids(&server).await, 1, "its settlement's marker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_s_lapsed_hold_is_charged_by_the_next_admission_on_another() {
    // Two instances on one Redis, holds of 3 s. A stream on A, A killed:
    // its hold is renewed no more, and B's next admission, the first call
    // to find it lapsed, charges it before deciding. The account holds
    // enough for one such request and not two: B is refused exactly when
    // the lapse was charged, and served once the balance is topped up.
    const FUNDS: i64 = 400 * NANOS_PER_CREDIT;
    let server = RedisServer::start();
    let (upstream, received) = slow_upstream().await;
    let directory = tempfile::tempdir().unwrap();
    let config = directory.path().join("gateway.json");
    let price = json!({"prompt_per_million": 1000000, "completion_per_million": 1000000});
    std::fs::write(
        &config,
        json!({"pricing": {"default": price}, "credit": {"reservation_ttl_seconds": 3}})
            .to_string(),
    )
    .unwrap();
    let admin_key = modelgate::auth::ApiKey::generate();
    let first = start_proxy(&server.url(), &upstream, &config, admin_key.expose());
    let second = start_proxy(&server.url(), &upstream, &config, admin_key.expose());
    let key = first.create_key(admin_key.expose(), "two instances").await;
    let store = RedisStore::connect(&server.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    store.top_up("default", FUNDS).await.unwrap();

    let (reply, generation) = long_story(&first.address, &key).await;
    wait_for(&received, 1).await;
    let (_, held) = charged(&server, &key).await;
    assert!(
        held <= FUNDS && 2 * held > FUNDS,
        "the funds cover one such hold and not two: {held}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    kill_9(&first);
    drop(reply);
    // Its last renewal at most 1 s before the kill: a hold's lifetime and
    // more later it has lapsed. Nothing reads the ledger meanwhile.
    tokio::time::sleep(Duration::from_millis(4500)).await;

    let (status, text) = stream_saying(&second.address, &key, "a long story").await;
    assert_eq!(status, 402, "B refused for the lapse's charge: {text}");
    assert_eq!(
        charged(&server, &key).await,
        (held, 0),
        "the lapse charged once to the key, no hold left"
    );
    assert_eq!(balance_nanos(&server).await, FUNDS - held);
    let record = generation_record(&store, &generation).await;
    assert_eq!(record["cost_basis"], "lapsed", "{record}");
    assert_eq!(record_cost_nanos(&record), held);

    // With the lapse's charge made good, the balance covers B's request.
    store.top_up("default", held).await.unwrap();
    let (status, text) = stream_saying(&second.address, &key, "short").await;
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // 3 prompt and 5 completion tokens.
    let cost = 8 * NANOS_PER_CREDIT;
    wait_until_charged(&server, &key, (held + cost, 0), Duration::from_secs(10)).await;
    assert_eq!(balance_nanos(&server).await, FUNDS - cost);
}

/// A 45 s stream started on the proxy at `address` (its headers read): the
/// response, and its generation id.
async fn long_story(address: &str, key: &str) -> (reqwest::Response, String) {
    let reply = reqwest::Client::new()
        .post(format!("{address}/api/v1/chat/completions"))
        .bearer_auth(key)
        .json(
            &json!({"model": "openai/gpt-4o-mini", "stream": true, "max_tokens": 300,
                      "messages": [{"role": "user", "content": "a long story"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    let generation = reply.headers()["x-generation-id"]
        .to_str()
        .unwrap()
        .to_owned();
    (reply, generation)
}

/// `kill -9` of the proxy: an instance that dies, settling nothing.
fn kill_9(proxy: &ProxyProcess) {
    let killed = Command::new("kill")
        .args(["-KILL", &proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
}

/// The record of the generation `generation` (`gen-…`) of `default`.
async fn generation_record(store: &RedisStore, generation: &str) -> serde_json::Value {
    let reservation = generation.strip_prefix("gen-").unwrap();
    let bytes = store
        .generation("default", reservation, chrono::Utc::now())
        .await
        .unwrap()
        .expect("the generation's record");
    serde_json::from_slice(&bytes).unwrap()
}
