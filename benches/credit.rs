//! CreditGuard per request: the reservation, the response passed through
//! and scanned, and the settlement; on `MemoryStore` and on `RedisStore`
//! over loopback, one request at a time and 32 at once. Also the usage
//! scanner alone on a long SSE stream.
//!
//! `cargo bench --features full --bench credit`; under `cargo test --all-targets` each
//! benchmark runs once as a smoke test.

mod support;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use modelgate::context::RequestContext;
use modelgate::credit::{BodyKind, CreditGuardLayer, PriceTable, UsageScanner};
use modelgate::keys::SharedStore;
use modelgate::store::NANOS_PER_CREDIT;
use tower::{ServiceBuilder, ServiceExt, service_fn};

const REPLY: &str = r#"{"choices": [{"message": {"role": "assistant", "content": "Hello there"}}], "usage": {"prompt_tokens": 12, "completion_tokens": 40}}"#;

fn sse_stream(chunks: usize) -> Bytes {
    let mut stream = String::new();
    for _ in 0..chunks {
        stream.push_str("data: {\"choices\":[{\"delta\":{\"content\":\"token \"}}]}\n\n");
    }
    stream.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":40}}\n\ndata: [DONE]\n\n");
    Bytes::from(stream)
}

fn bench_backend(
    c: &mut Criterion,
    runtime: &tokio::runtime::Runtime,
    backend: &str,
    store: SharedStore,
) {
    runtime
        .block_on(store.top_up("acct", 1_000_000_000 * NANOS_PER_CREDIT))
        .unwrap();
    let prices = PriceTable::from_json(
        r#"{"default": {"prompt_per_million": 2.5, "completion_per_million": 10}}"#,
    )
    .unwrap();
    let stream = sse_stream(20);
    let guard = ServiceBuilder::new()
        .layer(CreditGuardLayer::new(store, Arc::new(prices)))
        .service(service_fn(move |request: Request<Full<Bytes>>| {
            let stream = stream.clone();
            async move {
                let streaming = RequestContext::of(&request)
                    .and_then(|context| context.chat.as_ref())
                    .is_some_and(|chat| chat.stream);
                let body = if streaming {
                    stream
                } else {
                    Bytes::from_static(REPLY.as_bytes())
                };
                Ok::<_, Infallible>(Response::new(Full::new(body)))
            }
        }));
    let mut group = c.benchmark_group(format!("credit/{backend}"));
    // 32 requests of one account at once, as a loaded gateway sees them:
    // on Redis their settlements go with each other (group commit).
    group.throughput(Throughput::Elements(32));
    group.bench_function("reserve_call_settle/json_32_at_once", |b| {
        b.to_async(runtime).iter(|| {
            let calls = (0..32).map(|_| {
                let call = guard
                    .clone()
                    .oneshot(support::chat("acct", "openai/gpt-4o", false));
                async move {
                    let response = call.await.unwrap();
                    assert_eq!(response.status(), 200);
                    response.into_body().collect().await.unwrap();
                }
            });
            futures::future::join_all(calls)
        })
    });
    group.throughput(Throughput::Elements(1));
    for (name, stream) in [("json", false), ("sse_20_chunks", true)] {
        group.bench_function(format!("reserve_call_settle/{name}"), |b| {
            b.to_async(runtime).iter(|| {
                let call = guard
                    .clone()
                    .oneshot(support::chat("acct", "openai/gpt-4o", stream));
                async move {
                    let response = call.await.unwrap();
                    assert_eq!(response.status(), 200);
                    response.into_body().collect().await.unwrap();
                }
            })
        });
    }
    group.finish();
}

fn bench_scanner(c: &mut Criterion) {
    let stream = sse_stream(10_000);
    let mut group = c.benchmark_group("usage_scanner");
    group.throughput(Throughput::Bytes(stream.len() as u64));
    group.bench_function("sse_10000_chunks_in_16KiB_frames", |b| {
        b.iter(|| {
            let mut scanner = UsageScanner::new(BodyKind::EventStream, 1 << 20);
            for frame in stream.chunks(16 * 1024) {
                scanner.feed(frame);
            }
            assert!(scanner.finish().is_some());
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_scanner(c);
    support::on_both_stores(|runtime, backend, store| bench_backend(c, runtime, backend, store));
}

criterion_group!(credit, benches);
criterion_main!(credit);
