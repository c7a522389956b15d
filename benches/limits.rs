//! The per-request cost of GlobalRateLimit and FreeModelQuota, on
//! `MemoryStore` and on `RedisStore` over loopback: an admitted request
//! (one store round trip each), and a refusal answered from the memo of
//! full counters (none).
//!
//! `cargo bench --features full --bench limits`; under `cargo test --all-targets` each
//! benchmark runs once as a smoke test.

mod support;

use std::convert::Infallible;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::Full;
use modelgate::free_quota::{FreeModelQuotaLayer, FreeQuotaRules};
use modelgate::keys::SharedStore;
use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
use modelgate::store::NANOS_PER_CREDIT;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

fn upstream() -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    })
}

fn bench_backend(
    c: &mut Criterion,
    runtime: &tokio::runtime::Runtime,
    backend: &str,
    store: SharedStore,
) {
    let mut group = c.benchmark_group(format!("limits/{backend}"));
    let wide_open = RateLimitRules::from_json(
        r#"{"account": {"gcra": {"requests": 1000000, "period_seconds": 1, "burst": 1000000}},
            "models": [{"match": "openai/", "limit": {"rolling": {"requests": 1000000000, "window_seconds": 1}}}]}"#,
    )
    .unwrap();
    let rate = ServiceBuilder::new()
        .layer(GlobalRateLimitLayer::new(store.clone(), wide_open).unwrap())
        .service(upstream());
    group.bench_function("global_rate_limit/admitted", |b| {
        b.to_async(runtime).iter(|| {
            let call = rate
                .clone()
                .oneshot(support::chat("acct", "openai/gpt-4o", false));
            async move { assert_eq!(call.await.unwrap().status(), 200) }
        })
    });
    let closed = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 1, "window_seconds": 3600}}}"#,
    )
    .unwrap();
    let refusing = ServiceBuilder::new()
        .layer(GlobalRateLimitLayer::new(store.clone(), closed).unwrap())
        .service(upstream());
    runtime
        .block_on(
            refusing
                .clone()
                .oneshot(support::chat("full", "x/y", false)),
        )
        .unwrap();
    group.bench_function("global_rate_limit/refused_from_memo", |b| {
        b.to_async(runtime).iter(|| {
            let call = refusing
                .clone()
                .oneshot(support::chat("full", "x/y", false));
            async move { assert_eq!(call.await.unwrap().status(), 429) }
        })
    });
    runtime
        .block_on(store.top_up("buyer", 10 * NANOS_PER_CREDIT))
        .unwrap();
    let roomy = FreeQuotaRules {
        requests_per_minute: 1 << 40,
        requests_per_day: 1 << 40,
        requests_per_day_after_purchase: 1 << 40,
        ..FreeQuotaRules::default()
    };
    let free = ServiceBuilder::new()
        .layer(
            FreeModelQuotaLayer::new(store.clone())
                .rules(roomy)
                .unwrap(),
        )
        .service(upstream());
    group.bench_function("free_model_quota/admitted", |b| {
        b.to_async(runtime).iter(|| {
            let call = free
                .clone()
                .oneshot(support::chat("buyer", "a/b:free", false));
            async move { assert_eq!(call.await.unwrap().status(), 200) }
        })
    });
    group.bench_function("free_model_quota/paid_model_passes", |b| {
        b.to_async(runtime).iter(|| {
            let call = free.clone().oneshot(support::chat("buyer", "a/b", false));
            async move { assert_eq!(call.await.unwrap().status(), 200) }
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    support::on_both_stores(|runtime, backend, store| bench_backend(c, runtime, backend, store));
}

criterion_group!(limits, benches);
criterion_main!(limits);
