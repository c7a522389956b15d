//! Many providers behind one interface, over real HTTP: the whole gateway
//! stack in front of two mock upstreams on loopback acting as two
//! providers (a third refuses connections). Routing by the model's
//! provider with the prefix stripped, the provider's own key (from env and
//! from a file) and never the gateway's, the response naming the gateway's
//! model, fallbacks on 429, 5xx and a refused connection with each attempt
//! under its own model's limits (and none after the gateway's own refusal
//! of the account or key), 400s that point at the models list, and
//! `GET /api/v1/models`.

use crate::common;

use crate::mock;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::http_server::{RefusingPort, serve};
use common::redis_server::RedisServer;
use modelgate::keys::{ByokDirectory, KeyDirectory, NewKey, SharedStore};
use modelgate::proxy::{GatewayConfig, GatewayPlan, Upstream, UpstreamConfig, build_gateway};
use modelgate::store::{MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig};
use serde_json::{Value, json};

const ALPHA_KEY: &str = "alpha-provider-key-0123456789";
const BETA_KEY: &str = "beta-provider-key-0123456789";

struct Gateway {
    address: SocketAddr,
    /// Its settlements not recorded yet.
    settlements: modelgate::credit::PendingSettlements,
    key: String,
    /// A management key.
    admin: String,
    store: SharedStore,
    /// How many requests the beta provider has received.
    beta_received: Arc<AtomicU64>,
    _secrets: tempfile::TempDir,
    /// Gamma's port, kept so that no other server takes it.
    _refusing: RefusingPort,
}

/// Prices every model the tests use; `gamma` is a provider whose port
/// refuses connections. `extra` is merged into the config, object by
/// object.
async fn start(extra: Value) -> Gateway {
    start_on(Arc::new(MemoryStore::new()), extra).await
}

/// [`start`] on `store`.
async fn start_on(store: SharedStore, extra: Value) -> Gateway {
    let alpha = mock::start(mock::MockConfig::default()).await;
    let (beta, beta_received) = mock::start_counted(mock::MockConfig::default()).await;
    let refusing = RefusingPort::bind();
    let gamma = refusing.base_url();
    // MODELGATE_TEST_ALPHA_KEY (ALPHA_KEY) is set for the tests in .cargo/config.toml.
    let secrets = tempfile::tempdir().unwrap();
    let beta_key_file = secrets.path().join("beta-key");
    std::fs::write(&beta_key_file, format!("{BETA_KEY}\n")).unwrap();
    let price = json!({"prompt_per_million": 1, "completion_per_million": 2});
    let mut config = json!({
        "providers": {
            "alpha": {"base_url": alpha, "api_key": {"env": "MODELGATE_TEST_ALPHA_KEY"},
                      "headers": {"x-alpha-project": "proj-7"}},
            "beta": {"base_url": beta, "api_key": {"file": beta_key_file}, "model_prefix": "keep",
                     "byok": true},
            "gamma": {"base_url": gamma, "connect_timeout_ms": 2000},
        },
        "pricing": {"models": {
            "alpha/m1": price, "alpha/echo-headers": price, "alpha/status-429": price,
            "alpha/status-503": price, "beta/m2": price, "beta/echo-headers": price,
            // 20 tokens of it cost 2 credits.
            "alpha/pricey": {"prompt_per_million": 1, "completion_per_million": 100_000},
            "gamma/x": price,
        }, "free_models": ["alpha/m1:free"]},
        "fallbacks": {"alpha/status-503": ["beta/m2"]},
        "retry": {"max_attempts": 1},
    });
    merge(&mut config, extra);
    let config = GatewayConfig::from_json(&config.to_string()).unwrap();
    // Unused: with providers configured, each model goes to its provider.
    let upstream = Upstream::new(&UpstreamConfig::new("http://127.0.0.1:9/v1")).unwrap();
    let built = build_gateway::<hyper::body::Incoming>(
        &GatewayPlan::new(&config).unwrap(),
        store.clone(),
        upstream,
        Arc::new(modelgate::clock::SystemClock),
        KeyDirectory::DEFAULT_CACHE_TTL,
    );
    let address = serve(built.service).await;
    let directory = KeyDirectory::new(store.clone());
    let new = NewKey {
        account: "acme".into(),
        ..NewKey::named("tests")
    };
    let (key, _) = directory.create_key(new).await.unwrap();
    let operator = NewKey {
        management: true,
        ..NewKey::named("operator")
    };
    let (admin, _) = directory.create_key(operator).await.unwrap();
    directory
        .top_up("acme", 100 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    Gateway {
        address,
        settlements: built.settlements,
        key: key.expose().to_owned(),
        admin: admin.expose().to_owned(),
        store,
        beta_received,
        _secrets: secrets,
        _refusing: refusing,
    }
}

fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(base), Value::Object(extra)) => {
            for (name, value) in extra {
                merge(base.entry(name).or_insert(Value::Null), value);
            }
        }
        (base, extra) => *base = extra,
    }
}

