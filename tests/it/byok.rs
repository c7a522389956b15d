//! BYOK over real HTTP, on `MemoryStore` and on `RedisStore` with a real
//! `redis-server`: an account's own provider keys set, replaced, listed and
//! deleted through the management API by a management key (listed by the
//! account's own keys too, which may not change them), and never answered
//! back; a chat of that account to that provider hands the key to the
//! upstream and is BYOK usage.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};
use common::backends::backends;
use common::http_server::serve;
use common::redis_server::RedisServer;
use http::{Request, Response};
use http_body_util::Full;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::BearerAuthLayer;
use modelgate::body::BodyLimitLayer;
use modelgate::clock::ManualClock;
use modelgate::context::RequestContext;
use modelgate::credit::{CreditGuardLayer, PendingSettlements, PriceTable};
use modelgate::keys::{ByokDirectory, ByokProviders, KeyDirectory, NewKey, SharedStore};
use modelgate::store::{
    FailurePolicy, MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig, TimeSource,
    byok_keys,
};
use serde_json::{Value, json};
use tower::{ServiceBuilder, service_fn};

/// The provider keys the tests set. Every one has `SECRET` in the middle,
/// which no hint shows: no response may ever contain it.
const FIRST: &str = "sk-openai-FIRST-SECRET-0001";
const SECOND: &str = "sk-openai-SECOND-SECRET-0002";
const THIRD: &str = "sk-ant-THIRD-SECRET-0003";

/// A Wednesday, mid-month, mid-day.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 18, 12, 0, 0).unwrap()
}

/// 1000 credits per million completion tokens: `max_tokens` 1000 is one
/// credit, and prompts are free.
fn prices() -> PriceTable {
    PriceTable::from_json(
        r#"{"default": {"prompt_per_million": 0, "completion_per_million": 1000}}"#,
    )
    .unwrap()
}

/// What the upstream stand-in saw of each chat: the model and the
/// credential (provider, key), if any.
type Seen = Arc<Mutex<Vec<(String, Option<(String, String)>)>>>;

/// BodyLimit -> BearerAuth -> KeyRoutes -> CreditGuard -> an upstream
/// stand-in that records what it saw and reports `max_tokens` completion
/// tokens. KeyRoutes and CreditGuard share one BYOK directory, on
/// `byok_store`, trusting a lookup for `byok_ttl`.
async fn instance(
    store: SharedStore,
    byok_store: SharedStore,
    byok_ttl: Duration,
    clock: &ManualClock,
    policy: FailurePolicy,
    seen: Seen,
    providers: ByokProviders,
) -> (SocketAddr, PendingSettlements) {
    let clock = Arc::new(clock.clone());
    let directory = KeyDirectory::builder(store.clone())
        .clock(clock.clone())
        .build();
    let byok = ByokDirectory::builder(byok_store)
        .clock(clock.clone())
        .cache_ttl(byok_ttl)
        .build();
    let upstream = service_fn(move |request: Request<Full<Bytes>>| {
        let seen = seen.clone();
        async move {
            let context = RequestContext::of(&request).expect("the layers filled it");
            let chat = context.chat.clone().expect("BodyLimit parsed it");
            let credential = context
                .credential
                .as_ref()
                .map(|credential| (credential.provider.clone(), credential.api_key().to_owned()));
            seen.lock().unwrap().push((chat.model.clone(), credential));
            let body = json!({
                "choices": [{"message": {"role": "assistant", "content": "Hi"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": chat.max_tokens.unwrap_or(100)},
            });
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body.to_string()))))
        }
    });
    let credit = CreditGuardLayer::new(store, Arc::new(prices()))
        .clock(clock)
        .failure_policy(policy)
        .byok_directory(byok.clone())
        .byok_providers(providers.clone());
    let settlements = credit.pending_settlements();
    let service = ServiceBuilder::new()
        .layer(BodyLimitLayer::new())
        .layer(BearerAuthLayer::new(directory.clone()))
        .layer(
            KeyRoutesLayer::new(directory)
                .byok_directory(byok)
                .byok_providers(providers),
        )
        .layer(credit)
        .service(upstream);
    (serve(service).await, settlements)
}

