//! CreditGuard over real HTTP: exact key limits under concurrency (memory,
//! Redis, two instances on one Redis), the overspend bound, seed 000's
//! transitions, streamed usage passing through byte for byte, every way a
//! request can end being settled, BYOK, and the key status it feeds.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};
use common::http_server::serve;
use common::redis_server::RedisServer;
use futures::StreamExt;
use futures::future::join_all;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use modelgate::admission::AdmissionLayers;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::BearerAuthLayer;
use modelgate::body::{BodyLimitLayer, MessageContent};
use modelgate::clock::{Clock, ManualClock};
use modelgate::context::RequestContext;
use modelgate::credit::{CreditGuardLayer, PriceTable};
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::free_quota::FreeModelQuotaLayer;
use modelgate::keys::{ByokDirectory, KeyDirectory, NewKey, SharedStore};
use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
use modelgate::store::{
    FailurePolicy, MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig, TimeSource,
};
use serde_json::{Value, json};
use tower::{ServiceBuilder, service_fn};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;

/// 2026-11-18 12:00 UTC, a Wednesday.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 18, 12, 0, 0).unwrap()
}

/// 1000 credits per million completion tokens: `max_tokens` 1000 is one
/// credit. Prompts are free, so a request's estimate is exact. Except for
/// the models that test the prompt's part of the hold: 1000 credits per
/// million prompt tokens too (a token is 0.001 credit), with the prompt
/// bounds their names say (none for `unbounded/…`).
fn prices() -> PriceTable {
    PriceTable::from_json(
        r#"{"default": {"prompt_per_million": 0, "completion_per_million": 1000},
            "models": {
                "test/bytes": {"prompt_per_million": 1000, "completion_per_million": 1000},
                "image/hang": {"prompt_per_million": 1000, "completion_per_million": 0,
                               "max_tokens_per_image": 700, "context_length": 128000},
                "context/hang": {"prompt_per_million": 1000, "completion_per_million": 0,
                                 "context_length": 5000},
                "unbounded/hang": {"prompt_per_million": 1000, "completion_per_million": 0},
                "unpriced-prompt/hang": {"prompt_per_million": 0, "completion_per_million": 1000}},
            "free_models": ["meta-llama/llama-3-8b:free", "test/charges:free", "unbounded/hang:free"]}"#,
    )
    .unwrap()
}

/// The SSE stream the upstream sends for `stream: true`: keep-alive
/// comments, content, the usage chunk, `[DONE]`.
fn sse(completion_tokens: u64) -> Vec<Bytes> {
    vec![
        Bytes::from_static(b": OPENROUTER PROCESSING\n\n"),
        Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n"),
        Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n"),
        Bytes::from_static(b"\n: keep-alive\n\n"),
        Bytes::from(format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":{completion_tokens}}}}}\n\n"
        )),
        Bytes::from_static(b"data: [DONE]\n\n"),
    ]
}

fn stream_of(chunks: Vec<Result<Bytes, BoxError>>, then_hang: bool) -> UpstreamBody {
    let frames = futures::stream::iter(chunks).map(|chunk| chunk.map(http_body::Frame::data));
    if then_hang {
        StreamBody::new(frames.chain(futures::stream::pending())).boxed_unsync()
    } else {
        StreamBody::new(frames).boxed_unsync()
    }
}

