//! Leaked keys over real HTTP: a report revokes the key on every instance
//! sharing the store at once, whatever their key caches hold; the key stays
//! readable, cannot be enabled again, and records its last use.

mod common;
#[path = "../examples/support/mock.rs"]
mod mock;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::gateway::{chat, instance_with_cache, key_of};
use common::redis_server::RedisServer;
use modelgate::clock::SystemClock;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::store::{MemoryStore, RedisStore, RedisStoreConfig, NANOS_PER_CREDIT};
use serde_json::{json, Value};

const CONFIG: &str = r#"{"retry": {"max_attempts": 1}}"#;

/// Long enough that only a bypass of the cache can explain a refusal.
const LONG_CACHE: Duration = Duration::from_secs(3600);

fn paid() -> Value {
    json!({"model": "openai/gpt-4o-mini", "max_tokens": 5,
           "messages": [{"role": "user", "content": "Hi"}]})
}

fn free() -> Value {
    json!({"model": "meta-llama/llama-3.1-8b-instruct:free",
           "messages": [{"role": "user", "content": "Hi"}]})
}

async fn redis_store(server: &RedisServer) -> SharedStore {
    Arc::new(
        RedisStore::connect(&server.url(), RedisStoreConfig::default())
            .await
            .unwrap(),
    )
}

async fn instances(stores: &[SharedStore]) -> Vec<SocketAddr> {
    let base = mock::start(mock::MockConfig::default()).await;
    let mut addresses = Vec::new();
    for store in stores {
        addresses.push(
            instance_with_cache(
                store.clone(),
                &base,
                CONFIG,
                Arc::new(SystemClock),
                LONG_CACHE,
            )
            .await,
        );
    }
    addresses
}

async fn operator_key(store: &SharedStore) -> String {
    let new = NewKey {
        management: true,
        ..NewKey::named("operator")
    };
    let (key, _) = KeyDirectory::new(store.clone())
        .create_key(new)
        .await
        .unwrap();
    key.expose().to_owned()
}

async fn call(
    method: reqwest::Method,
    address: SocketAddr,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("http://{address}{path}"))
        .header("authorization", format!("Bearer {key}"));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let reply = request.send().await.unwrap();
    let status = reply.status().as_u16();
    let text = reply.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn reason(body: &Value) -> &str {
    body["error"]["metadata"]["reason"]
        .as_str()
        .unwrap_or_default()
}

