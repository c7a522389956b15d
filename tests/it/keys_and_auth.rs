//! BearerAuth and KeyRoutes over real HTTP: reqwest against an axum app
//! behind the layers, on `MemoryStore` and on `RedisStore` with a real
//! `redis-server`; two instances sharing one Redis for revocation.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::{Extension, Router};
use chrono::{DateTime, TimeZone, Utc};
use common::backends::backends;
use common::http_server::serve;
use common::redis_server::RedisServer;
use http::Request;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::{ApiKey, BearerAuthLayer, KeyHash, looks_like_key};
use modelgate::body::BodyLimitLayer;
use modelgate::clock::{Clock, ManualClock};
use modelgate::context::RequestContext;
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::free_quota::FreeQuotaRules;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::store::{
    AccountBalance, MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig, ReserveOutcome,
    ReserveRequest, Settlement, TimeSource,
};
use serde_json::{Value, json};
use tower::ServiceBuilder;

/// A Wednesday, mid-month, mid-day.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 18, 12, 0, 0).unwrap()
}

/// The upstream stand-in: answers chat calls with what BearerAuth said
/// about the caller.
async fn chat(Extension(context): Extension<RequestContext>, headers: http::HeaderMap) -> String {
    // The gateway key must never travel past BearerAuth.
    assert!(!headers.contains_key("authorization"));
    assert!(!headers.contains_key("x-api-key"));
    let principal = context.principal.expect("BearerAuth put it there");
    json!({
        "account": principal.account_id,
        "label": principal.label,
        "limit_nanos": principal.key_limit.map(|limit| limit.limit_nanos),
    })
    .to_string()
}

/// Any other route of the upstream stand-in.
async fn elsewhere() -> &'static str {
    "{\"upstream\": true}"
}

/// Serves the layer stack over `directory` on a loopback port.
async fn instance(directory: KeyDirectory) -> SocketAddr {
    let router: Router = Router::new()
        .route("/api/v1/chat/completions", post(chat))
        .fallback(elsewhere);
    let service = ServiceBuilder::new()
        .layer(ErrorMapperLayer::new())
        .layer(BearerAuthLayer::new(directory.clone()))
        .layer(BodyLimitLayer::new())
        .layer(KeyRoutesLayer::new(directory))
        .service(router);
    serve(service).await
}

struct Gateway {
    address: SocketAddr,
    directory: KeyDirectory,
    clock: ManualClock,
    admin: String,
}

async fn gateway(store: SharedStore) -> Gateway {
    let clock = ManualClock::new(t0());
    let directory = KeyDirectory::builder(store)
        .clock(Arc::new(clock.clone()))
        .build();
    let (admin, _) = directory
        .create_key(NewKey {
            management: true,
            ..NewKey::named("operator")
        })
        .await
        .unwrap();
    Gateway {
        address: instance(directory.clone()).await,
        directory,
        clock,
        admin: admin.expose().to_owned(),
    }
}

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

async fn send(
    address: SocketAddr,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: Option<Value>,
) -> Reply {
    let client = reqwest::Client::new();
    let mut request = client.request(method.parse().unwrap(), format!("http://{address}{path}"));
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        panic!(
            "{method} {path}: body is not JSON: {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    Reply {
        status,
        headers,
        body,
    }
}

impl Gateway {
    /// A call with the operator's management key.
    async fn manage(&self, method: &str, path: &str, body: Option<Value>) -> Reply {
        send(self.address, method, path, Some(&bearer(&self.admin)), body).await
    }
}

/// A GET with `key`.
async fn get_as(address: SocketAddr, path: &str, key: &str) -> Reply {
    send(address, "GET", path, Some(&bearer(key)), None).await
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn chat_body() -> Value {
    json!({"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "Hi"}]})
}

async fn chat_as(address: SocketAddr, key: &str) -> Reply {
    send(
        address,
        "POST",
        "/api/v1/chat/completions",
        Some(&bearer(key)),
        Some(chat_body()),
    )
    .await
}

/// A key made by the operator; its account, when named, is made first
/// (a key for an account that does not exist is refused).
async fn create(gateway: &Gateway, body: Value) -> (String, Value) {
    if let Some(account) = body["account"].as_str().filter(|id| *id != "default") {
        let made = gateway
            .manage("POST", "/api/v1/accounts", Some(json!({ "id": account })))
            .await;
        assert!(matches!(made.status, 201 | 422), "{}", made.body);
    }
    let reply = gateway.manage("POST", "/api/v1/keys", Some(body)).await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    assert_eq!(reply.headers["cache-control"], "no-store");
    let key = reply.body["key"].as_str().unwrap().to_owned();
    (key, reply.body["data"].clone())
}

fn assert_refused(reply: &Reply, status: u16, reason: &str, context: &str) {
    assert_eq!(reply.status, status, "{context}: {}", reply.body);
    assert_eq!(reply.body["error"]["code"], status, "{context}");
    assert_eq!(
        reply.body["error"]["metadata"]["reason"], reason,
        "{context}: {}",
        reply.body
    );
    if status == 401 {
        let challenge = reply.headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.starts_with("Bearer"), "{context}: {challenge}");
    }
}

#[tokio::test]
async fn an_account_management_key_manages_its_account_only() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (default_key, default_data) = create(&gateway, json!({"name": "old app"})).await;

        // The operator makes the account, funds it and gives it a manager.
        let made = gateway
            .manage(
                "POST",
                "/api/v1/accounts",
                Some(json!({"id": "acme", "name": "Acme", "email": "ops@acme.example"})),
            )
            .await;
        assert_eq!(made.status, 201, "{name}: {}", made.body);
        assert_eq!(made.body["data"]["name"], "Acme");
        assert_eq!(made.body["data"]["email"], "ops@acme.example");
        assert_eq!(made.body["data"]["balance"], 0);
        let again = gateway
            .manage("POST", "/api/v1/accounts", Some(json!({"id": "acme"})))
            .await;
        assert_refused(&again, 422, "account_exists", name);
        let funded = top_up_with_keys(&gateway, "acme", 10.0, &[]).await;
        assert_eq!(funded.status, 200, "{name}: {}", funded.body);
        let listed = gateway.manage("GET", "/api/v1/accounts", None).await;
        let ids: Vec<&str> = listed.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|account| account["id"].as_str().unwrap())
            .collect();
        assert!(
            ids.contains(&"acme") && ids.contains(&"default"),
            "{name}: {ids:?}"
        );
        let (manager, manager_data) = create(
            &gateway,
            json!({"name": "acme admin", "account": "acme", "management": true}),
        )
        .await;
        assert_eq!(manager_data["management"], true);
        assert_eq!(manager_data["operator"], false);
        let manager = bearer(&manager);
        let as_manager = |method: &'static str, path: String, body: Option<Value>| {
            let (address, manager) = (gateway.address, manager.clone());
            async move { send(address, method, &path, Some(&manager), body).await }
        };

        // Who it is.
        let me = get_as(
            gateway.address,
            "/api/v1/key",
            manager.trim_start_matches("Bearer "),
        )
        .await;
        assert_eq!(me.body["data"]["account"], "acme", "{name}");
        assert_eq!(me.body["data"]["management"], true);
        assert_eq!(me.body["data"]["operator"], false);
        let operator = get_as(gateway.address, "/api/v1/key", &gateway.admin).await;
        assert_eq!(operator.body["data"]["operator"], true, "{name}");

        // Its account: balance, tier and free requests; no other account.
        let account = as_manager("GET", "/api/v1/accounts/acme".into(), None).await;
        assert_eq!(account.status, 200, "{name}: {}", account.body);
        assert_eq!(account.body["data"]["balance"], 10);
        assert_eq!(account.body["data"]["is_free_tier"], false);
        assert!(account.body["data"]["free_model_daily_requests"]["remaining"].is_u64());
        let other = as_manager("GET", "/api/v1/accounts/default".into(), None).await;
        assert_refused(&other, 403, "other_account", name);
        let mine = as_manager("GET", "/api/v1/accounts".into(), None).await;
        assert_eq!(mine.body["data"].as_array().unwrap().len(), 1, "{name}");
        assert_eq!(mine.body["data"][0]["id"], "acme");

        // Keys: made in its account, listed alone, others out of sight.
        let app = as_manager(
            "POST",
            "/api/v1/keys".into(),
            Some(json!({"name": "app", "limit": 5})),
        )
        .await;
        assert_eq!(app.status, 201, "{name}: {}", app.body);
        assert_eq!(app.body["data"]["account"], "acme");
        let app_key = app.body["key"].as_str().unwrap().to_owned();
        let app_hash = app.body["data"]["hash"].as_str().unwrap().to_owned();
        let elsewhere = as_manager(
            "POST",
            "/api/v1/keys".into(),
            Some(json!({"name": "x", "account": "default-2"})),
        )
        .await;
        assert_refused(&elsewhere, 403, "other_account", name);
        let promoted = as_manager(
            "POST",
            "/api/v1/keys".into(),
            Some(json!({"name": "x", "account": "acme", "management": true})),
        )
        .await;
        assert_refused(&promoted, 403, "operator_only", name);
        // Without `account` too: not told to name one it cannot have.
        let unnamed = as_manager(
            "POST",
            "/api/v1/keys".into(),
            Some(json!({"name": "x", "management": true})),
        )
        .await;
        assert_refused(&unnamed, 403, "operator_only", name);
        let keys = as_manager("GET", "/api/v1/keys".into(), None).await;
        let accounts: Vec<&str> = keys.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|key| key["account"].as_str().unwrap())
            .collect();
        assert_eq!(accounts, ["acme", "acme"], "{name}: {}", keys.body);
        let peek = as_manager("GET", "/api/v1/keys?account=default".into(), None).await;
        assert_refused(&peek, 403, "other_account", name);
        let default_hash = default_data["hash"].as_str().unwrap();
        for method in ["GET", "PATCH", "DELETE"] {
            let reply = as_manager(
                method,
                format!("/api/v1/keys/{default_hash}"),
                (method == "PATCH").then(|| json!({"disabled": true})),
            )
            .await;
            assert_eq!(reply.status, 404, "{name} {method}: {}", reply.body);
        }
        assert_eq!(
            chat_as(gateway.address, &default_key).await.status,
            200,
            "{name}"
        );
        let raised = as_manager(
            "PATCH",
            format!("/api/v1/keys/{app_hash}"),
            Some(json!({"limit": 7})),
        )
        .await;
        assert_eq!(raised.body["data"]["limit"], 7, "{name}: {}", raised.body);
        let operator_view = gateway
            .manage("GET", "/api/v1/keys?account=acme", None)
            .await;
        assert_eq!(
            operator_view.body["data"].as_array().unwrap().len(),
            2,
            "{name}"
        );

        // Its provider keys, not another account's.
        let byok = as_manager(
            "PUT",
            "/api/v1/accounts/acme/byok/openai".into(),
            Some(json!({"key": "sk-acme-0123456789"})),
        )
        .await;
        assert_eq!(byok.status, 200, "{name}: {}", byok.body);
        let foreign = as_manager(
            "PUT",
            "/api/v1/accounts/default/byok/openai".into(),
            Some(json!({"key": "sk-acme-0123456789"})),
        )
        .await;
        assert_refused(&foreign, 403, "other_account", name);

        // What only the operator does; and no models.
        let credits = as_manager(
            "POST",
            "/api/v1/accounts/acme/credits".into(),
            Some(json!({"amount": 100})),
        )
        .await;
        assert_refused(&credits, 403, "operator_only", name);
        let create = as_manager(
            "POST",
            "/api/v1/accounts".into(),
            Some(json!({"id": "mine"})),
        )
        .await;
        assert_refused(&create, 403, "operator_only", name);
        let reply = chat_as(gateway.address, manager.trim_start_matches("Bearer ")).await;
        assert_refused(&reply, 403, "management_key", name);

        // An inference key reads only itself.
        let refused = get_as(gateway.address, "/api/v1/accounts/acme", &app_key).await;
        assert_refused(&refused, 403, "management_key_required", name);
        let own = get_as(gateway.address, "/api/v1/key", &app_key).await;
        assert_eq!(own.body["data"]["management"], false, "{name}");
        assert_eq!(
            chat_as(gateway.address, &app_key).await.status,
            200,
            "{name}"
        );
    }
}