struct Reply {
    status: u16,
    model_header: Option<String>,
    body: Value,
    text: String,
}

impl Gateway {
    async fn chat(&self, body: Value) -> Reply {
        self.chat_with(&self.key, body).await
    }

    async fn chat_with(&self, key: &str, body: Value) -> Reply {
        let response = reqwest::Client::new()
            .post(format!("http://{}/api/v1/chat/completions", self.address))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let model_header = response
            .headers()
            .get("x-modelgate-model")
            .map(|value| value.to_str().unwrap().to_owned());
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        // Its cost lands just after its answer: tests read it next.
        assert!(
            self.settlements
                .flush(std::time::Duration::from_secs(10))
                .await
                .is_empty()
        );
        Reply {
            status,
            model_header,
            body,
            text,
        }
    }
}

fn ask(model: &str) -> Value {
    json!({"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]})
}

/// What an `echo-headers` model received, from its reply.
fn echoed(reply: &Reply) -> Value {
    let content = reply.body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no echo in {}", reply.text));
    serde_json::from_str(content).unwrap()
}

#[tokio::test]
async fn each_model_goes_to_its_provider_under_the_gateways_name() {
    let gateway = start(json!({})).await;
    let alpha = gateway.chat(ask("alpha/m1")).await;
    assert_eq!(alpha.status, 200, "{}", alpha.text);
    // Alpha strips the prefix: it was asked for `m1`.
    let content = alpha.body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert!(content.starts_with("Hello from m1!"), "{content}");
    // The answer names the model as the gateway knows it.
    assert_eq!(alpha.body["model"], "alpha/m1");
    assert_eq!(alpha.model_header.as_deref(), Some("alpha/m1"));
    let beta = gateway.chat(ask("beta/m2")).await;
    let content = beta.body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    // Beta keeps the prefix.
    assert!(content.starts_with("Hello from beta/m2!"), "{content}");
    assert_eq!(beta.body["model"], "beta/m2");

    // A stream names the gateway's model in every event.
    let mut streamed = ask("alpha/m1");
    streamed["stream"] = json!(true);
    let stream = gateway.chat(streamed).await;
    assert_eq!(stream.status, 200);
    let events: Vec<&str> = stream
        .text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .collect();
    assert!(events.len() >= 2, "{}", stream.text);
    for event in events {
        let event: Value = serde_json::from_str(event).unwrap();
        assert_eq!(event["model"], "alpha/m1", "{event}");
    }
    assert!(stream.text.trim_end().ends_with("data: [DONE]"));
}

#[tokio::test]
async fn providers_get_their_own_key_and_headers_never_the_gateway_key() {
    let gateway = start(json!({})).await;
    let alpha = echoed(&gateway.chat(ask("alpha/echo-headers")).await);
    assert_eq!(alpha["authorization"], format!("Bearer {ALPHA_KEY}"));
    assert_eq!(alpha["x-alpha-project"], "proj-7");
    assert_eq!(alpha["model"], "echo-headers");
    let beta = echoed(&gateway.chat(ask("beta/echo-headers")).await);
    assert_eq!(beta["authorization"], format!("Bearer {BETA_KEY}"));
    assert!(beta.get("x-alpha-project").is_none());
    assert_eq!(beta["model"], "beta/echo-headers");
    for echo in [alpha, beta] {
        assert!(!echo.to_string().contains(&gateway.key), "{echo}");
    }
}

#[tokio::test]
async fn a_model_the_gateway_does_not_serve_is_400_pointing_at_the_list() {
    let gateway = start(json!({})).await;
    for (model, words) in [
        ("nobody/x", "no provider"),
        ("alpha/unpriced", "has no price"),
    ] {
        let reply = gateway.chat(ask(model)).await;
        assert_eq!(reply.status, 400, "{}", reply.text);
        let message = reply.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(words) && message.contains("GET /api/v1/models"),
            "{message}"
        );
        assert_eq!(reply.body["error"]["metadata"]["param"], "model");
    }
    let mut bad_list = ask("alpha/m1");
    bad_list["models"] = json!(["beta/m2", "nobody/y"]);
    let reply = gateway.chat(bad_list).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.body["error"]["metadata"]["param"], "models[1]");
    // At most 5 different models in all, `model` included.
    let five = [
        "alpha/m1",
        "alpha/pricey",
        "beta/m2",
        "gamma/x",
        "alpha/echo-headers",
    ];
    let mut listed = ask("alpha/m1");
    listed["models"] = json!(five);
    assert_eq!(gateway.chat(listed.clone()).await.status, 200);
    listed["models"] = json!([five.as_slice(), &["beta/echo-headers"]].concat());
    let reply = gateway.chat(listed).await;
    assert_eq!(reply.status, 422, "{}", reply.text);
    assert_eq!(reply.body["error"]["metadata"]["param"], "models");
}

