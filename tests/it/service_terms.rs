//! The layers on a service's own terms: its own keys beside modelgate's,
//! BearerAuth in its words, its handler's own 4xx as written. An axum app
//! behind the layers over real HTTP, on `MemoryStore` and on `RedisStore`
//! with a real `redis-server`.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::{Extension, Router};
use common::backends::backends;
use common::http_server::serve;
use common::wait::wait_until;
use modelgate::admission::AdmissionLayers;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::{BearerAuthLayer, ImportedKeys, KeyHash};
use modelgate::body::BodyLimitLayer;
use modelgate::context::RequestContext;
use modelgate::credit::{CreditGuardLayer, PriceTable};
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::free_quota::FreeModelQuotaLayer;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
use modelgate::store::NANOS_PER_CREDIT;
use serde_json::{Value, json};
use tower::ServiceBuilder;

/// A key the service issued before it used modelgate.
const LEGACY_KEY: &str = "sk-live-9fQ2xL7aPz0c";

/// The service's chat handler: answers with the caller's label and usage.
async fn chat(Extension(context): Extension<RequestContext>) -> String {
    let label = context.principal.map(|principal| principal.label);
    json!({
        "choices": [{"message": {"role": "assistant", "content": label}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 1000},
    })
    .to_string()
}

/// The service with the layers, authenticating by `auth` (made on
/// `directory`, which the key routes share, as one instance's do).
async fn service(store: SharedStore, directory: KeyDirectory, auth: BearerAuthLayer) -> SocketAddr {
    service_with(store, directory, auth, ErrorMapperLayer::new()).await
}

/// [`service`] with `errors` outermost.
async fn service_with(
    store: SharedStore,
    directory: KeyDirectory,
    auth: BearerAuthLayer,
    errors: ErrorMapperLayer,
) -> SocketAddr {
    let prices = PriceTable::from_json(
        r#"{"default": {"prompt_per_million": 1, "completion_per_million": 2}}"#,
    )
    .unwrap();
    let rules = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 60, "window_seconds": 60}}}"#,
    )
    .unwrap();
    let router: Router = Router::new().route("/api/v1/chat/completions", post(chat));
    let stack = ServiceBuilder::new()
        .layer(errors)
        .layer(auth)
        .layer(BodyLimitLayer::new())
        .layer(KeyRoutesLayer::new(directory))
        .layer(AdmissionLayers::new(
            GlobalRateLimitLayer::new(store.clone(), rules).unwrap(),
            FreeModelQuotaLayer::new(store.clone()),
            CreditGuardLayer::new(store, Arc::new(prices)),
        ))
        .service(router);
    serve(stack).await
}

struct Reply {
    status: u16,
    challenge: Option<String>,
    body: Value,
}

