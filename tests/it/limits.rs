//! GlobalRateLimit and FreeModelQuota: exact under concurrency, on
//! `MemoryStore`, on `RedisStore` (a real `redis-server`) and across two
//! gateway instances sharing one Redis; the daily tiers; failure policies;
//! the memo of full counters.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use chrono::{DateTime, TimeZone, Utc};
use common::http_server::serve;
use common::redis_server::{CommandWatch, RedisServer};
use futures::future::join_all;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::BearerAuthLayer;
use modelgate::body::BodyLimitLayer;
use modelgate::clock::ManualClock;
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::free_quota::FreeModelQuotaLayer;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
use modelgate::store::{
    FailurePolicy, MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig, TimeSource,
};
use serde_json::{Value, json};
use tower::ServiceBuilder;

/// 2026-11-18 12:00:30 UTC, a Wednesday.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 18, 12, 0, 30).unwrap()
}

/// The layers here fail open, as their defaults do: a store call that
/// times out (500 ms by default) is admitted unchecked. These tests count
/// what the store decides, so a call may take as long as a loaded test
/// machine makes it: a burst of 200 on two busy cores once admitted four
/// past the quota, as failing open allows.
async fn redis_store(server: &RedisServer) -> SharedStore {
    Arc::new(
        RedisStore::connect(
            &server.url(),
            RedisStoreConfig {
                time_source: TimeSource::Caller,
                call_timeout: Duration::from_secs(30),
                ..RedisStoreConfig::default()
            },
        )
        .await
        .unwrap(),
    )
}

/// One gateway instance: the whole stack in front of an upstream stand-in
/// that answers every chat call with 200.
async fn instance(
    store: SharedStore,
    clock: &ManualClock,
    rules: RateLimitRules,
    policy: FailurePolicy,
) -> SocketAddr {
    let clock: Arc<ManualClock> = Arc::new(clock.clone());
    let directory = KeyDirectory::builder(store.clone())
        .clock(clock.clone())
        .build();
    let router: Router = Router::new()
        .route(
            "/api/v1/chat/completions",
            post(|| async { "{\"choices\": []}" }),
        )
        .fallback(|| async { "{}" });
    let service = ServiceBuilder::new()
        .layer(ErrorMapperLayer::new())
        .layer(BodyLimitLayer::new())
        .layer(BearerAuthLayer::new(directory.clone()))
        .layer(KeyRoutesLayer::new(directory))
        .layer(
            GlobalRateLimitLayer::new(store.clone(), rules)
                .unwrap()
                .clock(clock.clone())
                .failure_policy(policy),
        )
        .layer(
            FreeModelQuotaLayer::new(store)
                .clock(clock)
                .failure_policy(policy),
        )
        .service(router);
    serve(service).await
}

/// `count` keys of one account.
async fn keys(store: &SharedStore, account: &str, count: usize) -> Vec<String> {
    let directory = KeyDirectory::new(store.clone());
    let mut keys = Vec::new();
    for index in 0..count {
        let new = NewKey {
            account: account.to_owned(),
            ..NewKey::named(format!("key-{index}"))
        };
        keys.push(
            directory
                .create_key(new)
                .await
                .unwrap()
                .0
                .expose()
                .to_owned(),
        );
    }
    keys
}

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

async fn chat(client: &reqwest::Client, address: SocketAddr, key: &str, model: &str) -> Reply {
    let response = client
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(json!({"model": model, "messages": [{"role": "user", "content": "Hi"}]}).to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    Reply {
        status,
        headers,
        body,
    }
}

/// Sends `total` chat calls at once, round-robin over `keys` and
/// `addresses`; returns the replies.
async fn burst(addresses: &[SocketAddr], keys: &[String], model: &str, total: usize) -> Vec<Reply> {
    let client = reqwest::Client::new();
    join_all((0..total).map(|index| {
        let client = client.clone();
        let address = addresses[index % addresses.len()];
        let key = keys[index % keys.len()].clone();
        let model = model.to_owned();
        async move { chat(&client, address, &key, &model).await }
    }))
    .await
}

fn count(replies: &[Reply], status: u16) -> usize {
    replies
        .iter()
        .filter(|reply| reply.status == status)
        .count()
}

fn assert_refusals(replies: &[Reply], limit_source: &str) {
    for reply in replies.iter().filter(|reply| reply.status == 429) {
        assert_eq!(
            reply.body["error"]["metadata"]["limit_source"], limit_source,
            "{}",
            reply.body
        );
        let retry: u64 = reply.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry >= 1);
        assert_eq!(reply.headers["x-ratelimit-remaining"], "0");
    }
}

