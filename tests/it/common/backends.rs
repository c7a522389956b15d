//! One store per backend a test runs against: memory, and Redis on a
//! fresh server (on the caller's clock, so the test's instants decide).

#![allow(dead_code)]

use std::sync::Arc;

use modelgate::keys::SharedStore;
use modelgate::store::{MemoryStore, RedisStore, RedisStoreConfig, TimeSource};

use super::redis_server::RedisServer;

/// A store, its name for messages, and the server it lives on.
pub struct Backend {
    pub name: &'static str,
    pub store: SharedStore,
    pub _server: Option<RedisServer>,
}

/// Memory, and Redis on a server of its own.
pub async fn backends() -> Vec<Backend> {
    let server = RedisServer::start();
    let redis = RedisStore::connect(
        &server.url(),
        RedisStoreConfig {
            time_source: TimeSource::Caller,
            ..RedisStoreConfig::default()
        },
    )
    .await
    .unwrap();
    vec![
        Backend {
            name: "memory",
            store: Arc::new(MemoryStore::new()),
            _server: None,
        },
        Backend {
            name: "redis",
            store: Arc::new(redis),
            _server: Some(server),
        },
    ]
}