struct Gateway {
    address: SocketAddr,
    /// The settlements of its instances not recorded yet.
    settlements: Vec<PendingSettlements>,
    store: SharedStore,
    clock: ManualClock,
    admin: String,
    seen: Seen,
}

async fn gateway(store: SharedStore) -> Gateway {
    gateway_with(store, ByokProviders::Any).await
}

/// [`gateway`] taking provider keys for `providers` only.
async fn gateway_with(store: SharedStore, providers: ByokProviders) -> Gateway {
    let clock = ManualClock::new(t0());
    let seen = Seen::default();
    // The default cache: a change through KeyRoutes must still be used
    // at once, since CreditGuard shares its directory.
    let (address, settlements) = instance(
        store.clone(),
        store.clone(),
        ByokDirectory::DEFAULT_CACHE_TTL,
        &clock,
        FailurePolicy::FailClosed,
        seen.clone(),
        providers,
    )
    .await;
    let (admin, _) = KeyDirectory::new(store.clone())
        .create_key(NewKey {
            management: true,
            ..NewKey::named("operator")
        })
        .await
        .unwrap();
    Gateway {
        address,
        settlements: vec![settlements],
        store,
        clock,
        admin: admin.expose().to_owned(),
        seen,
    }
}

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

/// One call with `key`; `body` is sent as JSON text as it is. Asserts,
/// for every answer, that no provider key is in it.
async fn send(
    address: SocketAddr,
    method: &str,
    path: &str,
    key: &str,
    body: Option<&str>,
) -> Reply {
    let mut request = reqwest::Client::new()
        .request(method.parse().unwrap(), format!("http://{address}{path}"))
        .header("authorization", format!("Bearer {key}"));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.unwrap();
    let text = String::from_utf8_lossy(&bytes);
    for (name, value) in &headers {
        assert!(
            !String::from_utf8_lossy(value.as_bytes()).contains("SECRET"),
            "{method} {path}: header {name} shows a provider key"
        );
    }
    assert!(
        !text.contains("SECRET"),
        "{method} {path}: the answer shows a provider key: {text}"
    );
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{method} {path}: body is not JSON: {text}"));
    Reply {
        status,
        headers,
        body,
    }
}

fn key_body(key: &str) -> String {
    json!({ "key": key }).to_string()
}

fn byok_path(account: &str, provider: Option<&str>) -> String {
    match provider {
        Some(provider) => format!("/api/v1/accounts/{account}/byok/{provider}"),
        None => format!("/api/v1/accounts/{account}/byok"),
    }
}

impl Gateway {
    /// A normal key on `account`, whose balance gets 100 credits.
    async fn key(&self, account: &str, limit: Option<u64>) -> (String, String) {
        // Keys go only to accounts that exist.
        KeyDirectory::new(self.store.clone())
            .ensure_account(account)
            .await
            .unwrap();
        let body = json!({"name": "app", "account": account, "limit": limit}).to_string();
        let reply = send(
            self.address,
            "POST",
            "/api/v1/keys",
            &self.admin,
            Some(&body),
        )
        .await;
        assert_eq!(reply.status, 201, "{}", reply.body);
        self.store
            .top_up(account, 100 * NANOS_PER_CREDIT)
            .await
            .unwrap();
        (
            reply.body["key"].as_str().unwrap().to_owned(),
            reply.body["data"]["hash"].as_str().unwrap().to_owned(),
        )
    }

    async fn chat(&self, key: &str, model: &str) -> Reply {
        let body = json!({"model": model, "max_tokens": 1000, "messages": [{"role": "user", "content": "Hi"}]});
        send(
            self.address,
            "POST",
            "/api/v1/chat/completions",
            key,
            Some(&body.to_string()),
        )
        .await
    }