/// Point 3 of issue 34: the operator's key belongs to no tenant account.
/// To an account's management key (of `default`, where older stores kept
/// it) the operator's key answers as another account's key does: not
/// listed, not read, changed, deleted or reported. The reserved id is
/// no account's.
#[tokio::test]
async fn the_operators_key_is_out_of_every_accounts_reach() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let operator_hash = KeyHash::of(&gateway.admin).to_hex();
        let (manager, data) = create(
            &gateway,
            json!({"name": "default admin", "account": "default", "management": true}),
        )
        .await;
        let manager_hash = data["hash"].as_str().unwrap().to_owned();
        let manager = bearer(&manager);
        let (_, acme_key) = create(&gateway, json!({"name": "acme app", "account": "acme"})).await;
        let acme_hash = acme_key["hash"].as_str().unwrap();

        let me = get_as(gateway.address, "/api/v1/key", &gateway.admin).await;
        assert_eq!(me.body["data"]["account"], ":operator", "{name}");
        let listed = send(
            gateway.address,
            "GET",
            "/api/v1/keys?include_disabled=true",
            Some(&manager),
            None,
        )
        .await;
        assert_eq!(listed.status, 200, "{name}: {}", listed.body);
        let hashes: Vec<&str> = listed.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|key| key["hash"].as_str().unwrap())
            .collect();
        assert_eq!(
            hashes,
            [manager_hash.as_str()],
            "{name}: only its own account's keys"
        );

        // Every action on the operator's key answers as on another
        // account's key, and changes nothing.
        for (method, suffix, body) in [
            ("GET", "", None),
            ("PATCH", "", Some(json!({"disabled": true}))),
            ("PATCH", "", Some(json!({"name": "mine now"}))),
            ("DELETE", "", None),
            ("POST", "/leaked", Some(json!({}))),
        ] {
            let foreign = send(
                gateway.address,
                method,
                &format!("/api/v1/keys/{acme_hash}{suffix}"),
                Some(&manager),
                body.clone(),
            )
            .await;
            let operators = send(
                gateway.address,
                method,
                &format!("/api/v1/keys/{operator_hash}{suffix}"),
                Some(&manager),
                body,
            )
            .await;
            assert!(
                operators.status >= 400,
                "{name} {method}{suffix}: {}",
                operators.body
            );
            assert_eq!(
                (operators.status, &operators.body["error"]["metadata"]),
                (foreign.status, &foreign.body["error"]["metadata"]),
                "{name} {method}{suffix}: as another account's key"
            );
        }
        let me = get_as(gateway.address, "/api/v1/key", &gateway.admin).await;
        assert_eq!(me.status, 200, "{name}: {}", me.body);
        assert_eq!(me.body["data"]["label"], "operator");
        assert_eq!(me.body["data"]["operator"], true);

        // The operator sees it, marked as the key in use.
        let all = gateway.manage("GET", "/api/v1/keys", None).await;
        let own = all.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|key| key["hash"] == operator_hash.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{name}: {}", all.body));
        assert_eq!(own["account"], ":operator");
        assert_eq!(own["current"], true);
        assert!(
            all.body["data"]
                .as_array()
                .unwrap()
                .iter()
                .all(|key| key["current"] == (key["hash"] == operator_hash.as_str()))
        );

        // No account takes the reserved id, and it is no account.
        let taken = gateway
            .manage("POST", "/api/v1/accounts", Some(json!({"id": ":operator"})))
            .await;
        assert_refused(&taken, 422, "reserved_account", name);
        let keyed = gateway
            .manage(
                "POST",
                "/api/v1/keys",
                Some(json!({"name": "x", "account": ":operator"})),
            )
            .await;
        assert_refused(&keyed, 422, "reserved_account", name);
        let accounts = gateway.manage("GET", "/api/v1/accounts", None).await;
        assert!(
            !accounts.body.to_string().contains(":operator"),
            "{name}: {}",
            accounts.body
        );
    }
}

/// Point 3 of issue 34: no key disables, deletes or reports its own record
/// (409 `own_key`, saying how to rotate); other changes to it, and the
/// same actions on another key, go through.
#[tokio::test]
async fn no_key_disables_deletes_or_reports_itself() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (manager, data) = create(
            &gateway,
            json!({"name": "acme admin", "account": "acme", "management": true}),
        )
        .await;
        let manager_hash = data["hash"].as_str().unwrap().to_owned();
        let operator_hash = KeyHash::of(&gateway.admin).to_hex();
        for (key, hash, rotate) in [
            (&gateway.admin, &operator_hash, "MODELGATE_ADMIN_KEY"),
            (
                &manager,
                &manager_hash,
                "ask the gateway's operator to rotate it",
            ),
        ] {
            for (method, suffix, body) in [
                ("PATCH", "", Some(json!({"disabled": true}))),
                (
                    "PATCH",
                    "",
                    Some(json!({"name": "renamed", "disabled": true})),
                ),
                ("DELETE", "", None),
                (
                    "POST",
                    "/leaked",
                    Some(json!({"url": "https://example.com/x"})),
                ),
            ] {
                let reply = send(
                    gateway.address,
                    method,
                    &format!("/api/v1/keys/{hash}{suffix}"),
                    Some(&bearer(key)),
                    body,
                )
                .await;
                let context = format!("{name} {rotate} {method}{suffix}");
                assert_refused(&reply, 409, "own_key", &context);
                assert_eq!(reply.body["error"]["type"], "conflict_error");
                let message = reply.body["error"]["message"].as_str().unwrap();
                assert!(message.contains(rotate), "{context}: {message}");
            }
            // Nothing changed: the key works, under its old name.
            let me = get_as(gateway.address, "/api/v1/key", key).await;
            assert_eq!(me.status, 200, "{name}: {}", me.body);
            assert_ne!(me.body["data"]["label"], "renamed");
            // A change that locks nobody out is made.
            let renamed = send(
                gateway.address,
                "PATCH",
                &format!("/api/v1/keys/{hash}"),
                Some(&bearer(key)),
                Some(json!({"name": "still me", "disabled": false})),
            )
            .await;
            assert_eq!(renamed.status, 200, "{name}: {}", renamed.body);
            assert_eq!(renamed.body["data"]["current"], true);
        }
        let operator_reply = send(
            gateway.address,
            "PATCH",
            &format!("/api/v1/keys/{operator_hash}"),
            Some(&bearer(&gateway.admin)),
            Some(json!({"disabled": true})),
        )
        .await;
        assert!(
            operator_reply.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("proxy reset-operator-key")
        );
        // The operator disables and deletes the manager, another key.
        let disabled = gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{manager_hash}"),
                Some(json!({"disabled": true})),
            )
            .await;
        assert_eq!(disabled.status, 200, "{name}: {}", disabled.body);
        let deleted = gateway
            .manage("DELETE", &format!("/api/v1/keys/{manager_hash}"), None)
            .await;
        assert_eq!(deleted.status, 200, "{name}: {}", deleted.body);
    }
}

/// Point 5 of issue 34: a key for an account that does not exist is 422
/// `unknown_account` and makes nothing; `default` always exists; an
/// account made by `POST /api/v1/accounts` takes keys.
#[tokio::test]
async fn a_key_for_an_account_that_does_not_exist_is_refused() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        for body in [
            json!({"name": "typo", "account": "acmee"}),
            json!({"name": "typo admin", "account": "acmee", "management": true}),
        ] {
            let reply = gateway.manage("POST", "/api/v1/keys", Some(body)).await;
            assert_refused(&reply, 422, "unknown_account", name);
            assert_eq!(reply.body["error"]["metadata"]["param"], "account");
            let message = reply.body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("acmee") && message.contains("POST /api/v1/accounts"),
                "{name}: {message}"
            );
        }
        assert!(
            !gateway.directory.account_exists("acmee").await.unwrap(),
            "{name}"
        );
        let accounts = gateway.manage("GET", "/api/v1/accounts", None).await;
        assert!(!accounts.body.to_string().contains("acmee"), "{name}");
        let listed = gateway.manage("GET", "/api/v1/keys", None).await;
        assert!(!listed.body.to_string().contains("typo"), "{name}");

        let plain = gateway
            .manage(
                "POST",
                "/api/v1/keys",
                Some(json!({"name": "d", "account": "default"})),
            )
            .await;
        assert_eq!(plain.status, 201, "{name}: {}", plain.body);
        let made = gateway
            .manage("POST", "/api/v1/accounts", Some(json!({"id": "acme"})))
            .await;
        assert_eq!(made.status, 201, "{name}: {}", made.body);
        let key = gateway
            .manage(
                "POST",
                "/api/v1/keys",
                Some(json!({"name": "a", "account": "acme"})),
            )
            .await;
        assert_eq!(key.status, 201, "{name}: {}", key.body);
        assert_eq!(key.body["data"]["account"], "acme");
    }
}

