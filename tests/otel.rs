//! The `otel` feature: the request spans reach an OTLP/HTTP collector (a
//! loopback server standing in for one), with their fields.
//!
//! `cargo test --features otel --test otel` (scripts/test.sh runs it).

#![cfg(feature = "otel")]

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::http_server::serve;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_spans_are_exported_over_otlp_http() {
    let received: Arc<Mutex<Vec<(String, String, Bytes)>>> = Arc::default();
    let sink = Arc::clone(&received);
    let collector = serve(tower::service_fn(
        move |request: Request<hyper::body::Incoming>| {
            let sink = Arc::clone(&sink);
            async move {
                let path = request.uri().path().to_owned();
                let content_type = request
                    .headers()
                    .get("content-type")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let body = request.into_body().collect().await.unwrap().to_bytes();
                sink.lock().unwrap().push((path, content_type, body));
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            }
        },
    ))
    .await;
    let (layer, provider) = modelgate::telemetry::otel::otlp_layer(
        "modelgate-test",
        &format!("http://{collector}/v1/traces"),
    )
    .unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!(
            "request",
            request_id = "mg-otel-test-1",
            route = "chat_completions"
        );
        span.in_scope(|| tracing::info!("inside"));
    });
    // The exporter is blocking and flushes on shutdown: off the runtime's threads.
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .unwrap();
    let received = received.lock().unwrap();
    let (path, content_type, body) = received.first().expect("one export");
    assert_eq!(path, "/v1/traces");
    assert_eq!(content_type, "application/x-protobuf");
    let text = String::from_utf8_lossy(body);
    for expected in [
        "modelgate-test",
        "request",
        "mg-otel-test-1",
        "chat_completions",
    ] {
        assert!(text.contains(expected), "{expected} not exported");
    }
}