    /// What the upstream saw of the latest chat.
    fn last_seen(&self) -> (String, Option<(String, String)>) {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a chat reached the upstream")
    }

    fn chats_seen(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    async fn status(&self, key: &str) -> Value {
        // The costs of the requests before land just after their answers.
        for settlements in &self.settlements {
            assert!(settlements.flush(Duration::from_secs(10)).await.is_empty());
        }
        send(self.address, "GET", "/api/v1/key", key, None)
            .await
            .body["data"]
            .clone()
    }
}

fn stamp(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn assert_refused(reply: &Reply, status: u16, param: Option<&str>, context: &str) {
    assert_eq!(reply.status, status, "{context}: {}", reply.body);
    assert_eq!(reply.body["error"]["code"], status, "{context}");
    if let Some(param) = param {
        assert_eq!(
            reply.body["error"]["metadata"]["param"], param,
            "{context}: {}",
            reply.body
        );
        let message = reply.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(param), "{context}: {message}");
    }
}

#[tokio::test]
async fn provider_keys_are_set_and_deleted_by_management_keys_and_listed_by_own_keys_too() {
    for backend in backends().await {
        let name = backend.name;
        let gateway = gateway(backend.store).await;
        let (own, _) = gateway.key("team-a", None).await;
        let address = gateway.address;

        // A management key sets it; the provider is kept in lower case.
        let body = key_body(FIRST);
        let set = send(
            address,
            "PUT",
            &byok_path("team-a", Some("OpenAI")),
            &gateway.admin,
            Some(&body),
        )
        .await;
        assert_eq!(set.status, 200, "{name}: {}", set.body);
        assert_eq!(set.headers["cache-control"], "no-store", "{name}");
        assert_eq!(
            set.body,
            json!({"data": {
                "provider": "openai",
                "hint": "sk-…0001",
                "created_at": stamp(t0()),
                "updated_at": stamp(t0()),
            }}),
            "{name}"
        );

        // The account's own key may not replace or delete it: the key
        // decides who pays for the account's requests.
        let body = key_body(SECOND);
        for (method, body) in [("PUT", Some(body.as_str())), ("DELETE", None)] {
            let path = byok_path("team-a", Some("openai"));
            let reply = send(address, method, &path, &own, body).await;
            let context = format!("{name}: {method} with the account's own key");
            assert_refused(&reply, 403, None, &context);
            assert_eq!(reply.body["error"]["type"], "permission_error", "{context}");
            assert_eq!(
                reply.body["error"]["metadata"]["reason"], "management_key_required",
                "{context}"
            );
            let message = reply.body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("only a management key may set or delete"),
                "{context}: {message}"
            );
        }

        // A replacement keeps the creation time.
        gateway.clock.advance(Duration::from_secs(60));
        let replaced = send(
            address,
            "PUT",
            &byok_path("team-a", Some("openai")),
            &gateway.admin,
            Some(&body),
        )
        .await;
        assert_eq!(replaced.status, 200, "{name}: {}", replaced.body);
        let openai = json!({
            "provider": "openai",
            "hint": "sk-…0002",
            "created_at": stamp(t0()),
            "updated_at": stamp(t0() + chrono::Duration::seconds(60)),
        });
        assert_eq!(replaced.body["data"], openai, "{name}");
        let body = key_body(THIRD);
        let third = send(
            address,
            "PUT",
            &byok_path("team-a", Some("anthropic")),
            &gateway.admin,
            Some(&body),
        )
        .await;
        assert_eq!(third.status, 200, "{name}: {}", third.body);

        // Both list the same, by provider, hints only.
        for key in [&own, &gateway.admin] {
            let listed = send(address, "GET", &byok_path("team-a", None), key, None).await;
            assert_eq!(listed.status, 200, "{name}: {}", listed.body);
            assert_eq!(listed.headers["cache-control"], "no-store", "{name}");
            assert_eq!(
                listed.body,
                json!({"data": [third.body["data"], openai]}),
                "{name}"
            );
        }

        // The store holds the key, in the documented record.
        let record = gateway
            .store
            .get_record_at(&byok_keys("team-a"), "openai", t0())
            .await
            .unwrap()
            .unwrap();
        let record: Value = serde_json::from_slice(&record.value).unwrap();
        assert_eq!(
            (
                record["provider"].clone(),
                record["apiKey"].clone(),
                record["hint"].clone()
            ),
            (json!("openai"), json!(SECOND), json!("sk-…0002")),
            "{name}"
        );
        assert!(record["createdAt"].is_string() && record["updatedAt"].is_string());

        // Deleted; a second delete finds nothing.
        let path = byok_path("team-a", Some("anthropic"));
        let deleted = send(address, "DELETE", &path, &gateway.admin, None).await;
        assert_eq!(
            (deleted.status, deleted.body.clone()),
            (200, json!({"deleted": true})),
            "{name}"
        );
        let again = send(address, "DELETE", &path, &gateway.admin, None).await;
        assert_refused(&again, 404, None, name);
        assert_eq!(again.body["error"]["type"], "not_found_error", "{name}");
        let deleted = send(
            address,
            "DELETE",
            &byok_path("team-a", Some("OPENAI")),
            &gateway.admin,
            None,
        )
        .await;
        assert_eq!(deleted.status, 200, "{name}: {}", deleted.body);
        let listed = send(address, "GET", &byok_path("team-a", None), &own, None).await;
        assert_eq!(listed.body, json!({"data": []}), "{name}");
    }
}

