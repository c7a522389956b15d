//! The whole gateway in process over real HTTP, for tests that drive it
//! with a real client.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use modelgate::clock::{Clock, SystemClock};
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::proxy::{GatewayConfig, GatewayPlan, Upstream, gateway_with_clock};
use modelgate::store::KeyLimit;
use serde_json::Value;

use super::http_server::serve;

/// One gateway instance on `store` in front of the upstream at `base`,
/// on the system clock.
pub async fn instance(store: SharedStore, base: &str, config: &str) -> SocketAddr {
    instance_with_clock(store, base, config, Arc::new(SystemClock)).await
}

/// [`instance`] on `clock`.
pub async fn instance_with_clock(
    store: SharedStore,
    base: &str,
    config: &str,
    clock: Arc<dyn Clock>,
) -> SocketAddr {
    instance_with_cache(store, base, config, clock, Duration::from_secs(1)).await
}

/// [`instance_with_clock`] whose key cache trusts a lookup for `key_cache_ttl`.
pub async fn instance_with_cache(
    store: SharedStore,
    base: &str,
    config: &str,
    clock: Arc<dyn Clock>,
    key_cache_ttl: Duration,
) -> SocketAddr {
    let config = GatewayConfig::from_json(config).unwrap();
    let plan = GatewayPlan::new(&config).unwrap();
    let upstream = Upstream::new(&config.upstream_config(Some(base)).unwrap()).unwrap();
    let service = gateway_with_clock(&plan, store, upstream, clock, key_cache_ttl);
    serve(service).await
}

/// A new key of `account`, with `limit` when given; its plaintext.
pub async fn key_of(store: &SharedStore, account: &str, limit: Option<KeyLimit>) -> String {
    let new = NewKey {
        account: account.to_owned(),
        limit_nanos: limit.map(|limit| limit.limit_nanos),
        limit_reset: limit.and_then(|limit| limit.reset),
        ..NewKey::named("client")
    };
    KeyDirectory::new(store.clone())
        .create_key(new)
        .await
        .unwrap()
        .0
        .expose()
        .to_owned()
}

/// A chat completion through the gateway at `address`: status and body.
pub async fn chat(address: SocketAddr, key: &str, body: &Value) -> (u16, Value) {
    let reply = reqwest::Client::new()
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = reply.status().as_u16();
    let text = reply.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}
