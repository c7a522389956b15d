//! A service on the crate's terms (issue 51, points 3 and 4): provisioning
//! that survives restarts on SQLite and Redis (`ensure_key`, `grant_once`,
//! `StoreLocation::open`), and the key routes mounted under a prefix of an
//! axum service's own, over real HTTP.

use std::collections::HashSet;
use std::net::SocketAddr;

use axum::Router;
use axum::routing::{get, post};
use modelgate::api::MountedKeyRoutes;
use modelgate::auth::BearerAuthLayer;
use modelgate::body::BodyLimitLayer;
use modelgate::keys::{EnsuredKey, KeyDirectory, NewKey};
use modelgate::store::{NANOS_PER_CREDIT, OpenStoreError, StoreLocation, TopUpOutcome};
use serde_json::{Value, json};
use tower::ServiceBuilder;

use crate::common::redis_server::RedisServer;

/// What a service runs at each start: its key and its grant. The key's
/// hash, and whether this start made it.
async fn start_service(location: &StoreLocation) -> (modelgate::keys::KeyHash, bool, TopUpOutcome) {
    let directory = KeyDirectory::new(location.open().await.unwrap());
    let new = NewKey {
        account: "acme".into(),
        ..NewKey::named("service")
    };
    directory.ensure_account("acme").await.unwrap();
    let (hash, created) = match directory.ensure_key("service-key", new).await.unwrap() {
        EnsuredKey::Created(key, record) => {
            assert_eq!(key.hash(), record.hash);
            (record.hash, true)
        }
        EnsuredKey::Existing(record) => (record.hash, false),
        EnsuredKey::Deleted(_) => panic!("nobody deleted the key"),
    };
    let grant = directory
        .grant_once("acme", 10 * NANOS_PER_CREDIT, "initial-grant")
        .await
        .unwrap();
    (hash, created, grant)
}

async fn keys_of(location: &StoreLocation, account: &str) -> usize {
    let directory = KeyDirectory::new(location.open().await.unwrap());
    directory
        .list(0, true, Some(account), 100)
        .await
        .unwrap()
        .len()
}

async fn restarts_make_nothing_new(location: StoreLocation) {
    let (first, created, grant) = start_service(&location).await;
    assert!(created);
    assert!(matches!(grant, TopUpOutcome::Credited(_)));
    for _ in 0..2 {
        let (again, created, grant) = start_service(&location).await;
        assert_eq!(again, first);
        assert!(!created, "a restart makes no key");
        assert!(matches!(grant, TopUpOutcome::Repeated(_)), "{grant:?}");
    }
    let store = location.open().await.unwrap();
    let balance = store.account_balance("acme").await.unwrap();
    assert_eq!(balance.balance_nanos, 10 * NANOS_PER_CREDIT);
    assert_eq!(balance.purchased_nanos, 10 * NANOS_PER_CREDIT);
    assert_eq!(keys_of(&location, "acme").await, 1);
}

#[tokio::test]
async fn a_restart_on_sqlite_makes_no_key_and_gives_no_credits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    restarts_make_nothing_new(StoreLocation::Sqlite(path)).await;
}

#[tokio::test]
async fn a_restart_on_redis_makes_no_key_and_gives_no_credits() {
    let redis = RedisServer::start();
    restarts_make_nothing_new(redis.url().parse().unwrap()).await;
}

#[tokio::test]
async fn instances_starting_at_once_on_redis_make_one_key() {
    let redis = RedisServer::start();
    let location: StoreLocation = redis.url().parse().unwrap();
    // Each its own connection, as separate processes would have.
    let mut instances = Vec::new();
    for _ in 0..6 {
        instances.push(KeyDirectory::new(location.open().await.unwrap()));
    }
    instances[0].ensure_account("acme").await.unwrap();
    let calls: Vec<_> = instances
        .into_iter()
        .map(|directory| {
            tokio::spawn(async move {
                let new = NewKey {
                    account: "acme".into(),
                    ..NewKey::named("service")
                };
                directory.ensure_key("service-key", new).await.unwrap()
            })
        })
        .collect();
    let mut created = 0;
    let mut hashes = HashSet::new();
    for call in calls {
        match call.await.unwrap() {
            EnsuredKey::Created(_, record) => {
                created += 1;
                hashes.insert(record.hash);
            }
            EnsuredKey::Existing(record) => {
                hashes.insert(record.hash);
            }
            EnsuredKey::Deleted(_) => panic!("nobody deleted the key"),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(hashes.len(), 1);
    assert_eq!(
        keys_of(&location, "acme").await,
        1,
        "the losers' keys are gone"
    );
}

#[tokio::test]
async fn a_deleted_key_is_not_made_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let location = StoreLocation::Sqlite(dir.path().join("state.db"));
    let (hash, _, _) = start_service(&location).await;
    let directory = KeyDirectory::new(location.open().await.unwrap());
    assert!(directory.delete(&hash).await.unwrap());
    drop(directory);
    let directory = KeyDirectory::new(location.open().await.unwrap());
    let new = NewKey {
        account: "acme".into(),
        ..NewKey::named("service")
    };
    let again = directory.ensure_key("service-key", new).await.unwrap();
    assert!(matches!(again, EnsuredKey::Deleted(deleted) if deleted == hash));
    assert_eq!(keys_of(&location, "acme").await, 0);
}

#[tokio::test]
async fn each_location_opens_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    for text in [
        "memory".to_owned(),
        format!("sqlite:{}", dir.path().join("open.db").display()),
        redis.url(),
    ] {
        let location: StoreLocation = text.parse().unwrap();
        let store = location.open().await.unwrap();
        let balance = store.top_up("acct", 3).await.unwrap();
        assert_eq!(balance.balance_nanos, 3, "{text}");
    }
    // Data kept where the location says: the file is there, Redis has it.
    assert!(dir.path().join("open.db").exists());
    let again: StoreLocation = redis.url().parse().unwrap();
    let store = again.open().await.unwrap();
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        3
    );
}