#[tokio::test]
async fn another_accounts_key_is_refused_and_bad_input_is_named() {
    for backend in backends().await {
        let name = backend.name;
        let gateway = gateway(backend.store).await;
        let address = gateway.address;
        let (own, _) = gateway.key("team-a", None).await;
        let (other, _) = gateway.key("team-b", None).await;
        let body = key_body(FIRST);
        let set = send(
            address,
            "PUT",
            &byok_path("team-a", Some("openai")),
            &gateway.admin,
            Some(&body),
        )
        .await;
        assert_eq!(set.status, 200, "{name}: {}", set.body);

        // Another account's key may neither see nor change team-a's keys.
        let body = key_body(SECOND);
        for (method, path, body, reason) in [
            ("GET", byok_path("team-a", None), None, "other_account"),
            (
                "PUT",
                byok_path("team-a", Some("openai")),
                Some(body.as_str()),
                "management_key_required",
            ),
            (
                "DELETE",
                byok_path("team-a", Some("openai")),
                None,
                "management_key_required",
            ),
        ] {
            let reply = send(address, method, &path, &other, body).await;
            let context = format!("{name}: {method} {path}");
            assert_refused(&reply, 403, None, &context);
            assert_eq!(reply.body["error"]["type"], "permission_error", "{context}");
            assert_eq!(
                reply.body["error"]["metadata"]["reason"], reason,
                "{context}"
            );
        }
        let listed = send(address, "GET", &byok_path("team-a", None), &own, None).await;
        assert_eq!(
            listed.body["data"][0]["hint"], "sk-…0001",
            "{name}: unchanged"
        );

        // Bad bodies name the field; none repeats the key.
        let path = byok_path("team-a", Some("openai"));
        let spaced = key_body(&format!("{FIRST}\n"));
        let short = key_body("sk-1234");
        let long = key_body(&"k".repeat(4097));
        let number = json!({"key": 42}).to_string();
        let extra = json!({"key": SECOND, "label": "mine"}).to_string();
        for (body, status, param) in [
            ("{}", 400, Some("key")),
            (extra.as_str(), 400, Some("label")),
            ("{\"key\": \"sk-", 400, None),
            ("", 400, None),
            (number.as_str(), 422, Some("key")),
            (short.as_str(), 422, Some("key")),
            (long.as_str(), 422, Some("key")),
            (spaced.as_str(), 422, Some("key")),
        ] {
            let reply = send(address, "PUT", &path, &gateway.admin, Some(body)).await;
            assert_refused(&reply, status, param, &format!("{name}: {body:.40}"));
        }
        let reply = send(
            address,
            "PUT",
            &byok_path("team-a", Some("z.ai")),
            &gateway.admin,
            Some(&key_body(SECOND)),
        )
        .await;
        assert_refused(&reply, 400, Some("provider"), name);
        let reply = send(
            address,
            "GET",
            &byok_path("a%20b", None),
            &gateway.admin,
            None,
        )
        .await;
        assert_refused(&reply, 400, Some("account"), name);

        // A wrong method is 405 with Allow.
        for (method, path, allow) in [
            ("POST", byok_path("team-a", None), "GET, HEAD"),
            ("GET", byok_path("team-a", Some("openai")), "PUT, DELETE"),
            ("PATCH", byok_path("team-a", Some("openai")), "PUT, DELETE"),
        ] {
            let reply = send(address, method, &path, &own, None).await;
            assert_eq!(reply.status, 405, "{name}: {method} {path}");
            assert_eq!(reply.headers["allow"], allow, "{name}: {method} {path}");
        }
        let listed = send(address, "GET", &byok_path("team-a", None), &own, None).await;
        assert_eq!(
            listed.body["data"][0]["hint"], "sk-…0001",
            "{name}: still unchanged"
        );
    }
}

