//! What BearerAuth adds to a request: the header parser, the key check and
//! hash, and the whole layer with its cache on and off, on `MemoryStore`
//! and on `RedisStore` over loopback (a chat request trusts the cache; any
//! other route reads a live key afresh); and `GET /api/v1/key` end to end.
//! Also what a secret-scanning alert costs before any lookup: its
//! signature checked and its body parsed.
//!
//! `cargo bench --features full --bench auth`; under `cargo test --all-targets` each
//! benchmark runs once as a smoke test.

#[path = "../tests/it/common/redis_server.rs"]
mod redis_server;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::Full;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::{ApiKey, BearerAuthLayer, parse_bearer};
use modelgate::body::BodyLimitLayer;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::leaks::{ScanningKeys, parse_alert};
use modelgate::store::{MemoryStore, RedisStore, RedisStoreConfig};
use tower::{ServiceBuilder, ServiceExt, service_fn};

fn request(path: &str, authorization: &str) -> Request<Full<Bytes>> {
    let method = if path.ends_with("/chat/completions") {
        http::Method::POST
    } else {
        http::Method::GET
    };
    Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", authorization)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn bench_leak_alert(c: &mut Criterion) {
    use base64::Engine as _;
    use p256::ecdsa::signature::Signer as _;
    use p256::elliptic_curve::Generate as _;
    use p256::pkcs8::EncodePublicKey as _;
    let signing = p256::ecdsa::SigningKey::generate();
    let pem = signing
        .verifying_key()
        .to_public_key_pem(p256::pkcs8::LineEnding::LF)
        .unwrap();
    let document = serde_json::json!({"public_keys": [{"key_identifier": "k1", "key": pem, "is_current": true}]});
    let keys = ScanningKeys::from_json(document.to_string().as_bytes()).unwrap();
    let body = serde_json::json!([{"token": ApiKey::generate().expose(), "type": "modelgate_api_key",
                                   "url": "https://github.com/o/r/blob/main/.env", "source": "content"}])
    .to_string();
    let signature: p256::ecdsa::DerSignature = signing.sign(body.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(signature.as_bytes());
    c.bench_function("leak_alert/verify_and_parse_one_token", |b| {
        b.iter(|| {
            keys.verify("k1", &signature, std::hint::black_box(body.as_bytes()))
                .unwrap();
            parse_alert(body.as_bytes()).unwrap()
        })
    });
}

fn bench_parsing(c: &mut Criterion) {
    let key = ApiKey::generate();
    let header = format!("Bearer {}", key.expose());
    c.bench_function("parse_bearer", |b| {
        b.iter(|| parse_bearer(std::hint::black_box(header.as_bytes())).unwrap())
    });
    c.bench_function("api_key_parse_and_hash", |b| {
        b.iter(|| {
            ApiKey::parse(std::hint::black_box(key.expose()))
                .unwrap()
                .hash()
        })
    });
}

fn bench_layer(
    c: &mut Criterion,
    runtime: &tokio::runtime::Runtime,
    backend: &str,
    store: SharedStore,
) {
    let mut group = c.benchmark_group(format!("bearer_auth/{backend}"));
    for (cache, ttl) in [
        ("cached", Duration::from_secs(1)),
        ("uncached", Duration::ZERO),
    ] {
        let directory = KeyDirectory::builder(store.clone()).cache_ttl(ttl).build();
        let (key, _) = runtime
            .block_on(directory.create_key(NewKey::named("bench")))
            .unwrap();
        let authorization = format!("Bearer {}", key.expose());
        let service = ServiceBuilder::new()
            .layer(BearerAuthLayer::new(directory.clone()))
            .service(service_fn(|_: Request<Full<Bytes>>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            }));
        group.bench_function(cache, |b| {
            b.to_async(runtime).iter(|| {
                let call = service
                    .clone()
                    .oneshot(request("/api/v1/chat/completions", &authorization));
                async move { assert_eq!(call.await.unwrap().status(), 200) }
            })
        });
        if cache == "cached" {
            group.bench_function("live_lookup_other_route", |b| {
                b.to_async(runtime).iter(|| {
                    let call = service
                        .clone()
                        .oneshot(request("/api/v1/models", &authorization));
                    async move { assert_eq!(call.await.unwrap().status(), 200) }
                })
            });
        }
        if cache == "cached" {
            let status = ServiceBuilder::new()
                .layer(BodyLimitLayer::new())
                .layer(BearerAuthLayer::new(directory.clone()))
                .layer(KeyRoutesLayer::new(directory))
                .service(service_fn(|_: Request<Full<Bytes>>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                }));
            group.bench_function("get_api_v1_key", |b| {
                b.to_async(runtime).iter(|| {
                    let call = status
                        .clone()
                        .oneshot(request("/api/v1/key", &authorization));
                    async move { assert_eq!(call.await.unwrap().status(), 200) }
                })
            });
        }
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_parsing(c);
    bench_leak_alert(c);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    bench_layer(c, &runtime, "memory", Arc::new(MemoryStore::new()));
    let server = redis_server::RedisServer::start();
    let redis = runtime
        .block_on(RedisStore::connect(
            &server.url(),
            RedisStoreConfig::default(),
        ))
        .unwrap();
    bench_layer(c, &runtime, "redis", Arc::new(redis));
}

criterion_group!(auth, benches);
criterion_main!(auth);
