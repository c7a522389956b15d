//! The standalone gateway: every modelgate layer in front of an
//! OpenAI-compatible upstream.
//!
//! ```sh
//! cargo run --release --example proxy -- [--listen ADDR] [--upstream URL] [--redis URL] [--config FILE]
//! ```
//!
//! - `--listen`: where to serve (default `127.0.0.1:8080`).
//! - `--admin-listen`: where `/metrics` (Prometheus), `/healthz` and
//!   `/readyz` are served (default `127.0.0.1:9091`, loopback only).
//! - `--upstream`: the upstream's base URL, such as
//!   `https://api.openai.com/v1` (its key from the config's
//!   `upstream.api_key_env`). Without it the built-in mock upstream runs in
//!   process.
//! - `--redis`: share state through Redis (`redis://127.0.0.1:6379`);
//!   without it everything lives in process.
//! - `--bare true`: the upstream client with no layer at all, the
//!   baseline `bench/load.sh` compares against.
//! - `--config`: a JSON file (see `modelgate::proxy::GatewayConfig`); its
//!   `plugins.entries.webhooks` routes are served too, and every SecretRef
//!   in it reads from its `secrets.providers`.
//!
//! The management key comes from `MODELGATE_ADMIN_KEY`; when that is unset
//! one is generated and printed once. Ctrl-C or SIGTERM stops accepting,
//! lets requests in flight finish, waits (up to 30 s) for every settlement
//! to reach the store, logs any it could not record with its account, key
//! hash prefix and amount, then exits.

#[path = "support/admin.rs"]
mod admin;
#[path = "support/args.rs"]
mod args;
#[path = "support/mock.rs"]
mod mock;
#[path = "support/serve.rs"]
mod serve;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use modelgate::auth::ApiKey;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use modelgate::clock::SystemClock;
use modelgate::credit::PendingSettlements;
use modelgate::error::{ErrorKind, GatewayError};
use modelgate::proxy::{build_gateway, GatewayBody, GatewayConfig, GatewayService, Upstream};
use tokio::net::TcpListener;

/// How long a stopping proxy waits for the settlements of its last
/// requests (a store outage shorter than this loses nothing).
const SETTLEMENT_DEADLINE: Duration = Duration::from_secs(30);

const USAGE: &str = "usage: proxy [--listen ADDR] [--admin-listen ADDR] [--upstream URL] [--redis URL] [--config FILE] [--bare true]";

