//! What body handling costs: `ChatRequest::parse` and the whole `BodyLimit`
//! layer for 1 KB, 32 KB and 1 MB chat bodies, next to the floor they are
//! measured against, one `serde_json::Value` parse and one copy of the body.
//!
//! `cargo bench --features full --bench body`

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{Full, StreamBody};
use modelgate::body::{BodyLimitLayer, ChatRequest};
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// A chat body of about `target_bytes`: a conversation of 500-byte messages
/// with non-ASCII text and escapes, as real prompts have.
fn chat_body(target_bytes: usize) -> Bytes {
    let text =
        "Explain the café's \\\"menu\\\" in detail, please — ü, 😀, line\\nbreaks. ".repeat(6);
    let mut messages = Vec::new();
    let mut size = 0;
    while size < target_bytes {
        let message = format!(r#"{{"role":"user","content":"{text}"}}"#);
        size += message.len() + 1;
        messages.push(message);
    }
    Bytes::from(format!(
        r#"{{"model":"openai/gpt-4o","stream":true,"max_tokens":512,"temperature":0.7,"messages":[{}]}}"#,
        messages.join(",")
    ))
}

fn sizes() -> [(&'static str, Bytes); 3] {
    [
        ("1KB", chat_body(1 << 10)),
        ("32KB", chat_body(32 << 10)),
        ("1MB", chat_body(1 << 20)),
    ]
}

fn parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse");
    for (name, body) in sizes() {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("chat_request", name), &body, |b, body| {
            b.iter(|| ChatRequest::parse(body).unwrap())
        });
        group.bench_with_input(
            BenchmarkId::new("serde_json_value", name),
            &body,
            |b, body| b.iter(|| serde_json::from_slice::<serde_json::Value>(body).unwrap()),
        );
        group.bench_with_input(BenchmarkId::new("copy", name), &body, |b, body| {
            b.iter(|| body.to_vec())
        });
    }
    group.finish();
}

fn layer(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let service = ServiceBuilder::new()
        .layer(BodyLimitLayer::new().max_body_bytes(8 << 20))
        .service(service_fn(|request: Request<Full<Bytes>>| async move {
            Ok::<_, Infallible>(Response::new(request.into_body()))
        }));
    let mut group = c.benchmark_group("body_limit_layer");
    for (name, body) in sizes() {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("one_chunk", name), &body, |b, body| {
            b.to_async(&runtime).iter(|| {
                let request = Request::post("/api/v1/chat/completions")
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .unwrap();
                service.clone().oneshot(request)
            })
        });
        // As a network delivers it: 16 KiB frames, gathered with one copy.
        let frames: Vec<Bytes> = body.chunks(16 << 10).map(Bytes::copy_from_slice).collect();
        group.bench_with_input(
            BenchmarkId::new("16KiB_frames", name),
            &frames,
            |b, frames| {
                b.to_async(&runtime).iter(|| {
                    let stream = futures::stream::iter(
                        frames
                            .iter()
                            .cloned()
                            .map(|frame| Ok::<_, Infallible>(http_body::Frame::data(frame))),
                    );
                    let request = Request::post("/api/v1/chat/completions")
                        .header("content-type", "application/json")
                        .body(StreamBody::new(stream))
                        .unwrap();
                    service.clone().oneshot(request)
                })
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = parse, layer
}
criterion_main!(benches);
