//! The webhook routes alone: the managed-flow routes of a JSON config file,
//! each behind its shared secret and limits.
//!
//! ```sh
//! cargo run --features proxy --example webhooks -- --config webhooks.json [--listen ADDR] [--store memory|sqlite:PATH|redis://…]
//! ```
//!
//! The file holds the plugin entry where the gateway's config keeps it,
//! and the `secrets` providers its SecretRefs name (`default`, the
//! environment, needs no declaring):
//!
//! ```json
//! {"secrets": {"providers": {"vault": {"source": "file", "path": "/run/secrets/hooks.json", "mode": "json"}}},
//!  "plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {
//!   "deploys": {"sessionKey": "agent:main",
//!               "secret": {"source": "env", "provider": "default", "id": "DEPLOY_HOOK_SECRET"}},
//!   "ci": {"sessionKey": "agent:ci",
//!          "secret": {"source": "file", "provider": "vault", "id": "/hooks/ci"}}
//! }}}}}}
//! ```
//!
//! It prints `webhooks listening on http://ADDR`, then one line per served
//! route (`route <id> POST <path>`); a route whose secret cannot be read,
//! or whose provider is not declared, is skipped with a warning on stderr.
//! Any other path answers 404.

#[path = "support/args.rs"]
mod args;
#[path = "support/serve.rs"]
mod serve;

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use modelgate::proxy::GatewayConfig;
use modelgate::secrets::ResolveLimits;
use modelgate::webhook::{WebhookSecretLayer, resolve_routes};
use tokio::net::TcpListener;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, service_fn};

const USAGE: &str = "usage: webhooks --config FILE [--listen ADDR] [--store memory|sqlite:PATH|redis://…] [--redis URL]";

#[tokio::main]
async fn main() {
    let logging = serve::init_logging();
    if let Err(message) = run().await {
        drop(logging);
        eprintln!("webhooks: {message}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let args = args::Args::parse(&["listen", "store", "redis", "config"], USAGE)?;
    let listen: SocketAddr =
        args.parsed("listen", "127.0.0.1:8090".parse().expect("a valid address"))?;
    let path = args
        .get("config")
        .ok_or_else(|| format!("--config is required\n{USAGE}"))?;
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read --config {path}: {error}"))?;
    let config = GatewayConfig::from_json(&text).map_err(|error| format!("{path}: {error}"))?;
    let webhooks = config
        .webhooks()
        .ok_or_else(|| format!("{path}: no plugins.entries.webhooks entry"))?;
    if !webhooks.enabled {
        return Err(format!(
            "{path}: the webhooks plugin is disabled (plugins.entries.webhooks.enabled)"
        ));
    }
    let store = serve::open_store(
        &serve::store_location(args.get("store"), args.get("redis"))?,
        &Default::default(),
    )
    .await?;
    let (routes, _skipped) = resolve_routes(webhooks, &config.secrets, &ResolveLimits::default());

    let listener = TcpListener::bind(listen)
        .await
        .map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    let address = listener.local_addr().map_err(|error| error.to_string())?;
    println!("webhooks listening on http://{address}");
    for route in &routes {
        println!("route {} POST {}", route.scope.route_id, route.path);
    }

    let service = ServiceBuilder::new()
        .map_response(|response: Response<_>| {
            response.map(
                |body: modelgate::response_body::ResponseBody<Full<Bytes>>| {
                    body.map_err(Into::into).boxed_unsync()
                },
            )
        })
        .layer(WebhookSecretLayer::new(store, routes).limits(webhooks.limits))
        .service(service_fn(not_found));
    serve::serve(
        listener,
        BoxCloneService::new(service),
        serve::shutdown_signal(),
        modelgate::proxy::DEFAULT_SHUTDOWN_GRACE,
        &modelgate::credit::PendingSettlements::default(),
    )
    .await;
    Ok(())
}

async fn not_found(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = serde_json::json!({
        "ok": false,
        "code": "not_found",
        "error": format!("no webhook route at {}", request.uri().path()),
        "result": {},
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