// Every request allocates on whichever worker runs it: glibc's malloc
// spent about a sixth of the proxy's CPU under load, part of it waiting on
// its arena locks; mimalloc's per-thread heaps do not contend.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let logging = serve::init_logging();
    if let Err(message) = run().await {
        drop(logging);
        eprintln!("proxy: {message}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let args = args::Args::parse(
        &[
            "listen",
            "admin-listen",
            "upstream",
            "redis",
            "config",
            "bare",
        ],
        USAGE,
    )?;
    let listen: SocketAddr =
        args.parsed("listen", "127.0.0.1:8080".parse().expect("a valid address"))?;
    let admin_listen: SocketAddr = args.parsed(
        "admin-listen",
        "127.0.0.1:9091".parse().expect("a valid address"),
    )?;
    let metrics = admin::install_recorder()?;
    let config = match args.get("config") {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|error| format!("cannot read --config {path}: {error}"))?;
            GatewayConfig::from_json(&text).map_err(|error| format!("{path}: {error}"))?
        }
        None => GatewayConfig::default(),
    };
    let store = serve::open_store(args.get("redis")).await?;
    let base_url = match args
        .get("upstream")
        .map(str::to_owned)
        .or(config.upstream.base_url.clone())
    {
        Some(url) => url,
        None => {
            let url = mock::start(mock::MockConfig::default()).await;
            tracing::info!(%url, "no upstream given: the built-in mock upstream answers");
            url
        }
    };
    let upstream_config = config
        .upstream_config(Some(&base_url))
        .map_err(|error| error.to_string())?;
    let upstream = Upstream::new(&upstream_config).map_err(|error| error.to_string())?;
    // `--bare true`: the upstream client alone, no layer: the baseline of bench/load.sh.
    let (service, settlements, app_ranking) = if args.parsed("bare", false)? {
        (bare(upstream), PendingSettlements::default(), None)
    } else {
        let gateway = build_gateway(
            &config,
            store.clone(),
            upstream,
            Arc::new(SystemClock),
            KeyDirectory::DEFAULT_CACHE_TTL,
        )
        .map_err(|error| error.to_string())?;
        (
            gateway.service,
            gateway.settlements,
            Some(gateway.app_ranking),
        )
    };
    admin_key(&store).await?;

    let listener = TcpListener::bind(listen)
        .await
        .map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    let address = listener.local_addr().map_err(|error| error.to_string())?;
    let admin_listener = TcpListener::bind(admin_listen)
        .await
        .map_err(|error| format!("cannot listen on --admin-listen {admin_listen}: {error}"))?;
    let admin_address = admin_listener
        .local_addr()
        .map_err(|error| error.to_string())?;
    tokio::spawn(admin::serve(admin_listener, metrics, store.clone(), true));
    println!("modelgate listening on http://{address}");
    println!("admin (metrics, healthz, readyz) on http://{admin_address}");

    serve::serve(listener, service, serve::shutdown_signal()).await;
    // The requests have ended; what they cost must reach the store before
    // the process does. Those that cannot are logged for booking by hand.
    let pending = settlements.len();
    let unrecorded = settlements.flush(SETTLEMENT_DEADLINE).await;
    tracing::info!(
        pending,
        unrecorded = unrecorded.len(),
        "settlements flushed; stopping"
    );
    // The app ranking's last second of counts, best effort: no money.
    if let Some(ranking) = app_ranking {
        if let Err(error) = ranking.flush().await {
            tracing::warn!(%error, "app ranking: the last counts were not written");
        }
    }
    Ok(())
}

/// Only the upstream client, errors as canonical responses: what the
/// proxy costs without any policy.
fn bare(upstream: Upstream) -> GatewayService<Incoming> {
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let mut upstream = upstream.clone();
        async move {
            let (parts, body) = request.into_parts();
            let outcome = match body.collect().await {
                Err(_) => Err(GatewayError::new(
                    ErrorKind::InvalidRequest,
                    "the body could not be read",
                )),
                Ok(collected) => {
                    let request = Request::from_parts(parts, Full::new(collected.to_bytes()));
                    tower::Service::call(&mut upstream, request).await
                }
            };
            let response: Response<GatewayBody> = match outcome {
                Ok(response) => response.map(|body| body.map_err(Into::into).boxed_unsync()),
                Err(error) => error
                    .to_response::<Full<Bytes>>()
                    .map(|body| body.map_err(|never| match never {}).boxed_unsync()),
            };
            Ok::<_, Infallible>(response)
        }
    });
    tower::util::BoxCloneService::new(service)
}

/// Registers `MODELGATE_ADMIN_KEY`, or makes and prints a management key.
async fn admin_key(store: &SharedStore) -> Result<(), String> {
    let directory = KeyDirectory::new(store.clone());
    let admin = NewKey {
        management: true,
        ..NewKey::named("operator")
    };
    match std::env::var("MODELGATE_ADMIN_KEY") {
        Ok(text) => {
            let key = ApiKey::parse(text.trim())
                .map_err(|error| format!("MODELGATE_ADMIN_KEY is not a modelgate key: {error}"))?;
            let record = directory
                .register_key(&key, admin)
                .await
                .map_err(|error| format!("cannot register MODELGATE_ADMIN_KEY: {error}"))?;
            if !record.management {
                return Err(
                    "MODELGATE_ADMIN_KEY is registered as a normal key, not a management key"
                        .into(),
                );
            }
        }
        Err(_) => {
            let (key, _) = directory
                .create_key(admin)
                .await
                .map_err(|error| format!("cannot create a management key: {error}"))?;
            // Shown once, on stdout for the operator; never logged.
            println!("management key (shown once): {}", key.expose());
        }
    }
    Ok(())
}