async fn send(
    address: SocketAddr,
    method: &str,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> Reply {
    let mut request = reqwest::Client::new()
        .request(method.parse().unwrap(), format!("http://{address}{path}"))
        .header("authorization", format!("Bearer {key}"));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let reply = request.send().await.unwrap();
    let status = reply.status().as_u16();
    let challenge = reply
        .headers()
        .get("www-authenticate")
        .map(|value| value.to_str().unwrap().to_owned());
    let text = reply.text().await.unwrap();
    Reply {
        status,
        challenge,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

async fn chat_with(address: SocketAddr, key: &str) -> Reply {
    let body = json!({"model": "demo/model", "messages": [{"role": "user", "content": "Hi"}]});
    send(address, "POST", "/api/v1/chat/completions", key, Some(body)).await
}

/// The operator's key, and `default` topped up with 10 credits.
async fn provision(store: &SharedStore) -> String {
    let directory = KeyDirectory::new(store.clone());
    store
        .top_up("default", 10 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let (admin, _) = directory
        .create_key(NewKey {
            management: true,
            ..NewKey::named("operator")
        })
        .await
        .unwrap();
    admin.expose().to_owned()
}

/// Waits until the account has spent `nanos`.
async fn spent(store: &SharedStore, nanos: i64) {
    wait_until(
        Duration::from_secs(10),
        format!("{nanos} nano-credits charged"),
        || async {
            let balance = store.account_balance("default").await.unwrap();
            balance.purchased_nanos - balance.balance_nanos == nanos
        },
    )
    .await;
}

/// 1000 prompt tokens at 1 and 1000 completion tokens at 2 per million.
const ONE_CALL_NANOS: i64 = 3000 * NANOS_PER_CREDIT / 1_000_000;

#[tokio::test]
async fn an_imported_key_by_its_hash_authenticates_is_charged_and_listed() {
    for backend in backends().await {
        let store = backend.store.clone();
        let admin = provision(&store).await;
        let directory = KeyDirectory::new(store.clone());
        let hash = KeyHash::of(LEGACY_KEY);
        // Imported on every start: the second import changes nothing.
        for _ in 0..2 {
            directory
                .import_key_hash(hash, NewKey::named("legacy"))
                .await
                .unwrap();
        }
        let auth = BearerAuthLayer::new(directory.clone())
            .imported_keys(ImportedKeys::prefixes(["sk-live-"]));
        let address = service(store.clone(), directory.clone(), auth).await;

        let reply = chat_with(address, LEGACY_KEY).await;
        assert_eq!(reply.status, 200, "{}: {}", backend.name, reply.body);
        assert_eq!(reply.body["choices"][0]["message"]["content"], "legacy");
        spent(&store, ONE_CALL_NANOS).await;

        // Listed and shown like any key, without a hint.
        let path = format!("/api/v1/keys/{}", hash.to_hex());
        let shown = send(address, "GET", &path, &admin, None).await;
        assert_eq!(shown.status, 200, "{}: {}", backend.name, shown.body);
        assert_eq!(shown.body["data"]["name"], "legacy");
        assert_eq!(shown.body["data"]["hint"], Value::Null);
        let listed = send(address, "GET", "/api/v1/keys", &admin, None).await;
        assert!(
            listed.body["data"]
                .as_array()
                .unwrap()
                .iter()
                .any(|key| key["hash"] == hash.to_hex()),
            "{}: {}",
            backend.name,
            listed.body
        );
        // Disabled through the key routes, it is refused.
        let patched = send(
            address,
            "PATCH",
            &path,
            &admin,
            Some(json!({"disabled": true})),
        )
        .await;
        assert_eq!(patched.status, 200, "{}: {}", backend.name, patched.body);
        let refused = chat_with(address, LEGACY_KEY).await;
        assert_eq!(refused.status, 401, "{}: {}", backend.name, refused.body);
        assert_eq!(refused.body["error"]["metadata"]["reason"], "disabled_key");
        spent(&store, ONE_CALL_NANOS).await;
    }
}

#[tokio::test]
async fn a_key_the_service_verifies_is_looked_up_under_the_identity_it_names() {
    for backend in backends().await {
        let store = backend.store.clone();
        provision(&store).await;
        let directory = KeyDirectory::new(store.clone());
        // The service keeps its keys its own way; it names each key's id.
        let identity = KeyHash::verified("customer-42");
        directory
            .import_key_hash(identity, NewKey::named("customer 42"))
            .await
            .unwrap();
        let verifier =
            |token: &str| (token == "acme_live_secret42").then(|| "customer-42".to_owned());
        let auth = BearerAuthLayer::new(directory.clone())
            .imported_keys(ImportedKeys::prefixes(["acme_"]).verified_by(verifier));
        let address = service(store.clone(), directory.clone(), auth).await;

        let reply = chat_with(address, "acme_live_secret42").await;
        assert_eq!(reply.status, 200, "{}: {}", backend.name, reply.body);
        assert_eq!(
            reply.body["choices"][0]["message"]["content"],
            "customer 42"
        );
        spent(&store, ONE_CALL_NANOS).await;
        // The id itself is no key: a verified identity is no token's hash.
        let imported_shape = chat_with(address, "acme_customer-42").await;
        assert_eq!(imported_shape.status, 401, "{}", backend.name);
        // Its SHA-256 is not its identity here: the verifier decides.
        let refused = chat_with(address, "acme_live_other").await;
        assert_eq!(refused.status, 401, "{}: {}", backend.name, refused.body);
        assert_eq!(refused.body["error"]["metadata"]["reason"], "unknown_key");
        spent(&store, ONE_CALL_NANOS).await;
    }
}

#[tokio::test]
async fn refusals_speak_the_service_s_words_and_realm() {
    for backend in backends().await {
        let store = backend.store.clone();
        provision(&store).await;
        let directory = KeyDirectory::new(store.clone());
        let auth = BearerAuthLayer::new(directory.clone())
            .realm("acme")
            .product_name("Acme")
            .imported_keys(ImportedKeys::prefixes(["sk-live-"]));
        let address = service(store.clone(), directory.clone(), auth).await;

        // An imported shape that is no key.
        let unknown = chat_with(address, "sk-live-nosuchkey").await;
        assert_eq!(unknown.status, 401, "{}: {}", backend.name, unknown.body);
        assert_eq!(unknown.body["error"]["metadata"]["reason"], "unknown_key");
        let message = unknown.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("no Acme key"), "{message}");
        assert!(!message.contains("modelgate"), "{message}");
        assert_eq!(
            unknown.challenge.as_deref(),
            Some("Bearer realm=\"acme\", error=\"invalid_token\"")
        );
        // A token of no shape: both shapes are named, not `mg-v1-` alone.
        let other = chat_with(address, "pk-123").await;
        let message = other.body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("unknown API key: Acme keys start with `mg-v1-`"),
            "{message}"
        );
        assert!(message.contains("or `sk-live-`"), "{message}");
        // A malformed header names the product too.
        let reply = reqwest::Client::new()
            .post(format!("http://{address}/api/v1/chat/completions"))
            .header("authorization", "Basic abc")
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 401);
        let body: Value = reply.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("<your Acme key>"), "{message}");
        // Without a key, the challenge names the realm.
        let missing = reqwest::Client::new()
            .post(format!("http://{address}/api/v1/chat/completions"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            missing.headers()["www-authenticate"],
            "Bearer realm=\"acme\""
        );
        spent(&store, 0).await;
    }
}

#[tokio::test]
async fn the_handler_s_own_client_error_passes_as_it_wrote_it() {
    for backend in backends().await {
        let store = backend.store.clone();
        provision(&store).await;
        let directory = KeyDirectory::new(store.clone());
        let (key, _) = directory.create_key(NewKey::named("client")).await.unwrap();
        let auth = BearerAuthLayer::new(directory.clone());
        let errors = ErrorMapperLayer::new().handler_client_errors_as_written();
        let address = service_with(store.clone(), directory.clone(), auth, errors).await;

        // axum's own 405 for a GET on a POST route: empty, with `Allow`.
        let reply = reqwest::Client::new()
            .get(format!("http://{address}/api/v1/chat/completions"))
            .header("authorization", format!("Bearer {}", key.expose()))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 405, "{}", backend.name);
        assert_eq!(reply.headers()["allow"], "POST", "{}", backend.name);
        assert_eq!(reply.text().await.unwrap(), "", "{}", backend.name);
        // The layers' own refusals are still in the one format.
        let refused = chat_with(address, "sk-live-unknown").await;
        assert_eq!(refused.status, 401);
        assert_eq!(refused.body["error"]["code"], 401);
    }
}