/// The three ways a gateway runs: one instance on memory, one on Redis,
/// two on one Redis. Each gives the instances' addresses and the store.
async fn deployments(
    rules: &RateLimitRules,
) -> Vec<(
    &'static str,
    Vec<SocketAddr>,
    SharedStore,
    ManualClock,
    Option<RedisServer>,
)> {
    let mut deployments = Vec::new();
    let clock = ManualClock::new(t0());
    let memory: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(
        memory.clone(),
        &clock,
        rules.clone(),
        FailurePolicy::FailOpen,
    )
    .await;
    deployments.push(("memory", vec![address], memory, clock, None));
    let server = RedisServer::start();
    let clock = ManualClock::new(t0());
    let redis = redis_store(&server).await;
    let address = instance(
        redis.clone(),
        &clock,
        rules.clone(),
        FailurePolicy::FailOpen,
    )
    .await;
    deployments.push(("redis", vec![address], redis, clock, Some(server)));
    let server = RedisServer::start();
    let clock = ManualClock::new(t0());
    let first = redis_store(&server).await;
    let second = redis_store(&server).await;
    let addresses = vec![
        instance(
            first.clone(),
            &clock,
            rules.clone(),
            FailurePolicy::FailOpen,
        )
        .await,
        instance(second, &clock, rules.clone(), FailurePolicy::FailOpen).await,
    ];
    deployments.push(("two instances", addresses, first, clock, Some(server)));
    deployments
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_free_requests_admit_exactly_twenty_a_minute() {
    for (name, addresses, store, clock, _server) in deployments(&RateLimitRules::default()).await {
        let keys = keys(&store, "acme", 3).await;
        let replies = burst(&addresses, &keys, "meta-llama/llama-3-8b:free", 200).await;
        assert_eq!(count(&replies, 200), 20, "{name}");
        assert_eq!(count(&replies, 429), 180, "{name}");
        assert_refusals(&replies, "free_per_minute");
        // Another free model shares the minute; a paid one does not.
        let replies = burst(&addresses, &keys, "google/gemma-2-9b:free", 10).await;
        assert_eq!(count(&replies, 429), 10, "{name}");
        let replies = burst(&addresses, &keys, "openai/gpt-4o", 10).await;
        assert_eq!(count(&replies, 200), 10, "{name}");
        // A minute later there is room for 20 more, and no more.
        clock.advance(Duration::from_secs(60));
        let replies = burst(&addresses, &keys, "google/gemma-2-9b:FREE", 50).await;
        assert_eq!(count(&replies, 200), 20, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_account_rule_is_shared_by_every_key_and_holds_under_load() {
    let rules = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 30, "window_seconds": 60}},
            "models": [{"match": "openai/gpt-4o", "limit": {"gcra": {"requests": 1, "period_seconds": 60, "burst": 5}}}]}"#,
    )
    .unwrap();
    for (name, addresses, store, clock, _server) in deployments(&rules).await {
        let keys = keys(&store, "acme", 3).await;
        // The model rule: a burst of 5, whatever the variant or case.
        let replies = burst(&addresses, &keys, "OpenAI/gpt-4o:nitro", 40).await;
        assert_eq!(count(&replies, 200), 5, "{name}");
        assert_refusals(&replies, "model_rate");
        let refused = replies.iter().find(|reply| reply.status == 429).unwrap();
        assert_eq!(refused.headers["x-ratelimit-limit"], "5", "{name}");
        assert!(
            refused.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("openai/gpt-4o")
        );
        // The 35 refusals counted nowhere: the account has 25 left of 30.
        let replies = burst(&addresses, &keys, "anthropic/claude-3.5-sonnet", 100).await;
        assert_eq!(count(&replies, 200), 25, "{name}");
        assert_refusals(&replies, "account_rate");
        // A new key of the same account gets no fresh quota.
        let more = self::keys(&store, "acme", 1).await;
        assert_eq!(
            burst(&addresses, &more, "x/y", 1).await[0].status,
            429,
            "{name}"
        );
        // Another account is untouched.
        let other = self::keys(&store, "other", 1).await;
        let reply = &burst(&addresses, &other, "x/y", 1).await[0];
        assert_eq!(reply.status, 200, "{name}");
        assert_eq!(reply.headers["x-ratelimit-limit"], "30", "{name}");
        assert_eq!(reply.headers["x-ratelimit-remaining"], "29", "{name}");
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            burst(&addresses, &keys, "x/y", 1).await[0].status,
            200,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_own_rate_and_model_list_hold_under_load_and_refusals_count_nowhere() {
    let rules = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 50, "window_seconds": 60}}}"#,
    )
    .unwrap();
    for (name, addresses, store, clock, _server) in deployments(&rules).await {
        let directory = KeyDirectory::new(store.clone());
        let narrow = NewKey {
            account: "acme".into(),
            allowed_models: Some(vec!["openai/".into(), "anthropic/claude-3.5-sonnet".into()]),
            rate_limit: Some(modelgate::keys::KeyRateLimit {
                requests: 4,
                window_seconds: 60,
            }),
            ..NewKey::named("narrow")
        };
        let narrow = vec![
            directory
                .create_key(narrow)
                .await
                .unwrap()
                .0
                .expose()
                .to_owned(),
        ];
        // Models outside its list: 403, in any case, a variant it does not
        // name, and a model it names spelled in another case (model ids
        // are case-sensitive upstream, and go up as the client spells them).
        for model in [
            "mistral/large",
            "ANTHROPIC/claude-3-haiku",
            "OPENAI-x/gpt",
            "anthropic/claude-3.5-sonnet:beta",
            "OpenAI/gpt-4o",
            "Anthropic/Claude-3.5-Sonnet",
        ] {
            let replies = burst(&addresses, &narrow, model, 10).await;
            assert_eq!(count(&replies, 403), 10, "{name} {model}");
            for reply in &replies {
                assert_eq!(
                    reply.body["error"]["metadata"]["reason"],
                    "model_not_allowed"
                );
            }
        }
        let misspelled = burst(&addresses, &narrow, "Anthropic/Claude-3.5-Sonnet", 1).await;
        let message = misspelled[0].body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("name anthropic/claude-3.5-sonnet, spelled exactly so"),
            "{message}"
        );
        // Its own rate: 4 of 40 at once, on any model it may call.
        let mut replies = burst(&addresses, &narrow, "openai/gpt-4o", 20).await;
        replies.extend(burst(&addresses, &narrow, "anthropic/claude-3.5-sonnet", 20).await);
        assert_eq!(count(&replies, 200), 4, "{name}");
        assert_eq!(count(&replies, 429), 36, "{name}");
        assert_refusals(&replies, "key");
        let refused = replies.iter().find(|reply| reply.status == 429).unwrap();
        assert_eq!(refused.headers["x-ratelimit-limit"], "4", "{name}");
        // None of the 40 refused by model nor the 36 by rate counted on the
        // account: of its 50, 46 are left for its other keys.
        let others = keys(&store, "acme", 2).await;
        let replies = burst(&addresses, &others, "x/y", 80).await;
        assert_eq!(count(&replies, 200), 46, "{name}");
        assert_refusals(&replies, "account_rate");
        // A minute on, both windows have room again.
        clock.advance(Duration::from_secs(60));
        let replies = burst(&addresses, &narrow, "openai/o1", 10).await;
        assert_eq!(count(&replies, 200), 4, "{name}");
    }
}

