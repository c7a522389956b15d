//! OAuth keys for apps over real HTTP, through the whole gateway on
//! loopback with the mock upstream: on a `MemoryStore`, and on a real
//! `redis-server` shared by two instances (a code made on one is exchanged
//! on the other, and a second exchange on either is refused).
//!
//! The exchange gives the key once; every refusal is checked (wrong
//! verifier, reused, expired, unknown or malformed code, another method:
//! 403; a bad method, bad JSON or a missing field: 400); exchanges racing
//! for one code give exactly one key; refusals count against the address;
//! the app's key keeps the approved limit (402 past it). The approval
//! route refuses inference keys, bad callback URLs and bad challenges.
//!
//! The consent page runs in headless Chromium (chromedriver, as in
//! `tests/settings_page.rs`): a person signs in, sets a limit and clicks
//! Authorize; the browser lands on the app's callback, a loopback server
//! of the test's own, with the code; the test exchanges it and uses the
//! key. Denying sends `error=access_denied`; a request with a
//! `javascript:` callback shows an error and no Authorize button.

use crate::common;
use crate::mock;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use common::browser::{Browser, Chromedriver, PATIENCE};
use common::gateway::{chat, instance_with_clock};
use common::http_server::serve;
use common::redis_server::RedisServer;
use common::settle::key_settled;
use futures::future::join_all;
use http::{Request, Response};
use http_body_util::Full;
use modelgate::clock::{Clock, ManualClock};
use modelgate::keys::{KeyDirectory, NewAccount, NewKey, SharedStore};
use modelgate::oauth::{AuthCode, CODE_LIFETIME, s256_challenge};
use modelgate::settings::CONTENT_SECURITY_POLICY;
use modelgate::store::{MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig};
use rand::distr::{Alphanumeric, SampleString};
use serde_json::{Value, json};

/// A credit per completion token and 0.1 per prompt token (a request of
/// `paid()` holds 40 × 0.1 + 5 = 9 credits and costs 2 × 0.1 + 5 = 5.2),
/// limits far away, no retries. Refusals are counted per address but the
/// limit is far too (one test lowers it); the racing exchanges all come
/// from one address.
const CONFIG: &str = r#"{
    "pricing": {"default": {"prompt_per_million": 100000, "completion_per_million": 1000000}},
    "rate_limits": {"account": {"gcra": {"requests": 60000, "period_seconds": 60, "burst": 6000}}},
    "auth_failures": {"max_failures": 1000, "window_seconds": 600},
    "unauthenticated": {"max_in_flight_per_address": 64},
    "retry": {"max_attempts": 1}
}"#;

/// The account that authorizes apps.
const ACCOUNT: &str = "acme";
/// Where the app waits, on a host no test listens on (the API tests never
/// follow it).
const CALLBACK: &str = "https://app.example.com/oauth/callback?state=s1";

/// The gateway instances of one test, over one store.
struct Gateway {
    addresses: Vec<SocketAddr>,
    store: SharedStore,
    clock: Arc<ManualClock>,
    /// The operator's management key.
    operator: String,
    /// The management key of [`ACCOUNT`].
    manager: String,
    http: reqwest::Client,
}

async fn redis_store(server: &RedisServer) -> SharedStore {
    Arc::new(
        RedisStore::connect(&server.url(), RedisStoreConfig::default())
            .await
            .unwrap(),
    )
}

impl Gateway {
    /// `stores.len()` instances (one store each, or clones of one) with
    /// `config`, on one manual clock that starts now (so Redis's clock and
    /// the gateway's agree), with the account, its 1000 credits and keys.
    async fn start(stores: &[SharedStore], config: &str) -> Gateway {
        let base = mock::start(mock::MockConfig::default()).await;
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let mut addresses = Vec::new();
        for store in stores {
            addresses.push(instance_with_clock(store.clone(), &base, config, clock.clone()).await);
        }
        let store = stores[0].clone();
        let directory = KeyDirectory::builder(store.clone())
            .clock(clock.clone())
            .build();
        directory
            .create_account(NewAccount {
                id: ACCOUNT.into(),
                name: "Acme Ltd".into(),
                email: None,
            })
            .await
            .unwrap();
        directory
            .top_up(ACCOUNT, 1000 * NANOS_PER_CREDIT)
            .await
            .unwrap();
        let (operator, _) = directory
            .create_key(NewKey {
                management: true,
                ..NewKey::named("operator")
            })
            .await
            .unwrap();
        let (manager, _) = directory
            .create_key(NewKey {
                account: ACCOUNT.into(),
                management: true,
                scoped_to_account: true,
                ..NewKey::named("acme admin")
            })
            .await
            .unwrap();
        Gateway {
            addresses,
            store,
            clock,
            operator: operator.expose().to_owned(),
            manager: manager.expose().to_owned(),
            http: reqwest::Client::new(),
        }
    }

    async fn on_memory() -> Gateway {
        Gateway::start(&[Arc::new(MemoryStore::new())], CONFIG).await
    }

