//! Exact money through the whole gateway over real HTTP, in front of the
//! mock upstream, on MemoryStore, on a real redis-server and across two
//! instances sharing it: one atomic admission per request (a refusal
//! spends no rate and no free quota), the balance as a limit, and holds
//! that bound what a request can cost (the completion bound the upstream
//! receives, stream usage asked for and kept from the client).

use crate::common;
use crate::mock;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;

use common::examples::ProxyProcess;
use common::gateway::{chat, instance, key_of};
use common::redis_server::RedisServer;
use common::settle::settled;
use futures::future::join_all;
use modelgate::auth::KeyHash;
use modelgate::keys::SharedStore;
use modelgate::store::{
    KeyLimit, MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig, Settlement,
};
use serde_json::{Value, json};

/// One credit per token, both ways; generous rate limits.
const CONFIG: &str = r#"{
    "pricing": {"default": {"prompt_per_million": 1000000, "completion_per_million": 1000000},
                "free_models": ["meta-llama/llama-3.1-8b-instruct:free"]},
    "rate_limits": {"account": {"gcra": {"requests": 60000, "period_seconds": 60, "burst": 6000}}},
    "retry": {"max_attempts": 1}
}"#;

fn credits(amount: i64) -> i64 {
    amount * NANOS_PER_CREDIT
}

/// "Hi there" is held as 40 prompt tokens (8 bytes, a token each, plus
/// `MESSAGE_OVERHEAD_TOKENS` (16) for the message and 16 for the reply);
/// the mock charges 2 prompt tokens and one per word it says.
fn paid(max_tokens: Option<u64>, stream: bool) -> Value {
    let mut body = json!({"model": "openai/gpt-4o-mini", "stream": stream,
                          "messages": [{"role": "user", "content": "Hi there"}]});
    if let Some(tokens) = max_tokens {
        body["max_tokens"] = json!(tokens);
    }
    body
}

fn free() -> Value {
    json!({"model": "meta-llama/llama-3.1-8b-instruct:free",
           "messages": [{"role": "user", "content": "Hi there"}]})
}

/// A store on `server` that waits for a busy Redis rather than fail the
/// call: these tests are about money, and a machine loaded by other builds
/// answers 200 requests at once slower than the default 500 ms bound.
async fn redis_store(server: &RedisServer) -> SharedStore {
    let config = RedisStoreConfig {
        call_timeout: std::time::Duration::from_secs(10),
        ..RedisStoreConfig::default()
    };
    Arc::new(RedisStore::connect(&server.url(), config).await.unwrap())
}

/// One gateway instance per store, all in front of one mock upstream.
async fn instances(stores: &[SharedStore]) -> Vec<SocketAddr> {
    let base = mock::start(mock::MockConfig::default()).await;
    let mut addresses = Vec::new();
    for store in stores {
        addresses.push(instance(store.clone(), &base, CONFIG).await);
    }
    addresses
}

fn source(body: &Value) -> &str {
    body["error"]["metadata"]["limit_source"]
        .as_str()
        .unwrap_or_default()
}