/// The service's chat handler, which refuses a request it does not like
/// (`"model": "demo/refused"`) with a 422 of its own.
async fn picky_chat(Extension(context): Extension<RequestContext>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let refused = context
        .chat
        .as_ref()
        .is_some_and(|chat| chat.model_id.as_str() == "demo/refused");
    if refused {
        return (http::StatusCode::UNPROCESSABLE_ENTITY, "no such thing here").into_response();
    }
    let broken = context
        .chat
        .as_ref()
        .is_some_and(|chat| chat.model_id.as_str() == "demo/broken");
    if broken {
        return (http::StatusCode::INTERNAL_SERVER_ERROR, "oops").into_response();
    }
    chat(Extension(context)).await.into_response()
}

#[tokio::test]
async fn what_the_service_answers_itself_spends_no_rate_and_no_credit() {
    for backend in backends().await {
        let store = backend.store.clone();
        provision(&store).await;
        let directory = KeyDirectory::new(store.clone());
        let (key, _) = directory.create_key(NewKey::named("client")).await.unwrap();
        let key = key.expose().to_owned();
        let prices = PriceTable::from_json(
            r#"{"default": {"prompt_per_million": 1, "completion_per_million": 2}}"#,
        )
        .unwrap();
        // Three model calls a minute for the whole account.
        let rules = RateLimitRules::from_json(
            r#"{"account": {"rolling": {"requests": 3, "window_seconds": 60}}}"#,
        )
        .unwrap();
        // The layers around the whole router (not one route), counting only
        // model calls.
        let router: Router = Router::new()
            .route("/api/v1/chat/completions", post(picky_chat))
            .route("/status", axum::routing::get(|| async { "up" }));
        let stack = ServiceBuilder::new()
            .layer(ErrorMapperLayer::for_own_handler())
            .layer(BearerAuthLayer::new(directory.clone()))
            .layer(BodyLimitLayer::new())
            .layer(AdmissionLayers::new(
                GlobalRateLimitLayer::new(store.clone(), rules)
                    .unwrap()
                    .served_routes(modelgate::rate_limit::model_calls),
                FreeModelQuotaLayer::new(store.clone()),
                CreditGuardLayer::new(store.clone(), Arc::new(prices)),
            ))
            .service(router);
        let address = serve(stack).await;

        // The router's own answers: a 405, a 404 and a route of its own,
        // each many times over.
        for _ in 0..5 {
            assert_eq!(
                send(address, "GET", "/api/v1/chat/completions", &key, None)
                    .await
                    .status,
                405
            );
            assert_eq!(
                send(address, "GET", "/nowhere", &key, None).await.status,
                404
            );
            assert_eq!(
                send(address, "GET", "/status", &key, None).await.status,
                200
            );
        }
        // The handler's own refusal of a model call passes as written and
        // is charged nothing; it is a model call answered, so it counts.
        let body =
            json!({"model": "demo/refused", "messages": [{"role": "user", "content": "Hi"}]});
        let refused = send(
            address,
            "POST",
            "/api/v1/chat/completions",
            &key,
            Some(body),
        )
        .await;
        assert_eq!(refused.status, 422, "{}", backend.name);
        assert_eq!(refused.body, json!("no such thing here"));
        // Its 5xx is in the one format, naming this service, no upstream.
        let body = json!({"model": "demo/broken", "messages": [{"role": "user", "content": "Hi"}]});
        let broken = send(
            address,
            "POST",
            "/api/v1/chat/completions",
            &key,
            Some(body),
        )
        .await;
        assert_eq!(broken.status, 500, "{}", backend.name);
        let message = broken.body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("this service answered 500"),
            "{message}"
        );
        assert!(!message.contains("upstream"), "{message}");
        // One model call of the three is left: none of the above spent it.
        assert_eq!(
            chat_with(address, &key).await.status,
            200,
            "{}",
            backend.name
        );
        spent(&store, ONE_CALL_NANOS).await;
        let third = chat_with(address, &key).await;
        assert_eq!(third.status, 429, "{}: {}", backend.name, third.body);
    }
}

