//! What a webhook route costs: the payload parser alone, and a whole
//! request through `WebhookSecret` (rate window, in-flight slot, secret,
//! body, action) for a read (`get_flow`) and a write (`set_waiting` then
//! `resume_flow`, each a compare-and-set), on `MemoryStore` and on
//! `RedisStore` over loopback.
//!
//! `cargo bench --features full --bench webhook`; under `cargo test --all-targets` each
//! benchmark runs once as a smoke test.

mod support;

use std::convert::Infallible;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use modelgate::secrets::{ResolveLimits, SecretProviders};
use modelgate::webhook::{
    FlowAction, WebhookLimits, WebhookSecretLayer, WebhooksConfig, resolve_routes,
};
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt, service_fn};

const SECRET: &str = "bench-secret-0123456789";

fn bench_parser(c: &mut Criterion) {
    let body = json!({"action": "run_task", "flowId": "flow-abc", "runtime": "acp", "task": "build the release",
        "runId": "run-1", "childSessionKey": "agent:main:build", "label": "Build"})
    .to_string();
    c.bench_function("webhook_payload_parse", |b| {
        b.iter(|| FlowAction::parse(std::hint::black_box(body.as_bytes())).unwrap())
    });
}

fn request(body: &Value) -> Request<Full<Bytes>> {
    Request::post("/plugins/webhooks/bench")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {SECRET}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn bench_layer(c: &mut Criterion) {
    support::on_both_stores(|runtime, backend, store| {
        let config =
            WebhooksConfig::from_plugin_entry(&json!({"enabled": true, "config": {"routes": {
                "bench": {"sessionKey": "agent:bench", "secret": SECRET}
            }}}))
            .unwrap();
        let (routes, _) = resolve_routes(
            &config,
            &SecretProviders::default(),
            &ResolveLimits::default(),
        );
        let limits = WebhookLimits {
            requests_per_window: u64::MAX >> 12,
            ..WebhookLimits::default()
        };
        let service = ServiceBuilder::new()
            .layer(WebhookSecretLayer::new(store, routes).limits(limits))
            .service(service_fn(|_: Request<Full<Bytes>>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            }));
        let call = |body: Value| {
            let service = service.clone();
            async move {
                let response = service.oneshot(request(&body)).await.unwrap();
                let bytes = response.into_body().collect().await.unwrap().to_bytes();
                serde_json::from_slice::<Value>(&bytes).unwrap()
            }
        };
        let created = runtime.block_on(call(json!({"action": "create_flow", "goal": "bench"})));
        let flow_id = created["result"]["flow"]["flowId"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut group = c.benchmark_group(format!("webhook/{backend}"));
        group.bench_function("get_flow", |b| {
            b.to_async(runtime)
                .iter(|| call(json!({"action": "get_flow", "flowId": flow_id})))
        });
        group.bench_function("set_waiting_then_resume", |b| {
            b.to_async(runtime).iter(|| async {
                let current = call(json!({"action": "get_flow", "flowId": flow_id})).await;
                let revision = current["result"]["flow"]["revision"].as_u64().unwrap();
                let waiting = call(json!({"action": "set_waiting", "flowId": flow_id, "expectedRevision": revision})).await;
                assert_eq!(waiting["ok"], true);
                call(json!({"action": "resume_flow", "flowId": flow_id, "expectedRevision": revision + 1})).await
            })
        });
        group.finish();
    });
}

criterion_group!(benches, bench_parser, bench_layer);
criterion_main!(benches);
