//! One store per backend a test runs against: memory, Redis on a fresh
//! server (on the caller's clock, so the test's instants decide), and for
//! the tests that take it, SQLite in a file of its own.

#![allow(dead_code)]

use std::sync::Arc;

use modelgate::keys::SharedStore;
use modelgate::store::{MemoryStore, RedisStore, RedisStoreConfig, TimeSource};

use super::redis_server::RedisServer;

/// A store, its name for messages, and the server or folder it lives in.
pub struct Backend {
    pub name: &'static str,
    pub store: SharedStore,
    pub _server: Option<RedisServer>,
    #[cfg(feature = "sqlite")]
    pub _folder: Option<tempfile::TempDir>,
}

/// Memory, and Redis on a server of its own.
pub async fn backends() -> Vec<Backend> {
    let server = RedisServer::start();
    vec![
        Backend {
            name: "memory",
            store: Arc::new(MemoryStore::new()),
            _server: None,
            #[cfg(feature = "sqlite")]
            _folder: None,
        },
        Backend {
            name: "redis",
            store: redis_store(&server).await,
            _server: Some(server),
            #[cfg(feature = "sqlite")]
            _folder: None,
        },
    ]
}

/// Memory, SQLite in a fresh file, and Redis on a server of its own.
#[cfg(feature = "sqlite")]
pub async fn every_backend() -> Vec<Backend> {
    use modelgate::store::{SqliteStore, SqliteStoreConfig};

    let folder = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(
        folder.path().join("modelgate.db"),
        SqliteStoreConfig::default(),
    )
    .unwrap();
    let mut all = backends().await;
    all.insert(
        1,
        Backend {
            name: "sqlite",
            store: Arc::new(sqlite),
            _server: None,
            _folder: Some(folder),
        },
    );
    all
}

/// Another store on `server`'s Redis, as another instance has.
pub async fn redis_store(server: &RedisServer) -> SharedStore {
    Arc::new(
        RedisStore::connect(
            &server.url(),
            RedisStoreConfig {
                time_source: TimeSource::Caller,
                ..RedisStoreConfig::default()
            },
        )
        .await
        .unwrap(),
    )
}