#[tokio::test]
async fn a_key_revoked_behind_the_cache_is_refused_in_the_service_s_words() {
    for backend in backends().await {
        let store = backend.store.clone();
        provision(&store).await;
        let directory = KeyDirectory::new(store.clone());
        let (key, record) = directory.create_key(NewKey::named("client")).await.unwrap();
        let auth = BearerAuthLayer::new(directory.clone())
            .realm("acme")
            .product_name("Acme");
        let address = service(store.clone(), directory.clone(), auth).await;
        // Cached live by this instance's BearerAuth.
        assert_eq!(chat_with(address, key.expose()).await.status, 200);
        // Another instance revokes it: only the ledger knows at first, so
        // CreditGuard's admission is what refuses it.
        let elsewhere = KeyDirectory::new(store.clone());
        let report = modelgate::keys::LeakReport {
            reported_at: elsewhere.now(),
            reported_by: "operator".to_owned(),
            url: None,
            source: None,
        };
        elsewhere.report_leak(&record.hash, &report).await.unwrap();
        let refused = chat_with(address, key.expose()).await;
        assert_eq!(refused.status, 401, "{}: {}", backend.name, refused.body);
        assert_eq!(refused.body["error"]["metadata"]["reason"], "leaked_key");
        assert_eq!(
            refused.challenge.as_deref(),
            Some("Bearer realm=\"acme\", error=\"invalid_token\""),
            "{}",
            backend.name
        );
        let message = refused.body["error"]["message"].as_str().unwrap();
        assert!(!message.contains("modelgate"), "{message}");
        spent(&store, ONE_CALL_NANOS).await;
    }
}