    /// Two instances sharing the Redis of `server`.
    async fn on_redis(server: &RedisServer) -> Gateway {
        let stores = [redis_store(server).await, redis_store(server).await];
        Gateway::start(&stores, CONFIG).await
    }

    /// `POST path` on instance `instance` with `body` (raw text), as `key`
    /// (`None`: no Authorization header): status, headers and JSON body.
    async fn post_raw(
        &self,
        instance: usize,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut request = self
            .http
            .post(format!("http://{}{path}", self.addresses[instance]))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// The approval, as the consent page posts it, with `key`.
    async fn approve(&self, instance: usize, key: &str, body: &Value) -> (u16, Value) {
        let (status, _, answer) = self
            .post_raw(
                instance,
                "/api/v1/auth/keys/code",
                Some(key),
                &body.to_string(),
            )
            .await;
        (status, answer)
    }

    /// A code approved by the account's manager for `challenge` (S256),
    /// with `extra` fields; fails unless made.
    async fn code(&self, instance: usize, challenge: &str, extra: Value) -> String {
        let mut body = json!({
            "callback_url": CALLBACK,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        });
        for (field, value) in extra.as_object().unwrap() {
            body[field] = value.clone();
        }
        let (status, answer) = self.approve(instance, &self.manager, &body).await;
        assert_eq!(status, 201, "{answer}");
        answer["data"]["id"].as_str().unwrap().to_owned()
    }

    /// The app's exchange, with no key: status and answer.
    async fn exchange(&self, instance: usize, body: &Value) -> (u16, Value) {
        let (status, _, answer) = self
            .post_raw(instance, "/api/v1/auth/keys", None, &body.to_string())
            .await;
        (status, answer)
    }

    /// `GET /api/v1/key` as `key`.
    async fn key_status(&self, instance: usize, key: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("http://{}/api/v1/key", self.addresses[instance]))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        (
            response.status().as_u16(),
            response.json().await.unwrap_or(Value::Null),
        )
    }
}

/// A fresh PKCE verifier (64 characters) and its S256 challenge.
fn pkce() -> (String, String) {
    let verifier = Alphanumeric.sample_string(&mut rand::rng(), 64);
    let challenge = s256_challenge(&verifier);
    (verifier, challenge)
}

fn reason(body: &Value) -> &str {
    body["error"]["metadata"]["reason"]
        .as_str()
        .unwrap_or_default()
}

/// A 403 of the canonical format with `metadata.reason` `expected`.
fn assert_forbidden(status: u16, body: &Value, expected: &str, context: &str) {
    assert_eq!((status, reason(body)), (403, expected), "{context}: {body}");
    assert_eq!(body["error"]["type"], "permission_error", "{context}");
    assert_eq!(body["error"]["code"], 403, "{context}");
}

/// A 400 naming `param` (when given).
fn assert_bad_request(status: u16, body: &Value, param: Option<&str>, context: &str) {
    assert_eq!(status, 400, "{context}: {body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{context}");
    if let Some(param) = param {
        assert_eq!(
            body["error"]["metadata"]["param"], param,
            "{context}: {body}"
        );
    }
}

fn paid() -> Value {
    json!({"model": "openai/gpt-4o-mini", "max_tokens": 5,
           "messages": [{"role": "user", "content": "Hi there"}]})
}

/// Uses `key` for chat completions on `instance` until it is refused: the
/// refusal must be the key's own 402, and what the key used must stay
/// within `limit` credits. The number of requests served.
async fn spend_until_refused(gateway: &Gateway, instance: usize, key: &str, limit: f64) -> usize {
    for served in 0..50 {
        let (status, body) = chat(gateway.addresses[instance], key, &paid()).await;
        if status == 402 {
            assert_eq!(
                body["error"]["metadata"]["limit_source"], "key_limit",
                "{body}"
            );
            let usage = key_settled(&gateway.store, key, gateway.clock.now()).await;
            assert!(
                usage.total_nanos as f64 <= limit * NANOS_PER_CREDIT as f64,
                "used {} nano-credits past the limit of {limit}",
                usage.total_nanos
            );
            assert!(served > 0, "refused before any request was served");
            return served;
        }
        assert_eq!(status, 200, "{body}");
        key_settled(&gateway.store, key, gateway.clock.now()).await;
    }
    panic!("the key was never refused: its limit of {limit} credits does not hold");
}