/// No route with an account in its path makes that account: a top-up,
/// a read or a provider key for an id never made by `POST
/// /api/v1/accounts` is 404 `unknown_account` and writes nothing (no
/// account, no balance, no provider key); `default` always exists.
#[tokio::test]
async fn an_account_path_naming_no_account_is_404_and_makes_nothing() {
    for backend in backends().await {
        let gateway = gateway(backend.store.clone()).await;
        let name = backend.name;
        let calls = [
            (
                "POST",
                "/api/v1/accounts/acmee/credits",
                Some(json!({"amount": 5})),
            ),
            ("GET", "/api/v1/accounts/acmee", None),
            ("GET", "/api/v1/accounts/acmee/byok", None),
            (
                "PUT",
                "/api/v1/accounts/acmee/byok/openai",
                Some(json!({"key": "sk-acmee-0123456789"})),
            ),
            ("DELETE", "/api/v1/accounts/acmee/byok/openai", None),
        ];
        for (method, path, body) in calls {
            let reply = gateway.manage(method, path, body).await;
            let context = format!("{name} {method} {path}");
            assert_refused(&reply, 404, "unknown_account", &context);
            assert_eq!(reply.body["error"]["type"], "not_found_error", "{context}");
            let message = reply.body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("acmee") && message.contains("POST /api/v1/accounts"),
                "{context}: {message}"
            );
        }
        // A retried purchase with its Idempotency-Key is refused alike.
        let keyed = top_up_with_keys(&gateway, "acmee", 5.0, &[b"order-1"]).await;
        assert_refused(&keyed, 404, "unknown_account", name);

        assert!(
            !gateway.directory.account_exists("acmee").await.unwrap(),
            "{name}"
        );
        let accounts = gateway.manage("GET", "/api/v1/accounts", None).await;
        assert!(!accounts.body.to_string().contains("acmee"), "{name}");
        let balance = backend.store.account_balance("acmee").await.unwrap();
        assert_eq!(balance, AccountBalance::default(), "{name}");

        // Made by POST /api/v1/accounts, it starts empty: nothing refused
        // above was kept for it, and the same calls now work.
        let made = gateway
            .manage("POST", "/api/v1/accounts", Some(json!({"id": "acmee"})))
            .await;
        assert_eq!(made.status, 201, "{name}: {}", made.body);
        assert_eq!(made.body["data"]["total_credits"], 0, "{name}");
        let provider_keys = gateway
            .manage("GET", "/api/v1/accounts/acmee/byok", None)
            .await;
        assert_eq!(provider_keys.body, json!({"data": []}), "{name}");
        let keyed = top_up_with_keys(&gateway, "acmee", 5.0, &[b"order-1"]).await;
        assert_eq!(keyed.status, 200, "{name}: {}", keyed.body);
        assert!(keyed.headers.get("idempotent-replayed").is_none(), "{name}");
        assert_eq!(keyed.body["data"]["total_credits"], 5, "{name}");

        // `default` needs no making.
        let default = top_up_with_keys(&gateway, "default", 2.0, &[]).await;
        assert_eq!(default.status, 200, "{name}: {}", default.body);
    }
}

#[tokio::test]
async fn the_seed_lifecycle_create_use_delete() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (key, data) = create(&gateway, json!({"name": "ci", "account": "team-a"})).await;
        assert!(looks_like_key(&key), "{name}: {key}");
        assert_eq!(data["hash"], KeyHash::of(&key).to_hex(), "{name}");
        assert_eq!(data["name"], "ci");
        assert_eq!(data["account"], "team-a");
        assert_eq!(data["limit"], Value::Null);
        assert_eq!(data["disabled"], false);
        // The plaintext is never stored or listed again.
        let listed = gateway.manage("GET", "/api/v1/keys", None).await;
        assert!(!listed.body.to_string().contains(&key), "{name}");

        let reply = chat_as(gateway.address, &key).await;
        assert_eq!(reply.status, 200, "{name}: {}", reply.body);
        assert_eq!(
            reply.body,
            json!({"account": "team-a", "label": "ci", "limit_nanos": null})
        );

        let hash = data["hash"].as_str().unwrap();
        let deleted = gateway
            .manage("DELETE", &format!("/api/v1/keys/{hash}"), None)
            .await;
        assert_eq!(deleted.status, 200, "{name}");
        assert_eq!(deleted.body, json!({"deleted": true}));
        // At once, on the instance that deleted it: no cache delay.
        assert_refused(
            &chat_as(gateway.address, &key).await,
            401,
            "deleted_key",
            name,
        );
        let gone = gateway
            .manage("GET", &format!("/api/v1/keys/{hash}"), None)
            .await;
        assert_eq!(gone.status, 404, "{name}");
        let again = gateway
            .manage("DELETE", &format!("/api/v1/keys/{hash}"), None)
            .await;
        assert_eq!(again.status, 404, "{name}");
    }
}

/// A chat call with these key headers, as Anthropic's clients send one
/// (their query string included).
async fn chat_with_headers(address: SocketAddr, headers: &[(&str, &str)]) -> Reply {
    let client = reqwest::Client::new();
    let mut request = client
        .post(format!(
            "http://{address}/api/v1/chat/completions?beta=true"
        ))
        .header("content-type", "application/json")
        .body(chat_body().to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap();
    Reply {
        status,
        headers,
        body,
    }
}

/// Anthropic's clients (its SDKs, Claude Code with `ANTHROPIC_API_KEY`)
/// send the key alone in `x-api-key`: it is taken as the bearer is, never
/// travels on (the stand-in upstream asserts it), and is as strict.
#[tokio::test]
async fn a_key_in_x_api_key_is_taken_as_strictly_as_a_bearer() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (key, _) = create(&gateway, json!({"name": "claude"})).await;
        let (other, _) = create(&gateway, json!({"name": "other"})).await;
        let bearer_key = bearer(&key);

        let alone = chat_with_headers(gateway.address, &[("x-api-key", &key)]).await;
        assert_eq!(alone.status, 200, "{name}: {}", alone.body);
        assert_eq!(alone.body["label"], "claude", "{name}");
        let both = chat_with_headers(
            gateway.address,
            &[("x-api-key", &key), ("authorization", &bearer_key)],
        )
        .await;
        assert_eq!(both.status, 200, "{name}: {}", both.body);

        let cases: Vec<(Vec<(&str, String)>, &str)> = vec![
            (
                vec![
                    ("x-api-key", other.clone()),
                    ("authorization", bearer_key.clone()),
                ],
                "conflicting_keys",
            ),
            (
                vec![("x-api-key", key.clone()), ("x-api-key", key.clone())],
                "malformed_authorization",
            ),
            (
                vec![("x-api-key", String::new())],
                "malformed_authorization",
            ),
            (
                vec![("x-api-key", bearer_key.clone())],
                "malformed_authorization",
            ),
            (
                vec![("x-api-key", ApiKey::generate().expose().to_owned())],
                "unknown_key",
            ),
            // A good x-api-key does not excuse a bad Authorization.
            (
                vec![
                    ("x-api-key", key.clone()),
                    ("authorization", format!("Basic {key}")),
                ],
                "wrong_scheme",
            ),
        ];
        for (headers, reason) in &cases {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(header, value)| (*header, value.as_str()))
                .collect();
            let reply = chat_with_headers(gateway.address, &headers).await;
            let context = format!(
                "{name}: {reason} for {:?}",
                headers.iter().map(|h| h.0).collect::<Vec<_>>()
            );
            assert_refused(&reply, 401, reason, &context);
            let message = reply.body["error"]["message"].as_str().unwrap();
            assert!(!message.contains(&key[6..]), "{context}: the key leaked");
        }
    }
}

/// On the Messages API's paths every refusal is in Anthropic's error shape,
/// as its SDKs and Claude Code read it; elsewhere in the canonical one.
#[tokio::test]
async fn refusals_on_the_messages_paths_are_in_anthropics_shape() {
    let gateway = gateway(Arc::new(MemoryStore::new())).await;
    for path in [
        "/api/v1/messages?beta=true",
        "/api/v1/messages/count_tokens",
    ] {
        let reply = send(gateway.address, "POST", path, None, Some(json!({}))).await;
        assert_eq!(reply.status, 401, "{path}");
        assert_eq!(reply.body["type"], "error", "{path}: {}", reply.body);
        assert_eq!(reply.body["error"]["type"], "authentication_error");
        assert_eq!(
            reply.body["error"]["metadata"]["reason"],
            "missing_authorization"
        );
        assert!(
            reply.headers["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Bearer")
        );
        // The operator's management key may not call models: 403.
        let reply = send(
            gateway.address,
            "POST",
            path,
            Some(&bearer(&gateway.admin)),
            Some(json!({})),
        )
        .await;
        assert_eq!(reply.status, 403, "{path}: {}", reply.body);
        assert_eq!(reply.body["error"]["type"], "permission_error", "{path}");
    }
    let chat = send(
        gateway.address,
        "POST",
        "/api/v1/chat/completions",
        None,
        Some(chat_body()),
    )
    .await;
    assert_eq!(chat.body["error"]["code"], 401);
    assert_eq!(chat.body.get("type"), None);
}

