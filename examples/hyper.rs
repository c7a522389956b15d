//! modelgate's layers around a plain hyper server, no framework: bearer
//! keys and the error format in front of a `service_fn`.
//!
//! ```sh
//! cargo run --example hyper                                  # in memory
//! MODELGATE_STORE=sqlite:demo.db cargo run --example hyper   # kept across restarts
//! ```

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::{AuthFailureLimit, AuthFailures, BearerAuthLayer};
use modelgate::body::{BodyLimitLayer, DrainUnreadLayer};
use modelgate::client_addr::ClientAddr;
use modelgate::context::{CheckedStack, RequestContext};
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::in_flight::InFlightLimitLayer;
use modelgate::keys::{EnsuredKey, KeyDirectory, NewKey};
use modelgate::store::StoreLocation;
use tower::{ServiceBuilder, service_fn};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let location: StoreLocation = std::env::var("MODELGATE_STORE")
        .unwrap_or_else(|_| "memory".to_owned())
        .parse()?;
    let directory = KeyDirectory::new(location.open().await?);
    // Made at the first start only: a restart on a durable store makes none.
    let key = match directory
        .ensure_key("hyper-demo", NewKey::named("hyper-demo"))
        .await?
    {
        EnsuredKey::Created(key, _) => key.expose().to_owned(),
        EnsuredKey::Existing(_) => "<the key printed at the first start>".to_owned(),
        EnsuredKey::Deleted(_) => return Err("the demo key was deleted".into()),
    };

    // Checked as it is built: a layer stacked without the one it reads
    // from (KeyRoutes without BearerAuth) is an error here.
    let service = CheckedStack::new()
        // A body refused unread is read into nothing after the answer, so
        // the client can read the answer.
        .plain(DrainUnreadLayer::new(4 << 20, Duration::from_secs(10)))
        .plain(ErrorMapperLayer::new())
        // The key before the body; an address past 20 failures in 10
        // minutes gets 429 without a lookup, but for keys already in use.
        .layer(
            BearerAuthLayer::new(directory.clone())
                .failure_limit(AuthFailures::new(AuthFailureLimit::default())?),
        )
        // Places in flight for keyed requests only.
        .plain(InFlightLimitLayer::new(256))
        .layer(BodyLimitLayer::new())
        .layer(KeyRoutesLayer::new(directory))
        .service(service_fn(|request: Request<Full<Bytes>>| async move {
            let caller = RequestContext::of(&request)
                .and_then(|context| context.principal.as_ref())
                .map(|p| p.label.clone())
                .unwrap_or_default();
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                "hello, {caller}\n"
            )))))
        }))?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    println!(
        "hyper with modelgate on http://{}; try:",
        listener.local_addr()?
    );
    println!(
        "curl -s localhost:3001/anything -H 'authorization: Bearer {}'",
        key
    );
    loop {
        let (stream, peer) = listener.accept().await?;
        // Per-address limits key on the connection's peer.
        let service = ServiceBuilder::new()
            .map_request(move |mut request: Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ClientAddr(peer.ip()));
                request
            })
            .service(service.clone());
        let service = TowerToHyperService::new(service);
        tokio::spawn(async move {
            let _ = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