#[tokio::test]
async fn a_request_falls_back_on_429_5xx_and_a_refused_connection() {
    let gateway = start(json!({})).await;
    // The request's own list, after the provider's 429.
    let mut listed = ask("alpha/status-429");
    listed["models"] = json!(["beta/echo-headers"]);
    let reply = gateway.chat(listed).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.model_header.as_deref(), Some("beta/echo-headers"));
    assert_eq!(
        reply.body["model"],
        Value::Null,
        "the echo has no model field to rewrite"
    );
    // The provider got one model, never the list.
    let echo = echoed(&reply);
    assert_eq!(echo["model"], "beta/echo-headers");
    assert!(!echo["body_fields"].as_str().unwrap().contains("models"));

    // The configured fallback, after a 503.
    let reply = gateway.chat(ask("alpha/status-503")).await;
    assert_eq!(
        (reply.status, reply.model_header.as_deref()),
        (200, Some("beta/m2"))
    );
    assert_eq!(reply.body["model"], "beta/m2");

    // A provider that refuses connections (a 502), streamed.
    let mut refused = ask("gamma/x");
    refused["models"] = json!(["alpha/m1"]);
    refused["stream"] = json!(true);
    let reply = gateway.chat(refused).await;
    assert_eq!(
        (reply.status, reply.model_header.as_deref()),
        (200, Some("alpha/m1"))
    );
    assert!(reply.text.contains("\"model\":\"alpha/m1\""));

    // With nothing left to try, the last answer is the client's.
    let reply = gateway.chat(ask("gamma/x")).await;
    assert_eq!(reply.status, 502, "{}", reply.text);
    assert_eq!(
        reply.body["error"]["metadata"]["upstream_failure"],
        "connect"
    );
}

#[tokio::test]
async fn each_attempt_passes_its_own_models_limits_and_is_charged_as_that_model() {
    let gateway = start(json!({"rate_limits": {"models": [
        {"match": "alpha/", "limit": {"rolling": {"requests": 1, "window_seconds": 3600}}}
    ]}}))
    .await;
    assert_eq!(gateway.chat(ask("alpha/m1")).await.status, 200);
    // Alpha's rule is used up: alone, the gateway refuses it …
    let refused = gateway.chat(ask("alpha/m1")).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.body["error"]["metadata"]["limit_source"],
        "model_rate"
    );
    // … with a fallback, the request is answered by beta under beta's limits.
    let mut with_fallback = ask("alpha/m1");
    with_fallback["models"] = json!(["beta/m2"]);
    let reply = gateway.chat(with_fallback).await;
    assert_eq!(
        (reply.status, reply.model_header.as_deref()),
        (200, Some("beta/m2"))
    );
    // Only answered attempts cost anything: three answers, each priced at
    // what its own model's usage says.
    let usage = gateway.store.account_balance("acme").await.unwrap();
    assert!(usage.balance_nanos < 100 * NANOS_PER_CREDIT);
    assert!(usage.balance_nanos > 99 * NANOS_PER_CREDIT);
}

/// `model`, then `fallback` as the request's own list.
fn ask_with_fallback(model: &str, fallback: &str) -> Value {
    let mut body = ask(model);
    body["models"] = json!([fallback]);
    body
}