#[tokio::test]
async fn every_refusal_is_a_401_with_its_own_message() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (key, data) = create(
            &gateway,
            json!({"name": "short-lived", "expires_at": "2026-11-18T13:00:00Z"}),
        )
        .await;
        let (disabled_key, disabled) = create(&gateway, json!({"name": "off"})).await;
        let (deleted_key, deleted) = create(&gateway, json!({"name": "gone"})).await;
        let patch = gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{}", disabled["hash"].as_str().unwrap()),
                Some(json!({"disabled": true})),
            )
            .await;
        assert_eq!(patch.body["data"]["disabled"], true, "{name}");
        gateway
            .manage(
                "DELETE",
                &format!("/api/v1/keys/{}", deleted["hash"].as_str().unwrap()),
                None,
            )
            .await;
        let mut corrupted = key.clone();
        let last = corrupted.pop().unwrap();
        corrupted.push(if last == 'a' { 'b' } else { 'a' });

        let cases: Vec<(Option<String>, &str)> = vec![
            (None, "missing_authorization"),
            (Some(format!("Basic {key}")), "wrong_scheme"),
            (Some(key.clone()), "wrong_scheme"),
            (Some(format!("Bearer  {key}")), "malformed_authorization"),
            // (Trailing whitespace never reaches a service: HTTP/1 parsers
            // strip it, so the parser's unit tests cover that case.)
            (Some(format!("Bearer {key}x")), "unknown_key"),
            (Some(format!("Bearer\t{key}")), "malformed_authorization"),
            (Some("Bearer ".to_owned()), "malformed_authorization"),
            (Some(bearer(ApiKey::generate().expose())), "unknown_key"),
            (Some(bearer(&corrupted)), "unknown_key"),
            (Some(bearer("sk-or-v1-abc")), "unknown_key"),
            (Some(bearer(&deleted_key)), "deleted_key"),
            (Some(bearer(&disabled_key)), "disabled_key"),
        ];
        let mut messages = std::collections::HashSet::new();
        for (authorization, reason) in &cases {
            let reply = send(
                gateway.address,
                "POST",
                "/api/v1/chat/completions",
                authorization.as_deref(),
                Some(chat_body()),
            )
            .await;
            let context = format!("{name}: {reason}");
            assert_refused(&reply, 401, reason, &context);
            let message = reply.body["error"]["message"].as_str().unwrap().to_owned();
            assert!(!message.contains(&key[6..]), "{context}: the key leaked");
            messages.insert((reason.to_string(), message));
        }
        // A reason may have several wordings; one wording never serves two reasons.
        for (reason, message) in &messages {
            let others: Vec<_> = messages
                .iter()
                .filter(|(other, text)| other != reason && text == message)
                .collect();
            assert!(
                others.is_empty(),
                "{name}: {message:?} serves {reason} and {others:?}"
            );
        }

        // The key works until its expiry instant, and not from then on.
        assert_eq!(chat_as(gateway.address, &key).await.status, 200, "{name}");
        gateway.clock.advance(Duration::from_secs(3600));
        assert_refused(
            &chat_as(gateway.address, &key).await,
            401,
            "expired_key",
            name,
        );
        assert_eq!(data["expires_at"], "2026-11-18T13:00:00.000Z");
        // Its hint: the first and last few characters, no more.
        let hint = format!("{}…{}", &key[..9], &key[key.len() - 4..]);
        assert_eq!(data["hint"], hint.as_str(), "{name}");

        // A later expiry brings it back; `null` makes it never expire.
        let path = format!("/api/v1/keys/{}", data["hash"].as_str().unwrap());
        let later = gateway
            .manage(
                "PATCH",
                &path,
                Some(json!({"expires_at": "2026-11-18T15:00:00Z"})),
            )
            .await;
        assert_eq!(later.status, 200, "{name}: {:?}", later.body);
        assert_eq!(later.body["data"]["expires_at"], "2026-11-18T15:00:00.000Z");
        assert_eq!(chat_as(gateway.address, &key).await.status, 200, "{name}");
        let past = gateway
            .manage(
                "PATCH",
                &path,
                Some(json!({"expires_at": "2026-11-18T12:30:00Z"})),
            )
            .await;
        assert_eq!(past.status, 422, "{name}: a past expiry");
        assert_eq!(past.body["error"]["metadata"]["param"], "expires_at");
        let never = gateway
            .manage("PATCH", &path, Some(json!({"expires_at": null})))
            .await;
        assert_eq!(never.body["data"]["expires_at"], Value::Null, "{name}");
        gateway.clock.advance(Duration::from_secs(3 * 3600));
        assert_eq!(chat_as(gateway.address, &key).await.status, 200, "{name}");
    }
}

#[tokio::test]
async fn management_and_model_keys_keep_to_their_own_endpoints() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (key, _) = create(&gateway, json!({"name": "app"})).await;
        let reply = chat_as(gateway.address, &gateway.admin).await;
        assert_refused(&reply, 403, "management_key", name);
        assert_eq!(reply.body["error"]["type"], "permission_error");
        // An allow-list: every other route is closed to a management key,
        // whatever its spelling.
        for (method, path) in [
            ("POST", "/api/v1/completions"),
            ("POST", "/api/v1/embeddings"),
            ("POST", "/api/v1/responses"),
            ("GET", "/api/v1/models"),
            ("POST", "/api/v1/chat/completions;x"),
            ("POST", "/api/v1/chat/completions%3B"),
            ("POST", "/api/v1/chat%5Ccompletions"),
            ("POST", "/api/v1/keys/../chat/completions"),
        ] {
            let reply = send(
                gateway.address,
                method,
                path,
                Some(&bearer(&gateway.admin)),
                Some(chat_body()),
            )
            .await;
            assert_refused(
                &reply,
                403,
                "management_key",
                &format!("{name}: {method} {path}"),
            );
        }
        // A normal key reaches those routes.
        let reply = send(
            gateway.address,
            "POST",
            "/api/v1/completions",
            Some(&bearer(&key)),
            Some(json!({})),
        )
        .await;
        assert_eq!(reply.body, json!({"upstream": true}), "{name}");
        for (method, path, body) in [
            ("GET", "/api/v1/keys", None),
            ("POST", "/api/v1/keys", Some(json!({"name": "x"}))),
            (
                "GET",
                "/api/v1/keys/0000000000000000000000000000000000000000000000000000000000000000",
                None,
            ),
            (
                "POST",
                "/api/v1/accounts/default/credits",
                Some(json!({"amount": 100})),
            ),
        ] {
            let reply = send(gateway.address, method, path, Some(&bearer(&key)), body).await;
            assert_refused(
                &reply,
                403,
                "management_key_required",
                &format!("{name}: {method} {path}"),
            );
        }
        // Path spellings that normalise to a guarded route stay guarded.
        for path in [
            "/api/v1//keys",
            "/API/V1/KEYS",
            "/api/v1/x/../keys",
            "/api/v1/%6Beys",
        ] {
            let reply = get_as(gateway.address, path, &key).await;
            assert_eq!(reply.status, 403, "{name}: {path}");
        }
        // A wrong method is 405 with Allow.
        let reply = gateway.manage("PUT", "/api/v1/keys", None).await;
        assert_eq!(reply.status, 405, "{name}");
        assert_eq!(reply.headers["allow"], "GET, HEAD, POST");
    }
}

#[tokio::test]
async fn bad_management_input_is_400_or_422_naming_the_field() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let admin = bearer(&gateway.admin);
        let cases = [
            (json!({}), 400, "name"),
            (json!({"name": 5}), 422, "name"),
            (json!({"name": "  "}), 422, "name"),
            (json!({"name": "a", "limit": -1}), 422, "limit"),
            (json!({"name": "a", "limit": "10"}), 422, "limit"),
            (
                json!({"name": "a", "limit_reset": "hourly"}),
                422,
                "limit_reset",
            ),
            (
                json!({"name": "a", "include_byok_in_limit": "yes"}),
                422,
                "include_byok_in_limit",
            ),
            (
                json!({"name": "a", "expires_at": "tomorrow"}),
                422,
                "expires_at",
            ),
            (
                json!({"name": "a", "expires_at": "2020-01-01T00:00:00Z"}),
                422,
                "expires_at",
            ),
            (json!({"name": "a", "account": "a/b"}), 422, "account"),
            (json!({"name": "a", "colour": "red"}), 400, "colour"),
        ];
        for (body, status, field) in cases {
            let reply = gateway
                .manage("POST", "/api/v1/keys", Some(body.clone()))
                .await;
            assert_eq!(reply.status, status, "{name}: {body}: {}", reply.body);
            assert_eq!(
                reply.body["error"]["metadata"]["param"], field,
                "{name}: {body}"
            );
            assert!(
                reply.body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(field),
                "{name}: {body}"
            );
        }
        let client = reqwest::Client::new();
        let not_json = client
            .post(format!("http://{}/api/v1/keys", gateway.address))
            .header("authorization", &admin)
            .header("content-type", "application/json")
            .body("{\"name\": ")
            .send()
            .await
            .unwrap();
        assert_eq!(not_json.status(), 400, "{name}");
        let reply = gateway
            .manage(
                "PATCH",
                "/api/v1/keys/not-a-hash",
                Some(json!({"disabled": true})),
            )
            .await;
        assert_eq!(reply.status, 400, "{name}");
        let unknown = KeyHash::of("nobody").to_hex();
        let reply = gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{unknown}"),
                Some(json!({"disabled": true})),
            )
            .await;
        assert_eq!(reply.status, 404, "{name}");
        let reply = gateway.manage("GET", "/api/v1/keys?offset=-1", None).await;
        assert_eq!(
            (
                reply.status,
                reply.body["error"]["metadata"]["param"].clone()
            ),
            (422, json!("offset")),
            "{name}"
        );
        let reply = gateway
            .manage(
                "POST",
                "/api/v1/accounts/acme/credits",
                Some(json!({"amount": 0})),
            )
            .await;
        assert_eq!(
            (
                reply.status,
                reply.body["error"]["metadata"]["param"].clone()
            ),
            (422, json!("amount")),
            "{name}"
        );
        let reply = gateway
            .manage(
                "POST",
                "/api/v1/accounts/a%20b/credits",
                Some(json!({"amount": 1})),
            )
            .await;
        assert_eq!(reply.status, 400, "{name}");
    }
}

#[tokio::test]
async fn listing_pages_newest_first_and_hides_disabled_keys_unless_asked() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let mut hashes = Vec::new();
        for index in 0..5 {
            let (_, data) = create(&gateway, json!({"name": format!("k{index}")})).await;
            hashes.push(data["hash"].as_str().unwrap().to_owned());
        }
        gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{}", hashes[3]),
                Some(json!({"disabled": true})),
            )
            .await;
        let names = |reply: &Reply| -> Vec<String> {
            reply.body["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|key| key["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let all = gateway.manage("GET", "/api/v1/keys", None).await;
        assert_eq!(names(&all), ["k4", "k2", "k1", "k0", "operator"], "{name}");
        let with_disabled = gateway
            .manage("GET", "/api/v1/keys?include_disabled=true&offset=1", None)
            .await;
        assert_eq!(
            names(&with_disabled),
            ["k3", "k2", "k1", "k0", "operator"],
            "{name}"
        );
        let page = gateway.manage("GET", "/api/v1/keys?offset=2", None).await;
        assert_eq!(names(&page), ["k1", "k0", "operator"], "{name}");
    }
}

