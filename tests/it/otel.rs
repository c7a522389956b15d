//! The `otel` feature: the request spans reach an OTLP/HTTP collector (a
//! loopback server standing in for one), with their fields; a chat call's
//! span carries OpenTelemetry's GenAI attributes.
//!
//! `cargo test --test it otel::` (scripts/test.sh runs it).

use crate::common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::http_server::serve;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tracing_subscriber::layer::SubscriberExt;

/// What a collector got: each export's path, content type and body.
type Received = Arc<Mutex<Vec<(String, String, Bytes)>>>;

/// A loopback server standing in for an OTLP/HTTP collector.
async fn collector() -> (std::net::SocketAddr, Received) {
    let received: Received = Arc::default();
    let sink = Arc::clone(&received);
    let address = serve(tower::service_fn(
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
    (address, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_spans_are_exported_over_otlp_http() {
    let (collector, received) = collector().await;
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

/// What a collector received, decoded: every span of every export.
fn exported_spans(
    received: &[(String, String, Bytes)],
) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    received
        .iter()
        .flat_map(|(_, _, body)| {
            ExportTraceServiceRequest::decode(body.as_ref())
                .expect("an OTLP protobuf export")
                .resource_spans
        })
        .flat_map(|resource| resource.scope_spans)
        .flat_map(|scope| scope.spans)
        .collect()
}

/// A span attribute's value, as text (strings) or a number (integers).
fn attribute(span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let value = span
        .attributes
        .iter()
        .find(|attribute| attribute.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match value {
        Value::StringValue(text) => text.clone(),
        Value::IntValue(number) => number.to_string(),
        other => format!("{other:?}"),
    })
}

/// A chat completion through BearerAuth, BodyLimit and CreditGuard, over
/// real HTTP, leaves one `chat <model>` span of client kind with the GenAI
/// semantic conventions' attributes, its usage from the upstream's answer;
/// a request refused for want of credits leaves none.
#[tokio::test]
async fn a_chat_call_is_exported_as_a_genai_span() {
    use modelgate::auth::BearerAuthLayer;
    use modelgate::body::BodyLimitLayer;
    use modelgate::context::{CheckedStack, RequestContext};
    use modelgate::credit::{CreditGuardLayer, PriceTable};
    use modelgate::error_mapper::ErrorMapperLayer;
    use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
    use modelgate::store::{MemoryStore, NANOS_PER_CREDIT};
    use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
    use serde_json::json;

    let (collector, received) = collector().await;
    let (layer, provider) = modelgate::telemetry::otel::otlp_layer(
        "modelgate-test",
        &format!("http://{collector}/v1/traces"),
    )
    .unwrap();
    // This test's runtime has one thread: every span is made and ended on it.
    let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    let store: SharedStore = Arc::new(MemoryStore::new());
    let directory = KeyDirectory::new(store.clone());
    let (key, _) = directory.create_key(NewKey::named("otel")).await.unwrap();
    // A limit no call fits in: refused with 402 before anything is sent.
    let (broke, _) = directory
        .create_key(NewKey {
            limit_nanos: Some(1),
            ..NewKey::named("capped")
        })
        .await
        .unwrap();
    store
        .top_up("default", 10 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let prices = PriceTable::from_json(
        r#"{"default": {"prompt_per_million": 1, "completion_per_million": 2}}"#,
    )
    .unwrap();
    let upstream = tower::service_fn(|request: Request<Full<Bytes>>| async move {
        let model = RequestContext::of(&request)
            .and_then(|context| context.chat.as_ref())
            .map(|chat| chat.model.clone())
            .unwrap_or_default();
        let answer = json!({
            "model": model,
            "choices": [{"message": {"role": "assistant", "content": "Hi"}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7},
        });
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(answer.to_string()))))
    });
    let gateway = CheckedStack::new()
        .plain(ErrorMapperLayer::new())
        .layer(BearerAuthLayer::new(directory))
        .layer(BodyLimitLayer::new())
        .layer(CreditGuardLayer::new(store.clone(), Arc::new(prices)))
        .service(upstream)
        .unwrap();
    let address = serve(gateway).await;
    let client = reqwest::Client::new();
    let chat = |key: String| {
        client
            .post(format!("http://{address}/api/v1/chat/completions"))
            .bearer_auth(key)
            .json(&json!({"model": "openai/gpt-4o", "max_tokens": 20, "messages": [{"role": "user", "content": "Hi"}]}))
            .send()
    };
    let answered = chat(key.expose().to_owned()).await.unwrap();
    assert_eq!(answered.status(), 200);
    answered.bytes().await.unwrap();
    let refused = chat(broke.expose().to_owned()).await.unwrap();
    assert_eq!(refused.status(), 402);
    common::settle::key_settled(&store, key.expose(), chrono::Utc::now()).await;

    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .unwrap();
    let spans = exported_spans(&received.lock().unwrap());
    let chats: Vec<_> = spans
        .iter()
        .filter(|span| span.name.starts_with("chat"))
        .collect();
    assert_eq!(chats.len(), 1, "one admitted call, one span: {spans:#?}");
    let span = chats[0];
    assert_eq!(span.name, "chat openai/gpt-4o");
    assert_eq!(span.kind, SpanKind::Client as i32);
    for (key, expected) in [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "openai"),
        ("gen_ai.request.model", "openai/gpt-4o"),
        ("gen_ai.response.model", "openai/gpt-4o"),
        ("gen_ai.request.max_tokens", "20"),
        ("gen_ai.usage.input_tokens", "11"),
        ("gen_ai.usage.output_tokens", "7"),
    ] {
        assert_eq!(attribute(span, key).as_deref(), Some(expected), "{key}");
    }
}
