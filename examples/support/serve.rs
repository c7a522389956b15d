//! The examples' server loop: HTTP/1 and HTTP/2 over TCP, the client's
//! address in each request's extensions, and a graceful stop on Ctrl-C or
//! SIGTERM.

#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use modelgate::keys::SharedStore;
use modelgate::proxy::GatewayService;
use modelgate::store::{MemoryStore, RedisStore, RedisStoreConfig};
use modelgate::webhook::ClientAddr;
use tokio::net::TcpListener;
use tower::ServiceBuilder;

/// How long requests in flight may take to finish after a shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Serves `service` on `listener` until `shutdown` completes, then lets
/// requests in flight finish for up to [`SHUTDOWN_GRACE`].
pub async fn serve(
    listener: TcpListener,
    service: GatewayService<Incoming>,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    // A client that never finishes its headers cannot hold a connection.
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of descriptors and the like: back off, do not spin.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // A response's last bytes (the end of a metered body, sent once
                // its cost is recorded) must not wait for the client's delayed ACK.
                let _ = stream.set_nodelay(true);
                // Per-client limits (the webhook routes') key on the peer's address.
                let service = ServiceBuilder::new()
                    .map_request(move |mut request: http::Request<Incoming>| {
                        request.extensions_mut().insert(ClientAddr(peer.ip()));
                        request
                    })
                    .service(service.clone());
                let connection = builder.serve_connection_with_upgrades(
                    TokioIo::new(stream),
                    TowerToHyperService::new(service),
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
}

/// Redis at `redis_url` (`--redis`), or the in-process store.
pub async fn open_store(redis_url: Option<&str>) -> Result<SharedStore, String> {
    Ok(match redis_url {
        Some(url) => Arc::new(
            RedisStore::connect(url, RedisStoreConfig::default())
                .await
                .map_err(|error| format!("cannot use --redis {url}: {error}"))?,
        ),
        None => Arc::new(MemoryStore::new()),
    })
}

/// Logs to stderr at `RUST_LOG` (default `info`); stdout stays for what
/// the operator must read (the address, a key shown once). Built with the
/// `otel` feature and given `OTEL_EXPORTER_OTLP_ENDPOINT`, it also exports
/// the request spans over OTLP/HTTP.
///
/// Lines are written by a logging thread through a buffer, so a request
/// pays for formatting its line, not for a `write` of its own: under load
/// the thread writes many lines at once. Nothing is dropped (a full queue
/// makes the logger wait), and dropping the returned guard flushes what is
/// left. Colours only on a terminal: a file or a collector gets plain text.
#[must_use = "dropping the guard stops the logging thread"]
pub fn init_logging() -> tracing_appender::non_blocking::WorkerGuard {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::stderr().is_terminal();
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("modelgate-log")
        .finish(std::io::BufWriter::new(std::io::stderr()));
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(writer);
    let registry = tracing_subscriber::registry().with(filter).with(fmt);
    #[cfg(feature = "otel")]
    if let Ok(endpoint) = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        let traces = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        match modelgate::telemetry::otel::otlp_layer("modelgate", &traces) {
            Ok((layer, provider)) => {
                registry.with(layer).init();
                // Lives as long as the process: spans export until exit.
                std::mem::forget(provider);
                return guard;
            }
            Err(error) => eprintln!("OpenTelemetry export disabled: {error}"),
        }
    }
    registry.init();
    guard
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
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