/// 200 paid requests at once on an account funded for about ten of them,
/// spread over `stores`' instances: the balance never goes below zero and
/// every refusal is a 402 `credits`.
async fn burst_never_overdraws(stores: Vec<SharedStore>) {
    let addresses = instances(&stores).await;
    let store = &stores[0];
    // Each request holds 40 + 16 = 56 credits; 560 pay for ten at once.
    store.top_up("acme", credits(560)).await.unwrap();
    let key = key_of(store, "acme", None).await;
    let replies = join_all((0..200).map(|index| {
        let key = key.clone();
        let address = addresses[index % addresses.len()];
        async move { chat(address, &key, &paid(Some(16), false)).await }
    }))
    .await;
    let admitted = replies.iter().filter(|(status, _)| *status == 200).count();
    for (status, body) in &replies {
        assert!(
            *status == 200 || (*status == 402 && source(body) == "credits"),
            "{status} {body}"
        );
    }
    assert!(admitted >= 10, "{admitted} admitted");
    let hash = KeyHash::of(&key).to_hex();
    let usage = settled(store.as_ref(), "acme", &hash, chrono::Utc::now()).await;
    let balance = store.account_balance("acme").await.unwrap();
    assert!(balance.balance_nanos >= 0, "{balance:?}");
    // Each answered request cost 9 credits: 2 prompt tokens and 7 words.
    assert_eq!(
        balance.balance_nanos,
        credits(560) - credits(9) * admitted as i64
    );
    assert_eq!(usage.reserved_nanos, 0, "every hold was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_never_overdraws_the_balance_on_memory() {
    burst_never_overdraws(vec![Arc::new(MemoryStore::new())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_never_overdraws_the_balance_on_redis() {
    let server = RedisServer::start();
    burst_never_overdraws(vec![redis_store(&server).await]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_never_overdraws_the_balance_across_two_instances() {
    let server = RedisServer::start();
    burst_never_overdraws(vec![redis_store(&server).await, redis_store(&server).await]).await;
}

/// An account that bought nothing uses free models, not paid ones; a
/// negative balance refuses both; and those refusals spend none of the
/// account's rate nor of its free quota.
async fn refusals_cost_nothing(store: SharedStore) {
    let base = mock::start(mock::MockConfig::default()).await;
    let config = r#"{
        "pricing": {"default": {"prompt_per_million": 1000000, "completion_per_million": 1000000},
                "free_models": ["meta-llama/llama-3.1-8b-instruct:free"]},
        "rate_limits": {"account": {"rolling": {"requests": 5, "window_seconds": 60}}},
        "free_quota": {"requests_per_minute": 3},
        "retry": {"max_attempts": 1}
    }"#;
    let address = instance(store.clone(), &base, config).await;
    let key = key_of(&store, "acme", None).await;
    let (status, body) = chat(address, &key, &paid(Some(16), false)).await;
    assert_eq!((status, source(&body)), (402, "credits"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no credits"),
        "{body}"
    );
    // Now below zero: an overspend recorded by an upstream that ignored
    // its bound, say.
    store.top_up("acme", credits(10)).await.unwrap();
    let overspend = Settlement {
        account: "acme".into(),
        key: KeyHash::of(&key).to_hex(),
        reservation_id: "overspent".into(),
        hold_granted: false,
        cost_nanos: credits(20),
        byok: false,
        record: None,
    };
    store.settle(&overspend, chrono::Utc::now()).await.unwrap();
    for body in [free(), paid(Some(16), false)].iter().cycle().take(10) {
        let (status, reply) = chat(address, &key, body).await;
        assert_eq!((status, source(&reply)), (402, "credits"), "{reply}");
    }
    // Back to 190: the holds of 40 + 16 of the paid requests below fit,
    // two at once (a settlement lands after its answer).
    store.top_up("acme", credits(200)).await.unwrap();
    // The free quota (3 a minute) and the rate (5 a minute) are whole.
    for _ in 0..3 {
        assert_eq!(chat(address, &key, &free()).await.0, 200);
    }
    let (status, reply) = chat(address, &key, &free()).await;
    assert_eq!(
        (status, source(&reply)),
        (429, "free_per_minute"),
        "{reply}"
    );
    for _ in 0..2 {
        assert_eq!(chat(address, &key, &paid(Some(16), false)).await.0, 200);
    }
    let (status, reply) = chat(address, &key, &paid(Some(16), false)).await;
    assert_eq!((status, source(&reply)), (429, "account_rate"), "{reply}");
}

#[tokio::test]
async fn refusals_spend_no_rate_and_no_free_quota_on_memory() {
    refusals_cost_nothing(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn refusals_spend_no_rate_and_no_free_quota_on_redis() {
    let server = RedisServer::start();
    refusals_cost_nothing(redis_store(&server).await).await;
}

/// What the upstream received, as the `…/echo-body` model repeats it.
async fn upstream_saw(address: SocketAddr, key: &str, mut body: Value) -> Value {
    body["model"] = json!("openai/echo-body");
    let (status, reply) = chat(address, key, &body).await;
    assert_eq!(status, 200, "{reply}");
    serde_json::from_str(reply["choices"][0]["message"]["content"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn the_upstream_always_receives_a_bound_the_hold_covers() {
    let base = mock::start(mock::MockConfig::default()).await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(store.clone(), &base, CONFIG).await;
    store.top_up("acme", credits(100_000)).await.unwrap();
    let key = key_of(&store, "acme", None).await;

    // No bound from the client: the default one is written.
    let seen = upstream_saw(address, &key, paid(None, false)).await;
    assert_eq!(seen["max_tokens"], 4096, "{seen}");
    assert!(seen.get("stream_options").is_none(), "{seen}");
    // The client's own bound goes as it is.
    let seen = upstream_saw(address, &key, paid(Some(10), false)).await;
    assert_eq!(seen["max_tokens"], 10);
    // In the field this provider reads (`max_tokens`), whichever field the
    // client used: a bound in a field it ignores would bound nothing.
    let mut other_field = paid(None, false);
    other_field["max_completion_tokens"] = json!(1);
    let seen = upstream_saw(address, &key, other_field).await;
    assert_eq!(seen["max_tokens"], 1, "{seen}");
    assert!(seen.get("max_completion_tokens").is_none(), "{seen}");
    // Both sent: the larger is what was held for, and what goes.
    let mut both = paid(Some(10), false);
    both["max_completion_tokens"] = json!(20);
    let seen = upstream_saw(address, &key, both).await;
    assert_eq!(seen["max_tokens"], 20, "{seen}");
    assert!(seen.get("max_completion_tokens").is_none(), "{seen}");
    // A stream asks for usage, keeping the client's other stream options.
    let mut stream = paid(None, true);
    stream["stream_options"] = json!({"include_usage": false, "other": 1});
    let seen = upstream_saw(address, &key, stream).await;
    assert_eq!(
        seen["stream_options"],
        json!({"include_usage": true, "other": 1})
    );

    // A key with 100 credits left: the bound is what they pay for.
    let limit = KeyLimit {
        limit_nanos: credits(100),
        reset: None,
        include_byok: false,
    };
    let limited = key_of(&store, "acme", Some(limit)).await;
    let seen = upstream_saw(address, &limited, paid(None, false)).await;
    assert_eq!(seen["max_tokens"], 100 - 40, "{seen}");
    // A client bound it cannot pay for is refused, saying what it can (once
    // the echo's cost has replaced its hold).
    settled(
        store.as_ref(),
        "acme",
        &KeyHash::of(&limited).to_hex(),
        chrono::Utc::now(),
    )
    .await;
    let (status, body) = chat(address, &limited, &paid(Some(500), false)).await;
    assert_eq!((status, source(&body)), (402, "key_limit"), "{body}");
    assert_eq!(body["error"]["metadata"]["requested_tokens"], 500);
    // 2 credits were used by the echo: 98 left, 40 of them the prompt.
    assert_eq!(body["error"]["metadata"]["affordable_tokens"], 58, "{body}");
}

#[tokio::test]
async fn a_provider_can_take_the_bound_as_max_completion_tokens() {
    let base = mock::start(mock::MockConfig::default()).await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let config = json!({
        "pricing": {"default": {"prompt_per_million": 1, "completion_per_million": 1}},
        "providers": {"openai": {"base_url": base, "model_prefix": "keep",
                                 "completion_bound_field": "max_completion_tokens"}},
        "retry": {"max_attempts": 1}
    });
    let address = instance(store.clone(), &base, &config.to_string()).await;
    store.top_up("acme", credits(100)).await.unwrap();
    let key = key_of(&store, "acme", None).await;
    let seen = upstream_saw(address, &key, paid(None, false)).await;
    assert_eq!(seen["max_completion_tokens"], 4096, "{seen}");
    assert!(seen.get("max_tokens").is_none(), "{seen}");
    // A client's `max_tokens` goes where this provider reads it.
    let seen = upstream_saw(address, &key, paid(Some(7), false)).await;
    assert_eq!(seen["max_completion_tokens"], 7, "{seen}");
    assert!(seen.get("max_tokens").is_none(), "{seen}");
}

#[tokio::test]
async fn a_stream_is_charged_its_usage_and_the_client_gets_what_it_asked_for() {
    let base = mock::start(mock::MockConfig::default()).await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(store.clone(), &base, CONFIG).await;
    store.top_up("acme", credits(1000)).await.unwrap();
    let key = key_of(&store, "acme", None).await;
    let streamed = reqwest::Client::new()
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(paid(Some(16), true).to_string())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    // Byte for byte what the upstream sends a client that did not ask for usage.
    let direct = reqwest::Client::new()
        .post(format!("{base}/chat/completions"))
        .header("content-type", "application/json")
        .body(paid(Some(16), true).to_string())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    // (The mock gives each answer an id of its own.)
    assert_eq!(
        common::mock_ids::without_ids(&streamed),
        common::mock_ids::without_ids(&direct)
    );
    assert!(!String::from_utf8_lossy(&streamed).contains("usage"));
    // Charged what it used (2 + 7 tokens), not its hold (40 + 16).
    settled(
        store.as_ref(),
        "acme",
        &KeyHash::of(&key).to_hex(),
        chrono::Utc::now(),
    )
    .await;
    let balance = store.account_balance("acme").await.unwrap();
    assert_eq!(balance.balance_nanos, credits(1000 - 9));
    // A client that asked for usage gets it.
    let mut asked = paid(Some(16), true);
    asked["stream_options"] = json!({"include_usage": true});
    let text = reqwest::Client::new()
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(asked.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("\"usage\":{"), "{text}");
}

/// A key with a small limit and a client that sets no bound: served, each
/// request bounded by what is left, until it cannot pay for its prompt and
/// one token; never past the limit.
async fn served_until_the_limit(stores: Vec<SharedStore>) {
    let addresses = instances(&stores).await;
    let store = &stores[0];
    store.top_up("acme", credits(1000)).await.unwrap();
    let limit = KeyLimit {
        limit_nanos: credits(50),
        reset: None,
        include_byok: false,
    };
    let key = key_of(store, "acme", Some(limit)).await;
    let hash = KeyHash::of(&key).to_hex();
    let mut served = 0;
    loop {
        let (status, body) = chat(
            addresses[served % addresses.len()],
            &key,
            &paid(None, false),
        )
        .await;
        // A client that reads its usage before its next request.
        let usage = settled(store.as_ref(), "acme", &hash, chrono::Utc::now()).await;
        assert!(usage.total_nanos <= credits(50), "{usage:?}");
        if status == 402 {
            assert_eq!(source(&body), "key_limit", "{body}");
            break;
        }
        assert_eq!(status, 200, "{body}");
        served += 1;
        assert!(served < 100, "never refused");
    }
    // The first is bounded at 10 tokens (50 less its prompt's 40) and pays
    // 9 (2 + 7 words); the second at 1 token (41 left) and pays 3; 38 left
    // cannot pay 40 + 1.
    assert_eq!(served, 2);
    // Concurrently, the limit holds too.
    let fresh = key_of(store, "acme", Some(limit)).await;
    let replies = join_all((0..40).map(|index| {
        let fresh = fresh.clone();
        let address = addresses[index % addresses.len()];
        async move { chat(address, &fresh, &paid(None, false)).await.0 }
    }))
    .await;
    let fresh_hash = KeyHash::of(&fresh).to_hex();
    let usage = settled(store.as_ref(), "acme", &fresh_hash, chrono::Utc::now()).await;
    assert!(usage.total_nanos <= credits(50), "{usage:?} {replies:?}");
    assert!(
        replies
            .iter()
            .all(|status| *status == 200 || *status == 402)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_key_limit_is_served_until_used_up_on_memory() {
    served_until_the_limit(vec![Arc::new(MemoryStore::new())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_key_limit_is_served_until_used_up_across_two_instances() {
    let server = RedisServer::start();
    served_until_the_limit(vec![redis_store(&server).await, redis_store(&server).await]).await;
}

#[tokio::test]
async fn an_upstream_that_ignores_the_bound_is_charged_in_full() {
    let base = mock::start(mock::MockConfig::default()).await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(store.clone(), &base, CONFIG).await;
    store.top_up("acme", credits(100)).await.unwrap();
    let key = key_of(&store, "acme", None).await;
    let mut body = paid(Some(16), false);
    body["model"] = json!("openai/ignores-bound");
    assert_eq!(chat(address, &key, &body).await.0, 200);
    settled(
        store.as_ref(),
        "acme",
        &KeyHash::of(&key).to_hex(),
        chrono::Utc::now(),
    )
    .await;
    // It said a million tokens: charged them, and the account is now below
    // zero, so the next request, free or paid, is refused.
    let balance = store.account_balance("acme").await.unwrap();
    assert_eq!(balance.balance_nanos, credits(100) - credits(1_000_002));
    let (status, reply) = chat(address, &key, &free()).await;
    assert_eq!((status, source(&reply)), (402, "credits"), "{reply}");
}

/// The proxy example as a process under libfaketime, its clock `offset`
/// from the machine's, on `redis_url`.
fn skewed_proxy(offset: &str, redis_url: &str, admin_key: &str) -> ProxyProcess {
    let faketime = which("faketime")
        .expect("faketime is missing: run ./scripts/test.sh, which installs Debian's faketime");
    let mut command = Command::new(faketime);
    command
        .args(["-f", offset])
        .arg(common::examples::binary("proxy"))
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--redis", redis_url])
        // Only the wall clock is moved: timers keep real time.
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("MODELGATE_ADMIN_KEY", admin_key);
    ProxyProcess::spawn(command)
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|directory| directory.join(program))
            .find(|path| path.is_file())
    })
}

#[tokio::test]
async fn instances_with_clocks_apart_hold_the_free_minute_quota_exactly() {
    let server = RedisServer::start();
    let admin_key = modelgate::auth::ApiKey::generate();
    // 40 s apart each way: by their own clocks, each would see the other's
    // requests outside its rolling minute and admit 20 of its own.
    let ahead = skewed_proxy("+40s", &server.url(), admin_key.expose());
    let behind = skewed_proxy("-40s", &server.url(), admin_key.expose());
    let client = reqwest::Client::new();
    let key = ahead.create_key(admin_key.expose(), "skewed").await;
    let mut admitted = 0;
    for index in 0..40 {
        let proxy = if index % 2 == 0 { &ahead } else { &behind };
        let reply = client
            .post(format!("{}/api/v1/chat/completions", proxy.address))
            .bearer_auth(&key)
            .json(&free())
            .send()
            .await
            .unwrap();
        match reply.status().as_u16() {
            200 => admitted += 1,
            429 => {
                let body: Value = reply.json().await.unwrap();
                assert_eq!(source(&body), "free_per_minute", "{body}");
            }
            other => panic!("unexpected status {other}: {}", reply.text().await.unwrap()),
        }
    }
    assert_eq!(admitted, 20);
}

#[tokio::test]
async fn a_stream_the_client_left_is_charged_what_it_streamed_not_its_hold() {
    let base = mock::start(mock::MockConfig {
        event_delay: std::time::Duration::from_millis(300),
        ..mock::MockConfig::default()
    })
    .await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(store.clone(), &base, CONFIG).await;
    store.top_up("acme", credits(1000)).await.unwrap();
    let key = key_of(&store, "acme", None).await;
    let mut response = reqwest::Client::new()
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(paid(Some(16), true).to_string())
        .send()
        .await
        .unwrap();
    // The keep-alive and two chunks, then the client goes.
    for _ in 0..3 {
        assert!(response.chunk().await.unwrap().is_some());
    }
    drop(response);
    let hash = KeyHash::of(&key).to_hex();
    // The hold is released once it is settled.
    let usage = settled(store.as_ref(), "acme", &hash, chrono::Utc::now()).await;
    // The prompt as likely counted (40 tokens held: 8 bytes and 2 × 16 of
    // framing; charged 3 for its text and 2 × 4) and a token a chunk
    // streamed: far less than the hold of 40 + 16.
    assert!(
        (credits(12)..credits(11 + 5)).contains(&usage.total_nanos),
        "{usage:?}"
    );
}

/// CreditGuard in front of a service that holds each request `waiting`
/// (as a concurrency limit or buffer would) and marks it sent only after.
async fn dropped_while_waiting(marks_before_waiting: bool) -> modelgate::store::KeyUsage {
    use bytes::Bytes;
    use http_body_util::Full;
    use modelgate::auth::BearerAuthLayer;
    use modelgate::body::BodyLimitLayer;
    use modelgate::context::RequestContext;
    use modelgate::credit::{CreditGuardLayer, PriceTable};
    use modelgate::keys::KeyDirectory;
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    let store: SharedStore = Arc::new(MemoryStore::new());
    store.top_up("acme", credits(1000)).await.unwrap();
    let key = key_of(&store, "acme", None).await;
    let prices = PriceTable::from_json(
        r#"{"default": {"prompt_per_million": 1000000, "completion_per_million": 1000000}}"#,
    )
    .unwrap();
    let service = ServiceBuilder::new()
        .layer(BodyLimitLayer::new())
        .layer(BearerAuthLayer::new(KeyDirectory::new(store.clone())))
        .layer(
            CreditGuardLayer::new(store.clone(), Arc::new(prices)).upstream_reports_sending(true),
        )
        .service(service_fn(
            move |request: http::Request<Full<Bytes>>| async move {
                let sent = RequestContext::of(&request)
                    .and_then(|context| context.sent.clone())
                    .unwrap();
                if marks_before_waiting {
                    sent.mark();
                }
                // Waits for a turn that never comes.
                std::future::pending::<()>().await;
                sent.mark();
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
            },
        ));
    let request = http::Request::post("/api/v1/chat/completions")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(paid(Some(16), false).to_string())))
        .unwrap();
    // The client gives up while the request waits.
    let waited = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        service.oneshot(request),
    )
    .await;
    assert!(waited.is_err());
    let hash = KeyHash::of(&key).to_hex();
    settled(store.as_ref(), "acme", &hash, chrono::Utc::now()).await
}

#[tokio::test]
async fn a_request_dropped_before_it_was_sent_costs_nothing() {
    assert_eq!(dropped_while_waiting(false).await.total_nanos, 0);
    // Once sent, the upstream may be working: charged what its bound allows.
    assert_eq!(
        dropped_while_waiting(true).await.total_nanos,
        credits(40 + 16)
    );
}

#[tokio::test]
async fn a_key_expires_by_the_store_s_clock_not_the_instance_s() {
    // An instance whose clock is an hour behind still takes the key for
    // live: the admission step, by Redis's clock, refuses it.
    let server = RedisServer::start();
    let admin_key = modelgate::auth::ApiKey::generate();
    let behind = skewed_proxy("-1h", &server.url(), admin_key.expose());
    let client = reqwest::Client::new();
    let expires_at = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
    let created: Value = client
        .post(format!("{}/api/v1/keys", behind.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({"name": "short-lived",
                      "expires_at": expires_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = created["key"].as_str().unwrap().to_owned();
    let chat = || {
        client
            .post(format!("{}/api/v1/chat/completions", behind.address))
            .bearer_auth(&key)
            .json(&free())
            .send()
    };
    assert_eq!(chat().await.unwrap().status(), 200);
    // Past its expiry by Redis's clock (the instance's says an hour before).
    common::wait::wait_until(
        common::wait::PATIENCE,
        "Redis's clock past the key's expiry",
        || async { server.clock() > expires_at },
    )
    .await;
    let reply = chat().await.unwrap();
    assert_eq!(reply.status(), 401);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["error"]["metadata"]["reason"], "expired_key", "{body}");
}

#[tokio::test]
async fn a_lowered_key_limit_holds_at_once_on_every_instance() {
    // Instance B has just read the key (its cache keeps it a second); the
    // limit is lowered through instance A; B's next request is refused by
    // the new limit, not admitted by its copy of the old one.
    let server = RedisServer::start();
    let admin_key = modelgate::auth::ApiKey::generate();
    let first = skewed_proxy("+0s", &server.url(), admin_key.expose());
    let second = skewed_proxy("+0s", &server.url(), admin_key.expose());
    let client = reqwest::Client::new();
    let created: Value = client
        .post(format!("{}/api/v1/keys", first.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({"name": "limited", "limit": 1000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = created["key"].as_str().unwrap().to_owned();
    let hash = created["data"]["hash"].as_str().unwrap().to_owned();
    let funded = client
        .post(format!("{}/api/v1/accounts/default/credits", first.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({"amount": 1000}))
        .send()
        .await
        .unwrap();
    assert!(funded.status().is_success());
    let chat = |address: String| {
        client
            .post(format!("{address}/api/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&paid(Some(16), false))
            .send()
    };
    for _ in 0..2 {
        let reply = chat(second.address.clone()).await.unwrap();
        assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap());
    }
    let lowered = client
        .patch(format!("{}/api/v1/keys/{hash}", first.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({"limit": 0}))
        .send()
        .await
        .unwrap();
    assert!(lowered.status().is_success());
    let reply = chat(second.address.clone()).await.unwrap();
    assert_eq!(reply.status(), 402, "{}", reply.text().await.unwrap());
}
