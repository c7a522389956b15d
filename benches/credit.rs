//! CreditGuard per request: the reservation, the response passed through
//! and scanned, and the settlement; on `MemoryStore` and on `RedisStore`
//! over loopback. Also the usage scanner alone on a long SSE stream.
//!
//! `cargo bench --bench credit`; under `cargo test --all-targets` each
//! benchmark runs once as a smoke test.

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use modelgate::auth::{KeyHash, Principal};
use modelgate::body::ChatRequest;
use modelgate::credit::{BodyKind, CreditGuardLayer, PriceTable, UsageScanner};
use modelgate::keys::SharedStore;
use modelgate::store::{MemoryStore, RedisStore, RedisStoreConfig, NANOS_PER_CREDIT};
use tower::{service_fn, ServiceBuilder, ServiceExt};

const REPLY: &str = r#"{"choices": [{"message": {"role": "assistant", "content": "Hello there"}}], "usage": {"prompt_tokens": 12, "completion_tokens": 40}}"#;

fn chat(stream: bool) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model": "openai/gpt-4o", "stream": {stream}, "max_tokens": 100, "messages": [{{"role": "user", "content": "Hi"}}]}}"#
    );
    let mut request = Request::post("/api/v1/chat/completions")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    request.extensions_mut().insert(Principal {
        key_hash: KeyHash::of("bench"),
        account_id: "acct".into(),
        label: "bench".into(),
        management: false,
        key_limit: None,
        include_byok_in_limit: false,
        expires_at: None,
    });
    request
        .extensions_mut()
        .insert(ChatRequest::parse(body.as_bytes()).unwrap());
    request
}

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
                let streaming = request
                    .extensions()
                    .get::<ChatRequest>()
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
    for (name, stream) in [("json", false), ("sse_20_chunks", true)] {
        group.bench_function(format!("reserve_call_settle/{name}"), |b| {
            b.to_async(runtime).iter(|| {
                let call = guard.clone().oneshot(chat(stream));
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    bench_backend(c, &runtime, "memory", Arc::new(MemoryStore::new()));
    let server = redis_server::RedisServer::start();
    let redis = runtime
        .block_on(RedisStore::connect(
            &server.url(),
            RedisStoreConfig::default(),
        ))
        .unwrap();
    bench_backend(c, &runtime, "redis", Arc::new(redis));
}

criterion_group!(credit, benches);
criterion_main!(credit);