#[tokio::test]
async fn key_status_reports_the_ledger_by_utc_period() {
    for backend in backends().await {
        let gateway = gateway(backend.store.clone()).await;
        let name = backend.name;
        let (key, data) = create(
            &gateway,
            json!({"name": "metered", "account": "acme", "limit": 10, "limit_reset": "daily"}),
        )
        .await;
        let hash = data["hash"].as_str().unwrap();
        let spend = |cost_nanos: i64, byok: bool, id: &'static str| {
            let store = backend.store.clone();
            let now = gateway.clock.now();
            let hash = hash.to_owned();
            async move {
                let reserve = ReserveRequest {
                    account: "acme".into(),
                    key: hash.clone(),
                    reservation_id: id.into(),
                    amount_nanos: cost_nanos,
                    key_limit: None,
                    min_amount_nanos: None,
                    check_balance: false,
                    covered_by_balance: false,
                    lapse_record: None,
                    counts_against_key_limit: true,
                    ttl: Duration::from_secs(60),
                };
                assert!(matches!(
                    store.reserve(&reserve, now).await.unwrap(),
                    ReserveOutcome::Reserved { .. }
                ));
                let settlement = Settlement {
                    account: "acme".into(),
                    key: hash,
                    reservation_id: id.into(),
                    hold_granted: false,
                    cost_nanos,
                    byok,
                    record: None,
                };
                store.settle(&settlement, now).await.unwrap();
            }
        };
        // Sunday of the week before: counts in the month only.
        gateway
            .clock
            .set(Utc.with_ymd_and_hms(2026, 11, 15, 9, 0, 0).unwrap());
        spend(1_000_000_000, false, "sunday").await;
        // Monday of this week.
        gateway
            .clock
            .set(Utc.with_ymd_and_hms(2026, 11, 16, 0, 0, 0).unwrap());
        spend(500_000_000, false, "monday").await;
        // Today: own usage and usage through the account's own provider key.
        gateway.clock.set(t0());
        spend(2_250_000_000, false, "today").await;
        spend(750_000_000, true, "today-byok").await;

        let status = get_as(gateway.address, "/api/v1/key", &key).await;
        assert_eq!(status.status, 200, "{name}: {}", status.body);
        assert_eq!(
            status.body,
            json!({"data": {
                "label": "metered",
                "account": "acme",
                "management": false,
                "operator": false,
                "limit": 10,
                "limit_reset": "daily",
                "limit_remaining": 7.75,
                "include_byok_in_limit": false,
                "usage": 3.75,
                "usage_daily": 2.25,
                "usage_weekly": 2.75,
                "usage_monthly": 3.75,
                "byok_usage": 0.75,
                "byok_usage_daily": 0.75,
                "byok_usage_weekly": 0.75,
                "byok_usage_monthly": 0.75,
                "is_free_tier": true,
                "free_model_daily_requests": {"used": 0, "limit": 50, "remaining": 50},
            }}),
            "{name}"
        );

        // BYOK counts once the key says so.
        let patched = gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{hash}"),
                Some(json!({"include_byok_in_limit": true})),
            )
            .await;
        assert_eq!(patched.body["data"]["limit_remaining"], 7, "{name}");

        // Free-model requests counted by the quota's daily counter, and the
        // higher daily limit once 10 credits were bought.
        let rules = FreeQuotaRules::default();
        for _ in 0..3 {
            assert!(
                backend
                    .store
                    .check_and_add("acme", &[rules.daily_check(0, 1)], gateway.clock.now())
                    .await
                    .unwrap()
                    .admitted
            );
        }
        let bought = gateway
            .manage(
                "POST",
                "/api/v1/accounts/acme/credits",
                Some(json!({"amount": 10})),
            )
            .await;
        assert_eq!(bought.status, 200, "{name}: {}", bought.body);
        let status = get_as(gateway.address, "/api/v1/key", &key).await;
        assert_eq!(status.body["data"]["is_free_tier"], false, "{name}");
        assert_eq!(
            status.body["data"]["free_model_daily_requests"],
            json!({"used": 3, "limit": 1000, "remaining": 997}),
            "{name}"
        );

        // Next day (a Thursday): the daily figures and the daily limit start over.
        gateway
            .clock
            .set(Utc.with_ymd_and_hms(2026, 11, 19, 0, 0, 0).unwrap());
        let status = get_as(gateway.address, "/api/v1/key", &key).await;
        let data = &status.body["data"];
        assert_eq!(
            (
                data["usage_daily"].clone(),
                data["usage_weekly"].clone(),
                data["usage"].clone()
            ),
            (json!(0), json!(2.75), json!(3.75)),
            "{name}"
        );
        assert_eq!(data["limit_remaining"], 10, "{name}");
        assert_eq!(data["free_model_daily_requests"]["used"], 0, "{name}");
        // Next month.
        gateway
            .clock
            .set(Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap());
        let status = get_as(gateway.address, "/api/v1/key", &key).await;
        assert_eq!(status.body["data"]["usage_monthly"], 0, "{name}");
        assert_eq!(status.body["data"]["usage"], 3.75, "{name}");
    }
}

/// A top-up by the operator carrying these `Idempotency-Key` values.
async fn top_up_with_keys(gateway: &Gateway, account: &str, amount: f64, keys: &[&[u8]]) -> Reply {
    let mut request = reqwest::Client::new()
        .post(format!(
            "http://{}/api/v1/accounts/{account}/credits",
            gateway.address
        ))
        .header("authorization", bearer(&gateway.admin))
        .header("content-type", "application/json")
        .body(json!({ "amount": amount }).to_string());
    for key in keys {
        request = request.header(
            "idempotency-key",
            reqwest::header::HeaderValue::from_bytes(key).unwrap(),
        );
    }
    let response = request.send().await.unwrap();
    Reply {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: serde_json::from_slice(&response.bytes().await.unwrap()).unwrap(),
    }
}

#[tokio::test]
async fn a_top_up_retried_with_its_idempotency_key_credits_once() {
    for backend in backends().await {
        let gateway = gateway(backend.store.clone()).await;
        let name = backend.name;
        let made = gateway
            .manage("POST", "/api/v1/accounts", Some(json!({"id": "shop"})))
            .await;
        assert_eq!(made.status, 201, "{name}: {}", made.body);
        let key: &[u8] = b"5b7e0c2a-1f4d-4e8b-9c3a-7d2e6f1a0b94";
        let first = top_up_with_keys(&gateway, "shop", 12.5, &[key]).await;
        let expected = json!({"data": {"account": "shop", "total_credits": 12.5, "total_usage": 0, "balance": 12.5}});
        assert_eq!((first.status, &first.body), (200, &expected), "{name}");
        assert!(first.headers.get("idempotent-replayed").is_none(), "{name}");
        // Another purchase in between; the retry still answers as the first.
        let other = top_up_with_keys(&gateway, "shop", 1.0, &[b"another"]).await;
        assert_eq!(other.body["data"]["balance"], 13.5, "{name}");
        gateway.clock.advance(Duration::from_secs(3600));
        let retry = top_up_with_keys(&gateway, "shop", 12.5, &[key]).await;
        assert_eq!((retry.status, &retry.body), (200, &expected), "{name}");
        assert_eq!(retry.headers["idempotent-replayed"], "true", "{name}");
        let balance = gateway
            .directory
            .store()
            .account_balance("shop")
            .await
            .unwrap();
        assert_eq!(balance.purchased_nanos, 13_500_000_000, "{name}");

        // The key for another amount: refused, nothing credited.
        let reused = top_up_with_keys(&gateway, "shop", 20.0, &[key]).await;
        assert_eq!(reused.status, 422, "{name}: {}", reused.body);
        assert_eq!(reused.body["error"]["metadata"]["param"], "Idempotency-Key");
        assert_eq!(
            reused.body["error"]["metadata"]["reason"],
            "idempotency_key_reused"
        );
        let message = reused.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("12.5 credits"), "{message}");

        // A malformed header: 400 naming it, nothing credited.
        let too_long = vec![b'k'; 256];
        let cases: [&[&[u8]]; 5] = [
            &[b""],
            &[&too_long],
            &[b"a b"],
            &[b"caf\xe9"],
            &[b"one", b"two"],
        ];
        for keys in cases {
            let refused = top_up_with_keys(&gateway, "shop", 12.5, keys).await;
            assert_eq!(refused.status, 400, "{name} {keys:?}: {}", refused.body);
            assert_eq!(refused.body["error"]["type"], "invalid_request_error");
            assert_eq!(
                refused.body["error"]["metadata"]["param"],
                "Idempotency-Key"
            );
            assert!(
                refused.body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("Idempotency-Key")
            );
        }
        let balance = gateway
            .directory
            .store()
            .account_balance("shop")
            .await
            .unwrap();
        assert_eq!(balance.purchased_nanos, 13_500_000_000, "{name}");

        // Without the header a top-up is not idempotent, as before.
        for _ in 0..2 {
            top_up_with_keys(&gateway, "shop", 1.0, &[]).await;
        }
        let balance = gateway
            .directory
            .store()
            .account_balance("shop")
            .await
            .unwrap();
        assert_eq!(balance.purchased_nanos, 15_500_000_000, "{name}");
    }
}

#[tokio::test]
async fn credits_and_balance_follow_purchases_and_spending() {
    for backend in backends().await {
        let gateway = gateway(backend.store.clone()).await;
        let name = backend.name;
        let (key, data) = create(&gateway, json!({"name": "buyer", "account": "shop"})).await;
        let credits = get_as(gateway.address, "/api/v1/credits", &key).await;
        assert_eq!(
            credits.body,
            json!({"data": {"total_credits": 0, "total_usage": 0}}),
            "{name}"
        );
        let balance = get_as(gateway.address, "/user/balance", &key).await;
        assert_eq!(
            balance.body,
            json!({"is_available": false, "balance_infos": [{"currency": "CREDITS", "total_balance": "0.00", "granted_balance": "0.00", "topped_up_balance": "0.00"}]}),
            "{name}"
        );
        let bought = gateway
            .manage(
                "POST",
                "/api/v1/accounts/shop/credits",
                Some(json!({"amount": 12.5})),
            )
            .await;
        assert_eq!(
            bought.body,
            json!({"data": {"account": "shop", "total_credits": 12.5, "total_usage": 0, "balance": 12.5}}),
            "{name}"
        );
        let settle = Settlement {
            account: "shop".into(),
            key: data["hash"].as_str().unwrap().into(),
            reservation_id: "r1".into(),
            hold_granted: false,
            cost_nanos: 2 * NANOS_PER_CREDIT,
            byok: false,
            record: None,
        };
        backend
            .store
            .settle(&settle, gateway.clock.now())
            .await
            .unwrap();
        let credits = get_as(gateway.address, "/api/v1/credits", &key).await;
        assert_eq!(
            credits.body,
            json!({"data": {"total_credits": 12.5, "total_usage": 2}}),
            "{name}"
        );
        let balance = get_as(gateway.address, "/user/balance", &key).await;
        assert_eq!(balance.body["is_available"], true, "{name}");
        assert_eq!(
            balance.body["balance_infos"][0]["total_balance"], "10.50",
            "{name}"
        );
        // Spending past the balance: negative, and not available.
        let settle = Settlement {
            reservation_id: "r2".into(),
            cost_nanos: 11 * NANOS_PER_CREDIT,
            ..settle
        };
        backend
            .store
            .settle(&settle, gateway.clock.now())
            .await
            .unwrap();
        let balance = get_as(gateway.address, "/user/balance", &key).await;
        assert_eq!(balance.body["is_available"], false, "{name}");
        assert_eq!(
            balance.body["balance_infos"][0]["total_balance"], "-0.50",
            "{name}"
        );
        // An account is created on first use, with nothing purchased.
        assert!(gateway.directory.account_exists("shop").await.unwrap());
        assert!(
            !gateway
                .directory
                .account_exists("never-used")
                .await
                .unwrap()
        );
    }
}

