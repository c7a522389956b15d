//! No settlement lost, no request kept waiting on a sick store: the proxy
//! as a process on a real redis-server, with streams in flight through a
//! slow upstream. SIGTERM lets every stream
//! finish and every cost land before the process exits; a stream still
//! open after `shutdown_grace_seconds` is ended with a last error event
//! and charged its prompt and what it streamed; Redis stopped
//! mid-stream and back once every settlement has failed twice (its data
//! kept) still gets every cost, once; Redis out of the proxy's reach until
//! the holds have lapsed still gets every cost, once; Redis restarted from
//! files older than a stream's admission (its
//! hold lost) still gets the stream's cost, once. A killed instance's hold
//! lapses and the next admission, on another instance, charges it first.
//! Charges are read back through a store connection of their own,
//! as a second instance would. A frozen Redis (SIGSTOP) is answered fast
//! under the failure policy once the store's breaker opens, and the same
//! gateway answers again after SIGCONT.
//!
//! Nothing here waits a fixed time: each step waits for what it needs to
//! have happened (the proxy's log says every settlement failed, Redis's
//! clock is past a hold's expiry, the ledger shows the charge), and "no
//! retry records it twice later" is shown by stopping the proxy, which
//! exits only once no settlement is pending, and reading the ledger after.

use crate::common;
use crate::mock;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::examples::{ProxyProcess, WatchedProxy};
use common::redis_server::RedisServer;
use common::relay::Relay;
use common::wait::{PATIENCE, wait_for, wait_until};
use futures::future::join_all;
use modelgate::auth::KeyHash;
use modelgate::store::{LedgerStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig};
use serde_json::json;

const STREAMS: usize = 20;

/// The proxy on `redis_url` in front of `upstream`, configured by `config`,
/// its log kept.
fn start_proxy(
    redis_url: &str,
    upstream: &str,
    config: &std::path::Path,
    admin_key: &str,
) -> WatchedProxy {
    let mut command = Command::new(common::examples::binary("proxy"));
    command
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--redis", redis_url, "--upstream", upstream, "--config"])
        .arg(config)
        .env("MODELGATE_ADMIN_KEY", admin_key);
    ProxyProcess::spawn_watched(command)
}

struct Setup {
    proxy: WatchedProxy,
    key: String,
    received: std::sync::Arc<std::sync::atomic::AtomicU64>,
    _config: tempfile::TempDir,
}

/// A proxy on `server` in front of a mock whose streams take about two
/// seconds, a key, and an account with credits.
async fn setup(server: &RedisServer) -> Setup {
    setup_with(&server.url(), json!({})).await
}

/// [`setup`] on the Redis at `redis_url`, with `credit` as the config's
/// `credit` section.
async fn setup_with(redis_url: &str, credit: serde_json::Value) -> Setup {
    let streams = mock::MockConfig {
        event_delay: Duration::from_millis(200),
        ..mock::MockConfig::default()
    };
    setup_on(redis_url, streams, json!({ "credit": credit })).await
}