#[tokio::test]
async fn the_gateways_own_refusal_of_the_account_or_key_is_answered_without_falling_back() {
    // A key whose 1-credit limit admits beta/m2 but not alpha/pricey: a
    // fallback would be answered, yet the key's 402 is the answer.
    let gateway = start(json!({})).await;
    let new = NewKey {
        account: "acme".into(),
        limit_nanos: Some(NANOS_PER_CREDIT),
        ..NewKey::named("limited")
    };
    let (limited, _) = KeyDirectory::new(gateway.store.clone())
        .create_key(new)
        .await
        .unwrap();
    let reply = gateway
        .chat_with(
            limited.expose(),
            ask_with_fallback("alpha/pricey", "beta/m2"),
        )
        .await;
    assert_eq!(reply.status, 402, "{}", reply.text);
    assert_eq!(reply.body["error"]["metadata"]["limit_source"], "key_limit");
    assert_eq!(reply.model_header.as_deref(), Some("alpha/pricey"));
    assert_eq!(
        gateway.beta_received.load(Ordering::SeqCst),
        0,
        "the fallback was never tried"
    );
    let reply = gateway.chat_with(limited.expose(), ask("beta/m2")).await;
    assert_eq!(reply.status, 200, "alone, the fallback fits the limit");

    let gateway = start(json!({"rate_limits": {
        "account": {"rolling": {"requests": 4, "window_seconds": 3600}},
        "models": [{"match": "alpha/m1", "limit": {"rolling": {"requests": 1, "window_seconds": 3600}}}],
    }}))
    .await;
    let beta = || gateway.beta_received.load(Ordering::SeqCst);

    // A per-model rule's 429 (alpha/m1 used once) moves on: account 1 + 1.
    assert_eq!(gateway.chat(ask("alpha/m1")).await.status, 200);
    let reply = gateway.chat(ask_with_fallback("alpha/m1", "beta/m2")).await;
    assert_eq!(
        (reply.status, reply.model_header.as_deref()),
        (200, Some("beta/m2")),
        "{}",
        reply.text
    );
    assert_eq!(beta(), 1);
    // So does the upstream's own 503: account 3 + 1, now used up.
    let reply = gateway.chat(ask("alpha/status-503")).await;
    assert_eq!(
        (reply.status, reply.model_header.as_deref()),
        (200, Some("beta/m2")),
        "{}",
        reply.text
    );
    assert_eq!(beta(), 2);

    // The account-wide rule's 429 is the answer, the fallback untried.
    let reply = gateway.chat(ask("alpha/status-503")).await;
    assert_eq!(reply.status, 429, "{}", reply.text);
    assert_eq!(
        reply.body["error"]["metadata"]["limit_source"],
        "account_rate"
    );
    assert_eq!(reply.model_header.as_deref(), Some("alpha/status-503"));
    assert_eq!(beta(), 2, "the fallback was never tried");
}

#[tokio::test]
async fn the_models_list_has_the_openai_shape() {
    let gateway = start(json!({})).await;
    let response = reqwest::Client::new()
        .get(format!("http://{}/api/v1/models", gateway.address))
        .bearer_auth(&gateway.key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let list: Value = response.json().await.unwrap();
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"alpha/m1") && ids.contains(&"beta/m2") && ids.contains(&"gamma/x"));
    for model in list["data"].as_array().unwrap() {
        // What OpenAI's client reads: id, object, created, owned_by.
        assert_eq!(model["object"], "model");
        assert!(model["created"].is_i64());
        assert!(model["owned_by"].is_string());
        assert!(model["pricing"]["prompt"].is_string());
    }
    let degraded = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|model| model["id"] == "alpha/status-503")
        .unwrap();
    assert_eq!(degraded["fallbacks"], json!(["beta/m2"]));
    assert_eq!(degraded["pricing"]["completion_per_million"], "2");
    // The configured `:free` variant is listed with the free quota, and
    // served for nothing; no other model has one.
    let free = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|model| model["id"] == "alpha/m1:free")
        .unwrap();
    assert_eq!(free["pricing"]["prompt"], "0");
    assert_eq!(free["pricing"]["completion"], "0");
    assert_eq!(free["limits"]["free_quota"]["requests_per_minute"], 20);
    let reply = gateway.chat(ask("alpha/m1:free")).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert!(!ids.contains(&"beta/m2:free"));
    let reply = gateway.chat(ask("beta/m2:free")).await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert_eq!(reply.body["error"]["metadata"]["param"], "model");
    // The list is for callers with a key, like every gateway route.
    let anonymous = reqwest::get(format!("http://{}/api/v1/models", gateway.address))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
}