#[tokio::test]
async fn raising_the_limit_of_a_key_over_its_limit_makes_it_valid_again() {
    for backend in backends().await {
        let gateway = gateway(backend.store.clone()).await;
        let name = backend.name;
        let (key, data) = create(&gateway, json!({"name": "capped", "limit": 1})).await;
        let hash = data["hash"].as_str().unwrap().to_owned();
        let settle = Settlement {
            account: "default".into(),
            key: hash.clone(),
            reservation_id: "r".into(),
            hold_granted: false,
            cost_nanos: NANOS_PER_CREDIT,
            byok: false,
            record: None,
        };
        backend
            .store
            .settle(&settle, gateway.clock.now())
            .await
            .unwrap();
        // What CreditGuard will do with the principal's limit.
        let reserve = |limit_nanos: i64| ReserveRequest {
            account: "default".into(),
            key: hash.clone(),
            reservation_id: format!("next-{limit_nanos}"),
            amount_nanos: 1,
            key_limit: Some(modelgate::store::KeyLimit {
                limit_nanos,
                reset: None,
                include_byok: false,
            }),
            min_amount_nanos: None,
            check_balance: false,
            covered_by_balance: false,
            lapse_record: None,
            counts_against_key_limit: true,
            ttl: Duration::from_secs(60),
        };
        let seen = chat_as(gateway.address, &key).await.body["limit_nanos"]
            .as_i64()
            .unwrap();
        assert!(
            matches!(
                backend
                    .store
                    .reserve(&reserve(seen), gateway.clock.now())
                    .await
                    .unwrap(),
                ReserveOutcome::KeyLimitReached { .. }
            ),
            "{name}"
        );
        let status = get_as(gateway.address, "/api/v1/key", &key).await;
        assert_eq!(status.body["data"]["limit_remaining"], 0, "{name}");

        gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{hash}"),
                Some(json!({"limit": 5})),
            )
            .await;
        let seen = chat_as(gateway.address, &key).await.body["limit_nanos"]
            .as_i64()
            .unwrap();
        assert_eq!(
            seen,
            5 * NANOS_PER_CREDIT,
            "{name}: the new limit is seen at once"
        );
        assert!(
            matches!(
                backend
                    .store
                    .reserve(&reserve(seen), gateway.clock.now())
                    .await
                    .unwrap(),
                ReserveOutcome::Reserved { .. }
            ),
            "{name}"
        );
        let status = get_as(gateway.address, "/api/v1/key", &key).await;
        assert_eq!(status.body["data"]["limit_remaining"], 4, "{name}");
        // Removing the limit: null limit, null remaining.
        let patched = gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{hash}"),
                Some(json!({"limit": null})),
            )
            .await;
        assert_eq!(
            (
                patched.body["data"]["limit"].clone(),
                patched.body["data"]["limit_remaining"].clone()
            ),
            (Value::Null, Value::Null),
            "{name}"
        );
    }
}

#[tokio::test]
async fn many_concurrent_creations_give_distinct_working_keys() {
    for backend in backends().await {
        let gateway = Arc::new(gateway(backend.store).await);
        let name = backend.name;
        let tasks: Vec<_> = (0..40)
            .map(|index| {
                let gateway = gateway.clone();
                tokio::spawn(async move {
                    create(&gateway, json!({"name": format!("c{index}")}))
                        .await
                        .0
                })
            })
            .collect();
        let mut keys = std::collections::HashSet::new();
        for task in tasks {
            keys.insert(task.await.unwrap());
        }
        assert_eq!(keys.len(), 40, "{name}");
        let checks: Vec<_> = keys
            .iter()
            .map(|key| {
                let address = gateway.address;
                let key = key.clone();
                tokio::spawn(async move { chat_as(address, &key).await.status })
            })
            .collect();
        for check in checks {
            assert_eq!(check.await.unwrap(), 200, "{name}");
        }
    }
}

/// Two gateway instances, each with its own directory and cache, on one
/// Redis and one clock.
async fn two_instances(
    cache_ttl: Duration,
) -> (
    RedisServer,
    ManualClock,
    [(SocketAddr, KeyDirectory); 2],
    String,
) {
    let server = RedisServer::start();
    let clock = ManualClock::new(t0());
    let mut instances = Vec::new();
    for _ in 0..2 {
        let store: SharedStore = Arc::new(
            RedisStore::connect(
                &server.url(),
                RedisStoreConfig {
                    time_source: TimeSource::Caller,
                    ..RedisStoreConfig::default()
                },
            )
            .await
            .unwrap(),
        );
        let directory = KeyDirectory::builder(store)
            .clock(Arc::new(clock.clone()))
            .cache_ttl(cache_ttl)
            .build();
        instances.push((instance(directory.clone()).await, directory));
    }
    let (admin, _) = instances[0]
        .1
        .create_key(NewKey {
            management: true,
            ..NewKey::named("operator")
        })
        .await
        .unwrap();
    let instances: [(SocketAddr, KeyDirectory); 2] = instances.try_into().unwrap();
    (server, clock, instances, admin.expose().to_owned())
}

#[tokio::test]
async fn a_deleted_or_disabled_key_stops_on_every_instance_within_the_cache_time() {
    let ttl = KeyDirectory::DEFAULT_CACHE_TTL;
    let (_server, clock, [(a, _), (b, _)], admin) = two_instances(ttl).await;
    for change in ["delete", "disable"] {
        let created = send(
            a,
            "POST",
            "/api/v1/keys",
            Some(&bearer(&admin)),
            Some(json!({"name": change})),
        )
        .await;
        let key = created.body["key"].as_str().unwrap().to_owned();
        let hash = created.body["data"]["hash"].as_str().unwrap().to_owned();
        // Both instances have the key cached as good.
        assert_eq!(chat_as(a, &key).await.status, 200);
        assert_eq!(chat_as(b, &key).await.status, 200);
        let reason = if change == "delete" {
            send(
                a,
                "DELETE",
                &format!("/api/v1/keys/{hash}"),
                Some(&bearer(&admin)),
                None,
            )
            .await;
            "deleted_key"
        } else {
            send(
                a,
                "PATCH",
                &format!("/api/v1/keys/{hash}"),
                Some(&bearer(&admin)),
                Some(json!({"disabled": true})),
            )
            .await;
            "disabled_key"
        };
        assert_refused(
            &chat_as(a, &key).await,
            401,
            reason,
            "the changing instance, at once",
        );
        // The other instance may trust its cache for less than the TTL…
        clock.advance(ttl - Duration::from_millis(1));
        assert_eq!(
            chat_as(b, &key).await.status,
            200,
            "{change}: within the documented bound"
        );
        // …and never for longer.
        clock.advance(Duration::from_millis(1));
        assert_refused(
            &chat_as(b, &key).await,
            401,
            reason,
            "the other instance, after the TTL",
        );
        // A new key made on one instance works on the other at once.
        let fresh = send(
            a,
            "POST",
            "/api/v1/keys",
            Some(&bearer(&admin)),
            Some(json!({"name": "fresh"})),
        )
        .await;
        assert_eq!(
            chat_as(b, fresh.body["key"].as_str().unwrap()).await.status,
            200
        );
    }
}

#[tokio::test]
async fn without_a_cache_a_deletion_is_seen_everywhere_at_once() {
    let (_server, _clock, [(a, _), (b, _)], admin) = two_instances(Duration::ZERO).await;
    let created = send(
        a,
        "POST",
        "/api/v1/keys",
        Some(&bearer(&admin)),
        Some(json!({"name": "k"})),
    )
    .await;
    let key = created.body["key"].as_str().unwrap().to_owned();
    assert_eq!(chat_as(b, &key).await.status, 200);
    let hash = created.body["data"]["hash"].as_str().unwrap();
    send(
        a,
        "DELETE",
        &format!("/api/v1/keys/{hash}"),
        Some(&bearer(&admin)),
        None,
    )
    .await;
    assert_refused(&chat_as(b, &key).await, 401, "deleted_key", "no cache");
}

#[tokio::test]
async fn a_store_that_cannot_answer_gives_503_never_a_pass() {
    let mut server = RedisServer::start();
    let config = RedisStoreConfig {
        call_timeout: Duration::from_millis(300),
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store: SharedStore = Arc::new(RedisStore::connect(&server.url(), config).await.unwrap());
    let directory = KeyDirectory::builder(store)
        .cache_ttl(Duration::ZERO)
        .build();
    let (key, _) = directory.create_key(NewKey::named("k")).await.unwrap();
    let address = instance(directory.clone()).await;
    assert_eq!(chat_as(address, key.expose()).await.status, 200);
    server.stop();
    let reply = chat_as(address, key.expose()).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.body["error"]["metadata"]["layer"], "BearerAuth");
    let status = get_as(address, "/api/v1/key", key.expose()).await;
    assert_eq!(status.status, 503);
    assert_eq!(status.body["error"]["metadata"]["layer"], "BearerAuth");
    // After a restart without persistence the key is gone: unknown, not a pass.
    server.restart();
    let reply = common::wait::wait_for(common::wait::PATIENCE, || async {
        let reply = chat_as(address, key.expose()).await;
        if reply.status == 503 {
            Err(format!("still 503 after the restart: {}", reply.body))
        } else {
            Ok(reply)
        }
    })
    .await;
    assert_refused(&reply, 401, "unknown_key", "after restart");
}

