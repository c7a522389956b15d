//! The proxy's admin listener: `/metrics` (Prometheus text), `/healthz`
//! (the process answers) and `/readyz` (the store answers and an upstream
//! is configured). `/readyz` names the store's state: `ok`,
//! `circuit_open` (its circuit breaker refuses calls after failures in a
//! row), `unreachable` or `timeout`; all but `ok` answer 503. Kept off the public listener: it says how the gateway
//! is doing, which is the operator's business.

#![allow(dead_code)]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use modelgate::keys::SharedStore;
use modelgate::store::StoreErrorKind;
use tokio::net::TcpListener;

/// How long `/readyz` waits for the store.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Installs the Prometheus recorder every modelgate metric goes to.
pub fn install_recorder() -> Result<PrometheusHandle, String> {
    let seconds = [
        0.000_1, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        10.0, 30.0, 60.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)
        .map_err(|error| format!("metrics: {error}"))?
        .install_recorder()
        .map_err(|error| format!("metrics: {error}"))?;
    // Histograms are folded in the background, not on each scrape.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Serves the admin routes on `listener` until the process ends.
pub async fn serve(
    listener: TcpListener,
    metrics: PrometheusHandle,
    store: SharedStore,
    upstream_configured: bool,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let metrics = metrics.clone();
        let store = store.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let metrics = metrics.clone();
            let store = store.clone();
            async move {
                Ok::<_, Infallible>(answer(&request, &metrics, &store, upstream_configured).await)
            }
        });
        tokio::spawn(async move {
            let _ = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    request: &Request<Incoming>,
    metrics: &PrometheusHandle,
    store: &SharedStore,
    upstream_configured: bool,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match request.uri().path() {
        "/metrics" => (
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.render(),
        ),
        "/healthz" => (
            StatusCode::OK,
            "application/json",
            r#"{"status":"ok"}"#.to_owned(),
        ),
        "/readyz" => {
            let store_state = match tokio::time::timeout(READY_TIMEOUT, store.ping()).await {
                Ok(Ok(())) => "ok".to_owned(),
                // Refused at once, not sent: the breaker says the store is sick.
                Ok(Err(error)) if matches!(error.kind(), StoreErrorKind::CircuitOpen) => {
                    "circuit_open".to_owned()
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "not ready: the store does not answer");
                    "unreachable".to_owned()
                }
                Err(_) => "timeout".to_owned(),
            };
            let ready = store_state == "ok" && upstream_configured;
            let body = serde_json::json!({
                "status": if ready { "ready" } else { "not_ready" },
                "store": store_state,
                "upstream": if upstream_configured { "configured" } else { "missing" },
            });
            let status = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (status, "application/json", body.to_string())
        }
        _ => (
            StatusCode::NOT_FOUND,
            "application/json",
            r#"{"error":"the admin listener serves /metrics, /healthz and /readyz"}"#.to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}