#[tokio::test]
async fn only_providers_that_take_a_key_get_one_and_a_key_stored_before_for_another_is_not_used() {
    for backend in backends().await {
        let name = backend.name;
        let providers = ByokProviders::Configured {
            byok: ["openai".to_owned()].into(),
            others: ["anthropic".to_owned()].into(),
        };
        let gateway = gateway_with(backend.store, providers).await;
        let address = gateway.address;
        let (own, _) = gateway.key("team-a", None).await;
        let refused = send(
            address,
            "PUT",
            &byok_path("team-a", Some("anthropic")),
            &gateway.admin,
            Some(&key_body(THIRD)),
        )
        .await;
        assert_refused(&refused, 422, Some("provider"), name);
        assert_eq!(
            refused.body["error"]["metadata"]["reason"], "byok_not_allowed",
            "{name}"
        );
        let listed = send(address, "GET", &byok_path("team-a", None), &own, None).await;
        assert_eq!(listed.body, json!({"data": []}), "{name}: nothing stored");

        // Stored before the configuration changed: charged, and no key goes.
        ByokDirectory::new(gateway.store.clone())
            .set("team-a", "anthropic", THIRD)
            .await
            .unwrap();
        let reply = gateway.chat(&own, "anthropic/claude").await;
        assert_eq!(reply.status, 200, "{name}: {}", reply.body);
        assert_eq!(gateway.last_seen().1, None, "{name}: no key went");
        let status = gateway.status(&own).await;
        assert_eq!(
            (status["usage"].clone(), status["byok_usage"].clone()),
            (json!(1), json!(0)),
            "{name}: {status}"
        );

        // The one that takes keys still does.
        let set = send(
            address,
            "PUT",
            &byok_path("team-a", Some("openai")),
            &gateway.admin,
            Some(&key_body(FIRST)),
        )
        .await;
        assert_eq!(set.status, 200, "{name}: {}", set.body);
        assert_eq!(gateway.chat(&own, "openai/gpt-4o").await.status, 200);
        assert_eq!(
            gateway.last_seen().1,
            Some(("openai".to_owned(), FIRST.to_owned())),
            "{name}"
        );
        let status = gateway.status(&own).await;
        assert_eq!(status["byok_usage"], json!(1), "{name}: {status}");
        let balance = gateway.store.account_balance("team-a").await.unwrap();
        assert_eq!(balance.balance_nanos, 99 * NANOS_PER_CREDIT, "{name}");
    }
}