/// The key's hash as the management API lists it.
async fn hash_of(address: SocketAddr, admin: &str, name: &str) -> String {
    let (status, keys) = call(reqwest::Method::GET, address, "/api/v1/keys", admin, None).await;
    assert_eq!(status, 200, "{keys}");
    keys["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|key| key["name"] == name)
        .unwrap_or_else(|| panic!("no key named {name}: {keys}"))["hash"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The operator reports a key through instance A; instance B, whose cache
/// holds the key as live for an hour, refuses it at once on every route.
async fn a_reported_key_is_refused_everywhere_at_once(stores: [SharedStore; 2]) {
    let addresses = instances(&stores).await;
    let (a, b) = (addresses[0], addresses[1]);
    let admin = operator_key(&stores[0]).await;
    stores[0]
        .top_up("default", 100 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let key = key_of(&stores[0], "default", None).await;
    // Both instances cache the key as live.
    for address in [a, b] {
        assert_eq!(chat(address, &key, &paid()).await.0, 200);
        assert_eq!(chat(address, &key, &free()).await.0, 200);
    }
    let hash = hash_of(a, &admin, "client").await;
    let (status, reported) = call(
        reqwest::Method::POST,
        a,
        &format!("/api/v1/keys/{hash}/leaked"),
        &admin,
        Some(json!({"url": "https://github.com/o/r/blob/main/.env", "source": "content"})),
    )
    .await;
    assert_eq!(status, 200, "{reported}");
    assert_eq!(reported["data"]["disabled"], true);
    assert_eq!(reported["data"]["leak"]["reported_by"], "operator");
    assert_eq!(
        reported["data"]["leak"]["url"],
        "https://github.com/o/r/blob/main/.env"
    );
    for address in [b, a] {
        for body in [paid(), free()] {
            let (status, refused) = chat(address, &key, &body).await;
            assert_eq!((status, reason(&refused)), (401, "leaked_key"), "{refused}");
        }
        let (status, refused) =
            call(reqwest::Method::GET, address, "/api/v1/key", &key, None).await;
        assert_eq!((status, reason(&refused)), (401, "leaked_key"), "{refused}");
    }
    // Its usage stays readable; it cannot be enabled again.
    let (status, read) = call(
        reqwest::Method::GET,
        b,
        &format!("/api/v1/keys/{hash}"),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, 200, "{read}");
    assert!(read["data"]["usage"].as_f64().unwrap() > 0.0, "{read}");
    assert!(read["data"]["leak"]["reported_at"].is_string(), "{read}");
    let (status, refused) = call(
        reqwest::Method::PATCH,
        b,
        &format!("/api/v1/keys/{hash}"),
        &admin,
        Some(json!({"disabled": false})),
    )
    .await;
    assert_eq!((status, reason(&refused)), (422, "leaked_key"), "{refused}");
    // Reported again: the first report stands.
    let (status, again) = call(
        reqwest::Method::POST,
        b,
        &format!("/api/v1/keys/{hash}/leaked"),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["data"]["leak"], reported["data"]["leak"]);
    // An unknown hash is 404; a malformed body names its field.
    let (status, _) = call(
        reqwest::Method::POST,
        a,
        &format!("/api/v1/keys/{}/leaked", "ab".repeat(32)),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, refused) = call(
        reqwest::Method::POST,
        a,
        &format!("/api/v1/keys/{hash}/leaked"),
        &admin,
        Some(json!({"url": 5})),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_key_is_refused_at_once_on_memory() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    a_reported_key_is_refused_everywhere_at_once([store.clone(), store]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_key_is_refused_at_once_on_two_instances_sharing_redis() {
    let server = RedisServer::start();
    a_reported_key_is_refused_everywhere_at_once([
        redis_store(&server).await,
        redis_store(&server).await,
    ])
    .await;
}

/// `last_used_at` is written on first use and then at most once a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_records_its_last_use_coarsely() {
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    let addresses = instances(&[store.clone()]).await;
    let admin = operator_key(&store).await;
    let key = key_of(&store, "default", None).await;
    let hash = hash_of(addresses[0], &admin, "client").await;
    let address = addresses[0];
    let read = |hash: String| last_used(address, admin.clone(), hash);
    assert_eq!(read(hash.clone()).await, Value::Null, "never used yet");
    for _ in 0..20 {
        let (status, _) = call(reqwest::Method::GET, address, "/api/v1/key", &key, None).await;
        assert_eq!(status, 200);
    }
    // The write happens in the background.
    let mut first = Value::Null;
    for _ in 0..100 {
        first = read(hash.clone()).await;
        if first.is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(first.is_string(), "{first}");
    let revision_before = redis_revision(&server, &hash);
    for _ in 0..20 {
        let (status, _) = call(reqwest::Method::GET, address, "/api/v1/key", &key, None).await;
        assert_eq!(status, 200);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        read(hash.clone()).await,
        first,
        "written once a minute at most"
    );
    assert_eq!(
        redis_revision(&server, &hash),
        revision_before,
        "no store write within the minute"
    );
}

async fn last_used(address: SocketAddr, admin: String, hash: String) -> Value {
    call(
        reqwest::Method::GET,
        address,
        &format!("/api/v1/keys/{hash}"),
        &admin,
        None,
    )
    .await
    .1["data"]["last_used_at"]
        .clone()
}

/// The key record's revision in Redis: it rises on every write.
fn redis_revision(server: &RedisServer, hash: &str) -> String {
    let output = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &server.port().to_string(),
            "HGET",
            "mg:{r:keys}:revs",
            hash,
        ])
        .output()
        .unwrap();
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}
