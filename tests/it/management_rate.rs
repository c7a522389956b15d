//! The rate of an account's calls to the API over real HTTP: on a
//! `MemoryStore` shared by two instances and on two instances sharing a
//! real redis-server, an account's management key gets 429
//! `management_rate` with `Retry-After` past the configured rate, whatever
//! instance it calls and whatever route (a write changes nothing), while
//! another account's keys and the operator are served. An account's
//! inference keys share its count on the usage routes: one scanning its
//! records is held up alone.

use crate::common;
use crate::mock;

use std::net::SocketAddr;
use std::sync::Arc;

use common::gateway::{instance, key_of};
use common::redis_server::RedisServer;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::store::{MemoryStore, RedisStore, RedisStoreConfig};
use serde_json::{Value, json};

/// 5 management calls per account, then one each 12 s.
const CONFIG: &str = r#"{"retry": {"max_attempts": 1},
    "management_rate": {"gcra": {"requests": 5, "period_seconds": 60, "burst": 5}}}"#;

struct Reply {
    status: u16,
    retry_after: Option<u64>,
    body: Value,
}

async fn call(address: SocketAddr, method: reqwest::Method, path: &str, key: &str) -> Reply {
    let mut request = reqwest::Client::new()
        .request(method.clone(), format!("http://{address}{path}"))
        .bearer_auth(key);
    if method == reqwest::Method::POST {
        request = request
            .header("content-type", "application/json")
            .body(json!({"name": "made while limited"}).to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap().parse().unwrap());
    let text = response.text().await.unwrap();
    Reply {
        status,
        retry_after,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

async fn manager_of(store: &SharedStore, account: &str, operator: bool) -> String {
    let (key, _) = KeyDirectory::new(store.clone())
        .create_key(NewKey {
            account: account.into(),
            management: true,
            scoped_to_account: !operator,
            ..NewKey::named("manager")
        })
        .await
        .unwrap();
    key.expose().to_owned()
}

async fn an_account_past_its_rate_is_refused_alone(first: SharedStore, second: SharedStore) {
    let base = mock::start(mock::MockConfig::default()).await;
    let instances = [
        instance(first.clone(), &base, CONFIG).await,
        instance(second, &base, CONFIG).await,
    ];
    let acme = manager_of(&first, "acme", false).await;
    let globex = manager_of(&first, "globex", false).await;
    let operator = manager_of(&first, "default", true).await;
    let acme_client = key_of(&first, "acme", None).await;
    let get = reqwest::Method::GET;

    // Five calls of acme's manager, over both instances, are served.
    for index in 0..5 {
        let reply = call(instances[index % 2], get.clone(), "/api/v1/keys", &acme).await;
        assert_eq!(reply.status, 200, "call {index}: {}", reply.body);
    }
    // The sixth, on either instance and any route, is 429 with Retry-After.
    for (address, method, path) in [
        (instances[0], get.clone(), "/api/v1/keys"),
        (instances[1], get.clone(), "/api/v1/accounts/acme"),
        (instances[1], reqwest::Method::POST, "/api/v1/keys"),
    ] {
        let reply = call(address, method, path, &acme).await;
        assert_eq!(reply.status, 429, "{path}: {}", reply.body);
        assert_eq!(
            reply.body["error"]["metadata"]["limit_source"], "management_rate",
            "{}",
            reply.body
        );
        let wait = reply.retry_after.expect("a Retry-After");
        assert!((1..=12).contains(&wait), "{wait}");
        assert!(
            reply.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("acme"),
            "{}",
            reply.body
        );
    }
    // Another account's manager and the operator are served meanwhile;
    // acme's own inference key shares acme's count.
    for address in instances {
        let reply = call(address, get.clone(), "/api/v1/keys", &globex).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        for _ in 0..5 {
            let reply = call(address, get.clone(), "/api/v1/keys?account=acme", &operator).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
        let reply = call(address, get.clone(), "/api/v1/key", &acme_client).await;
        assert_eq!(reply.status, 429, "{}", reply.body);
    }
    // An inference key that scans its records is held up at its account's
    // rate, over both instances, while another tenant reads its credits.
    let scanner = key_of(&first, "initech", None).await;
    let reader = key_of(&first, "globex", None).await;
    for index in 0..5 {
        let reply = call(
            instances[index % 2],
            get.clone(),
            "/api/v1/generations?limit=100",
            &scanner,
        )
        .await;
        assert_eq!(reply.status, 200, "scan {index}: {}", reply.body);
    }
    let reply = call(
        instances[1],
        get.clone(),
        "/api/v1/generations?limit=100",
        &scanner,
    )
    .await;
    assert_eq!(reply.status, 429, "{}", reply.body);
    assert_eq!(
        reply.body["error"]["metadata"]["limit_source"], "management_rate",
        "{}",
        reply.body
    );
    let reply = call(instances[0], get.clone(), "/api/v1/credits", &reader).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // The refused write made nothing.
    let listed = call(instances[0], get, "/api/v1/keys?account=acme", &operator).await;
    let names: Vec<&str> = listed.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|key| key["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"made while limited"), "{names:?}");
}

#[tokio::test]
async fn an_account_past_its_management_rate_is_refused_alone_on_memory() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    an_account_past_its_rate_is_refused_alone(store.clone(), store).await;
}

#[tokio::test]
async fn an_account_past_its_management_rate_is_refused_alone_across_instances_sharing_redis() {
    let server = RedisServer::start();
    let connect = || async {
        let store: SharedStore = Arc::new(
            RedisStore::connect(&server.url(), RedisStoreConfig::default())
                .await
                .unwrap(),
        );
        store
    };
    an_account_past_its_rate_is_refused_alone(connect().await, connect().await).await;
}

#[tokio::test]
async fn a_bad_management_rate_stops_start_up() {
    use modelgate::proxy::{GatewayConfig, GatewayPlan, OAuthSection};
    for (json, words) in [
        (
            r#"{"management_rate": {"gcra": {"requests": 0, "period_seconds": 60, "burst": 5}}}"#,
            "management_rate",
        ),
        (
            r#"{"oauth": {"max_pending_codes_per_account": 0}}"#,
            "max_pending_codes_per_account",
        ),
    ] {
        // Refused as the config is read, naming the field.
        let error = GatewayConfig::from_json(json).expect_err(json).to_string();
        assert!(error.contains(words), "{json}: {error}");
    }
    // A config built in code is checked when its plan is made, which a
    // gateway is built from.
    let config = GatewayConfig {
        oauth: OAuthSection {
            max_pending_codes_per_account: Some(0),
            ..OAuthSection::default()
        },
        ..GatewayConfig::default()
    };
    let error = match GatewayPlan::new(&config) {
        Err(error) => error.to_string(),
        Ok(_) => panic!("max_pending_codes_per_account 0 was accepted"),
    };
    assert!(error.contains("max_pending_codes_per_account"), "{error}");
    assert!(GatewayConfig::from_json(r#"{"oauth": {"allow_plain": true}}"#).is_err());
}
