//! The whole gateway in process: every layer of `modelgate::proxy::gateway`
//! in front of the mock upstream on loopback, one chat completion per
//! iteration, on `MemoryStore` and on `RedisStore`; and the bare upstream
//! client for comparison.
//!
//! `cargo bench --features full --bench gateway`; under `cargo test --all-targets` each
//! benchmark runs once as a smoke test.

mod support;

#[path = "../examples/support/mock.rs"]
mod mock;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::Request;
use http_body_util::{BodyExt, Full};
use modelgate::keys::{KeyDirectory, NewKey};
use modelgate::proxy::{GatewayConfig, GatewayPlan, Upstream, UpstreamConfig, gateway};
use modelgate::store::NANOS_PER_CREDIT;
use tower::{Service, ServiceExt};

const BODY: &str = r#"{"model": "openai/gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello to the benchmark."}]}"#;

fn request(key: Option<&str>) -> Request<Full<Bytes>> {
    let mut builder =
        Request::post("/api/v1/chat/completions").header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("authorization", format!("Bearer {key}"));
    }
    builder
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .unwrap()
}

fn bench_gateway(c: &mut Criterion) {
    support::on_both_stores(|runtime, backend, store| {
        let base = runtime.block_on(mock::start(mock::MockConfig::default()));
        let config = GatewayConfig::from_json(
            r#"{"rate_limits": {"account": {"gcra": {"requests": 1000000, "period_seconds": 1, "burst": 1000000}}}}"#,
        )
        .unwrap();
        let upstream = Upstream::new(&UpstreamConfig::new(base.clone())).unwrap();
        let plan = GatewayPlan::new(&config).unwrap();
        let service = gateway::<Full<Bytes>>(&plan, store.clone(), upstream.clone());
        let directory = KeyDirectory::new(store);
        let key = runtime.block_on(async {
            let (key, _) = directory.create_key(NewKey::named("bench")).await.unwrap();
            directory
                .top_up("default", 1_000_000 * NANOS_PER_CREDIT)
                .await
                .unwrap();
            key
        });
        let mut group = c.benchmark_group(format!("gateway/{backend}"));
        group.bench_function("chat_completion", |b| {
            b.to_async(runtime).iter(|| async {
                let response = service
                    .clone()
                    .oneshot(request(Some(key.expose())))
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                response.into_body().collect().await.unwrap().to_bytes()
            })
        });
        if backend == "memory" {
            // The baseline: the upstream client alone, same request.
            group.bench_function("bare_upstream", |b| {
                b.to_async(runtime).iter(|| async {
                    let mut upstream = upstream.clone();
                    let response = upstream.call(request(None)).await.unwrap();
                    response.into_body().collect().await.unwrap().to_bytes()
                })
            });
        }
        group.finish();
    });
}

criterion_group!(benches, bench_gateway);
criterion_main!(benches);