#[tokio::test]
async fn the_layers_work_without_axum_in_plain_tower() {
    // KeyRoutes without BearerAuth before it says which layer is missing.
    let store: SharedStore = Arc::new(MemoryStore::new());
    let directory = KeyDirectory::new(store);
    let service = ServiceBuilder::new()
        .layer(BodyLimitLayer::new())
        .layer(KeyRoutesLayer::new(directory))
        .service(tower::service_fn(
            |_: Request<http_body_util::Full<bytes::Bytes>>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::new(),
                )))
            },
        ));
    let response = tower::ServiceExt::oneshot(
        service,
        Request::get("/api/v1/key")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 500);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("BearerAuth")
    );
}

#[tokio::test]
async fn key_routes_fail_closed_when_the_key_is_cached_but_the_store_is_down() {
    let mut server = RedisServer::start();
    let config = RedisStoreConfig {
        call_timeout: Duration::from_millis(300),
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store: SharedStore = Arc::new(RedisStore::connect(&server.url(), config).await.unwrap());
    let directory = KeyDirectory::builder(store)
        .cache_ttl(Duration::from_secs(3600))
        .build();
    let (key, _) = directory.create_key(NewKey::named("k")).await.unwrap();
    let address = instance(directory).await;
    assert_eq!(chat_as(address, key.expose()).await.status, 200);
    server.stop();
    // Off the chat path BearerAuth reads a live key afresh (so a revoked
    // key is refused at once): with the store down it refuses, closed.
    for path in ["/api/v1/key", "/api/v1/credits", "/user/balance"] {
        let reply = get_as(address, path, key.expose()).await;
        assert_eq!(reply.status, 503, "{path}: {}", reply.body);
        assert_eq!(
            reply.body["error"]["metadata"]["layer"], "BearerAuth",
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_rotated_key_works_for_its_grace_then_only_its_successor_does() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (old_key, old) = create(
            &gateway,
            json!({"name": "ci", "limit": 5, "limit_reset": "weekly", "expires_at": "2027-01-01T00:00:00Z"}),
        )
        .await;
        let path = format!("/api/v1/keys/{}/rotate", old["hash"].as_str().unwrap());
        let rotated = gateway
            .manage("POST", &path, Some(json!({"grace_seconds": 60})))
            .await;
        assert_eq!(rotated.status, 201, "{name}: {:?}", rotated.body);
        let new_key = rotated.body["key"].as_str().unwrap().to_owned();
        let new = &rotated.body["data"];
        ApiKey::parse(&new_key).unwrap();
        assert_ne!(new["hash"], old["hash"], "{name}");
        // The successor carries the old key's terms.
        for field in [
            "name",
            "account",
            "limit",
            "limit_reset",
            "expires_at",
            "management",
        ] {
            assert_eq!(new[field], old[field], "{name}: {field}");
        }
        assert_eq!(rotated.body["rotated"]["hash"], old["hash"]);
        assert_eq!(
            rotated.body["rotated"]["expires_at"], "2026-11-18T12:01:00.000Z",
            "{name}: the grace ends a minute on"
        );

        // Both work during the grace.
        assert_eq!(
            chat_as(gateway.address, &old_key).await.status,
            200,
            "{name}"
        );
        assert_eq!(
            chat_as(gateway.address, &new_key).await.status,
            200,
            "{name}"
        );
        // A key is rotated once.
        let again = gateway.manage("POST", &path, None).await;
        assert_refused(&again, 409, "already_rotated", name);

        // After it, the old key is refused as rotated; the new one works.
        gateway.clock.advance(Duration::from_secs(61));
        assert_refused(
            &chat_as(gateway.address, &old_key).await,
            401,
            "rotated_key",
            name,
        );
        assert_eq!(
            chat_as(gateway.address, &new_key).await.status,
            200,
            "{name}"
        );

        // A disabled key is not rotated; nor is an unknown one.
        let (_, off) = create(&gateway, json!({"name": "off"})).await;
        let off_path = format!("/api/v1/keys/{}", off["hash"].as_str().unwrap());
        gateway
            .manage("PATCH", &off_path, Some(json!({"disabled": true})))
            .await;
        let refused = gateway
            .manage("POST", &format!("{off_path}/rotate"), None)
            .await;
        assert_refused(&refused, 422, "disabled_key", name);
        let unknown = gateway
            .manage(
                "POST",
                &format!("/api/v1/keys/{}/rotate", "ab".repeat(32)),
                None,
            )
            .await;
        assert_eq!(unknown.status, 404, "{name}");
        let bad = gateway
            .manage("POST", &path, Some(json!({"grace_seconds": -5})))
            .await;
        assert_eq!(bad.status, 422, "{name}");
        // The operator's key lives in MODELGATE_ADMIN_KEY: not rotated here.
        let operator = gateway
            .manage(
                "POST",
                &format!(
                    "/api/v1/keys/{}/rotate",
                    KeyHash::of(&gateway.admin).to_hex()
                ),
                None,
            )
            .await;
        assert_refused(&operator, 422, "operator_key", name);
    }
}

// ---- rotation and expiry changes: what no key may do with them ----------

/// An account `acme` with a management key made by the operator; its
/// plaintext and data.
async fn tenant_manager(gateway: &Gateway, extra: Value) -> (String, Value) {
    let mut body = json!({"name": "acme admin", "account": "acme", "management": true});
    for (field, value) in extra.as_object().unwrap() {
        body[field] = value.clone();
    }
    create(gateway, body).await
}

/// The operator rotates a tenant's management key; the successor then
/// clears the old key's expiry with PATCH: the rotated key would never
/// stop, and the tenant would hold two management keys.
#[tokio::test]
async fn a_rotated_key_s_grace_cannot_be_extended() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (manager, data) = tenant_manager(&gateway, json!({})).await;
        let hash = data["hash"].as_str().unwrap().to_owned();
        let rotated = gateway
            .manage(
                "POST",
                &format!("/api/v1/keys/{hash}/rotate"),
                Some(json!({"grace_seconds": 60})),
            )
            .await;
        assert_eq!(rotated.status, 201, "{name}: {}", rotated.body);
        assert_eq!(rotated.body["data"]["management"], true);
        let successor = rotated.body["key"].as_str().unwrap().to_owned();
        let revived = send(
            gateway.address,
            "PATCH",
            &format!("/api/v1/keys/{hash}"),
            Some(&bearer(&successor)),
            Some(json!({"expires_at": null})),
        )
        .await;
        gateway.clock.advance(Duration::from_secs(3600));
        let old = get_as(gateway.address, "/api/v1/keys", &manager).await;
        assert_eq!(revived.status, 422, "{name}: {}", revived.body);
        assert_eq!(revived.body["error"]["metadata"]["reason"], "rotated_key");
        assert_eq!(
            old.status, 401,
            "{name}: the rotated key stops with its grace"
        );
    }
}

/// The operator gives a tenant a management key that expires; the tenant
/// clears that expiry itself.
#[tokio::test]
async fn a_tenant_cannot_lift_the_expiry_the_operator_set_on_its_key() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (manager, data) =
            tenant_manager(&gateway, json!({"expires_at": "2026-11-19T12:00:00Z"})).await;
        let hash = data["hash"].as_str().unwrap();
        let lifted = send(
            gateway.address,
            "PATCH",
            &format!("/api/v1/keys/{hash}"),
            Some(&bearer(&manager)),
            Some(json!({"expires_at": null})),
        )
        .await;
        assert_refused(&lifted, 409, "own_key", name);
        // Nor through another of its management keys.
        let (second, _) = create(
            &gateway,
            json!({"name": "acme second", "account": "acme", "management": true}),
        )
        .await;
        let by_other = send(
            gateway.address,
            "PATCH",
            &format!("/api/v1/keys/{hash}"),
            Some(&bearer(&second)),
            Some(json!({"expires_at": null})),
        )
        .await;
        assert_refused(&by_other, 403, "operator_only", name);
        gateway.clock.advance(Duration::from_secs(7 * 86_400));
        let later = get_as(gateway.address, "/api/v1/keys", &manager).await;
        assert_eq!(later.status, 401, "{name}: the operator's expiry holds");
    }
}

/// A tenant's management key rotating itself with a month's grace, again
/// and again, would keep several live management keys; a contractor's
/// key that expires tomorrow rotating another manager's key with no grace
/// would get a management key that never expires and lock its owner out.
/// Management keys are the operator's: both are 403, and nothing changes.
#[tokio::test]
async fn an_accounts_manager_rotates_no_management_key() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (manager, data) = tenant_manager(&gateway, json!({})).await;
        let hash = data["hash"].as_str().unwrap().to_owned();
        let (contractor, _) = tenant_manager(
            &gateway,
            json!({"name": "contractor", "expires_at": "2026-11-19T12:00:00Z"}),
        )
        .await;
        for (caller, grace) in [(&manager, 2_592_000), (&contractor, 0)] {
            let rotated = send(
                gateway.address,
                "POST",
                &format!("/api/v1/keys/{hash}/rotate"),
                Some(&bearer(caller)),
                Some(json!({"grace_seconds": grace})),
            )
            .await;
            assert_refused(&rotated, 403, "operator_only", name);
        }
        let listed = get_as(gateway.address, "/api/v1/keys", &manager).await;
        assert_eq!(listed.status, 200, "{name}: the owner keeps its key");
        let managers = listed.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|key| key["management"] == true)
            .count();
        assert_eq!(managers, 2, "{name}: no management key was made");
        // An ordinary key of the account is still the manager's to rotate,
        // into a successor no wider than it.
        let (_, app) = create(
            &gateway,
            json!({"name": "app", "account": "acme", "limit": 3,
                   "expires_at": "2026-12-01T00:00:00Z"}),
        )
        .await;
        let rotated = send(
            gateway.address,
            "POST",
            &format!("/api/v1/keys/{}/rotate", app["hash"].as_str().unwrap()),
            Some(&bearer(&contractor)),
            Some(json!({"grace_seconds": 0})),
        )
        .await;
        assert_eq!(rotated.status, 201, "{name}: {}", rotated.body);
        for field in ["expires_at", "limit", "management", "account"] {
            assert_eq!(rotated.body["data"][field], app[field], "{name}: {field}");
        }
    }
}