/// Requests the upstream stand-in received for `test/slow`.
static SLOW_ARRIVALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The upstream stand-in. The model's name says how it behaves; it
/// reports `max_tokens` completion tokens (×1.5 for `test/overrun`), and
/// 3 prompt tokens, or for `test/bytes` one per byte of the prompt's text
/// (a tokenizer that splits a 2-byte script into bytes).
async fn upstream(request: Request<Full<Bytes>>) -> Result<Response<UpstreamBody>, Infallible> {
    let chat = RequestContext::of(&request)
        .and_then(|context| context.chat.clone())
        .expect("BodyLimit parsed it");
    let max_tokens = chat.max_tokens.unwrap_or(100);
    let tokens = if chat.model == "test/overrun" {
        max_tokens * 3 / 2
    } else {
        max_tokens
    };
    let json_body = |body: Value| {
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync()
    };
    let name = match chat.model_id.variant() {
        Some(variant) => format!("{}:{variant}", chat.model_id.model()),
        None => chat.model_id.model().to_owned(),
    };
    let response = match name.as_str() {
        "error" => Response::builder()
            .status(500)
            .body(json_body(json!({"error": {"message": "boom"}}))),
        "no-usage" => Response::builder().body(json_body(json!({"choices": []}))),
        "broken-stream" => Response::builder().body(stream_of(
            vec![Ok(sse(tokens)[1].clone()), Err("upstream reset".into())],
            false,
        )),
        "hang" => Response::builder().body(stream_of(vec![Ok(sse(tokens)[1].clone())], true)),
        "sse-anyway" => Response::builder()
            .header("content-type", "text/event-stream; charset=utf-8")
            .body(stream_of(
                sse(tokens / 2).into_iter().map(Ok).collect(),
                false,
            )),
        "charges:free" => Response::builder().body(json_body(json!({
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "cost": 5.0},
        }))),
        "slow" => {
            // At work and never answering: its client gives up.
            SLOW_ARRIVALS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::pending::<()>().await;
            unreachable!()
        }
        "bytes" => {
            let text_bytes: usize = chat
                .messages
                .iter()
                .map(|message| match &message.content {
                    Some(MessageContent::Text(text)) => text.len(),
                    Some(MessageContent::Parts(parts)) => parts
                        .iter()
                        .filter_map(|part| part["text"].as_str())
                        .map(str::len)
                        .sum(),
                    None => 0,
                })
                .sum();
            Response::builder().body(json_body(json!({
                "choices": [{"message": {"role": "assistant", "content": "Hi"}}],
                "usage": {"prompt_tokens": text_bytes, "completion_tokens": tokens},
            })))
        }
        "stream-no-usage" => {
            let mut chunks = sse(tokens);
            chunks.remove(4);
            Response::builder().body(stream_of(chunks.into_iter().map(Ok).collect(), false))
        }
        _ if chat.stream => Response::builder()
            .header("content-type", "text/event-stream")
            .body(stream_of(sse(tokens).into_iter().map(Ok).collect(), false)),
        _ => Response::builder().body(json_body(json!({
            "choices": [{"message": {"role": "assistant", "content": "Hi"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens},
        }))),
    };
    Ok(response.unwrap())
}

struct Gateway {
    addresses: Vec<SocketAddr>,
    store: SharedStore,
    clock: ManualClock,
    admin: String,
    _server: Option<RedisServer>,
}

/// What some tests add to the gateway: the rate and free-quota layers,
/// deciding with CreditGuard in one step ([`AdmissionLayers`]), and the
/// accounts' own provider keys (BYOK).
#[derive(Clone, Default)]
struct Extras {
    rate_rules: Option<RateLimitRules>,
    byok: bool,
}

async fn instance(
    store: SharedStore,
    clock: &ManualClock,
    configure: fn(CreditGuardLayer) -> CreditGuardLayer,
    extras: &Extras,
) -> SocketAddr {
    let clock: Arc<ManualClock> = Arc::new(clock.clone());
    let directory = KeyDirectory::builder(store.clone())
        .clock(clock.clone())
        .build();
    let mut credit =
        configure(CreditGuardLayer::new(store.clone(), Arc::new(prices())).clock(clock.clone()));
    let mut routes = KeyRoutesLayer::new(directory.clone());
    if extras.byok {
        let byok = ByokDirectory::builder(store.clone())
            .clock(clock.clone())
            .build();
        credit = credit.byok_directory(byok.clone());
        routes = routes.byok_directory(byok);
    }
    let front = ServiceBuilder::new()
        .layer(ErrorMapperLayer::new())
        .layer(BodyLimitLayer::new())
        .layer(BearerAuthLayer::new(directory))
        .layer(routes);
    match &extras.rate_rules {
        None => serve(front.layer(credit).service(service_fn(upstream))).await,
        Some(rules) => {
            let admission = AdmissionLayers::new(
                GlobalRateLimitLayer::new(store.clone(), rules.clone())
                    .unwrap()
                    .clock(clock.clone()),
                FreeModelQuotaLayer::new(store).clock(clock),
                credit,
            );
            serve(front.layer(admission).service(service_fn(upstream))).await
        }
    }
}

async fn redis(server: &RedisServer) -> SharedStore {
    Arc::new(
        RedisStore::connect(
            &server.url(),
            RedisStoreConfig {
                time_source: TimeSource::Caller,
                ..RedisStoreConfig::default()
            },
        )
        .await
        .unwrap(),
    )
}

/// `instances` gateways on one store: memory when `redis` is false.
async fn gateway(
    redis_backed: bool,
    instances: usize,
    configure: fn(CreditGuardLayer) -> CreditGuardLayer,
) -> Gateway {
    gateway_with(redis_backed, instances, configure, &Extras::default()).await
}

/// [`gateway`] with `extras` on every instance.
async fn gateway_with(
    redis_backed: bool,
    instances: usize,
    configure: fn(CreditGuardLayer) -> CreditGuardLayer,
    extras: &Extras,
) -> Gateway {
    let clock = ManualClock::new(t0());
    let (stores, server): (Vec<SharedStore>, _) = if redis_backed {
        let server = RedisServer::start();
        let mut stores = Vec::new();
        for _ in 0..instances {
            stores.push(redis(&server).await);
        }
        (stores, Some(server))
    } else {
        let store: SharedStore = Arc::new(MemoryStore::new());
        (vec![store; instances], None)
    };
    let mut addresses = Vec::new();
    for store in &stores {
        addresses.push(instance(store.clone(), &clock, configure, extras).await);
    }
    // The default account has money; tests of the balance use others.
    stores[0]
        .top_up("default", 1000 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let admin = KeyDirectory::new(stores[0].clone())
        .create_key(NewKey {
            management: true,
            ..NewKey::named("operator")
        })
        .await
        .unwrap()
        .0;
    Gateway {
        addresses,
        store: stores[0].clone(),
        clock,
        admin: admin.expose().to_owned(),
        _server: server,
    }
}

fn as_is(layer: CreditGuardLayer) -> CreditGuardLayer {
    layer
}

struct Reply {
    status: u16,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

async fn call(
    address: SocketAddr,
    method: &str,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> Reply {
    let client = reqwest::Client::new();
    let mut request = client
        .request(method.parse().unwrap(), format!("http://{address}{path}"))
        .header("authorization", format!("Bearer {key}"));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    Reply {
        status,
        body: response.bytes().await.unwrap(),
    }
}

fn chat_body(model: &str, max_tokens: u64, stream: bool) -> Value {
    json!({"model": model, "max_tokens": max_tokens, "stream": stream, "messages": [{"role": "user", "content": "Hi"}]})
}

async fn chat(address: SocketAddr, key: &str, model: &str, max_tokens: u64) -> Reply {
    call(
        address,
        "POST",
        "/api/v1/chat/completions",
        key,
        Some(chat_body(model, max_tokens, false)),
    )
    .await
}

impl Gateway {
    async fn key(&self, body: Value) -> (String, String) {
        // Keys go only to accounts that exist.
        if let Some(account) = body["account"].as_str() {
            KeyDirectory::new(self.store.clone())
                .ensure_account(account)
                .await
                .unwrap();
        }
        let reply = call(
            self.addresses[0],
            "POST",
            "/api/v1/keys",
            &self.admin,
            Some(body),
        )
        .await;
        assert_eq!(reply.status, 201, "{:?}", reply.json());
        let json = reply.json();
        (
            json["key"].as_str().unwrap().to_owned(),
            json["data"]["hash"].as_str().unwrap().to_owned(),
        )
    }

    async fn status(&self, key: &str) -> Value {
        common::settle::key_settled(&self.store, key, self.clock.now()).await;
        call(self.addresses[0], "GET", "/api/v1/key", key, None)
            .await
            .json()["data"]
            .clone()
    }

    async fn manage(&self, method: &str, path: &str, body: Value) -> Reply {
        call(self.addresses[0], method, path, &self.admin, Some(body)).await
    }
}

fn limit_source(reply: &Reply) -> Value {
    reply.json()["error"]["metadata"]["limit_source"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_one_credit_requests_admit_exactly_ten_under_a_ten_credit_limit() {
    for (name, redis_backed, instances) in [
        ("memory", false, 1),
        ("redis", true, 1),
        ("two instances", true, 2),
    ] {
        let gateway = gateway(redis_backed, instances, as_is).await;
        let (key, _) = gateway.key(json!({"name": "capped", "limit": 10})).await;
        let replies = join_all((0..100).map(|index| {
            let address = gateway.addresses[index % instances];
            let key = key.clone();
            async move { chat(address, &key, "openai/gpt-4o", 1000).await }
        }))
        .await;
        let admitted = replies.iter().filter(|reply| reply.status == 200).count();
        assert_eq!(admitted, 10, "{name}");
        for refused in replies.iter().filter(|reply| reply.status != 200) {
            assert_eq!(refused.status, 402, "{name}");
            assert_eq!(limit_source(refused), "key_limit", "{name}");
        }
        let status = gateway.status(&key).await;
        assert_eq!(
            (status["usage"].clone(), status["limit_remaining"].clone()),
            (json!(10), json!(0)),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overspend_is_bounded_by_the_estimate_error_of_requests_in_flight() {
    let gateway = gateway(false, 1, as_is).await;
    // Each request is estimated at 1 credit and really costs 1.5.
    let (key, _) = gateway
        .key(json!({"name": "concurrent", "limit": 10}))
        .await;
    let replies =
        join_all((0..100).map(|_| chat(gateway.addresses[0], &key, "test/overrun", 1000))).await;
    let admitted = replies.iter().filter(|reply| reply.status == 200).count() as f64;
    let used = gateway.status(&key).await["usage"].as_f64().unwrap();
    assert_eq!(used, admitted * 1.5);
    // Holds stop admission at the limit, so the overspend is at most the
    // estimate error (0.5) of each request admitted while others were held.
    assert!(
        used <= 10.0 + admitted * 0.5,
        "used {used} of 10 with {admitted} admitted"
    );
    assert!(admitted <= 10.0);
    // One at a time, admission stops once usage reaches the limit: the
    // overspend is under one request's real cost.
    let (key, _) = gateway
        .key(json!({"name": "sequential", "limit": 10}))
        .await;
    let mut admitted = 0;
    while chat(gateway.addresses[0], &key, "test/overrun", 1000)
        .await
        .status
        == 200
    {
        admitted += 1;
        // One at a time: each cost lands before the next request.
        common::settle::key_settled(&gateway.store, &key, gateway.clock.now()).await;
    }
    assert_eq!(
        admitted, 7,
        "6 × 1.5 = 9 < 10 admits a 7th; 10.5 ≥ 10 stops"
    );
    assert_eq!(gateway.status(&key).await["usage"], 10.5);
}

#[tokio::test]
async fn seed_transitions_limit_reached_raised_and_balance_negative_then_topped_up() {
    for redis_backed in [false, true] {
        let gateway = gateway(redis_backed, 1, as_is).await;
        let address = gateway.addresses[0];
        let (key, hash) = gateway
            .key(json!({"name": "app", "account": "shop", "limit": 2}))
            .await;
        gateway
            .manage(
                "POST",
                "/api/v1/accounts/shop/credits",
                json!({"amount": 3}),
            )
            .await;
        assert_eq!(chat(address, &key, "openai/gpt-4o", 1000).await.status, 200);
        assert_eq!(chat(address, &key, "openai/gpt-4o", 1000).await.status, 200);
        let refused = chat(address, &key, "openai/gpt-4o", 1000).await;
        assert_eq!(
            (refused.status, limit_source(&refused)),
            (402, json!("key_limit"))
        );
        let message = refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            message.contains("credit limit is 2 credits") && message.contains("never resets"),
            "{message}"
        );
        // Raising the limit makes the key valid again at once.
        gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{hash}"),
                json!({"limit": 4}),
            )
            .await;
        assert_eq!(chat(address, &key, "openai/gpt-4o", 1000).await.status, 200);
        // The key may spend more, but the account has spent the 3 it
        // bought: the balance is a limit too, a 402 `credits`.
        let refused = chat(address, &key, "openai/gpt-4o", 1000).await;
        assert_eq!(
            (refused.status, limit_source(&refused)),
            (402, json!("credits"))
        );
        // An upstream that ignored its bound took the balance below zero:
        // then even a free model gets 402.
        let overspend = modelgate::store::Settlement {
            account: "shop".into(),
            key: hash.clone(),
            reservation_id: "overspent".into(),
            hold_granted: false,
            cost_nanos: NANOS_PER_CREDIT,
            byok: false,
            record: None,
        };
        gateway.store.settle(&overspend, t0()).await.unwrap();
        gateway
            .manage(
                "PATCH",
                &format!("/api/v1/keys/{hash}"),
                json!({"limit": null}),
            )
            .await;
        let refused = chat(address, &key, "meta-llama/llama-3-8b:free", 10).await;
        assert_eq!(
            (refused.status, limit_source(&refused)),
            (402, json!("credits"))
        );
        assert!(
            refused.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("top up")
        );
        // A top-up above zero makes it usable again; free models cost nothing.
        gateway
            .manage(
                "POST",
                "/api/v1/accounts/shop/credits",
                json!({"amount": 1.5}),
            )
            .await;
        assert_eq!(
            chat(address, &key, "meta-llama/llama-3-8b:free", 10)
                .await
                .status,
            200
        );
        let status = gateway.status(&key).await;
        assert_eq!(status["usage"], 4, "the free request cost nothing");
    }
}

#[tokio::test]
async fn key_limits_reset_at_the_utc_day_week_and_month() {
    for redis_backed in [false, true] {
        let gateway = gateway(redis_backed, 1, as_is).await;
        let address = gateway.addresses[0];
        for (reset, next) in [
            (
                "daily",
                Utc.with_ymd_and_hms(2026, 11, 19, 0, 0, 0).unwrap(),
            ),
            (
                "weekly",
                Utc.with_ymd_and_hms(2026, 11, 23, 0, 0, 0).unwrap(),
            ),
            (
                "monthly",
                Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap(),
            ),
        ] {
            gateway.clock.set(t0());
            let (key, _) = gateway
                .key(json!({"name": reset, "limit": 1, "limit_reset": reset}))
                .await;
            assert_eq!(chat(address, &key, "openai/gpt-4o", 1000).await.status, 200);
            // Its cost lands in this period, before the clock moves on.
            common::settle::key_settled(&gateway.store, &key, gateway.clock.now()).await;
            let refused = chat(address, &key, "openai/gpt-4o", 1000).await;
            assert_eq!(refused.status, 402, "{reset}");
            assert_eq!(
                refused.json()["error"]["metadata"]["resets_at"],
                next.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            gateway.clock.set(next - chrono::Duration::seconds(1));
            assert_eq!(
                chat(address, &key, "openai/gpt-4o", 1000).await.status,
                402,
                "{reset}: not yet"
            );
            gateway.clock.set(next);
            assert_eq!(
                chat(address, &key, "openai/gpt-4o", 1000).await.status,
                200,
                "{reset}: reset"
            );
        }
    }
}

#[tokio::test]
async fn a_stream_passes_byte_for_byte_and_is_charged_its_reported_usage() {
    let gateway = gateway(true, 1, as_is).await;
    let (key, _) = gateway.key(json!({"name": "streamer"})).await;
    // A client that asks for usage gets every byte the upstream sent.
    let mut asked = chat_body("openai/gpt-4o", 1000, true);
    asked["stream_options"] = json!({"include_usage": true});
    let reply = call(
        gateway.addresses[0],
        "POST",
        "/api/v1/chat/completions",
        &key,
        Some(asked),
    )
    .await;
    assert_eq!(reply.status, 200);
    let expected: Vec<u8> = sse(1000).concat();
    assert_eq!(
        reply.body.as_ref(),
        expected.as_slice(),
        "not a byte changed, comments kept"
    );
    let status = gateway.status(&key).await;
    assert_eq!(status["usage"], 1, "1000 completion tokens");
    // One that did not: the gateway asked for it, read it and kept it back.
    let reply = call(
        gateway.addresses[0],
        "POST",
        "/api/v1/chat/completions",
        &key,
        Some(chat_body("openai/gpt-4o", 1000, true)),
    )
    .await;
    let mut expected = sse(1000);
    expected.remove(4);
    assert_eq!(reply.body.as_ref(), expected.concat().as_slice());
    let status = gateway.status(&key).await;
    assert_eq!(status["usage"], 2, "charged its usage all the same");
}

/// Waits (bounded) for a key's holds to be released: settlement in the
/// background after a client went away.
async fn settled(gateway: &Gateway, hash: &str) -> modelgate::store::KeyUsage {
    common::wait::wait_for(common::wait::PATIENCE, || async {
        let usage = gateway
            .store
            .key_usage("default", hash, gateway.clock.now())
            .await
            .unwrap();
        if usage.reserved_nanos == 0 {
            Ok(usage)
        } else {
            Err(format!("the reservation was never settled: {usage:?}"))
        }
    })
    .await
}

#[tokio::test]
async fn every_ending_is_settled_never_silently_zero() {
    let gateway = gateway(true, 1, as_is).await;
    let address = gateway.addresses[0];
    let cases = [
        ("test/no-usage", false, 1.0, "no usage: the hold is charged"),
        (
            "test/error",
            false,
            0.0,
            "an error response without usage costs nothing",
        ),
        (
            "test/broken-stream",
            true,
            1.0,
            "a broken stream is charged its hold",
        ),
    ];
    for (model, stream, charged, why) in cases {
        let (key, hash) = gateway.key(json!({"name": model})).await;
        let client = reqwest::Client::new();
        // A broken stream may break before the client has even its head.
        let response = client
            .post(format!("http://{address}/api/v1/chat/completions"))
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(chat_body(model, 1000, stream).to_string())
            .send()
            .await;
        if let Ok(response) = response {
            let _ = response.bytes().await;
        }
        let usage = settled(&gateway, &hash).await;
        assert_eq!(
            usage.total_nanos as f64 / NANOS_PER_CREDIT as f64,
            charged,
            "{why}"
        );
    }
    // A client that gives up before the response starts: the upstream may
    // be working, so it is charged its estimate, and the hold released.
    let (key, hash) = gateway.key(json!({"name": "impatient"})).await;
    let arrived_before = SLOW_ARRIVALS.load(std::sync::atomic::Ordering::SeqCst);
    let impatient = tokio::spawn(
        reqwest::Client::new()
            .post(format!("http://{address}/api/v1/chat/completions"))
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(chat_body("test/slow", 1000, false).to_string())
            .send(),
    );
    // It gives up once the request is at the upstream, which is at work.
    common::wait::wait_until(
        common::wait::PATIENCE,
        "the request at the upstream",
        || async { SLOW_ARRIVALS.load(std::sync::atomic::Ordering::SeqCst) > arrived_before },
    )
    .await;
    impatient.abort();
    assert!(impatient.await.unwrap_err().is_cancelled());
    let usage = settled(&gateway, &hash).await;
    assert_eq!(
        usage.total_nanos, NANOS_PER_CREDIT,
        "a client that gave up is charged"
    );
    // A client that goes away mid-stream: charged its hold, hold released.
    let (key, hash) = gateway.key(json!({"name": "leaver"})).await;
    let client = reqwest::Client::new();
    let mut response = client
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(chat_body("test/hang", 1000, true).to_string())
        .send()
        .await
        .unwrap();
    assert!(response.chunk().await.unwrap().is_some());
    drop(response);
    let usage = settled(&gateway, &hash).await;
    assert_eq!(
        usage.total_nanos, NANOS_PER_CREDIT,
        "a client that left is charged"
    );
}

#[tokio::test]
async fn a_store_failure_refuses_by_default_and_admits_when_set_to_fail_open() {
    fn open(layer: CreditGuardLayer) -> CreditGuardLayer {
        layer.failure_policy(FailurePolicy::FailOpen)
    }
    let mut server = RedisServer::start();
    let config = RedisStoreConfig {
        call_timeout: Duration::from_millis(300),
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store: SharedStore = Arc::new(RedisStore::connect(&server.url(), config).await.unwrap());
    let clock = ManualClock::new(t0());
    let closed = instance(store.clone(), &clock, as_is, &Extras::default()).await;
    let opened = instance(store.clone(), &clock, open, &Extras::default()).await;
    let (key, _) = KeyDirectory::new(store.clone())
        .create_key(NewKey::named("k"))
        .await
        .unwrap();
    store
        .top_up("default", 10 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    // Warm both key caches.
    assert_eq!(chat(closed, key.expose(), "a/b", 10).await.status, 200);
    assert_eq!(chat(opened, key.expose(), "a/b", 10).await.status, 200);
    server.stop();
    let refused = chat(closed, key.expose(), "a/b", 10).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.json()["error"]["metadata"]["layer"], "CreditGuard");
    assert_eq!(chat(opened, key.expose(), "a/b", 10).await.status, 200);
}

#[tokio::test]
async fn a_model_without_a_price_is_refused_not_guessed() {
    fn priced_only(layer: CreditGuardLayer) -> CreditGuardLayer {
        layer
    }
    let store: SharedStore = Arc::new(MemoryStore::new());
    store.top_up("default", NANOS_PER_CREDIT).await.unwrap();
    let directory = KeyDirectory::new(store.clone());
    let (key, _) = directory.create_key(NewKey::named("k")).await.unwrap();
    let table = PriceTable::from_json(
        r#"{"models": {"openai/gpt-4o": {"prompt_per_million": 1, "completion_per_million": 1}}}"#,
    )
    .unwrap();
    let service = ServiceBuilder::new()
        .layer(BodyLimitLayer::new())
        .layer(BearerAuthLayer::new(directory))
        .layer(priced_only(CreditGuardLayer::new(store, Arc::new(table))))
        .service(service_fn(upstream));
    let request = |model: &str| {
        Request::post("/api/v1/chat/completions")
            .header("authorization", format!("Bearer {}", key.expose()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                chat_body(model, 10, false).to_string(),
            )))
            .unwrap()
    };
    let response = tower::ServiceExt::oneshot(service.clone(), request("openai/o1"))
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let response = tower::ServiceExt::oneshot(service, request("openai/gpt-4o"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_request_that_could_pass_the_limit_is_refused_so_overspend_stays_bounded() {
    let gateway = gateway(false, 1, as_is).await;
    let address = gateway.addresses[0];
    let (key, _) = gateway.key(json!({"name": "k", "limit": 10})).await;
    for _ in 0..9 {
        assert_eq!(chat(address, &key, "openai/gpt-4o", 1000).await.status, 200);
    }
    // 9 of 10 used: a request estimated at 500 credits could take usage to
    // 509, so it is refused; one estimated at 1 fits exactly.
    let refused = chat(address, &key, "openai/gpt-4o", 500_000).await;
    assert_eq!(
        (refused.status, limit_source(&refused)),
        (402, json!("key_limit"))
    );
    assert_eq!(chat(address, &key, "openai/gpt-4o", 1000).await.status, 200);
    assert_eq!(gateway.status(&key).await["usage"], 10);
}

#[tokio::test]
async fn the_response_decides_how_it_is_read_and_free_models_are_never_charged() {
    let gateway = gateway(false, 1, as_is).await;
    let address = gateway.addresses[0];
    let (key, _) = gateway.key(json!({"name": "k"})).await;
    // Asked without `stream`, answered as SSE: its usage (500 tokens) is
    // read, not the estimate (1000) charged.
    assert_eq!(
        chat(address, &key, "test/sse-anyway", 1000).await.status,
        200
    );
    assert_eq!(gateway.status(&key).await["usage"], 0.5);
    // A free variant whose upstream states a cost: still free.
    assert_eq!(
        chat(address, &key, "test/charges:free", 1000).await.status,
        200
    );
    assert_eq!(gateway.status(&key).await["usage"], 0.5);
}

/// A 40-request burst of prompts in a 2-byte script on a 10-credit balance,
/// spread over `instances`: the upstream counts a prompt token per byte,
/// and the hold covers it, so the balance never goes below zero.
async fn two_byte_prompts_never_overdraw(redis_backed: bool, instances: usize) {
    let gateway = gateway(redis_backed, instances, as_is).await;
    let (key, hash) = gateway
        .key(json!({"name": "cyrillic", "account": "burst"}))
        .await;
    let topped = gateway
        .manage(
            "POST",
            "/api/v1/accounts/burst/credits",
            json!({"amount": 10}),
        )
        .await;
    assert!((200..300).contains(&topped.status), "{:?}", topped.json());
    // 1000 bytes of text: "я" is 2 bytes of UTF-8. The upstream charges
    // 1000 prompt and 10 completion tokens, 1.01 credits; counting a token
    // per 3 bytes, the hold would be a third of the prompt.
    let body = json!({"model": "test/bytes", "max_tokens": 10,
                      "messages": [{"role": "user", "content": "я".repeat(500)}]});
    let replies = join_all((0..40).map(|index| {
        let address = gateway.addresses[index % instances];
        let (key, body) = (key.clone(), body.clone());
        async move {
            call(
                address,
                "POST",
                "/api/v1/chat/completions",
                &key,
                Some(body),
            )
            .await
        }
    }))
    .await;
    let admitted = replies.iter().filter(|reply| reply.status == 200).count() as i64;
    for refused in replies.iter().filter(|reply| reply.status != 200) {
        assert_eq!(
            (refused.status, limit_source(refused)),
            (402, json!("credits")),
            "{:?}",
            refused.json()
        );
    }
    common::settle::settled(gateway.store.as_ref(), "burst", &hash, gateway.clock.now()).await;
    let balance = gateway.store.account_balance("burst").await.unwrap();
    assert!(
        balance.balance_nanos >= 0,
        "{admitted} admitted took the balance to {balance:?}"
    );
    // Each admitted request was charged its real cost, 1.01 credits; a
    // hold of 1.042 (the prompt's 1000 bytes and 32 of overhead, 10
    // completion tokens) admits at most 9 of them in 10 credits.
    assert_eq!(
        balance.balance_nanos,
        10 * NANOS_PER_CREDIT - admitted * 1_010_000_000
    );
    assert!((1..=9).contains(&admitted), "{admitted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_two_byte_prompts_never_overdraws_the_balance_on_memory() {
    two_byte_prompts_never_overdraw(false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_two_byte_prompts_never_overdraws_the_balance_across_two_instances() {
    two_byte_prompts_never_overdraw(true, 2).await;
}

/// What a new key made of `key_body` holds while a stream of `model` with
/// `content` is open; the reply, when refused.
async fn held_while_streaming(
    gateway: &Gateway,
    key_body: Value,
    model: &str,
    content: Value,
) -> Result<i64, Reply> {
    let account = key_body["account"].as_str().unwrap_or("default").to_owned();
    let (key, hash) = gateway.key(key_body).await;
    let balance_before = gateway.store.account_balance(&account).await.unwrap();
    let body = json!({"model": model, "max_tokens": 10, "stream": true,
                      "messages": [{"role": "user", "content": content}]});
    let mut response = reqwest::Client::new()
        .post(format!(
            "http://{}/api/v1/chat/completions",
            gateway.addresses[0]
        ))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    if response.status() != 200 {
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap();
        // Refused before anything was held or counted (the rates too: see
        // a_refused_prompt_costs_no_rate_and_no_hold).
        let usage = gateway
            .store
            .key_usage(&account, &hash, gateway.clock.now())
            .await
            .unwrap();
        assert_eq!((usage.total_nanos, usage.reserved_nanos), (0, 0));
        let balance = gateway.store.account_balance(&account).await.unwrap();
        assert_eq!(balance, balance_before);
        return Err(Reply { status, body });
    }
    // The stream's first chunk: admitted and held; then it hangs.
    assert!(response.chunk().await.unwrap().is_some());
    let usage = gateway
        .store
        .key_usage(&account, &hash, gateway.clock.now())
        .await
        .unwrap();
    drop(response);
    // The client gone, its settlement releases the hold: wait for it, so
    // that the next reading of the balance does not race it.
    common::wait::wait_until(common::wait::PATIENCE, "the hold released", || async {
        gateway
            .store
            .key_usage(&account, &hash, gateway.clock.now())
            .await
            .unwrap()
            .reserved_nanos
            == 0
    })
    .await;
    Ok(usage.reserved_nanos)
}

#[tokio::test]
async fn a_non_text_part_holds_its_models_bound_or_is_refused_naming_the_field_to_set() {
    use modelgate::credit::MESSAGE_OVERHEAD_TOKENS;
    let gateway = gateway(false, 1, as_is).await;
    let image =
        json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}});
    let content = json!([{"type": "text", "text": "What is it?"}, image]);
    // A prompt token is 0.001 credit, completions are free here: the hold
    // is the prompt's 11 bytes of text, one message and the reply's
    // header, and the image at the model's bound.
    let token_nanos = NANOS_PER_CREDIT / 1000;
    let held = held_while_streaming(
        &gateway,
        json!({"name": "image"}),
        "image/hang",
        content.clone(),
    )
    .await;
    assert_eq!(
        held.ok(),
        Some((11 + 2 * MESSAGE_OVERHEAD_TOKENS as i64 + 700) * token_nanos),
        "max_tokens_per_image"
    );
    // No image bound: the context length, which bounds the whole prompt.
    let held = held_while_streaming(
        &gateway,
        json!({"name": "context"}),
        "context/hang",
        content.clone(),
    )
    .await;
    assert_eq!(held.ok(), Some(5000 * token_nanos), "context_length");
    // Neither: 400, naming the field to set; nothing held or counted.
    for (part, field) in [
        (image, "max_tokens_per_image"),
        (
            json!({"type": "file", "file": {"file_id": "file-1"}}),
            "max_tokens_per_file",
        ),
        (
            json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
            "max_tokens_per_file",
        ),
        (
            json!({"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}),
            "context_length",
        ),
    ] {
        let content = json!([{"type": "text", "text": "What is it?"}, part]);
        let refused = held_while_streaming(
            &gateway,
            json!({"name": "unbounded"}),
            "unbounded/hang",
            content,
        )
        .await
        .expect_err("refused");
        let error = &refused.json()["error"];
        assert_eq!(refused.status, 400, "{error}");
        assert_eq!(error["type"], "invalid_request_error");
        assert_eq!(error["metadata"]["param"], field, "{error}");
        assert_eq!(error["metadata"]["reason"], "unbounded_prompt_part");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(field) && message.contains("messages[0].content[1]"),
            "{message}"
        );
    }
}

/// The image part of the tests of prompt bounds.
fn image_prompt() -> Value {
    json!([{"type": "text", "text": "What is it?"},
           {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}])
}

/// Invariant 1: a request refused for a prompt its model cannot bound
/// counts nowhere. Under an account rule of one request a day, decided
/// with the hold in one step, three refusals leave the day's one request
/// to the next good one; and with 2 credits, where each refusal's hold
/// (0.743) would leave too little for it, it is held and admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_prompt_costs_no_rate_and_no_hold() {
    let rules = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 1, "window_seconds": 86400}}}"#,
    )
    .unwrap();
    for redis_backed in [false, true] {
        let extras = Extras {
            rate_rules: Some(rules.clone()),
            byok: false,
        };
        let gateway = gateway_with(redis_backed, 1, as_is, &extras).await;
        KeyDirectory::new(gateway.store.clone())
            .ensure_account("rated")
            .await
            .unwrap();
        gateway
            .store
            .top_up("rated", 2 * NANOS_PER_CREDIT)
            .await
            .unwrap();
        let key = json!({"name": "rated", "account": "rated"});
        for _ in 0..3 {
            let refused =
                held_while_streaming(&gateway, key.clone(), "unbounded/hang", image_prompt())
                    .await
                    .expect_err("unbounded");
            assert_eq!(
                refused.json()["error"]["metadata"]["reason"],
                "unbounded_prompt_part",
                "redis: {redis_backed}"
            );
        }
        let held = held_while_streaming(&gateway, key.clone(), "image/hang", image_prompt()).await;
        assert_eq!(
            held.ok(),
            Some((11 + 2 * 16 + 700) * (NANOS_PER_CREDIT / 1000)),
            "redis: {redis_backed}"
        );
        // The rule counts: the day's one request is spent.
        let refused = held_while_streaming(&gateway, key, "image/hang", image_prompt())
            .await
            .expect_err("over the rate");
        assert_eq!(refused.status, 429, "redis: {redis_backed}");
    }
}

/// The prompt's bound matters only when the prompt holds credits: a
/// `:free` model, a model whose prompt tokens cost nothing and a BYOK
/// request its key's limit does not count admit an image no bound
/// covers; a BYOK request counted against its key's limit
/// (`include_byok_in_limit`) is refused as a paid one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_part_is_refused_only_when_the_prompt_holds_credits() {
    let token_nanos = NANOS_PER_CREDIT / 1000;
    for redis_backed in [false, true] {
        let extras = Extras {
            rate_rules: None,
            byok: true,
        };
        let gateway = gateway_with(redis_backed, 1, as_is, &extras).await;
        let case = format!("redis: {redis_backed}");
        // Free: nothing held, nothing to bound.
        let held = held_while_streaming(
            &gateway,
            json!({"name": "free"}),
            "unbounded/hang:free",
            image_prompt(),
        )
        .await;
        assert_eq!(held.map_err(|reply| reply.json()), Ok(0), "{case}");
        // Prompt tokens free: the hold is the completion bound alone.
        let held = held_while_streaming(
            &gateway,
            json!({"name": "unpriced"}),
            "unpriced-prompt/hang",
            image_prompt(),
        )
        .await;
        assert_eq!(
            held.map_err(|reply| reply.json()),
            Ok(10 * token_nanos),
            "{case}"
        );
        // The account's own key for the provider.
        KeyDirectory::new(gateway.store.clone())
            .ensure_account("own")
            .await
            .unwrap();
        let set = gateway
            .manage(
                "PUT",
                "/api/v1/accounts/own/byok/unbounded",
                json!({"key": "sk-own-provider-key-0001"}),
            )
            .await;
        assert!((200..300).contains(&set.status), "{:?}", set.json());
        let held = held_while_streaming(
            &gateway,
            json!({"name": "byok", "account": "own"}),
            "unbounded/hang",
            image_prompt(),
        )
        .await;
        assert_eq!(held.map_err(|reply| reply.json()), Ok(0), "{case}");
        // Counted against the key's limit: the hold must bound the prompt.
        let refused = held_while_streaming(
            &gateway,
            json!({"name": "byok-counted", "account": "own", "limit": 5, "include_byok_in_limit": true}),
            "unbounded/hang",
            image_prompt(),
        )
        .await
        .expect_err("counted");
        let error = &refused.json()["error"];
        assert_eq!(refused.status, 400, "{case}: {error}");
        assert_eq!(
            error["metadata"]["reason"], "unbounded_prompt_part",
            "{case}"
        );
        assert_eq!(error["metadata"]["param"], "max_tokens_per_image", "{case}");
    }
}