#[tokio::test]
async fn the_daily_free_tiers_are_fifty_then_a_thousand_after_ten_credits() {
    for (name, addresses, store, clock, _server) in deployments(&RateLimitRules::default()).await {
        let keys = keys(&store, "acme", 2).await;
        let client = reqwest::Client::new();
        let mut admitted = 0;
        let mut last = None;
        // 20 a minute until the day's 50 are used.
        for minute in 0..3 {
            for index in 0..20 {
                let reply = chat(
                    &client,
                    addresses[index % addresses.len()],
                    &keys[index % 2],
                    "a/b:free",
                )
                .await;
                if reply.status == 200 {
                    admitted += 1;
                } else {
                    last = Some(reply);
                }
            }
            assert!(minute < 2 || admitted == 50, "{name}");
            clock.advance(Duration::from_secs(60));
        }
        assert_eq!(admitted, 50, "{name}");
        let refused = last.unwrap();
        assert_eq!(
            refused.body["error"]["metadata"]["limit_source"], "free_per_day",
            "{name}"
        );
        let message = refused.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("50 requests per UTC day"), "{message}");
        assert!(message.contains("Buying 10 credits"), "{message}");
        assert!(message.contains("2026-11-19T00:00:00Z"), "{message}");
        // Retry-After reaches midnight: it was refused at 12:02:30.
        let retry: u64 = refused.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(retry, 11 * 3600 + 57 * 60 + 30, "{name}");

        // Nine credits are not enough; ten are, at once: the purchased
        // total is read in the same store step as the counters.
        store.top_up("acme", 9 * NANOS_PER_CREDIT).await.unwrap();
        assert_eq!(
            chat(&client, addresses[0], &keys[0], "a/b:free")
                .await
                .status,
            429,
            "{name}"
        );
        store.top_up("acme", NANOS_PER_CREDIT).await.unwrap();
        while admitted < 1000 {
            let wanted = (1000 - admitted).min(20);
            let replies = burst(&addresses, &keys, "a/b:free", wanted).await;
            assert_eq!(count(&replies, 200), wanted, "{name}: at {admitted}");
            admitted += wanted;
            clock.advance(Duration::from_secs(60));
        }
        let refused = chat(&client, addresses[0], &keys[0], "a/b:free").await;
        assert_eq!(refused.status, 429, "{name}");
        let message = refused.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("1000 requests per UTC day"), "{message}");
        assert!(!message.contains("Buying"), "{message}");
        // Midnight UTC starts a new day.
        clock.set(Utc.with_ymd_and_hms(2026, 11, 19, 0, 0, 0).unwrap());
        assert_eq!(
            chat(&client, addresses[0], &keys[0], "a/b:free")
                .await
                .status,
            200,
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_store_that_fails_is_passed_by_default_and_refused_when_set_to_fail_closed() {
    let rules = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 100, "window_seconds": 60}}}"#,
    )
    .unwrap();
    let mut server = RedisServer::start();
    let config = RedisStoreConfig {
        call_timeout: Duration::from_millis(300),
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store: SharedStore = Arc::new(RedisStore::connect(&server.url(), config).await.unwrap());
    let clock = ManualClock::new(t0());
    let open = instance(
        store.clone(),
        &clock,
        rules.clone(),
        FailurePolicy::FailOpen,
    )
    .await;
    let closed = instance(store.clone(), &clock, rules, FailurePolicy::FailClosed).await;
    let keys = keys(&store, "acme", 1).await;
    let client = reqwest::Client::new();
    // Warm each instance's key cache, then take Redis away.
    assert_eq!(chat(&client, open, &keys[0], "a/b:free").await.status, 200);
    assert_eq!(
        chat(&client, closed, &keys[0], "a/b:free").await.status,
        200
    );
    server.stop();
    let before = FailurePolicy::fail_open_decisions();
    assert_eq!(chat(&client, open, &keys[0], "a/b:free").await.status, 200);
    assert!(
        FailurePolicy::fail_open_decisions() >= before + 2,
        "both layers admitted unchecked"
    );
    let reply = chat(&client, closed, &keys[0], "a/b:free").await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.body["error"]["metadata"]["layer"], "GlobalRateLimit");
}

