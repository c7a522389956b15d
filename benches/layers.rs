//! Each layer's own cost per request, in process on `MemoryStore`: the
//! layer alone in front of an inner service that answers a chat
//! completion at once, against that inner service with no layer
//! (`no_layer`), then every layer in the gateway's order (`all_layers`).
//! A layer's cost is its time minus `no_layer`'s.
//!
//! A request reaches each layer as the layers before it leave it: with the
//! principal, parsed request and bytes that BearerAuth and BodyLimit add
//! to its `RequestContext`; BodyLimit and BearerAuth themselves get the request as a
//! client sends it. Logs (at `info`, formatted into a sink) and a
//! Prometheus recorder are on, as in the proxy example.
//!
//! `cargo bench --features full --bench layers`; under `cargo test --all-targets` each
//! benchmark runs once as a smoke test.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use modelgate::admission::AdmissionLayers;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::{ApiKey, AuthFailureLimit, AuthFailures, BearerAuthLayer, Principal};
use modelgate::body::{BodyLimitLayer, ChatRequest, DrainUnreadLayer};
use modelgate::client_addr::{ClientAddrLayer, TrustedProxies};
use modelgate::context::RequestContext;
use modelgate::credit::{CreditGuardLayer, PriceTable};
use modelgate::error::GatewayError;
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::free_quota::{FreeModelQuotaLayer, FreeQuotaRules};
use modelgate::in_flight::InFlightLimitLayer;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::proxy::{AccessLogLayer, FallbackLayer, ModelCatalog};
use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
use modelgate::store::{MemoryStore, NANOS_PER_CREDIT};
use modelgate::usage::{AppRanking, Generations};
use modelgate::webhook::WebhookSecretLayer;
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

const BODY: &str = r#"{"model": "openai/gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello to the benchmark."}]}"#;
const REPLY: &str = r#"{"id": "chatcmpl-1", "object": "chat.completion", "model": "openai/gpt-4o-mini", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}}"#;
const PRICES: &str = r#"{"models": {"openai/gpt-4o-mini": {"prompt_per_million": 0.15, "completion_per_million": 0.6}}}"#;
const RATE_LIMITS: &str =
    r#"{"account": {"gcra": {"requests": 1000000, "period_seconds": 1, "burst": 1000000}}}"#;

/// The upstream's part: a JSON chat completion, at once.
fn answer() -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = GatewayError,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, GatewayError>> + Send,
> + Clone
+ Send
+ 'static {
    service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, GatewayError>(
            Response::builder()
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(REPLY.as_bytes())))
                .expect("a valid response"),
        )
    })
}

/// The request as a client sends it.
fn sent(key: &str) -> Request<Full<Bytes>> {
    Request::post("/api/v1/chat/completions")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .expect("a valid request")
}

/// The request as BodyLimit and BearerAuth leave it.
fn admitted(key: &str, principal: &Principal) -> Request<Full<Bytes>> {
    let mut request = sent(key);
    request.headers_mut().remove("authorization");
    let context = RequestContext::of_mut(&mut request);
    context.principal = Some(principal.clone());
    context.chat = Some(Arc::new(
        ChatRequest::parse(BODY.as_bytes()).expect("a valid chat request"),
    ));
    context.body = Some(Bytes::from_static(BODY.as_bytes()));
    request
}

fn measure<S, B>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    runtime: &tokio::runtime::Runtime,
    name: &str,
    service: S,
    request: impl Fn() -> Request<Full<Bytes>>,
) where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    group.bench_function(name, |b| {
        b.to_async(runtime).iter(|| async {
            let response = service.clone().oneshot(request()).await.unwrap();
            assert_eq!(response.status(), 200, "{name} refused the request");
            let body = response.into_body().collect().await.unwrap().to_bytes();
            // Lets the tasks the request spawned run now, as a server's
            // runtime would, and count in its time: left to pile up until
            // the batch ends, settlements would leave every admission in
            // between with thousands of holds in flight.
            tokio::task::yield_now().await;
            body
        })
    });
}