/// The whole exchange: approved on instance `made_on`, exchanged on
/// `exchanged_on`; a second exchange on every instance is refused; the
/// key is the account's, named after the app, and its limit holds.
async fn whole_exchange(gateway: &Gateway, made_on: usize, exchanged_on: usize) {
    let (verifier, challenge) = pkce();
    let code = gateway
        .code(
            made_on,
            &challenge,
            json!({"limit": 20, "limit_reset": "monthly"}),
        )
        .await;
    assert!(AuthCode::parse(&code).is_some(), "{code}");
    let exchange =
        json!({"code": code, "code_verifier": verifier, "code_challenge_method": "S256"});
    let (status, headers, answer) = gateway
        .post_raw(
            exchanged_on,
            "/api/v1/auth/keys",
            None,
            &exchange.to_string(),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(headers["access-control-allow-origin"], "*");
    assert_eq!(answer["user_id"], ACCOUNT);
    assert_eq!(answer.as_object().unwrap().len(), 2, "{answer}");
    let key = answer["key"].as_str().unwrap().to_owned();

    for instance in 0..gateway.addresses.len() {
        let (status, again) = gateway.exchange(instance, &exchange).await;
        assert_forbidden(status, &again, "code_used", "a second exchange");
        assert!(again.get("key").is_none());
    }

    let (status, me) = gateway.key_status(made_on, &key).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["data"]["label"], "app.example.com");
    assert_eq!(me["data"]["account"], ACCOUNT);
    assert_eq!(me["data"]["management"], false);
    assert_eq!(me["data"]["limit"], 20);
    assert_eq!(me["data"]["limit_reset"], "monthly");
    let served = spend_until_refused(gateway, exchanged_on, &key, 20.0).await;
    assert!((2..=3).contains(&served), "{served} requests served");
}

#[tokio::test]
async fn the_whole_exchange_on_memory() {
    let gateway = Gateway::on_memory().await;
    whole_exchange(&gateway, 0, 0).await;
}

#[tokio::test]
async fn a_code_made_on_one_instance_is_exchanged_on_another_once() {
    let redis = RedisServer::start();
    let gateway = Gateway::on_redis(&redis).await;
    whole_exchange(&gateway, 0, 1).await;
    whole_exchange(&gateway, 1, 0).await;
}

