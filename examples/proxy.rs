//! The standalone gateway: every modelgate layer in front of an
//! OpenAI-compatible upstream.
//!
//! ```sh
//! cargo run --release --example proxy -- [--listen ADDR] [--upstream URL] [--redis URL] [--config FILE]
//! ```
//!
//! - `--listen`: where to serve (default `127.0.0.1:8080`).
//! - `--upstream`: the upstream's base URL, such as
//!   `https://api.openai.com/v1` (its key from the config's
//!   `upstream.api_key_env`). Without it the built-in mock upstream runs in
//!   process.
//! - `--redis`: share state through Redis (`redis://127.0.0.1:6379`);
//!   without it everything lives in process.
//! - `--config`: a JSON file (see `modelgate::proxy::GatewayConfig`).
//!
//! The management key comes from `MODELGATE_ADMIN_KEY`; when that is unset
//! one is generated and printed once. Ctrl-C or SIGTERM stops accepting,
//! lets requests in flight finish (and be settled), then exits.

#[path = "support/args.rs"]
mod args;
#[path = "support/mock.rs"]
mod mock;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use modelgate::auth::ApiKey;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::proxy::{gateway, GatewayConfig, Upstream};
use modelgate::store::{MemoryStore, RedisStore, RedisStoreConfig};
use tokio::net::TcpListener;

const USAGE: &str = "usage: proxy [--listen ADDR] [--upstream URL] [--redis URL] [--config FILE]";

/// How long requests in flight may take to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_target(false)
        .with_writer(std::io::stderr)
        .init();
    if let Err(message) = run().await {
        eprintln!("proxy: {message}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let args = args::Args::parse(&["listen", "upstream", "redis", "config"], USAGE)?;
    let listen: SocketAddr =
        args.parsed("listen", "127.0.0.1:8080".parse().expect("a valid address"))?;
    let config = match args.get("config") {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|error| format!("cannot read --config {path}: {error}"))?;
            GatewayConfig::from_json(&text).map_err(|error| format!("{path}: {error}"))?
        }
        None => GatewayConfig::default(),
    };
    if config.webhooks_enabled() {
        return Err(
            "the config enables the webhooks plugin, which this version does not serve yet; \
                    set plugins.entries.webhooks.enabled to false"
                .to_owned(),
        );
    }
    let store: SharedStore = match args.get("redis") {
        Some(url) => Arc::new(
            RedisStore::connect(url, RedisStoreConfig::default())
                .await
                .map_err(|error| format!("cannot use --redis {url}: {error}"))?,
        ),
        None => Arc::new(MemoryStore::new()),
    };
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
    let service = gateway(&config, store.clone(), upstream).map_err(|error| error.to_string())?;
    admin_key(&store).await?;

    let listener = TcpListener::bind(listen)
        .await
        .map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    let address = listener.local_addr().map_err(|error| error.to_string())?;
    println!("modelgate listening on http://{address}");

    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    // A client that never finishes its headers cannot hold a connection.
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of descriptors and the like: back off, do not spin.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let connection = builder.serve_connection_with_upgrades(
                    TokioIo::new(stream),
                    TowerToHyperService::new(service.clone()),
                );
                let connection = graceful.watch(connection.into_owned());
                tokio::spawn(async move {
                    let _ = connection.await;
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!("shutting down: finishing requests in flight");
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(SHUTDOWN_GRACE) => tracing::warn!("requests still in flight after the grace period"),
    }
    // Settlements of clients that left run in the background: a moment to land.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
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

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