fn bench_layers(c: &mut Criterion) {
    // As in the proxy example: info logs formatted (into a sink here, as
    // plain text), and a Prometheus recorder taking every metric.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        // As the proxy writes to a file or a collector: no colour codes.
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .try_init();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let _ = metrics::set_global_recorder(recorder);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store: SharedStore = Arc::new(MemoryStore::new());
    let directory = KeyDirectory::new(store.clone());
    let (key, record) = runtime.block_on(async {
        let (key, record) = directory.create_key(NewKey::named("bench")).await.unwrap();
        directory
            .top_up("default", 1_000_000_000 * NANOS_PER_CREDIT)
            .await
            .unwrap();
        (key, record)
    });
    let key: ApiKey = key;
    let principal = Principal::from_record(key.hash(), &record);
    let key = key.expose().to_owned();
    let prices = Arc::new(PriceTable::from_json(PRICES).unwrap());
    let rules = RateLimitRules::from_json(RATE_LIMITS).unwrap();
    let catalog = Arc::new(
        ModelCatalog::new(
            Arc::clone(&prices),
            None,
            &HashMap::new(),
            &rules,
            &FreeQuotaRules::default(),
        )
        .unwrap(),
    );
    let body = BodyLimitLayer::new();
    let auth = BearerAuthLayer::new(directory.clone())
        .failure_limit(AuthFailures::new(AuthFailureLimit::default()).unwrap());
    let in_flight = InFlightLimitLayer::new(InFlightLimitLayer::default_max_in_flight());
    let webhooks = WebhookSecretLayer::new(store.clone(), Vec::new());
    let key_routes = KeyRoutesLayer::new(directory.clone());
    let fallback = FallbackLayer::new(Arc::clone(&catalog));
    let rate_limit = GlobalRateLimitLayer::new(store.clone(), rules.clone()).unwrap();
    let free_quota = FreeModelQuotaLayer::new(store.clone());
    let credit = CreditGuardLayer::new(store.clone(), prices.clone());
    // As the proxy has it: each request's record kept with its settlement.
    let recording = credit
        .clone()
        .generations(Generations::new().app_ranking(AppRanking::new(store.clone())));

    let prepared = || admitted(&key, &principal);
    let as_sent = || sent(&key);
    let mut group = c.benchmark_group("layers/memory");
    measure(&mut group, &runtime, "no_layer", answer(), prepared);
    let access_log = ServiceBuilder::new()
        .layer(AccessLogLayer::new(Arc::clone(&catalog)))
        .layer(AccessLogLayer::annotate())
        .service(answer());
    measure(&mut group, &runtime, "AccessLog", access_log, prepared);
    measure(
        &mut group,
        &runtime,
        "WebhookSecret",
        webhooks.layer(answer()),
        prepared,
    );
    let error_mapper = ErrorMapperLayer::new().layer(answer());
    measure(&mut group, &runtime, "ErrorMapper", error_mapper, prepared);
    measure(
        &mut group,
        &runtime,
        "BodyLimit",
        body.layer(answer()),
        as_sent,
    );
    // BearerAuth before the body is read, as in the gateway.
    measure(
        &mut group,
        &runtime,
        "BearerAuth",
        auth.clone().layer(answer()),
        as_sent,
    );
    measure(
        &mut group,
        &runtime,
        "InFlightLimit",
        in_flight.layer(answer()),
        as_sent,
    );
    measure(
        &mut group,
        &runtime,
        "KeyRoutes",
        key_routes.layer(answer()),
        prepared,
    );
    measure(
        &mut group,
        &runtime,
        "Fallback",
        fallback.layer(answer()),
        prepared,
    );
    measure(
        &mut group,
        &runtime,
        "GlobalRateLimit",
        rate_limit.layer(answer()),
        prepared,
    );
    measure(
        &mut group,
        &runtime,
        "FreeModelQuota",
        free_quota.layer(answer()),
        prepared,
    );
    measure(
        &mut group,
        &runtime,
        "CreditGuard",
        credit.layer(answer()),
        prepared,
    );
    measure(
        &mut group,
        &runtime,
        "CreditGuard_with_generations",
        recording.clone().layer(answer()),
        prepared,
    );
    let all = ServiceBuilder::new()
        .layer(DrainUnreadLayer::new(4 << 20, Duration::from_secs(10)))
        .layer(AccessLogLayer::new(catalog))
        .layer(ClientAddrLayer::new(TrustedProxies::none()))
        .layer(in_flight)
        .layer(webhooks)
        .layer(ErrorMapperLayer::new())
        .layer(auth)
        .layer(body)
        .layer(AccessLogLayer::annotate())
        .layer(key_routes)
        .layer(fallback)
        // As the proxy stacks them: one admission step.
        .layer(AdmissionLayers::new(rate_limit, free_quota, recording))
        .service(answer());
    measure(&mut group, &runtime, "all_layers", all, as_sent);
    group.finish();
}

criterion_group!(benches, bench_layers);
criterion_main!(benches);