#[tokio::test]
async fn a_chat_to_that_provider_carries_the_accounts_key_and_is_byok_usage() {
    for backend in backends().await {
        let name = backend.name;
        let gateway = gateway(backend.store).await;
        let address = gateway.address;
        let (own, hash) = gateway.key("team-a", Some(2)).await;
        let (other, _) = gateway.key("team-b", None).await;
        let body = key_body(FIRST);
        let set = send(
            address,
            "PUT",
            &byok_path("team-a", Some("openai")),
            &gateway.admin,
            Some(&body),
        )
        .await;
        assert_eq!(set.status, 200, "{name}: {}", set.body);
        let with_first = Some(("openai".to_owned(), FIRST.to_owned()));

        // Three one-credit chats under a two-credit limit: BYOK does not count.
        for model in ["openai/gpt-4o", "openai/gpt-4o-mini", "OpenAI/gpt-4o"] {
            let reply = gateway.chat(&own, model).await;
            assert_eq!(reply.status, 200, "{name}: {model}: {}", reply.body);
            assert_eq!(
                gateway.last_seen(),
                (model.to_owned(), with_first.clone()),
                "{name}"
            );
        }
        // Another provider, or another account, carries no key.
        assert_eq!(
            gateway.chat(&own, "anthropic/claude").await.status,
            200,
            "{name}"
        );
        assert_eq!(gateway.last_seen().1, None, "{name}: another provider");
        assert_eq!(
            gateway.chat(&other, "openai/gpt-4o").await.status,
            200,
            "{name}"
        );
        assert_eq!(gateway.last_seen().1, None, "{name}: another account");

        let status = gateway.status(&own).await;
        assert_eq!(
            (
                status["usage"].clone(),
                status["byok_usage"].clone(),
                status["byok_usage_daily"].clone(),
                status["limit_remaining"].clone()
            ),
            (json!(1), json!(3), json!(3), json!(1)),
            "{name}: {status}"
        );
        let balance = gateway.store.account_balance("team-a").await.unwrap();
        assert_eq!(
            balance.balance_nanos,
            99 * NANOS_PER_CREDIT,
            "{name}: BYOK usage is not taken from the balance"
        );

        // Counted once the key says so: 1 + 3 used, the limit is 2.
        let patch = json!({"include_byok_in_limit": true}).to_string();
        let key_path = format!("/api/v1/keys/{hash}");
        assert_eq!(
            send(address, "PATCH", &key_path, &gateway.admin, Some(&patch))
                .await
                .status,
            200
        );
        let chats = gateway.chats_seen();
        let refused = gateway.chat(&own, "openai/gpt-4o").await;
        assert_refused(&refused, 402, None, name);
        assert_eq!(
            refused.body["error"]["metadata"]["limit_source"], "key_limit",
            "{name}"
        );
        assert_eq!(
            gateway.chats_seen(),
            chats,
            "{name}: a refused chat never reaches the upstream"
        );
        let patch = json!({"include_byok_in_limit": false}).to_string();
        assert_eq!(
            send(address, "PATCH", &key_path, &gateway.admin, Some(&patch))
                .await
                .status,
            200
        );

        // A replacement is used at once on this instance; after a deletion
        // the provider is the account's own usage again.
        let body = key_body(SECOND);
        send(
            address,
            "PUT",
            &byok_path("team-a", Some("openai")),
            &gateway.admin,
            Some(&body),
        )
        .await;
        assert_eq!(
            gateway.chat(&own, "openai/gpt-4o").await.status,
            200,
            "{name}"
        );
        assert_eq!(
            gateway.last_seen().1,
            Some(("openai".to_owned(), SECOND.to_owned())),
            "{name}"
        );
        let deleted = send(
            address,
            "DELETE",
            &byok_path("team-a", Some("openai")),
            &gateway.admin,
            None,
        )
        .await;
        assert_eq!(deleted.status, 200, "{name}: {}", deleted.body);
        assert_eq!(
            gateway.chat(&own, "openai/gpt-4o").await.status,
            200,
            "{name}"
        );
        assert_eq!(gateway.last_seen().1, None, "{name}: deleted");
        let status = gateway.status(&own).await;
        assert_eq!(
            (status["usage"].clone(), status["byok_usage"].clone()),
            (json!(2), json!(4)),
            "{name}: {status}"
        );
    }
}