/// The operator rotates a management key: its successor is a management
/// key of the same account, ending when it would have, never later.
#[tokio::test]
async fn a_management_key_s_successor_never_outlives_nor_outranks_it() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (_, data) =
            tenant_manager(&gateway, json!({"expires_at": "2026-11-19T12:00:00Z"})).await;
        let hash = data["hash"].as_str().unwrap();
        let rotated = gateway
            .manage(
                "POST",
                &format!("/api/v1/keys/{hash}/rotate"),
                Some(json!({"grace_seconds": 0})),
            )
            .await;
        assert_eq!(rotated.status, 201, "{name}: {}", rotated.body);
        let successor = &rotated.body["data"];
        for field in ["expires_at", "management", "operator", "account"] {
            assert_eq!(successor[field], data[field], "{name}: {field}");
        }
        let key = rotated.body["key"].as_str().unwrap();
        gateway.clock.advance(Duration::from_secs(2 * 86_400));
        let later = get_as(gateway.address, "/api/v1/keys", key).await;
        assert_refused(&later, 401, "expired_key", name);
    }
}

/// The operator disables a tenant's management key (and an ordinary one);
/// another manager of the account enables them again. Only the operator
/// lifts the operator's disable; a manager still lifts its own.
#[tokio::test]
async fn only_the_operator_enables_a_key_the_operator_disabled() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (manager, _) = tenant_manager(&gateway, json!({})).await;
        let (suspended, data) = tenant_manager(&gateway, json!({"name": "suspended"})).await;
        let (_, app) = create(&gateway, json!({"name": "app", "account": "acme"})).await;
        let as_manager = |method: &'static str, path: String, body: Value| {
            let manager = manager.clone();
            let address = gateway.address;
            async move { send(address, method, &path, Some(&bearer(&manager)), Some(body)).await }
        };
        for key in [&data, &app] {
            let path = format!("/api/v1/keys/{}", key["hash"].as_str().unwrap());
            let off = gateway
                .manage("PATCH", &path, Some(json!({"disabled": true})))
                .await;
            assert_eq!(off.status, 200, "{name}: {}", off.body);
            let enabled = as_manager("PATCH", path.clone(), json!({"disabled": false})).await;
            assert_refused(&enabled, 403, "operator_only", name);
            let read = gateway.manage("GET", &path, None).await;
            assert_eq!(read.body["data"]["disabled"], true, "{name}");
            // Disabled again by the manager, it is still the operator's.
            as_manager("PATCH", path.clone(), json!({"disabled": true})).await;
            let enabled = as_manager("PATCH", path.clone(), json!({"disabled": false})).await;
            assert_refused(&enabled, 403, "operator_only", name);
        }
        assert_refused(
            &get_as(gateway.address, "/api/v1/keys", &suspended).await,
            401,
            "disabled_key",
            name,
        );
        // The operator lifts it; then a manager's own disable is its own.
        let path = format!("/api/v1/keys/{}", data["hash"].as_str().unwrap());
        let on = gateway
            .manage("PATCH", &path, Some(json!({"disabled": false})))
            .await;
        assert_eq!(on.body["data"]["disabled"], false, "{name}");
        assert_eq!(
            get_as(gateway.address, "/api/v1/keys", &suspended)
                .await
                .status,
            200
        );
        let off = as_manager("PATCH", path.clone(), json!({"disabled": true})).await;
        assert_eq!(off.status, 200, "{name}: {}", off.body);
        let on = as_manager("PATCH", path.clone(), json!({"disabled": false})).await;
        assert_eq!(on.status, 200, "{name}: {}", on.body);
        assert_eq!(on.body["data"]["disabled"], false, "{name}");
    }
}

/// A key rotated with a grace, then reported leaked or disabled while the
/// grace runs: its successor (which whoever held it may have made) goes
/// with it. Once the grace is over, the old key's fate is its own.
#[tokio::test]
async fn a_leak_or_disable_of_a_key_in_its_grace_reaches_its_successors() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let rotate = |hash: String, grace: u64| {
            let gateway = &gateway;
            async move {
                let rotated = gateway
                    .manage(
                        "POST",
                        &format!("/api/v1/keys/{hash}/rotate"),
                        Some(json!({ "grace_seconds": grace })),
                    )
                    .await;
                assert_eq!(rotated.status, 201, "{}", rotated.body);
                (
                    rotated.body["key"].as_str().unwrap().to_owned(),
                    rotated.body["data"]["hash"].as_str().unwrap().to_owned(),
                )
            }
        };
        // Leaked: a management key rotated twice, the first two in grace.
        let (_, data) = tenant_manager(&gateway, json!({})).await;
        let first = data["hash"].as_str().unwrap().to_owned();
        let (_, second) = rotate(first.clone(), 3600).await;
        let (third_key, third) = rotate(second.clone(), 3600).await;
        let reported = gateway
            .manage("POST", &format!("/api/v1/keys/{first}/leaked"), None)
            .await;
        assert_eq!(reported.status, 200, "{name}: {}", reported.body);
        for hash in [&second, &third] {
            let read = gateway
                .manage("GET", &format!("/api/v1/keys/{hash}"), None)
                .await;
            assert_eq!(read.body["data"]["disabled"], true, "{name}");
            assert_eq!(read.body["data"]["leak"]["reported_by"], "operator");
        }
        assert_refused(
            &get_as(gateway.address, "/api/v1/keys", &third_key).await,
            401,
            "leaked_key",
            name,
        );
        // Disabled in its grace: the successor is disabled too, as the
        // operator's.
        let (_, app) = create(&gateway, json!({"name": "app", "account": "acme"})).await;
        let app_hash = app["hash"].as_str().unwrap().to_owned();
        let (next_key, next) = rotate(app_hash.clone(), 3600).await;
        gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{app_hash}"),
                Some(json!({"disabled": true})),
            )
            .await;
        let read = gateway
            .manage("GET", &format!("/api/v1/keys/{next}"), None)
            .await;
        assert_eq!(read.body["data"]["disabled"], true, "{name}");
        assert_refused(
            &chat_as(gateway.address, &next_key).await,
            401,
            "disabled_key",
            name,
        );
        // Past the grace, a disable of the old key is its own.
        let (_, late) = create(&gateway, json!({"name": "late"})).await;
        let late_hash = late["hash"].as_str().unwrap().to_owned();
        let (late_key, _) = rotate(late_hash.clone(), 60).await;
        gateway.clock.advance(Duration::from_secs(120));
        gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{late_hash}"),
                Some(json!({"disabled": true})),
            )
            .await;
        assert_eq!(
            chat_as(gateway.address, &late_key).await.status,
            200,
            "{name}"
        );
    }
}

/// A leak reported by an account's manager is recorded as that manager's,
/// not the operator's.
#[tokio::test]
async fn a_leak_report_names_its_real_reporter() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (manager, data) = tenant_manager(&gateway, json!({})).await;
        let (_, app) = create(&gateway, json!({"name": "app", "account": "acme"})).await;
        let reported = send(
            gateway.address,
            "POST",
            &format!("/api/v1/keys/{}/leaked", app["hash"].as_str().unwrap()),
            Some(&bearer(&manager)),
            None,
        )
        .await;
        assert_eq!(reported.status, 200, "{name}: {}", reported.body);
        let prefix = &data["hash"].as_str().unwrap()[..8];
        assert_eq!(
            reported.body["data"]["leak"]["reported_by"],
            format!("manager:{prefix}"),
            "{name}"
        );
    }
}

/// Rotating a key past its expiry gives a successor born expired.
#[tokio::test]
async fn an_expired_key_is_not_rotated_into_a_dead_successor() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (_, data) = create(
            &gateway,
            json!({"name": "short", "expires_at": "2026-11-18T13:00:00Z"}),
        )
        .await;
        gateway.clock.advance(Duration::from_secs(2 * 3600));
        let hash = data["hash"].as_str().unwrap();
        let rotated = gateway
            .manage("POST", &format!("/api/v1/keys/{hash}/rotate"), None)
            .await;
        assert_refused(&rotated, 422, "expired_key", name);
    }
}

/// The directory's rotation checks nothing of the key it edits: a key
/// reported leaked (or disabled) between the handler's read and the
/// rotation's write gets a working successor.
#[tokio::test]
async fn a_leaked_key_gets_no_successor_whoever_rotates_it() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let (_, data) = create(&gateway, json!({"name": "leaky"})).await;
        let hash = data["hash"].as_str().unwrap();
        let reported = gateway
            .manage("POST", &format!("/api/v1/keys/{hash}/leaked"), None)
            .await;
        assert_eq!(reported.status, 200, "{name}: {}", reported.body);
        let outcome = gateway
            .directory
            .rotate_key(&KeyHash::from_hex(hash).unwrap(), Duration::from_secs(60))
            .await
            .unwrap();
        assert!(
            matches!(outcome, modelgate::keys::RotateOutcome::NotRotatable(_)),
            "{name}: {outcome:?}"
        );
    }
}

/// Two rotations at once: one successor between them, the other refused.
#[tokio::test]
async fn two_rotations_at_once_make_one_successor() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        for _ in 0..20 {
            let (_, data) = create(&gateway, json!({"name": "twice"})).await;
            let hash = KeyHash::from_hex(data["hash"].as_str().unwrap()).unwrap();
            let (a, b) = tokio::join!(
                gateway.directory.rotate_key(&hash, Duration::from_secs(60)),
                gateway.directory.rotate_key(&hash, Duration::from_secs(60)),
            );
            let won = [a.unwrap(), b.unwrap()]
                .into_iter()
                .filter(|outcome| matches!(outcome, modelgate::keys::RotateOutcome::Rotated { .. }))
                .count();
            assert_eq!(won, 1, "{name}");
            let listed = gateway
                .manage("GET", "/api/v1/keys?include_disabled=true", None)
                .await;
            let named = listed.body["data"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|key| key["name"] == "twice")
                .count();
            assert_eq!(named % 2, 0, "{name}: an orphan successor is left");
            for key in listed.body["data"].as_array().unwrap() {
                if key["name"] == "twice" {
                    gateway
                        .manage(
                            "DELETE",
                            &format!("/api/v1/keys/{}", key["hash"].as_str().unwrap()),
                            None,
                        )
                        .await;
                }
            }
        }
    }
}

/// PATCH expires_at on the calling key: the lock-out own_key guards
/// against for disable and delete.
#[tokio::test]
async fn no_key_sets_its_own_expiry() {
    for backend in backends().await {
        let gateway = gateway(backend.store).await;
        let name = backend.name;
        let hash = KeyHash::of(&gateway.admin).to_hex();
        let set = gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{hash}"),
                Some(json!({"expires_at": "2026-11-18T12:01:00Z"})),
            )
            .await;
        gateway.clock.advance(Duration::from_secs(120));
        let after = gateway.manage("GET", "/api/v1/keys", None).await;
        assert_refused(&set, 409, "own_key", name);
        assert_eq!(after.status, 200, "{name}: {}", after.body);
    }
}