#[tokio::test]
async fn each_layer_costs_one_round_trip_per_request() {
    let rules = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 100, "window_seconds": 60}}}"#,
    )
    .unwrap();
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    let clock = ManualClock::new(t0());
    let address = instance(store.clone(), &clock, rules, FailurePolicy::FailOpen).await;
    let keys = keys(&store, "acme", 1).await;
    let client = reqwest::Client::new();
    // The first call reads the key, the account's purchases and counts.
    assert_eq!(
        chat(&client, address, &keys[0], "a/b:free").await.status,
        200
    );
    let watch = CommandWatch::start(server.port());
    for _ in 0..5 {
        assert_eq!(chat(&client, address, &keys[0], "x/y").await.status, 200);
    }
    assert_eq!(
        watch.client_commands(),
        ["fcall"; 5],
        "GlobalRateLimit: one round trip"
    );
    let watch = CommandWatch::start(server.port());
    for _ in 0..5 {
        assert_eq!(
            chat(&client, address, &keys[0], "a/b:free").await.status,
            200
        );
    }
    assert_eq!(
        watch.client_commands(),
        ["fcall"; 10],
        "plus FreeModelQuota: one more"
    );
}

#[tokio::test]
async fn a_full_counter_is_remembered_until_its_wait_ends_and_no_longer() {
    let rules = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 2, "window_seconds": 10}}}"#,
    )
    .unwrap();
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    let clock = ManualClock::new(t0());
    let address = instance(store.clone(), &clock, rules, FailurePolicy::FailOpen).await;
    let keys = keys(&store, "acme", 1).await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        assert_eq!(chat(&client, address, &keys[0], "x/y").await.status, 200);
    }
    assert_eq!(chat(&client, address, &keys[0], "x/y").await.status, 429);
    let watch = CommandWatch::start(server.port());
    for _ in 0..10 {
        let reply = chat(&client, address, &keys[0], "x/y").await;
        assert_eq!(reply.status, 429);
        assert_eq!(reply.headers["retry-after"], "10");
    }
    assert_eq!(
        watch.client_commands(),
        Vec::<String>::new(),
        "refused without a round trip"
    );
    // At the end of the reported wait the store is asked again, and admits.
    clock.advance(Duration::from_secs(10));
    let watch = CommandWatch::start(server.port());
    assert_eq!(chat(&client, address, &keys[0], "x/y").await.status, 200);
    // The key is read again (its cache time is over), then the counter.
    assert_eq!(watch.client_commands(), ["fcall", "fcall"]);
}

#[tokio::test]
async fn a_full_free_minute_refuses_without_reading_the_purchases() {
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    let clock = ManualClock::new(t0());
    let address = instance(
        store.clone(),
        &clock,
        RateLimitRules::default(),
        FailurePolicy::FailOpen,
    )
    .await;
    let keys = keys(&store, "acme", 1).await;
    let replies = burst(&[address], &keys, "a/b:free", 21).await;
    assert_eq!(count(&replies, 429), 1);
    // Later, with the purchase total and the key due to be read again: the
    // key is read, the purchases and counters are not.
    clock.advance(Duration::from_secs(2));
    let watch = CommandWatch::start(server.port());
    let client = reqwest::Client::new();
    let reply = chat(&client, address, &keys[0], "a/b:free").await;
    assert_eq!(reply.status, 429);
    assert_eq!(
        reply.body["error"]["metadata"]["limit_source"],
        "free_per_minute"
    );
    assert_eq!(watch.client_commands(), ["fcall"], "only the key lookup");
}
