//! What the layer benchmarks share: a runtime, both stores, and chat
//! requests as the layers before the measured one leave them.

#![allow(dead_code)]

use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use modelgate::auth::{KeyHash, Principal};
use modelgate::body::ChatRequest;
use modelgate::context::RequestContext;
use modelgate::keys::SharedStore;
use modelgate::store::{MemoryStore, RedisStore, RedisStoreConfig};

#[path = "../../tests/it/common/redis_server.rs"]
pub mod redis_server;

/// Runs `bench` on a current-thread runtime, once with `MemoryStore` and
/// once with `RedisStore` on a fresh loopback `redis-server`.
pub fn on_both_stores(mut bench: impl FnMut(&tokio::runtime::Runtime, &str, SharedStore)) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    bench(&runtime, "memory", Arc::new(MemoryStore::new()));
    let server = redis_server::RedisServer::start();
    let redis = runtime
        .block_on(RedisStore::connect(
            &server.url(),
            RedisStoreConfig {
                // A bench measures speed, not failure handling: a busy
                // machine (CI runs each bench once) must not time it out.
                call_timeout: std::time::Duration::from_secs(10),
                ..RedisStoreConfig::default()
            },
        ))
        .unwrap();
    bench(&runtime, "redis", Arc::new(redis));
}

/// A chat request with the `Principal` BearerAuth and the `ChatRequest`
/// BodyLimit would have added.
pub fn chat(account: &str, model: &str, stream: bool) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model": "{model}", "stream": {stream}, "max_tokens": 100, "messages": [{{"role": "user", "content": "x"}}]}}"#
    );
    let mut request = Request::post("/api/v1/chat/completions")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let context = RequestContext::of_mut(&mut request);
    context.principal = Some(Principal {
        key_hash: KeyHash::of("bench"),
        account_id: account.into(),
        label: "bench".into(),
        management: false,
        operator: false,
        key_limit: None,
        include_byok_in_limit: false,
        expires_at: None,
        rotated: false,
        allowed_models: None,
        rate_limit: None,
    });
    context.chat = Some(Arc::new(ChatRequest::parse(body.as_bytes()).unwrap()));
    request
}