/// A proxy on the Redis at `redis_url` in front of a mock answering as
/// `upstream` says, a credit a token, with the config's other sections
/// `sections`; a key, and an account with credits.
async fn setup_on(
    redis_url: &str,
    upstream: mock::MockConfig,
    sections: serde_json::Value,
) -> Setup {
    let (base, received) = mock::start_counted(upstream).await;
    let directory = tempfile::tempdir().unwrap();
    let config = directory.path().join("gateway.json");
    let price = json!({"prompt_per_million": 1000000, "completion_per_million": 1000000});
    let mut written = json!({"pricing": {"default": price}});
    for (section, value) in sections.as_object().unwrap() {
        written[section] = value.clone();
    }
    std::fs::write(&config, written.to_string()).unwrap();
    let admin_key = modelgate::auth::ApiKey::generate();
    let proxy = start_proxy(redis_url, &base, &config, admin_key.expose());
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

/// Waits until the upstream has received `count` requests.
async fn received_at_least(received: &std::sync::atomic::AtomicU64, count: u64) {
    wait_until(
        PATIENCE,
        format_args!("{count} requests at the upstream"),
        || async { received.load(Ordering::SeqCst) >= count },
    )
    .await;
}

/// How many times the proxy logged that each settlement's attempt failed,
/// by reservation id.
fn failed_settlements(proxy: &WatchedProxy) -> std::collections::HashMap<String, usize> {
    let mut failed = std::collections::HashMap::new();
    for line in proxy.log().lines() {
        if !line.contains("settlement attempt failed") {
            continue;
        }
        let reservation = line
            .split(' ')
            .find_map(|field| field.strip_prefix("reservation="))
            .unwrap_or_else(|| panic!("a reservation in {line:?}"));
        *failed.entry(reservation.to_owned()).or_default() += 1;
    }
    failed
}

/// Waits until the proxy has logged `times` failed attempts of `count`
/// settlements each: they were tried, and are being retried.
async fn settlements_failed(proxy: &WatchedProxy, count: usize, times: usize) {
    wait_for(PATIENCE, || async {
        let failed = failed_settlements(proxy);
        if failed.len() >= count && failed.values().all(|attempts| *attempts >= times) {
            Ok(())
        } else {
            Err(format!(
                "{count} settlements failed {times} times each: {failed:?}"
            ))
        }
    })
    .await;
}

/// Stops the proxy (SIGTERM) and waits for it to exit, which it does only
/// once it has no settlement pending (or has logged those it gave up,
/// which must be none): no retry can record anything after this.
fn stop_with_nothing_pending(proxy: &mut WatchedProxy) {
    proxy.terminate();
    assert_eq!(proxy.wait(PATIENCE), Some(0));
    let log = proxy.wait_for_log("settlements flushed; stopping");
    let flushed = log
        .lines()
        .find(|line| line.contains("settlements flushed; stopping"))
        .unwrap();
    assert!(flushed.contains("unrecorded=0"), "{flushed}");
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

/// Waits until the key's usage and holds read `expected`.
async fn charged_to_be(server: &RedisServer, key: &str, expected: (i64, i64)) {
    wait_for(PATIENCE, || async {
        let now_charged = charged(server, key).await;
        if now_charged == expected {
            Ok(())
        } else {
            Err(format!("charged {now_charged:?}, expected {expected:?}"))
        }
    })
    .await;
}

async fn connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The expiries (µs, by Redis's clock) of the live holds Redis keeps: the
/// positive scores of the ledgers' `ids` sets. Read as they are, so that
/// reading them lapses nothing (a ledger call would).
async fn hold_expiries(server: &RedisServer) -> Vec<i64> {
    let mut connection = connection(server).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:ids")
        .query_async(&mut connection)
        .await
        .unwrap();
    let mut expiries = Vec::new();
    for key in keys {
        let scored: Vec<(String, i64)> = redis::cmd("ZRANGEBYSCORE")
            .arg(&key)
            .arg("(0")
            .arg("+inf")
            .arg("WITHSCORES")
            .query_async(&mut connection)
            .await
            .unwrap();
        expiries.extend(scored.into_iter().map(|(_, expiry)| expiry));
    }
    expiries
}

/// The one live hold's expiry.
async fn the_hold_expiry(server: &RedisServer) -> i64 {
    match hold_expiries(server).await.as_slice() {
        [expiry] => *expiry,
        other => panic!("one live hold, not {other:?}"),
    }
}

/// Waits until Redis's clock has passed `expiry`: a hold that expired then
/// and was not renewed has lapsed, though nothing has charged it yet.
async fn redis_clock_past(server: &RedisServer, expiry: i64) {
    wait_until(
        PATIENCE,
        format_args!("Redis's clock past {expiry}"),
        || async { server.clock().timestamp_micros() > expiry },
    )
    .await;
}

/// Waits until the one live hold has been renewed: its expiry moved past
/// `first`.
async fn renewed_past(server: &RedisServer, first: i64) {
    wait_until(PATIENCE, "the hold renewed", || async {
        the_hold_expiry(server).await > first
    })
    .await;
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
    received_at_least(&setup.received, STREAMS as u64).await;
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

/// The same through the Messages API to an upstream that serves it: every
/// stream finishes through SIGTERM and is charged once, what its events'
/// usage (merged field by field) says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_every_messages_stream_finish_and_records_every_cost() {
    let server = RedisServer::start();
    let streams_config = mock::MockConfig {
        event_delay: Duration::from_millis(200),
        ..mock::MockConfig::default()
    };
    let sections = json!({"upstream": {"apis": ["messages"]}});
    let mut setup = setup_on(&server.url(), streams_config, sections).await;
    let address = setup.proxy.address.clone();
    let key = setup.key.clone();
    let running = tokio::spawn(async move {
        let client = reqwest::Client::new();
        join_all((0..STREAMS).map(|_| {
            let client = client.clone();
            let (address, key) = (address.clone(), key.clone());
            async move {
                let reply = client
                    .post(format!("{address}/api/v1/messages"))
                    .header("x-api-key", key)
                    .header("anthropic-version", "2023-06-01")
                    .json(&json!({"model": "anthropic/claude-test", "stream": true,
                        "max_tokens": 16, "messages": [{"role": "user", "content": "Hi there"}]}))
                    .send()
                    .await
                    .unwrap();
                (
                    reply.status().as_u16(),
                    reply.text().await.unwrap_or_default(),
                )
            }
        }))
        .await
    });
    received_at_least(&setup.received, STREAMS as u64).await;
    setup.proxy.terminate();
    let replies = running.await.unwrap();
    // A credit a token: each stream costs its prompt and output tokens.
    let mut expected = 0;
    for (status, text) in &replies {
        assert_eq!(*status, 200, "{text}");
        assert!(text.contains("event: message_stop"), "{text}");
        let mut usage = serde_json::Map::new();
        for data in text.lines().filter_map(|line| line.strip_prefix("data: ")) {
            let event: serde_json::Value = serde_json::from_str(data).unwrap();
            let part = match event["type"].as_str() {
                Some("message_start") => &event["message"]["usage"],
                Some("message_delta") => &event["usage"],
                _ => continue,
            };
            usage.extend(part.as_object().unwrap().clone());
        }
        let count = |field: &str| {
            usage
                .get(field)
                .and_then(|value| value.as_i64())
                .unwrap_or(0)
        };
        expected += (count("input_tokens")
            + count("cache_read_input_tokens")
            + count("cache_creation_input_tokens")
            + count("output_tokens"))
            * NANOS_PER_CREDIT;
    }
    assert!(expected > 0);
    assert_eq!(setup.proxy.wait(Duration::from_secs(60)), Some(0));
    assert_eq!(
        charged(&server, &setup.key).await,
        (expected, 0),
        "every stream charged once, no hold left"
    );
    assert_eq!(remembered_ids(&server).await, STREAMS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_mid_stream_while_settlements_retry_loses_no_cost() {
    let mut server = RedisServer::start_persistent();
    let mut setup = setup(&server).await;
    let address = setup.proxy.address.clone();
    let key = setup.key.clone();
    let running = tokio::spawn(async move { streams(&address, &key).await });
    received_at_least(&setup.received, STREAMS as u64).await;
    // Every stream was admitted; Redis goes away before any can settle.
    server.stop();
    let replies = running.await.unwrap();
    assert_complete(&replies);
    // Down until every settlement has failed and been retried and failed
    // again: each is waiting for a retry when Redis comes back.
    settlements_failed(&setup.proxy, STREAMS, 2).await;
    server.start_again();
    // The retries find it back: every cost lands, exactly once.
    charged_to_be(&server, &setup.key, (STREAMS as i64 * STREAM_COST_NANOS, 0)).await;
    // And no retry records one twice later: once the proxy has stopped
    // with nothing pending, the ledger still says the same.
    stop_with_nothing_pending(&mut setup.proxy);
    assert_eq!(
        charged(&server, &setup.key).await,
        (STREAMS as i64 * STREAM_COST_NANOS, 0)
    );
    assert_eq!(remembered_ids(&server).await, STREAMS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_past_the_holds_lifetime_still_loses_no_cost() {
    // Holds of 3 s; Redis out of the proxy's reach (through a relay the
    // test cuts) until every hold has lapsed, before any settlement can
    // land. The test, reading Redis directly as a second instance would,
    // finds them lapsed and charges them in full; the settlements retried
    // once Redis is back take their place, each once.
    let server = RedisServer::start();
    let relay = Relay::start(server.port()).await;
    let mut setup = setup_with(&relay.url(), json!({"reservation_ttl_seconds": 3})).await;
    let address = setup.proxy.address.clone();
    let key = setup.key.clone();
    let running = tokio::spawn(async move { streams(&address, &key).await });
    received_at_least(&setup.received, STREAMS as u64).await;
    let (used, held) = charged(&server, &setup.key).await;
    assert_eq!(used, 0);
    relay.cut();
    let replies = running.await.unwrap();
    assert_complete(&replies);
    settlements_failed(&setup.proxy, STREAMS, 1).await;
    // Renewed no more, every hold lapses a lifetime after its last
    // renewal: the first ledger read after that charges each in full.
    charged_to_be(&server, &setup.key, (held, 0)).await;
    assert!(
        held > STREAMS as i64 * STREAM_COST_NANOS,
        "the lapses charged more than the streams cost: {held}"
    );
    relay.restore();
    charged_to_be(&server, &setup.key, (STREAMS as i64 * STREAM_COST_NANOS, 0)).await;
    stop_with_nothing_pending(&mut setup.proxy);
    assert_eq!(
        charged(&server, &setup.key).await,
        (STREAMS as i64 * STREAM_COST_NANOS, 0)
    );
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
    wait_until(
        PATIENCE,
        "the same gateway to answer again after SIGCONT",
        || async { chat(address, &key, &body).await.0 == 200 },
    )
    .await;
}

/// An upstream whose streams send one chunk of two bytes every 200 ms and
/// no usage until their end: 5 chunks and usage (3 prompt tokens) for a
/// prompt saying "short", chunks until the test releases it for one saying
/// "until released", 225 chunks (45 s) for any other. Counts the requests
/// it receives.
struct SlowUpstream {
    base: String,
    received: std::sync::Arc<std::sync::atomic::AtomicU64>,
    release: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SlowUpstream {
    /// Lets the streams saying "until released" end after their next chunk.
    fn release(&self) {
        self.release.store(true, Ordering::SeqCst);
    }
}

async fn slow_upstream() -> SlowUpstream {
    use axum::body::Body;
    use axum::routing::post;

    let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let release = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let counted = received.clone();
    let released = release.clone();
    let chat = move |body: axum::body::Bytes| {
        let received = counted.clone();
        let released = released.clone();
        async move {
            received.fetch_add(1, Ordering::SeqCst);
            let text = String::from_utf8_lossy(&body);
            let chunks: Option<u64> = if text.contains("short") {
                Some(5)
            } else if text.contains("until released") {
                None
            } else {
                Some(225)
            };
            // (chunks sent, whether the usage was sent)
            let events = futures::stream::unfold((0u64, false), move |(sent, ended)| {
                let released = released.clone();
                async move {
                    let more = match chunks {
                        Some(chunks) => sent < chunks,
                        None => sent == 0 || !released.load(Ordering::SeqCst),
                    };
                    let (event, next) = if ended {
                        return None;
                    } else if more {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        let chunk = json!({"object": "chat.completion.chunk",
                               "choices": [{"index": 0, "delta": {"content": "ab"}}]});
                        (chunk.to_string(), (sent + 1, false))
                    } else {
                        let usage = json!({"object": "chat.completion.chunk", "choices": [],
                            "usage": {"prompt_tokens": 3, "completion_tokens": sent}});
                        (format!("{usage}\n\ndata: [DONE]"), (sent, true))
                    };
                    let frame = axum::body::Bytes::from(format!("data: {event}\n\n"));
                    Some((Ok::<_, std::convert::Infallible>(frame), next))
                }
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
    SlowUpstream {
        base,
        received,
        release,
    }
}

/// The chunks of text in a stream's `text`: its completion tokens, as the
/// slow upstream counts them.
fn chunks_in(text: &str) -> u64 {
    text.matches("\"content\":\"ab\"").count() as u64
}

/// A streamed chat request saying `prompt`: its status and whole text.
async fn stream_saying(address: &str, key: &str, prompt: &str) -> (u16, String) {
    stream_counted(address, key, prompt, &std::sync::atomic::AtomicU64::new(0)).await
}

/// [`stream_saying`], counting in `read` the chunks of text the client has
/// read so far.
async fn stream_counted(
    address: &str,
    key: &str,
    prompt: &str,
    read: &std::sync::atomic::AtomicU64,
) -> (u16, String) {
    let mut reply = reqwest::Client::new()
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
    let mut text = Vec::new();
    while let Ok(Some(chunk)) = reply.chunk().await {
        text.extend_from_slice(&chunk);
        read.store(chunks_in(&String::from_utf8_lossy(&text)), Ordering::SeqCst);
    }
    (status, String::from_utf8_lossy(&text).into_owned())
}

/// A record's `total_cost` (credits) in nano-credits.
fn record_cost_nanos(record: &serde_json::Value) -> i64 {
    (record["total_cost"].as_f64().unwrap() * NANOS_PER_CREDIT as f64).round() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_stream_past_the_grace_and_charges_what_it_streamed() {
    let server = RedisServer::start();
    let upstream = slow_upstream().await;
    let directory = tempfile::tempdir().unwrap();
    let config = directory.path().join("gateway.json");
    let price = json!({"prompt_per_million": 1000000, "completion_per_million": 1000000});
    std::fs::write(
        &config,
        json!({"pricing": {"default": price}, "shutdown_grace_seconds": 2}).to_string(),
    )
    .unwrap();
    let admin_key = modelgate::auth::ApiKey::generate();
    let mut proxy = start_proxy(&server.url(), &upstream.base, &config, admin_key.expose());
    let key = proxy.create_key(admin_key.expose(), "shutdown").await;
    let funded = reqwest::Client::new()
        .post(format!("{}/api/v1/accounts/default/credits", proxy.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({"amount": 10000}))
        .send()
        .await
        .unwrap();
    assert!(funded.status().is_success());

    let long_read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let long = tokio::spawn({
        let (address, key, read) = (proxy.address.clone(), key.clone(), long_read.clone());
        async move { stream_counted(&address, &key, "a long story", &read).await }
    });
    // The long stream well under way before the stop: with the grace's
    // chunks, more than its first few reach the client.
    wait_until(PATIENCE, "4 chunks of the long stream read", || async {
        long_read.load(Ordering::SeqCst) >= 4
    })
    .await;
    // About a second long: it ends within the grace.
    let short = tokio::spawn({
        let (address, key) = (proxy.address.clone(), key.clone());
        async move { stream_saying(&address, &key, "short").await }
    });
    received_at_least(&upstream.received, 2).await;
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
    let streamed_chunks = chunks_in(&text);
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
struct ShortHolds {
    proxy: WatchedProxy,
    key: String,
    upstream: SlowUpstream,
    _config: tempfile::TempDir,
}

async fn short_holds(server: &RedisServer, hold_seconds: u64, credits: u64) -> ShortHolds {
    let upstream = slow_upstream().await;
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
    let proxy = start_proxy(&server.url(), &upstream.base, &config, admin_key.expose());
    let key = proxy.create_key(admin_key.expose(), "holds").await;
    let funded = reqwest::Client::new()
        .post(format!("{}/api/v1/accounts/default/credits", proxy.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({ "amount": credits }))
        .send()
        .await
        .unwrap();
    assert!(funded.status().is_success());
    ShortHolds {
        proxy,
        key,
        upstream,
        _config: directory,
    }
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
    // 3 s holds, a stream that runs until Redis's clock is past its hold's
    // first expiry: its hold is renewed while it runs, so a second request
    // is refused for the balance it holds, and the stream is charged once,
    // its real cost, at its end.
    let server = RedisServer::start();
    let ShortHolds {
        proxy,
        key,
        upstream,
        _config,
    } = short_holds(&server, 3, 500).await;
    let long = tokio::spawn({
        let (address, key) = (proxy.address.clone(), key.clone());
        async move { stream_saying(&address, &key, "until released").await }
    });
    received_at_least(&upstream.received, 1).await;
    let first_expiry = the_hold_expiry(&server).await;
    redis_clock_past(&server, first_expiry).await;
    let (used, held) = charged(&server, &key).await;
    assert_eq!(used, 0, "nothing charged while it streams");
    assert!(
        held > 250 * NANOS_PER_CREDIT,
        "past its first lifetime, its hold is still held: {held}"
    );
    let second = stream_saying(&proxy.address, &key, "short").await;
    assert_eq!(second.0, 402, "{}", second.1);
    upstream.release();
    let (status, text) = long.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // 3 prompt tokens and a completion token a chunk, at a credit each.
    let cost = (3 + chunks_in(&text) as i64) * NANOS_PER_CREDIT;
    charged_to_be(&server, &key, (cost, 0)).await;
    assert_eq!(balance_nanos(&server).await, 500 * NANOS_PER_CREDIT - cost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_s_hold_lapses_charged_in_full_with_a_record_saying_so() {
    let server = RedisServer::start();
    let ShortHolds {
        proxy,
        key,
        upstream,
        _config,
    } = short_holds(&server, 3, 1000).await;
    let (reply, generation) = long_story(&proxy.address, &key).await;
    received_at_least(&upstream.received, 1).await;
    let (_, held) = charged(&server, &key).await;
    assert!(held > 0);
    // Renewed once, then the instance dies.
    renewed_past(&server, the_hold_expiry(&server).await).await;
    kill_9(&proxy);
    drop(reply);
    // Renewed no more: a lifetime after its last renewal, it lapses, and
    // the first call that finds it (here a usage read, as a second
    // instance would make) charges it in full, once.
    charged_to_be(&server, &key, (held, 0)).await;
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
    assert_eq!(
        record["model"], "openai/gpt-4o-mini",
        "the model it asked for"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_from_an_older_aof_still_charges_the_stream_once() {
    // Redis restarts from files older than a stream's admission (a restore,
    // a crash with lazy fsync, a failover to a replica behind): its hold is
    // gone. Its settlement finds neither hold nor marker, and charges its
    // cost all the same, once.
    let mut server = RedisServer::start_persistent();
    let ShortHolds {
        mut proxy,
        key,
        upstream,
        _config,
    } = short_holds(&server, 60, 500).await;
    let aof = server.data_dir().join("appendonlydir");
    let older = tempfile::tempdir().unwrap();
    // Every write is in the files before it is answered (appendfsync
    // always): the account is funded in this copy, and nothing is held.
    copy_files(&aof, older.path());
    let long = tokio::spawn({
        let (address, key) = (proxy.address.clone(), key.clone());
        async move { stream_saying(&address, &key, "until released").await }
    });
    received_at_least(&upstream.received, 1).await;
    let (used, held) = charged(&server, &key).await;
    assert_eq!(used, 0);
    assert!(held > 0, "the stream holds");

    server.stop();
    std::fs::remove_dir_all(&aof).unwrap();
    copy_files(older.path(), &aof);
    server.start_again();
    assert_eq!(charged(&server, &key).await, (0, 0), "its hold is lost");
    assert_eq!(balance_nanos(&server).await, 500 * NANOS_PER_CREDIT);

    // The stream ends after the restart.
    upstream.release();
    let (status, text) = long.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // 3 prompt tokens and a completion token a chunk, at a credit each.
    let cost = (3 + chunks_in(&text) as i64) * NANOS_PER_CREDIT;
    charged_to_be(&server, &key, (cost, 0)).await;
    assert_eq!(balance_nanos(&server).await, 500 * NANOS_PER_CREDIT - cost);
    // Nothing settles again later: the proxy stops with nothing pending,
    // and no hold is left to lapse.
    stop_with_nothing_pending(&mut proxy);
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
    let upstream = slow_upstream().await;
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
    let first = start_proxy(&server.url(), &upstream.base, &config, admin_key.expose());
    let second = start_proxy(&server.url(), &upstream.base, &config, admin_key.expose());
    let key = first.create_key(admin_key.expose(), "two instances").await;
    let store = RedisStore::connect(&server.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    store.top_up("default", FUNDS).await.unwrap();

    let (reply, generation) = long_story(&first.address, &key).await;
    received_at_least(&upstream.received, 1).await;
    let (_, held) = charged(&server, &key).await;
    assert!(
        held <= FUNDS && 2 * held > FUNDS,
        "the funds cover one such hold and not two: {held}"
    );
    // Renewed once, then A dies.
    renewed_past(&server, the_hold_expiry(&server).await).await;
    kill_9(&first);
    drop(reply);
    // Renewed no more, it has lapsed once Redis's clock is past its last
    // expiry. Nothing reads the ledger meanwhile (Redis's own clock and
    // the hold's expiry are read as they are, which lapses nothing).
    redis_clock_past(&server, the_hold_expiry(&server).await).await;

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
    charged_to_be(&server, &key, (held + cost, 0)).await;
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

/// SIGTERM while a timed-out request's late answer is still being waited
/// for: past its grace the proxy ends the wait, charges the request its hold once
/// (`unanswered`, as with no answer by the deadline), records it before it
/// exits, and leaves nothing held to lapse and charge again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_late_read_charges_the_hold_once_before_exiting() {
    let server = RedisServer::start();
    // Headers in an hour: the request times out, its answer stays coming.
    let silent = mock::MockConfig {
        latency: Duration::from_secs(3600),
        ..mock::MockConfig::default()
    };
    // A stop waits for the late answer as long as its grace, then gives
    // it up.
    let sections = json!({"shutdown_grace_seconds": 2,
        "upstream": {"response_header_timeout_ms": 300, "late_answer_seconds": 600}});
    let Setup {
        mut proxy,
        key,
        _config,
        ..
    } = setup_on(&server.url(), silent, sections).await;
    let client = reqwest::Client::new();
    let reply = client
        .post(format!("{}/api/v1/chat/completions", proxy.address))
        .bearer_auth(&key)
        .json(&json!({"model": "openai/gpt-4o-mini", "max_tokens": 600,
                      "messages": [{"role": "user", "content": "Hi there"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 504);
    let generation = reply.headers()["x-generation-id"]
        .to_str()
        .unwrap()
        .to_owned();
    // The late read is under way: the hold is still held.
    let (used, held) = charged(&server, &key).await;
    assert_eq!(used, 0);
    assert!(held > 0, "held while the answer may come");

    stop_with_nothing_pending(&mut proxy);
    assert_eq!(
        charged(&server, &key).await,
        (held, 0),
        "charged its hold once, nothing left held"
    );
    let store = RedisStore::connect(&server.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    let record = generation_record(&store, &generation).await;
    assert_eq!(record["cost_basis"], "unanswered", "{record}");
    assert_eq!(record_cost_nanos(&record), held);
    assert_eq!(
        balance_nanos(&server).await,
        10000 * NANOS_PER_CREDIT - held
    );
}
