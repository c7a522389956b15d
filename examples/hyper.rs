//! modelgate's layers around a plain hyper server, no framework: bearer
//! keys and the error format in front of a `service_fn`.
//!
//! ```sh
//! cargo run --example hyper
//! ```

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use modelgate::auth::{BearerAuthLayer, Principal};
use modelgate::body::BodyLimitLayer;
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::keys::{KeyDirectory, KeyRoutesLayer, NewKey, SharedStore};
use modelgate::store::MemoryStore;
use tower::{service_fn, ServiceBuilder};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let directory = KeyDirectory::new(store);
    let (key, _) = directory.create_key(NewKey::named("hyper-demo")).await?;

    let service = ServiceBuilder::new()
        .layer(ErrorMapperLayer::new())
        .layer(BodyLimitLayer::new())
        .layer(BearerAuthLayer::new(directory.clone()))
        .layer(KeyRoutesLayer::new(directory))
        .service(service_fn(|request: Request<Full<Bytes>>| async move {
            let caller = request
                .extensions()
                .get::<Principal>()
                .map(|p| p.label.clone())
                .unwrap_or_default();
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                "hello, {caller}\n"
            )))))
        }));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    println!(
        "hyper with modelgate on http://{}; try:",
        listener.local_addr()?
    );
    println!(
        "curl -s localhost:3001/anything -H 'authorization: Bearer {}'",
        key.expose()
    );
    loop {
        let (stream, _) = listener.accept().await?;
        let service = TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            let _ = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