#[tokio::test]
async fn a_redis_that_is_not_there_is_an_error_naming_it_without_its_password() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let location: StoreLocation = format!("redis://user:hunter2@127.0.0.1:{port}")
        .parse()
        .unwrap();
    let Err(error) = location.open().await else {
        panic!("nothing listens there");
    };
    assert!(matches!(error, OpenStoreError::Store { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
}

/// An axum service of its own: `/hello` open, a model route behind
/// BearerAuth, the key routes mounted under `/billing/v2`.
async fn serve_mounted(directory: KeyDirectory) -> SocketAddr {
    let guarded = Router::new()
        .route(
            "/v1/chat/completions",
            post(|| async { "from the service" }),
        )
        .layer(
            ServiceBuilder::new()
                .layer(BearerAuthLayer::new(directory.clone()))
                .layer(BodyLimitLayer::new()),
        );
    let app = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .merge(guarded)
        .nest_service("/billing/v2", MountedKeyRoutes::new(directory));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

async fn send(
    address: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, String) {
    let mut request =
        reqwest::Client::new().request(method.parse().unwrap(), format!("http://{address}{path}"));
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"))
}

#[tokio::test]
async fn key_routes_mounted_under_a_prefix_answer_there_and_nowhere_else() {
    let store = StoreLocation::Memory.open().await.unwrap();
    let directory = KeyDirectory::new(store);
    let (inference, _) = directory
        .create_key(NewKey::named("inference"))
        .await
        .unwrap();
    let (manager, _) = directory
        .create_key(NewKey {
            management: true,
            ..NewKey::named("operator")
        })
        .await
        .unwrap();
    let (inference, manager) = (inference.expose(), manager.expose());
    let address = serve_mounted(directory).await;

    // The calling key's own query, at the mounted path.
    let (status, body) = send(address, "GET", "/billing/v2/key", Some(inference), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["data"]["label"], "inference");
    let (status, body) = send(
        address,
        "GET",
        "/billing/v2/user/balance",
        Some(inference),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // A management key reaches the mounted routes...
    let (status, body) = send(address, "GET", "/billing/v2/key", Some(manager), None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(
        address,
        "POST",
        "/billing/v2/keys",
        Some(manager),
        Some(json!({"name": "made-here"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = send(
        address,
        "GET",
        "/billing/v2/keys?offset=0",
        Some(manager),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["data"].as_array().unwrap().len(), 3);
    // ...and is still refused on the service's model route.
    let chat = json!({"model": "demo/model", "messages": [{"role": "user", "content": "hi"}]});
    let (status, body) = send(
        address,
        "POST",
        "/v1/chat/completions",
        Some(manager),
        Some(chat.clone()),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = send(
        address,
        "POST",
        "/v1/chat/completions",
        Some(inference),
        Some(chat),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The permission matrix holds: an inference key may not manage keys,
    // no key is 401, a path not in the table is 404.
    let (status, body) = send(
        address,
        "POST",
        "/billing/v2/keys",
        Some(inference),
        Some(json!({"name": "nope"})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(json_of(&body)["error"]["code"], 403);
    let (status, body) = send(address, "GET", "/billing/v2/key", None, None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = send(
        address,
        "GET",
        "/billing/v2/chat/completions",
        Some(inference),
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = send(
        address,
        "GET",
        "/billing/v2/api/v1/key",
        Some(inference),
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    // The unprefixed paths are the service's, not the key routes'.
    let (status, _) = send(address, "GET", "/api/v1/key", Some(inference), None).await;
    assert_eq!(status, 404);
    // The service's own route, untouched by a bad key.
    let (status, body) = send(address, "GET", "/hello", Some("not-a-key"), None).await;
    assert_eq!((status, body.as_str()), (200, "hello"));
}