/// Every way an exchange is refused, on instance `other` for codes made on
/// instance 0; none spends the code except time.
async fn every_refusal_of_the_exchange(gateway: &Gateway, other: usize) {
    let (verifier, challenge) = pkce();
    let code = gateway.code(0, &challenge, json!({})).await;
    let with = |change: Value| {
        let mut body =
            json!({"code": code, "code_verifier": verifier, "code_challenge_method": "S256"});
        for (field, value) in change.as_object().unwrap() {
            if value.is_null() {
                body.as_object_mut().unwrap().remove(field);
            } else {
                body[field] = value.clone();
            }
        }
        body
    };

    let (wrong_verifier, _) = pkce();
    let (status, body) = gateway
        .exchange(other, &with(json!({"code_verifier": wrong_verifier})))
        .await;
    assert_forbidden(status, &body, "verifier_mismatch", "a wrong verifier");
    // The challenge itself is no verifier.
    let (status, body) = gateway
        .exchange(other, &with(json!({"code_verifier": challenge})))
        .await;
    assert_forbidden(
        status,
        &body,
        "verifier_mismatch",
        "the challenge as verifier",
    );
    let (status, body) = gateway
        .exchange(other, &with(json!({"code_challenge_method": "plain"})))
        .await;
    assert_forbidden(status, &body, "method_mismatch", "another method");
    let unknown = AuthCode::generate();
    for (code, context) in [
        (unknown.expose(), "an unknown code"),
        ("not-a-code", "a malformed code"),
        ("", "an empty code"),
    ] {
        let (status, body) = gateway.exchange(other, &with(json!({"code": code}))).await;
        assert_forbidden(status, &body, "invalid_code", context);
    }

    // Malformed requests: 400, naming the field.
    for (change, param, context) in [
        (
            json!({"code_challenge_method": "S512"}),
            "code_challenge_method",
            "a bad method",
        ),
        (
            json!({"code_challenge_method": "s256"}),
            "code_challenge_method",
            "a method misspelled",
        ),
        (json!({"code": null}), "code", "no code"),
        (
            json!({"code_verifier": null}),
            "code_verifier",
            "no verifier",
        ),
        (
            json!({"code_verifier": "short"}),
            "code_verifier",
            "a verifier too short",
        ),
        (json!({"code": 42}), "code", "a code that is no string"),
    ] {
        let (status, body) = gateway.exchange(other, &with(change)).await;
        assert_bad_request(status, &body, Some(param), context);
    }
    for (raw, context) in [
        ("{\"code\": ", "invalid JSON"),
        ("", "an empty body"),
        ("[]", "an array"),
        (
            "{\"code\": \"a\", \"code_verifier\": \"b\", \"extra\": 1}",
            "an unknown field",
        ),
    ] {
        let (status, _, body) = gateway
            .post_raw(other, "/api/v1/auth/keys", None, raw)
            .await;
        assert_bad_request(status, &body, None, context);
    }

    // None of that spent the code; the method may be left out (the
    // code's own), and a bearer key is not asked for nor looked at.
    let (status, _, answer) = gateway
        .post_raw(
            other,
            "/api/v1/auth/keys",
            Some("mg-v1-not-a-key"),
            &with(json!({"code_challenge_method": null})).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let (status, body) = gateway.exchange(0, &with(json!({}))).await;
    assert_forbidden(status, &body, "code_used", "a reused code");

    // A code waits 10 minutes, not a second more.
    let (verifier, challenge) = pkce();
    let late = gateway.code(0, &challenge, json!({})).await;
    let (verifier_2, challenge_2) = pkce();
    let in_time = gateway.code(0, &challenge_2, json!({})).await;
    gateway
        .clock
        .advance(CODE_LIFETIME - Duration::from_secs(1));
    let (status, answer) = gateway
        .exchange(
            other,
            &json!({"code": in_time, "code_verifier": verifier_2}),
        )
        .await;
    assert_eq!(status, 200, "a code a second before its end: {answer}");
    gateway.clock.advance(Duration::from_secs(2));
    let (status, body) = gateway
        .exchange(other, &json!({"code": late, "code_verifier": verifier}))
        .await;
    assert_forbidden(status, &body, "invalid_code", "an expired code");
}

#[tokio::test]
async fn every_refusal_of_the_exchange_on_memory() {
    let gateway = Gateway::on_memory().await;
    every_refusal_of_the_exchange(&gateway, 0).await;
}

#[tokio::test]
async fn every_refusal_of_the_exchange_on_redis_across_instances() {
    let redis = RedisServer::start();
    let gateway = Gateway::on_redis(&redis).await;
    every_refusal_of_the_exchange(&gateway, 1).await;
}

/// `per_instance` exchanges of one code on each instance at once: one key.
/// On Redis the store's round trips let them interleave between reading
/// the code and taking it (an unconditional write there gives every one a
/// key: tried); a memory store's calls never wait, so there the race is
/// only as close as the server's scheduling makes it.
async fn racing_exchanges_give_one_key(gateway: &Gateway, per_instance: usize) {
    let (verifier, challenge) = pkce();
    let code = gateway.code(0, &challenge, json!({})).await;
    let exchange = json!({"code": code, "code_verifier": verifier});
    // Connections opened beforehand, so the exchanges start together
    // rather than one connection setup apart.
    let empty = json!({});
    let warm_up = (0..gateway.addresses.len())
        .flat_map(|instance| std::iter::repeat_n(instance, per_instance))
        .map(|instance| gateway.exchange(instance, &empty));
    join_all(warm_up).await;
    let attempts = (0..gateway.addresses.len())
        .flat_map(|instance| std::iter::repeat_n(instance, per_instance))
        .map(|instance| gateway.exchange(instance, &exchange));
    let answers = join_all(attempts).await;
    let keys: Vec<&str> = answers
        .iter()
        .filter(|(status, _)| *status == 200)
        .map(|(_, answer)| answer["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 1, "{answers:?}");
    for (status, body) in &answers {
        if *status != 200 {
            assert_forbidden(*status, body, "code_used", "a losing exchange");
        }
    }
    // Exactly one key was made for the app.
    let (status, list) = {
        let response = gateway
            .http
            .get(format!("http://{}/api/v1/keys", gateway.addresses[0]))
            .bearer_auth(&gateway.manager)
            .send()
            .await
            .unwrap();
        (
            response.status().as_u16(),
            response.json::<Value>().await.unwrap(),
        )
    };
    assert_eq!(status, 200, "{list}");
    let app_keys = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|key| key["name"] == "app.example.com")
        .count();
    assert_eq!(app_keys, 1, "{list}");
}

#[tokio::test]
async fn racing_exchanges_of_one_code_give_one_key_on_memory() {
    let gateway = Gateway::on_memory().await;
    racing_exchanges_give_one_key(&gateway, 16).await;
}

#[tokio::test]
async fn racing_exchanges_of_one_code_give_one_key_on_two_instances_sharing_redis() {
    let redis = RedisServer::start();
    let gateway = Gateway::on_redis(&redis).await;
    racing_exchanges_give_one_key(&gateway, 8).await;
}

#[tokio::test]
async fn refused_exchanges_count_against_the_address_until_429() {
    let config = CONFIG.replace(
        r#""max_failures": 1000, "window_seconds": 600"#,
        r#""max_failures": 3, "window_seconds": 2"#,
    );
    let gateway = Gateway::start(&[Arc::new(MemoryStore::new())], &config).await;
    let (verifier, challenge) = pkce();
    let code = gateway.code(0, &challenge, json!({})).await;
    for attempt in 0..3 {
        let guess = json!({"code": AuthCode::generate().expose(), "code_verifier": verifier});
        let (status, body) = gateway.exchange(0, &guess).await;
        assert_forbidden(status, &body, "invalid_code", &format!("guess {attempt}"));
    }
    let guess = json!({"code": AuthCode::generate().expose(), "code_verifier": verifier});
    let (status, headers, body) = gateway
        .post_raw(0, "/api/v1/auth/keys", None, &guess.to_string())
        .await;
    assert_eq!((status, reason(&body)), (429, "auth_failures"), "{body}");
    assert!(headers.contains_key("retry-after"));
    // Past the limit nothing is read from the store, the right code
    // included; it is kept, and exchanged once the window has ended.
    let right = json!({"code": code, "code_verifier": verifier});
    let (status, body) = gateway.exchange(0, &right).await;
    assert_eq!((status, reason(&body)), (429, "auth_failures"), "{body}");
    gateway.clock.advance(Duration::from_secs(2));
    let (status, answer) = gateway.exchange(0, &right).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn the_approval_route_refuses_what_it_must() {
    let gateway = Gateway::on_memory().await;
    let (_, challenge) = pkce();
    let good = json!({"callback_url": CALLBACK, "code_challenge": challenge, "code_challenge_method": "S256"});
    let with = |change: Value| {
        let mut body = good.clone();
        for (field, value) in change.as_object().unwrap() {
            if value.is_null() {
                body.as_object_mut().unwrap().remove(field);
            } else {
                body[field] = value.clone();
            }
        }
        body
    };

    // Only a management key approves: an inference key of the account is
    // 403, no key 401.
    let inference = common::gateway::key_of(&gateway.store, ACCOUNT, None).await;
    let (status, body) = gateway.approve(0, &inference, &good).await;
    assert_forbidden(status, &body, "management_key_required", "an inference key");
    let (status, _, body) = gateway
        .post_raw(0, "/api/v1/auth/keys/code", None, &good.to_string())
        .await;
    assert_eq!(
        (status, reason(&body)),
        (401, "missing_authorization"),
        "{body}"
    );
    let response = gateway
        .http
        .get(format!(
            "http://{}/api/v1/auth/keys/code",
            gateway.addresses[0]
        ))
        .bearer_auth(&gateway.manager)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "POST");

    for (change, status, param) in [
        (
            json!({"callback_url": "javascript:alert(document.domain)"}),
            422,
            "callback_url",
        ),
        (
            json!({"callback_url": "data:text/html,<script>alert(1)</script>"}),
            422,
            "callback_url",
        ),
        (
            json!({"callback_url": "http://app.example.com/cb"}),
            422,
            "callback_url",
        ),
        (
            json!({"callback_url": "https://user:pw@app.example.com/cb"}),
            422,
            "callback_url",
        ),
        (
            json!({"callback_url": "https://app.example.com/cb#x"}),
            422,
            "callback_url",
        ),
        (json!({"callback_url": "/relative"}), 422, "callback_url"),
        (json!({"callback_url": null}), 400, "callback_url"),
        (
            json!({"code_challenge": "too-short"}),
            422,
            "code_challenge",
        ),
        (
            json!({"code_challenge": format!("{challenge}=")}),
            422,
            "code_challenge",
        ),
        (json!({"code_challenge": null}), 400, "code_challenge"),
        (
            json!({"code_challenge_method": "S512"}),
            422,
            "code_challenge_method",
        ),
        (json!({"limit": -1}), 422, "limit"),
        (json!({"limit_reset": "hourly"}), 422, "limit_reset"),
        (
            json!({"expires_at": "2000-01-01T00:00:00Z"}),
            422,
            "expires_at",
        ),
    ] {
        let (got, body) = gateway
            .approve(0, &gateway.manager, &with(change.clone()))
            .await;
        assert_eq!(got, status, "{change}: {body}");
        assert_eq!(
            body["error"]["metadata"]["param"], param,
            "{change}: {body}"
        );
    }

    // An account's manager approves for its own account only.
    let (status, body) = gateway
        .approve(0, &gateway.manager, &with(json!({"account": "other"})))
        .await;
    assert_forbidden(status, &body, "other_account", "another account");
    let (status, body) = gateway
        .approve(0, &gateway.manager, &with(json!({"account": ACCOUNT})))
        .await;
    assert_eq!(status, 201, "{body}");

    // The operator names an account that exists.
    let (status, body) = gateway.approve(0, &gateway.operator, &good).await;
    assert_eq!((status, reason(&body)), (422, "account_required"), "{body}");
    let (status, body) = gateway
        .approve(0, &gateway.operator, &with(json!({"account": "nobody"})))
        .await;
    assert_eq!((status, reason(&body)), (422, "unknown_account"), "{body}");
    let (verifier, challenge) = pkce();
    let (status, body) = gateway
        .approve(
            0,
            &gateway.operator,
            &json!({"callback_url": "http://localhost:8080/cb", "code_challenge": challenge,
                    "code_challenge_method": "S256", "account": ACCOUNT, "key_label": "CLI"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let created_at = body["data"]["created_at"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(created_at).is_ok(),
        "{body}"
    );
    let (status, answer) = gateway
        .exchange(
            0,
            &json!({"code": body["data"]["id"], "code_verifier": verifier}),
        )
        .await;
    assert_eq!(
        (status, answer["user_id"].as_str()),
        (200, Some(ACCOUNT)),
        "{answer}"
    );
    let (_, me) = gateway.key_status(0, answer["key"].as_str().unwrap()).await;
    assert_eq!(me["data"]["label"], "CLI");
    assert_eq!(me["data"]["limit"], Value::Null);

    // S256 only: `plain`, and no method at all (which RFC 7636 reads as
    // plain), are 400s saying to use S256.
    plain_pkce_is_refused(&gateway).await;
}

/// `plain` and an approval naming no method are 400s naming the method
/// and S256, and make no code.
async fn plain_pkce_is_refused(gateway: &Gateway) {
    let (verifier, _) = pkce();
    for (method, expected) in [
        (json!("plain"), "plain_pkce_refused"),
        (Value::Null, "pkce_method_required"),
    ] {
        let (status, body) = gateway
            .approve(
                0,
                &gateway.manager,
                &json!({"callback_url": CALLBACK, "code_challenge": verifier, "code_challenge_method": method}),
            )
            .await;
        assert_bad_request(status, &body, Some("code_challenge_method"), "plain PKCE");
        assert_eq!(reason(&body), expected, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("S256"), "{message}");
    }
}

/// `plain` (and an approval naming no method) only where the operator
/// allows it: `oauth.allow_plain_pkce`.
#[tokio::test]
async fn plain_pkce_only_where_the_operator_allows_it() {
    let config = |allowed: bool| {
        let mut config: Value = serde_json::from_str(CONFIG).unwrap();
        config["oauth"] = json!({"allow_plain_pkce": allowed});
        config.to_string()
    };
    let refusing = Gateway::start(&[Arc::new(MemoryStore::new())], &config(false)).await;
    plain_pkce_is_refused(&refusing).await;
    let allowing = Gateway::start(&[Arc::new(MemoryStore::new())], &config(true)).await;
    let (verifier, _) = pkce();
    for method in [json!("plain"), Value::Null] {
        let (status, body) = allowing
            .approve(
                0,
                &allowing.manager,
                &json!({"callback_url": CALLBACK, "code_challenge": verifier, "code_challenge_method": method}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let (status, answer) = allowing
            .exchange(0, &json!({"code": body["data"]["id"], "code_verifier": verifier, "code_challenge_method": "plain"}))
            .await;
        assert_eq!(status, 200, "{answer}");
    }
}

/// One account fills its cap of waiting codes (3 here) over both
/// instances: its next approval is 429 with `Retry-After` and nothing
/// made, while another account's are still approved; an exchange frees a
/// place at once.
async fn an_account_fills_its_cap_of_waiting_codes(gateway: &Gateway) {
    let directory = KeyDirectory::builder(gateway.store.clone())
        .clock(gateway.clock.clone())
        .build();
    directory
        .create_account(NewAccount {
            id: "globex".into(),
            name: "Globex".into(),
            email: None,
        })
        .await
        .unwrap();
    let (other_manager, _) = directory
        .create_key(NewKey {
            account: "globex".into(),
            management: true,
            scoped_to_account: true,
            ..NewKey::named("globex admin")
        })
        .await
        .unwrap();
    let instances = gateway.addresses.len();
    let mut made = Vec::new();
    for index in 0..3 {
        let (verifier, challenge) = pkce();
        let code = gateway.code(index % instances, &challenge, json!({})).await;
        made.push((code, verifier));
    }
    let approval = || {
        let (_, challenge) = pkce();
        json!({"callback_url": CALLBACK, "code_challenge": challenge, "code_challenge_method": "S256"})
    };
    for instance in 0..instances {
        let (status, headers, body) = gateway
            .post_raw(
                instance,
                "/api/v1/auth/keys/code",
                Some(&gateway.manager),
                &approval().to_string(),
            )
            .await;
        assert_eq!(
            (status, reason(&body)),
            (429, "too_many_pending_codes_for_account"),
            "{body}"
        );
        let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=600).contains(&retry_after), "{retry_after}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains('3'),
            "{body}"
        );
    }
    // Another account is not held up, on either instance.
    for instance in 0..instances {
        let (status, body) = gateway
            .approve(instance, other_manager.expose(), &approval())
            .await;
        assert_eq!(status, 201, "{body}");
    }
    // An exchange (on the last instance) frees one place, on every instance.
    let (code, verifier) = made.pop().unwrap();
    let (status, answer) = gateway
        .exchange(
            instances - 1,
            &json!({"code": code, "code_verifier": verifier}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let (status, body) = gateway.approve(0, &gateway.manager, &approval()).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = gateway
        .approve(instances - 1, &gateway.manager, &approval())
        .await;
    assert_eq!(status, 429, "{body}");
    // The codes made before still work.
    for (code, verifier) in made {
        let (status, answer) = gateway
            .exchange(0, &json!({"code": code, "code_verifier": verifier}))
            .await;
        assert_eq!(status, 200, "{answer}");
    }
}

fn capped_config() -> String {
    let mut config: Value = serde_json::from_str(CONFIG).unwrap();
    config["oauth"] = json!({"max_pending_codes_per_account": 3});
    config.to_string()
}

#[tokio::test]
async fn an_account_fills_its_cap_of_waiting_codes_on_memory() {
    let gateway = Gateway::start(&[Arc::new(MemoryStore::new())], &capped_config()).await;
    an_account_fills_its_cap_of_waiting_codes(&gateway).await;
}

#[tokio::test]
async fn an_account_fills_its_cap_of_waiting_codes_on_two_instances_sharing_redis() {
    let redis = RedisServer::start();
    let stores = [redis_store(&redis).await, redis_store(&redis).await];
    let gateway = Gateway::start(&stores, &capped_config()).await;
    an_account_fills_its_cap_of_waiting_codes(&gateway).await;
}

/// Approvals racing on two instances sharing Redis never make more codes
/// than the account's cap.
#[tokio::test]
async fn racing_approvals_never_pass_the_account_s_cap_across_instances() {
    let redis = RedisServer::start();
    let stores = [redis_store(&redis).await, redis_store(&redis).await];
    let gateway = Gateway::start(&stores, &capped_config()).await;
    let approvals = (0..16).map(|index| {
        let (_, challenge) = pkce();
        let body = json!({"callback_url": CALLBACK, "code_challenge": challenge, "code_challenge_method": "S256"});
        let gateway = &gateway;
        async move { gateway.approve(index % 2, &gateway.manager, &body).await }
    });
    let answers = join_all(approvals).await;
    let made = answers.iter().filter(|(status, _)| *status == 201).count();
    assert_eq!(made, 3, "{answers:?}");
    for (status, body) in &answers {
        assert!(
            *status == 201
                || (*status == 429 && reason(body) == "too_many_pending_codes_for_account"),
            "{status}: {body}"
        );
    }
}

// ---- the consent page in a browser ---------------------------------------

/// One Chromium at a time: the machine has two cores.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The app's callback: a loopback server that answers a small page and
/// keeps the path and query of every request.
async fn callback_server() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    let service = tower::service_fn(move |request: Request<hyper::body::Incoming>| {
        let kept = Arc::clone(&kept);
        async move {
            kept.lock().unwrap().push(request.uri().to_string());
            let page = "<!doctype html><title>The app</title><p>Back at the app.</p>";
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "text/html; charset=utf-8")
                    .body(Full::new(Bytes::from_static(page.as_bytes())))
                    .unwrap(),
            )
        }
    });
    (serve(service).await, seen)
}

/// Waits until the browser is at a URL starting with `prefix`; that URL.
async fn wait_for_url(browser: &Browser, prefix: &str) -> url::Url {
    common::wait::wait_for(PATIENCE, || async {
        let url = browser.client.current_url().await.unwrap();
        if url.as_str().starts_with(prefix) {
            return Ok(url);
        }
        let message = browser
            .script("const m = document.getElementById('message'); return m ? m.textContent : null")
            .await;
        Err(format!(
            "the browser never reached {prefix}; it is at {url} and the page says {message}"
        ))
    })
    .await
}

/// The consent page's address for `callback` and `challenge` (S256).
fn consent_url(gateway: SocketAddr, callback: &str, challenge: &str) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("callback_url", callback)
        .append_pair("code_challenge", challenge)
        .append_pair("code_challenge_method", "S256")
        .finish();
    format!("http://{gateway}/auth?{query}")
}

#[tokio::test]
async fn a_person_authorizes_an_app_in_a_browser_and_the_app_uses_its_key() {
    let _one_browser = BROWSER.lock().await;
    let gateway = Gateway::on_memory().await;
    let address = gateway.addresses[0];
    let (app, seen) = callback_server().await;
    let callback = format!("http://127.0.0.1:{}/callback?state=xyz", app.port());
    let (verifier, challenge) = pkce();

    let driver = Chromedriver::start();
    let browser = driver.browser().await;
    browser
        .goto(&consent_url(address, &callback, &challenge))
        .await;
    assert_eq!(
        browser.client.title().await.unwrap(),
        "Authorize an app · modelgate"
    );
    browser.watch_csp().await;
    // The app is named by its callback's origin, as text.
    browser.wait_shown("request", true).await;
    assert_eq!(
        browser.text("app-origin").await,
        format!("http://127.0.0.1:{}", app.port())
    );
    assert!(
        browser
            .button(None, "Sign in")
            .await
            .is_displayed()
            .await
            .unwrap()
    );
    assert!(!browser.displayed("consent").await);

    // Signed in as on the key settings page.
    browser
        .fill("sign-in", "Management key", &gateway.manager)
        .await;
    browser.click(Some("sign-in"), "Sign in").await;
    browser.wait_shown("consent", true).await;
    assert_eq!(
        browser
            .script("return sessionStorage.getItem('modelgate.managementKey')")
            .await,
        gateway.manager.as_str()
    );
    browser.fill("consent", "Credit limit", "20").await;
    browser.select("consent", "Limit reset", "weekly").await;
    assert_eq!(browser.csp_violations().await, json!([]));
    browser.click(Some("consent"), "Authorize").await;

    // Back at the app, with the code added to its own query.
    let landed = wait_for_url(
        &browser,
        &format!("http://127.0.0.1:{}/callback", app.port()),
    )
    .await;
    let query: Vec<(String, String)> = landed.query_pairs().into_owned().collect();
    assert_eq!(query[0], ("state".to_owned(), "xyz".to_owned()), "{landed}");
    let code = query
        .iter()
        .find(|(name, _)| name == "code")
        .map(|(_, code)| code.clone())
        .unwrap_or_else(|| panic!("no code in {landed}"));
    assert!(seen.lock().unwrap().iter().any(|uri| uri.contains(&code)));

    // The app exchanges it and uses its key, within the limit typed.
    let (status, answer) = gateway
        .exchange(
            0,
            &json!({"code": code, "code_verifier": verifier, "code_challenge_method": "S256"}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["user_id"], ACCOUNT);
    let key = answer["key"].as_str().unwrap();
    let (_, me) = gateway.key_status(0, key).await;
    assert_eq!(me["data"]["label"], "127.0.0.1");
    assert_eq!(me["data"]["limit"], 20);
    assert_eq!(me["data"]["limit_reset"], "weekly");
    spend_until_refused(&gateway, 0, key, 20.0).await;

    // Back on the consent page in the same tab: still signed in, and
    // Deny tells the app so.
    let (_, challenge) = pkce();
    browser
        .goto(&consent_url(address, &callback, &challenge))
        .await;
    browser.wait_shown("consent", true).await;
    browser.click(Some("consent"), "Deny").await;
    let denied = wait_for_url(
        &browser,
        &format!("http://127.0.0.1:{}/callback", app.port()),
    )
    .await;
    assert_eq!(denied.query(), Some("state=xyz&error=access_denied"));

    browser.close().await;
}

#[tokio::test]
async fn a_bad_request_shows_an_error_and_no_authorize_button() {
    let _one_browser = BROWSER.lock().await;
    let gateway = Gateway::on_memory().await;
    let address = gateway.addresses[0];
    let (_, challenge) = pkce();
    let driver = Chromedriver::start();
    let browser = driver.browser().await;

    // Signed in on the key settings page, so signed in on the consent
    // page of the same tab without typing the key again: only the
    // request's validity keeps the button away.
    browser.goto(&format!("http://{address}/settings")).await;
    browser
        .fill("sign-in", "Management key", &gateway.manager)
        .await;
    browser.click(Some("sign-in"), "Sign in").await;
    browser.wait_shown("keys", true).await;
    browser
        .goto(&consent_url(address, CALLBACK, &challenge))
        .await;
    browser.wait_shown("consent", true).await;
    assert!(!browser.displayed("sign-in").await);
    assert!(browser.text("who").await.contains("acme admin"));
    browser.button(Some("consent"), "Authorize").await;

    let bad_requests = [
        (
            consent_url(address, "javascript:alert(document.domain)", &challenge),
            "callback_url must start with https://",
        ),
        (
            consent_url(address, "http://app.example.com/cb", &challenge),
            "http:// only for localhost",
        ),
        (
            consent_url(address, "https://app.example.com/cb#x", &challenge),
            "#fragment",
        ),
        (
            consent_url(address, "https://app.example.com/cb", "short"),
            "code_challenge must be 43",
        ),
        (
            format!("http://{address}/auth?code_challenge={challenge}"),
            "callback_url is missing",
        ),
        (
            format!(
                "http://{address}/auth?callback_url=https://a.example/&code_challenge={challenge}&code_challenge_method=S512"
            ),
            "code_challenge_method must be S256 or plain",
        ),
    ];
    for (url, words) in bad_requests {
        browser.goto(&url).await;
        let message = browser
            .wait_for_text("message", words, |text| text.contains("not valid"))
            .await;
        assert!(message.contains(words), "{url}: {message}");
        let buttons = browser
            .client
            .find_all(fantoccini::Locator::XPath(
                "//button[normalize-space()='Authorize']",
            ))
            .await
            .unwrap();
        assert!(
            buttons.is_empty(),
            "{url}: an Authorize button is on the page"
        );
        assert!(
            browser
                .client
                .find_all(fantoccini::Locator::Id("management-key"))
                .await
                .unwrap()
                .is_empty(),
            "{url}"
        );
    }

    // The page's headers are the settings page's.
    let response = reqwest::get(consent_url(address, "javascript:alert(1)", &challenge))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-security-policy"],
        CONTENT_SECURITY_POLICY
    );
    assert_eq!(response.headers()["x-frame-options"], "DENY");
    assert_eq!(response.headers()["referrer-policy"], "no-referrer");

    // An app that names no method (plain, by RFC 7636) or plain is well
    // formed, but this gateway takes S256 only: Authorize says so, and the
    // browser stays on the page with no code made.
    let (verifier, _) = pkce();
    for method in ["", "&code_challenge_method=plain"] {
        let url = format!(
            "http://{address}/auth?callback_url=https://app.example.com/cb&code_challenge={verifier}{method}"
        );
        browser.goto(&url).await;
        browser.wait_shown("consent", true).await;
        browser.click(Some("consent"), "Authorize").await;
        let message = browser
            .wait_for_text("message", "the gateway's refusal", |text| {
                text.contains("S256")
            })
            .await;
        assert!(
            message.contains("code_challenge_method"),
            "{method}: {message}"
        );
        let at = browser.client.current_url().await.unwrap();
        assert!(
            at.as_str().starts_with(&format!("http://{address}/auth")),
            "{at}"
        );
    }
    browser.close().await;
}