#[tokio::test]
async fn a_failed_lookup_refuses_by_default_and_fails_open_without_the_key() {
    // Keys and credits in memory; only the BYOK keys on a Redis that dies,
    // so the lookup is the one store call that fails.
    let mut server = RedisServer::start();
    let config = RedisStoreConfig {
        call_timeout: Duration::from_millis(300),
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let redis: SharedStore = Arc::new(RedisStore::connect(&server.url(), config).await.unwrap());
    let store: SharedStore = Arc::new(MemoryStore::new());
    let clock = ManualClock::new(t0());
    let seen = Seen::default();
    let (closed, settlements) = instance(
        store.clone(),
        redis.clone(),
        Duration::ZERO,
        &clock,
        FailurePolicy::FailClosed,
        seen.clone(),
        ByokProviders::Any,
    )
    .await;
    let (opened, opened_settlements) = instance(
        store.clone(),
        redis.clone(),
        Duration::ZERO,
        &clock,
        FailurePolicy::FailOpen,
        seen.clone(),
        ByokProviders::Any,
    )
    .await;
    let gateway = Gateway {
        address: closed,
        settlements: vec![settlements, opened_settlements],
        store: store.clone(),
        clock,
        admin: KeyDirectory::new(store.clone())
            .create_key(NewKey {
                management: true,
                ..NewKey::named("operator")
            })
            .await
            .unwrap()
            .0
            .expose()
            .to_owned(),
        seen,
    };
    let (own, _) = gateway.key("team-a", None).await;
    let body = key_body(FIRST);
    assert_eq!(
        send(
            closed,
            "PUT",
            &byok_path("team-a", Some("openai")),
            &gateway.admin,
            Some(&body)
        )
        .await
        .status,
        200
    );
    for address in [closed, opened] {
        let reply = send(address, "POST", "/api/v1/chat/completions", &own, Some(&json!({"model": "openai/gpt-4o", "max_tokens": 1000, "messages": [{"role": "user", "content": "Hi"}]}).to_string())).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(
            gateway.last_seen().1,
            Some(("openai".to_owned(), FIRST.to_owned()))
        );
    }
    assert_eq!(gateway.status(&own).await["byok_usage"], 2);

    server.stop();
    let chats = gateway.chats_seen();
    let refused = gateway.chat(&own, "openai/gpt-4o").await;
    assert_refused(&refused, 503, None, "fail closed");
    assert_eq!(refused.body["error"]["metadata"]["layer"], "CreditGuard");
    assert_eq!(
        gateway.chats_seen(),
        chats,
        "a refused chat never reaches the upstream"
    );

    let admitted = Gateway {
        address: opened,
        ..gateway
    };
    assert_eq!(admitted.chat(&own, "openai/gpt-4o").await.status, 200);
    assert_eq!(
        admitted.last_seen().1,
        None,
        "no key could be read, so none is sent"
    );
    let status = admitted.status(&own).await;
    assert_eq!(
        (status["usage"].clone(), status["byok_usage"].clone()),
        (json!(1), json!(2)),
        "admitted unchecked as the account's own usage: {status}"
    );
}