#[tokio::test]
async fn an_accounts_own_provider_key_is_used_and_its_cost_is_byok() {
    let gateway = start(json!({})).await;
    let client = reqwest::Client::new();
    const OWN_KEY: &str = "acme-own-beta-key-0123456789";
    let put = |provider: &str, key: &str| {
        client
            .put(format!(
                "http://{}/api/v1/accounts/acme/byok/{provider}",
                gateway.address
            ))
            .bearer_auth(key)
            .json(&json!({"key": OWN_KEY}))
            .send()
    };
    // Only for a configured provider: another's key would never be sent.
    let unknown = put("delta", &gateway.admin).await.unwrap();
    assert_eq!(unknown.status(), 400);
    let unknown: Value = unknown.json().await.unwrap();
    assert_eq!(unknown["error"]["metadata"]["param"], "provider");
    let message = unknown["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("delta is not configured") && message.ends_with("take one: beta"),
        "{message}"
    );
    // Only by a management key.
    let own = put("beta", &gateway.key).await.unwrap();
    assert_eq!(own.status(), 403);
    let own: Value = own.json().await.unwrap();
    assert_eq!(
        own["error"]["metadata"]["reason"],
        "management_key_required"
    );
    let set = put("beta", &gateway.admin).await.unwrap();
    assert_eq!(set.status(), 200);
    let set = set.text().await.unwrap();
    assert!(!set.contains(OWN_KEY), "{set}");
    let usage = |gateway: &Gateway| {
        let client = client.clone();
        let url = format!("http://{}/api/v1/key", gateway.address);
        let key = gateway.key.clone();
        async move {
            let status: Value = client
                .get(url)
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (
                status["data"]["usage"].as_f64().unwrap(),
                status["data"]["byok_usage"].as_f64().unwrap(),
            )
        }
    };
    let before = usage(&gateway).await;
    let balance_before = gateway.store.account_balance("acme").await.unwrap();
    // Beta now gets the account's key; alpha still its configured one.
    let beta = echoed(&gateway.chat(ask("beta/echo-headers")).await);
    assert_eq!(beta["authorization"], format!("Bearer {OWN_KEY}"));
    let after_beta = usage(&gateway).await;
    assert!(
        after_beta.1 > before.1,
        "BYOK usage grows: {before:?} -> {after_beta:?}"
    );
    assert_eq!(after_beta.0, before.0, "and only BYOK usage");
    assert_eq!(
        gateway.store.account_balance("acme").await.unwrap(),
        balance_before,
        "the account's key was sent, so its balance pays nothing"
    );
    let alpha = echoed(&gateway.chat(ask("alpha/echo-headers")).await);
    assert_eq!(alpha["authorization"], format!("Bearer {ALPHA_KEY}"));
    let after_alpha = usage(&gateway).await;
    assert_eq!(after_alpha.1, after_beta.1, "alpha's cost is not BYOK");
    assert!(after_alpha.0 > after_beta.0);
    // Deleted: beta is back on the provider's key.
    let deleted = client
        .delete(format!(
            "http://{}/api/v1/accounts/acme/byok/beta",
            gateway.address
        ))
        .bearer_auth(&gateway.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let beta = echoed(&gateway.chat(ask("beta/echo-headers")).await);
    assert_eq!(beta["authorization"], format!("Bearer {BETA_KEY}"));
}

/// The credential a provider's configured header carries: no upstream may
/// see it beside an account's key.
const GATEWAY_HEADER_KEY: &str = "gateway-header-credential-0001";
/// What an account's manager sets as its own key.
const TENANT_KEY: &str = "tenant-own-key-0123456789";

/// Three more providers on one recording mock: `headed`, whose credential
/// is a configured `x-api-key`; `open`, trusted by its network (no
/// credential); `opted`, with an api_key, credential headers and `byok`.
async fn byok_gateway(store: SharedStore) -> Gateway {
    let mock = mock::start(mock::MockConfig::default()).await;
    let price = json!({"prompt_per_million": 1, "completion_per_million": 2});
    start_on(
        store,
        json!({
            "providers": {
                "headed": {"base_url": mock, "headers": {"x-api-key": GATEWAY_HEADER_KEY}},
                "open": {"base_url": mock},
                "opted": {"base_url": mock, "api_key": {"env": "MODELGATE_TEST_ALPHA_KEY"},
                          "byok": true, "credential_headers": ["x-goog-api-key"],
                          "headers": {"x-api-key": GATEWAY_HEADER_KEY,
                                      "x-goog-api-key": GATEWAY_HEADER_KEY,
                                      "openai-organization": "org-gateway",
                                      "x-gateway-note": "not-a-credential"},
                          "byok_headers": ["x-gateway-note"]},
            },
            "pricing": {"models": {"headed/echo-headers": price, "open/echo-headers": price,
                                   "opted/echo-headers": price}},
        }),
    )
    .await
}

/// Memory, then Redis (the server lives as long as its store is used).
async fn stores() -> Vec<(&'static str, SharedStore, Option<RedisServer>)> {
    let server = RedisServer::start();
    let redis = RedisStore::connect(&server.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    vec![
        ("memory", Arc::new(MemoryStore::new()), None),
        ("redis", Arc::new(redis), Some(server)),
    ]
}

/// Asserts that `received` (what the mock saw) carries no account key
/// beside a gateway credential: either the gateway's credentials alone, or
/// `TENANT_KEY` alone.
fn one_credential_only(backend: &str, received: &Value) {
    let tenant = received["authorization"] == format!("Bearer {TENANT_KEY}");
    let gateways = ["x-api-key", "api-key", "x-goog-api-key"]
        .iter()
        .any(|name| !received[name].is_null())
        || received["authorization"] == format!("Bearer {ALPHA_KEY}");
    assert!(!(tenant && gateways), "{backend}: both went up: {received}");
}

#[tokio::test]
async fn byok_is_only_for_providers_that_opt_in_and_never_rides_on_the_gateways_credential() {
    for (backend, store, _server) in stores().await {
        let gateway = byok_gateway(store.clone()).await;
        let client = reqwest::Client::new();
        let directory = KeyDirectory::new(store.clone());
        directory.ensure_account("broke").await.unwrap();
        let new = |management: bool| NewKey {
            account: "broke".into(),
            management,
            scoped_to_account: management,
            ..NewKey::named("broke")
        };
        let (key, _) = directory.create_key(new(false)).await.unwrap();
        let (manager, _) = directory.create_key(new(true)).await.unwrap();
        let (key, manager) = (key.expose().to_owned(), manager.expose().to_owned());
        let byok_url = |provider: &str| {
            format!(
                "http://{}/api/v1/accounts/broke/byok/{provider}",
                gateway.address
            )
        };

        // The account's manager cannot make the gateway's credential its own.
        for provider in ["headed", "open"] {
            let reply = client
                .put(byok_url(provider))
                .bearer_auth(&manager)
                .json(&json!({"key": TENANT_KEY}))
                .send()
                .await
                .unwrap();
            assert_eq!(reply.status(), 422, "{backend} {provider}");
            let text = reply.text().await.unwrap();
            assert!(!text.contains(TENANT_KEY), "{text}");
            let error = &serde_json::from_str::<Value>(&text).unwrap()["error"];
            assert_eq!(error["type"], "invalid_parameter", "{text}");
            assert_eq!(error["metadata"]["reason"], "byok_not_allowed", "{text}");
            assert_eq!(error["metadata"]["param"], "provider", "{text}");
            let message = error["message"].as_str().unwrap();
            assert!(
                message.contains(&format!(
                    "{provider} is reached with the gateway's own credential"
                )) && message.contains("it takes keys for: beta, opted"),
                "{message}"
            );
        }
        let listed: Value = client
            .get(format!(
                "http://{}/api/v1/accounts/broke/byok",
                gateway.address
            ))
            .bearer_auth(&manager)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(listed, json!({"data": []}), "{backend}: nothing stored");
        let byok = ByokDirectory::new(store.clone());
        assert!(byok.list("broke").await.unwrap().is_empty());

        // Keys stored before (an older version took them) are not used:
        // with a zero balance the requests are refused, not BYOK.
        for provider in ["headed", "open"] {
            byok.set("broke", provider, TENANT_KEY).await.unwrap();
            let reply = gateway
                .chat_with(&key, ask(&format!("{provider}/echo-headers")))
                .await;
            assert_eq!(reply.status, 402, "{backend} {provider}: {}", reply.text);
            assert_eq!(reply.body["error"]["metadata"]["limit_source"], "credits");
        }

        // The provider that opts in takes the account's key, alone, unpaid.
        let set = client
            .put(byok_url("opted"))
            .bearer_auth(&manager)
            .json(&json!({"key": TENANT_KEY}))
            .send()
            .await
            .unwrap();
        assert_eq!(set.status(), 200, "{backend}");
        let reply = gateway.chat_with(&key, ask("opted/echo-headers")).await;
        assert_eq!(
            reply.status, 200,
            "{backend}: BYOK needs no balance: {}",
            reply.text
        );
        let received = echoed(&reply);
        assert_eq!(received["authorization"], format!("Bearer {TENANT_KEY}"));
        // Neither a credential header nor one the provider did not declare
        // safe for BYOK (its organisation) rides beside the account's key.
        for name in ["x-api-key", "x-goog-api-key", "openai-organization"] {
            assert!(
                received[name].is_null(),
                "{backend}: {name} went up: {received}"
            );
        }
        assert_eq!(received["x-gateway-note"], "not-a-credential");
        one_credential_only(backend, &received);
        let balance = store.account_balance("broke").await.unwrap();
        assert_eq!(balance.balance_nanos, 0, "{backend}: BYOK is not charged");
        // Another account, with no key of its own, gets all the gateway's.
        let received = echoed(&gateway.chat(ask("opted/echo-headers")).await);
        assert_eq!(received["authorization"], format!("Bearer {ALPHA_KEY}"));
        assert_eq!(received["x-api-key"], GATEWAY_HEADER_KEY);
        assert_eq!(received["x-goog-api-key"], GATEWAY_HEADER_KEY);
        assert_eq!(received["openai-organization"], "org-gateway");

        // Funded, the stored keys still are not used: charged, and the
        // upstream sees the gateway's credential alone.
        directory
            .top_up("broke", 10 * NANOS_PER_CREDIT)
            .await
            .unwrap();
        for provider in ["headed", "open"] {
            let before = store.account_balance("broke").await.unwrap().balance_nanos;
            let reply = gateway
                .chat_with(&key, ask(&format!("{provider}/echo-headers")))
                .await;
            assert_eq!(reply.status, 200, "{backend} {provider}: {}", reply.text);
            let received = echoed(&reply);
            assert!(
                received["authorization"].is_null(),
                "{backend} {provider}: {received}"
            );
            if provider == "headed" {
                assert_eq!(received["x-api-key"], GATEWAY_HEADER_KEY);
            }
            one_credential_only(backend, &received);
            let after = store.account_balance("broke").await.unwrap().balance_nanos;
            assert!(
                after < before,
                "{backend} {provider}: charged {before} -> {after}"
            );
        }
    }
}

impl Gateway {
    /// `method path` with the operator's key and `body`; the status and JSON.
    async fn manage(&self, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
        let response = reqwest::Client::new()
            .request(method, format!("http://{}{path}", self.address))
            .bearer_auth(&self.admin)
            .json(&body)
            .send()
            .await
            .unwrap();
        (
            response.status().as_u16(),
            response.json().await.unwrap_or(Value::Null),
        )
    }

    async fn models_for(&self, key: &str) -> Vec<String> {
        let list: Value = reqwest::Client::new()
            .get(format!("http://{}/api/v1/models", self.address))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|model| model["id"].as_str().unwrap().to_owned())
            .collect()
    }
}

#[tokio::test]
async fn a_keys_model_list_and_own_rate_hold_through_the_whole_gateway() {
    for (backend, store, _server) in stores().await {
        let gateway = start_on(store, json!({})).await;
        let (status, created) = gateway
            .manage(
                reqwest::Method::POST,
                "/api/v1/keys",
                json!({"name": "narrow", "account": "acme",
                       "allowed_models": ["alpha/m1", "gpt-4o"],
                       "rate_limit": {"requests": 5, "window_seconds": 60}}),
            )
            .await;
        assert_eq!(status, 422, "{backend}: {created}");
        assert_eq!(created["error"]["metadata"]["param"], "allowed_models");
        let (status, created) = gateway
            .manage(
                reqwest::Method::POST,
                "/api/v1/keys",
                json!({"name": "narrow", "account": "acme",
                       "allowed_models": ["alpha/m1", "alpha/status-503", "beta/echo-headers", "ALPHA/pricey"],
                       "rate_limit": {"requests": 6, "window_seconds": 60}}),
            )
            .await;
        assert_eq!(status, 201, "{backend}: {created}");
        assert_eq!(
            created["data"]["allowed_models"],
            json!([
                "alpha/m1",
                "alpha/status-503",
                "beta/echo-headers",
                "ALPHA/pricey"
            ])
        );
        assert_eq!(
            created["data"]["rate_limit"],
            json!({"requests": 6, "window_seconds": 60})
        );
        let key = created["key"].as_str().unwrap().to_owned();
        let hash = created["data"]["hash"].as_str().unwrap().to_owned();

        // The list shows what the key may call, exactly (not the `:free`
        // variant it does not name, nor a model named in another case),
        // with only the fallbacks it may call.
        let mut listed = gateway.models_for(&key).await;
        listed.sort();
        assert_eq!(
            listed,
            ["alpha/m1", "alpha/status-503", "beta/echo-headers"],
            "{backend}"
        );
        assert!(gateway.models_for(&gateway.key).await.len() > listed.len());
        let list: Value = reqwest::Client::new()
            .get(format!("http://{}/api/v1/models", gateway.address))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let degraded = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|model| model["id"] == "alpha/status-503")
            .unwrap();
        assert_eq!(degraded["fallbacks"], json!([]), "{backend}");

        // Another model is 403, a fallback it may call does not change that,
        // and none of it costs anything: no rate, no money.
        let before = gateway.store.account_balance("acme").await.unwrap();
        for body in [
            ask("alpha/pricey"),
            ask("gamma/x"),
            ask("alpha/m1:free"),
            ask_with_fallback("beta/m2", "alpha/m1"),
        ] {
            let model = body["model"].as_str().unwrap().to_owned();
            let reply = gateway.chat_with(&key, body).await;
            assert_eq!(reply.status, 403, "{backend} {model}: {}", reply.text);
            assert_eq!(
                reply.body["error"]["metadata"]["reason"],
                "model_not_allowed"
            );
            assert!(
                reply.body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(&model)
            );
        }
        assert_eq!(
            gateway.store.account_balance("acme").await.unwrap(),
            before,
            "{backend}"
        );

        // Fallbacks it may not call are skipped: alpha/status-503's
        // configured beta/m2 is not tried, so the upstream's 503 stands; the
        // request's own fallback it may call is tried.
        let reply = gateway.chat_with(&key, ask("alpha/status-503")).await;
        assert_eq!(reply.status, 503, "{backend}: {}", reply.text);
        assert_eq!(gateway.beta_received.load(Ordering::SeqCst), 0, "{backend}");
        let reply = gateway
            .chat_with(
                &key,
                ask_with_fallback("alpha/status-503", "beta/echo-headers"),
            )
            .await;
        assert_eq!(
            (reply.status, reply.model_header.as_deref()),
            (200, Some("beta/echo-headers")),
            "{backend}: {}",
            reply.text
        );

        // Its own rate: 6 a minute, five used (each models list is a request
        // of the key, as for the account's rule, and each attempt of a
        // fallback is one); of ten at once one passes.
        let replies =
            futures::future::join_all((0..10).map(|_| gateway.chat_with(&key, ask("alpha/m1"))))
                .await;
        let admitted = replies.iter().filter(|reply| reply.status == 200).count();
        assert_eq!(admitted, 1, "{backend}");
        for reply in replies.iter().filter(|reply| reply.status != 200) {
            assert_eq!(reply.status, 429, "{}", reply.text);
            assert_eq!(reply.body["error"]["metadata"]["limit_source"], "key");
        }
        // The account's other key is not held back by it.
        assert_eq!(gateway.chat(ask("alpha/m1")).await.status, 200, "{backend}");

        // Rotation carries both over.
        let (status, rotated) = gateway
            .manage(
                reqwest::Method::POST,
                &format!("/api/v1/keys/{hash}/rotate"),
                json!({}),
            )
            .await;
        assert_eq!(status, 201, "{backend}: {rotated}");
        assert_eq!(
            rotated["data"]["allowed_models"],
            created["data"]["allowed_models"]
        );
        assert_eq!(rotated["data"]["rate_limit"], created["data"]["rate_limit"]);

        // Lifted with null: every model, no rate of its own.
        let (status, lifted) = gateway
            .manage(
                reqwest::Method::PATCH,
                &format!("/api/v1/keys/{hash}"),
                json!({"allowed_models": null, "rate_limit": null}),
            )
            .await;
        assert_eq!(status, 200, "{backend}: {lifted}");
        assert_eq!(lifted["data"]["allowed_models"], Value::Null);
        let reply = gateway.chat_with(&key, ask("alpha/pricey")).await;
        assert_eq!(reply.status, 200, "{backend}: {}", reply.text);

        // Neither is for a management key.
        let (status, refused) = gateway
            .manage(
                reqwest::Method::POST,
                "/api/v1/keys",
                json!({"name": "m", "account": "acme", "management": true,
                       "allowed_models": ["alpha/"]}),
            )
            .await;
        assert_eq!(status, 422, "{backend}: {refused}");
        assert_eq!(refused["error"]["metadata"]["param"], "allowed_models");
        let (status, manager) = gateway
            .manage(
                reqwest::Method::POST,
                "/api/v1/keys",
                json!({"name": "m", "account": "acme", "management": true}),
            )
            .await;
        assert_eq!(status, 201, "{backend}: {manager}");
        let (status, refused) = gateway
            .manage(
                reqwest::Method::PATCH,
                &format!("/api/v1/keys/{}", manager["data"]["hash"].as_str().unwrap()),
                json!({"rate_limit": {"requests": 1, "window_seconds": 1}}),
            )
            .await;
        assert_eq!(status, 422, "{backend}: {refused}");
        assert_eq!(refused["error"]["metadata"]["param"], "rate_limit");
        let (status, refused) = gateway
            .manage(
                reqwest::Method::POST,
                "/api/v1/keys",
                json!({"name": "x", "account": "acme", "allowed_models": []}),
            )
            .await;
        assert_eq!(status, 422, "{backend}: {refused}");
    }
}
