//! The webhook routes over real HTTP, on MemoryStore and on a real Redis:
//! every action, every rejection and its status, the rate window and the
//! in-flight bound under concurrency and across two instances, flows
//! shared between instances with exactly one winner per revision, and the
//! `webhooks` example and the proxy serving secrets from the named
//! providers of their `secrets` section (env, file, exec) while skipping a
//! route whose secret cannot be read or whose provider is not declared.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{TimeZone, Utc};
use common::http_server::serve;
use common::redis_server::RedisServer;
use futures::future::join_all;
use http::{Request, Response};
use http_body_util::Full;
use modelgate::clock::ManualClock;
use modelgate::keys::SharedStore;
use modelgate::secrets::{ResolveLimits, SecretProviders};
use modelgate::store::FailurePolicy;
use modelgate::store::{MemoryStore, RedisStore, RedisStoreConfig, TimeSource};
use modelgate::webhook::{
    CancelOutcome, ClientAddr, FlowStatus, TaskLaunch, TaskRunner, TaskRunnerError, TaskStatus,
    TaskUpdate, WebhookLimits, WebhookRoute, WebhookSecretLayer, WebhooksConfig, resolve_routes,
};
use serde_json::{Value, json};
use tower::{ServiceBuilder, service_fn};

const SECRET: &str = "deploys-secret-0123456789";
const AUDIT_SECRET: &str = "audit-secret-0123456789ab";
const OTHER_SECRET: &str = "other-secret-0123456789ab";
const DEPLOYS: &str = "/plugins/webhooks/deploys";
const AUDIT: &str = "/hooks/audit";
const OTHER: &str = "/plugins/webhooks/other";

/// Three routes: two on one session with different controllers, one on another session.
fn config() -> WebhooksConfig {
    WebhooksConfig::from_plugin_entry(&json!({"enabled": true, "config": {"routes": {
        "deploys": {"sessionKey": "agent:main", "secret": SECRET},
        "audit": {"sessionKey": "agent:main", "secret": AUDIT_SECRET, "path": AUDIT, "controllerId": "audit"},
        "other": {"sessionKey": "agent:other", "secret": OTHER_SECRET},
    }}}))
    .unwrap()
}

/// Serves the routes over `store`; a request's `x-test-client` header
/// stands for its client address, so tests can be several clients.
async fn start(store: SharedStore, limits: WebhookLimits) -> SocketAddr {
    serve_routes(|routes| WebhookSecretLayer::new(store, routes).limits(limits)).await
}

/// Serves the routes through the layer `build` makes of them; a request's
/// `x-test-client` header stands for its client address, so tests can be
/// several clients.
async fn serve_routes(build: impl FnOnce(Vec<WebhookRoute>) -> WebhookSecretLayer) -> SocketAddr {
    let (routes, skipped) = resolve_routes(
        &config(),
        &SecretProviders::default(),
        &ResolveLimits::default(),
    );
    assert!(skipped.is_empty());
    let service = ServiceBuilder::new()
        .map_request(|mut request: Request<hyper::body::Incoming>| {
            let client = request
                .headers()
                .get("x-test-client")
                .and_then(|value| value.to_str().ok()?.parse().ok());
            if let Some(address) = client {
                request.extensions_mut().insert(ClientAddr(address));
            }
            request
        })
        .layer(build(routes))
        .service(service_fn(|_: Request<hyper::body::Incoming>| async {
            let mut response = Response::new(Full::new(Bytes::from_static(b"inner")));
            *response.status_mut() = http::StatusCode::NOT_FOUND;
            Ok::<_, Infallible>(response)
        }));
    serve(service).await
}

fn memory() -> SharedStore {
    Arc::new(MemoryStore::new())
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

struct Reply {
    status: u16,
    headers: http::HeaderMap,
    body: Value,
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

async fn post(address: SocketAddr, path: &str, secret: &str, body: Value) -> Reply {
    send(
        client()
            .post(format!("http://{address}{path}"))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {secret}"))
            .body(body.to_string()),
    )
    .await
}

async fn send(request: reqwest::RequestBuilder) -> Reply {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply {
        status,
        headers,
        body,
    }
}

/// Every action, in the order a controller would use them.
async fn every_action(address: SocketAddr) {
    let act = |body: Value| post(address, DEPLOYS, SECRET, body);
    let created = act(
        json!({"action": "create_flow", "goal": "Release 1.2", "notifyPolicy": "state_changes",
        "currentStep": "plan", "stateJson": {"n": 1}}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["ok"], true);
    assert_eq!(created.body["routeId"], "deploys");
    let flow = &created.body["result"]["flow"];
    assert_eq!(flow["status"], "queued");
    assert_eq!(flow["revision"], 1);
    assert_eq!(flow["controllerId"], "webhooks/deploys");
    let text = created.body.to_string();
    for hidden in ["ownerKey", "requesterOrigin", "agent:main", "sessionKey"] {
        assert!(!text.contains(hidden), "{hidden} in {text}");
    }
    let flow_id = flow["flowId"].as_str().unwrap().to_owned();

    let got = act(json!({"action": "get_flow", "flowId": flow_id})).await;
    assert_eq!(
        (got.status, &got.body["result"]["flow"]["goal"]),
        (200, &json!("Release 1.2"))
    );
    let listed = act(json!({"action": "list_flows", "limit": 5})).await;
    assert_eq!(listed.body["result"]["flows"][0]["flowId"], json!(flow_id));
    let latest = act(json!({"action": "find_latest_flow"})).await;
    assert_eq!(latest.body["result"]["flow"]["flowId"], json!(flow_id));
    let resolved = act(json!({"action": "resolve_flow", "token": "agent:main"})).await;
    assert_eq!(resolved.body["result"]["flow"]["flowId"], json!(flow_id));

    let task = act(
        json!({"action": "run_task", "flowId": flow_id, "runtime": "subagent", "task": "build",
        "runId": "run-7", "childSessionKey": "agent:main:build", "label": "Build"}),
    )
    .await;
    assert_eq!(
        (task.status, &task.body["result"]["created"]),
        (201, &json!(true)),
        "{}",
        task.body
    );
    assert!(!task.body.to_string().contains("agent:main"));
    let retried = act(json!({"action": "run_task", "flowId": flow_id, "runtime": "subagent", "task": "build", "runId": "run-7"})).await;
    assert_eq!(
        (retried.status, &retried.body["result"]["created"]),
        (200, &json!(false))
    );
    let summary = act(json!({"action": "get_task_summary", "flowId": flow_id})).await;
    assert_eq!(summary.body["result"]["total"], 1);
    assert_eq!(summary.body["result"]["byRuntime"]["subagent"], 1);
    assert_eq!(summary.body["result"]["byStatus"]["queued"], 1);

    // run_task wrote the flow once: revision 2.
    let waiting = act(json!({"action": "set_waiting", "flowId": flow_id, "expectedRevision": 2, "waitJson": {"for": "review"}})).await;
    assert_eq!(
        (waiting.status, &waiting.body["result"]["flow"]["status"]),
        (200, &json!("waiting")),
        "{}",
        waiting.body
    );
    let resumed =
        act(json!({"action": "resume_flow", "flowId": flow_id, "expectedRevision": 3})).await;
    assert_eq!(resumed.body["result"]["flow"]["status"], "running");
    let finished =
        act(json!({"action": "finish_flow", "flowId": flow_id, "expectedRevision": 4})).await;
    assert_eq!(
        (finished.status, &finished.body["result"]["flow"]["status"]),
        (200, &json!("succeeded"))
    );

    let second = act(json!({"action": "create_flow", "goal": "Hotfix"})).await;
    let second_id = second.body["result"]["flow"]["flowId"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = act(json!({"action": "fail_flow", "flowId": second_id, "expectedRevision": 1, "error": "tests red"})).await;
    assert_eq!(failed.body["result"]["flow"]["status"], "failed");

    let third = act(json!({"action": "create_flow", "goal": "Cleanup", "status": "running"})).await;
    let third_id = third.body["result"]["flow"]["flowId"]
        .as_str()
        .unwrap()
        .to_owned();
    act(json!({"action": "run_task", "flowId": third_id, "runtime": "acp", "task": "sweep"})).await;
    let requested =
        act(json!({"action": "request_cancel", "flowId": third_id, "expectedRevision": 2})).await;
    assert_eq!(requested.status, 200, "{}", requested.body);
    assert!(requested.body["result"]["flow"]["cancelRequestedAt"].is_string());
    let cancelled = act(json!({"action": "cancel_flow", "flowId": third_id})).await;
    assert_eq!(
        (cancelled.status, &cancelled.body["result"]["outcome"]),
        (200, &json!("cancelled"))
    );
    assert_eq!(
        cancelled.body["result"]["flow"]["tasks"][0]["status"],
        "cancelled"
    );
}

/// Every rejection the routes give, with its status and code.
async fn every_rejection(address: SocketAddr) {
    let url = format!("http://{address}{DEPLOYS}");
    let check = |reply: Reply, status: u16, code: &str| {
        assert_eq!(reply.status, status, "{code}: {}", reply.body);
        assert_eq!(reply.body["ok"], false, "{code}");
        assert_eq!(reply.body["code"], code);
        assert_eq!(reply.body["routeId"], "deploys");
        assert!(
            reply.body["error"]
                .as_str()
                .is_some_and(|error| !error.is_empty())
        );
        assert!(reply.body["result"].is_object());
        reply
    };
    let get = check(
        send(
            client()
                .get(&url)
                .header("authorization", format!("Bearer {SECRET}")),
        )
        .await,
        405,
        "method_not_allowed",
    );
    assert_eq!(get.headers["allow"], "POST");
    check(
        send(
            client()
                .post(&url)
                .header("authorization", format!("Bearer {SECRET}"))
                .header("content-type", "text/plain")
                .body("{}"),
        )
        .await,
        415,
        "unsupported_media_type",
    );
    let valid = json!({"action": "list_flows"}).to_string();
    check(
        send(
            client()
                .post(&url)
                .header("content-type", "application/json")
                .body(valid.clone()),
        )
        .await,
        401,
        "unauthorized",
    );
    check(
        send(
            client()
                .post(&url)
                .header("content-type", "application/json")
                .header("authorization", "Bearer wrong-secret-0123456789")
                .body(valid.clone()),
        )
        .await,
        401,
        "unauthorized",
    );
    // Another route's secret opens only that route.
    check(
        post(
            address,
            DEPLOYS,
            OTHER_SECRET,
            json!({"action": "list_flows"}),
        )
        .await,
        401,
        "unauthorized",
    );
    // The dedicated header works as well as Authorization, and JSON with a charset is JSON.
    let by_header = send(
        client()
            .post(&url)
            .header("content-type", "application/json; charset=utf-8")
            .header("x-gateway-webhook-secret", SECRET)
            .body(valid),
    )
    .await;
    assert_eq!(by_header.status, 200, "{}", by_header.body);
    let oversized = json!({"action": "create_flow", "goal": "x".repeat(300 * 1024)});
    check(
        post(address, DEPLOYS, SECRET, oversized.clone()).await,
        413,
        "payload_too_large",
    );
    // Without Content-Length (streamed), the limit holds while reading.
    let chunks: Vec<Result<Bytes, Infallible>> = oversized
        .to_string()
        .into_bytes()
        .chunks(8192)
        .map(|chunk| Ok(Bytes::copy_from_slice(chunk)))
        .collect();
    check(
        send(
            client()
                .post(&url)
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {SECRET}"))
                .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks))),
        )
        .await,
        413,
        "payload_too_large",
    );
    let bad_json = send(
        client()
            .post(&url)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {SECRET}"))
            .body("{\"action\": "),
    )
    .await;
    let bad_json = check(bad_json, 400, "invalid_request");
    assert!(
        bad_json.body["error"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    let bad_field = check(
        post(
            address,
            DEPLOYS,
            SECRET,
            json!({"action": "create_flow", "goal": "g", "colour": "red"}),
        )
        .await,
        400,
        "invalid_request",
    );
    assert!(bad_field.body["error"].as_str().unwrap().contains("colour"));
    let bad_revision = check(
        post(
            address,
            DEPLOYS,
            SECRET,
            json!({"action": "finish_flow", "flowId": "f", "expectedRevision": 0}),
        )
        .await,
        400,
        "invalid_request",
    );
    assert!(
        bad_revision.body["error"]
            .as_str()
            .unwrap()
            .contains("expectedRevision")
    );

    check(
        post(
            address,
            DEPLOYS,
            SECRET,
            json!({"action": "get_flow", "flowId": "flow-none"}),
        )
        .await,
        404,
        "not_found",
    );
    let created = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "create_flow", "goal": "g"}),
    )
    .await;
    let flow_id = created.body["result"]["flow"]["flowId"]
        .as_str()
        .unwrap()
        .to_owned();
    // Another session cannot see it; another controller of the session cannot change it.
    let stranger = post(
        address,
        OTHER,
        OTHER_SECRET,
        json!({"action": "get_flow", "flowId": flow_id}),
    )
    .await;
    assert_eq!(
        (
            stranger.status,
            &stranger.body["code"],
            &stranger.body["routeId"]
        ),
        (404, &json!("not_found"), &json!("other"))
    );
    assert_eq!(
        post(
            address,
            AUDIT,
            AUDIT_SECRET,
            json!({"action": "get_flow", "flowId": flow_id})
        )
        .await
        .status,
        200
    );
    let audit = post(
        address,
        AUDIT,
        AUDIT_SECRET,
        json!({"action": "finish_flow", "flowId": flow_id, "expectedRevision": 1}),
    )
    .await;
    assert_eq!(
        (audit.status, &audit.body["code"], &audit.body["routeId"]),
        (409, &json!("not_managed"), &json!("audit"))
    );
    let stale = check(
        post(
            address,
            DEPLOYS,
            SECRET,
            json!({"action": "resume_flow", "flowId": flow_id, "expectedRevision": 9}),
        )
        .await,
        409,
        "revision_conflict",
    );
    assert_eq!(stale.body["result"]["flow"]["revision"], 1);
    assert!(!stale.body.to_string().contains("agent:main"));
    check(post(address, DEPLOYS, SECRET, json!({"action": "run_task", "flowId": flow_id, "runtime": "acp", "task": "t", "childSessionKey": "agent:other"})).await, 400, "invalid_request");
    post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "request_cancel", "flowId": flow_id, "expectedRevision": 1}),
    )
    .await;
    check(
        post(
            address,
            DEPLOYS,
            SECRET,
            json!({"action": "run_task", "flowId": flow_id, "runtime": "acp", "task": "t"}),
        )
        .await,
        409,
        "cancel_requested",
    );
    post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "cancel_flow", "flowId": flow_id}),
    )
    .await;
    let ended = check(
        post(
            address,
            DEPLOYS,
            SECRET,
            json!({"action": "fail_flow", "flowId": flow_id, "expectedRevision": 3}),
        )
        .await,
        409,
        "terminal",
    );
    assert_eq!(ended.body["result"]["flow"]["status"], "cancelled");
    let full = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "create_flow", "goal": "many"}),
    )
    .await;
    let full_id = full.body["result"]["flow"]["flowId"]
        .as_str()
        .unwrap()
        .to_owned();
    for index in 0..modelgate::webhook::MAX_TASKS_PER_FLOW {
        let task = post(address, DEPLOYS, SECRET, json!({"action": "run_task", "flowId": full_id, "runtime": "acp", "task": format!("t{index}")})).await;
        assert_eq!(task.status, 201);
    }
    check(
        post(
            address,
            DEPLOYS,
            SECRET,
            json!({"action": "run_task", "flowId": full_id, "runtime": "acp", "task": "one more"}),
        )
        .await,
        409,
        "task_not_created",
    );
    // Paths that are no route go to the inner service.
    let inner = send(client().post(format!("http://{address}/plugins/webhooks/nope"))).await;
    assert_eq!((inner.status, inner.body), (404, json!("inner")));
}

fn generous() -> WebhookLimits {
    WebhookLimits {
        requests_per_window: 10_000,
        max_in_flight: 100,
        ..WebhookLimits::default()
    }
}

#[tokio::test]
async fn every_action_works_over_http_on_memory() {
    every_action(start(memory(), generous()).await).await;
}

#[tokio::test]
async fn every_action_works_over_http_on_redis() {
    let server = RedisServer::start();
    every_action(start(redis(&server).await, generous()).await).await;
}

#[tokio::test]
async fn every_rejection_has_its_code_and_status_on_memory() {
    every_rejection(start(memory(), generous()).await).await;
}

#[tokio::test]
async fn every_rejection_has_its_code_and_status_on_redis() {
    let server = RedisServer::start();
    every_rejection(start(redis(&server).await, generous()).await).await;
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_gets_408() {
    let limits = WebhookLimits {
        body_timeout: Duration::from_millis(300),
        ..generous()
    };
    let address = start(memory(), limits).await;
    let (_sender, receiver) = futures::channel::mpsc::unbounded::<Result<Bytes, Infallible>>();
    let reply = send(
        client()
            .post(format!("http://{address}{DEPLOYS}"))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {SECRET}"))
            .body(reqwest::Body::wrap_stream(receiver)),
    )
    .await;
    assert_eq!(
        (reply.status, &reply.body["code"]),
        (408, &json!("request_timeout"))
    );
}

/// Sends `count` valid requests at once, spread over `addresses`; the statuses.
async fn burst(addresses: &[SocketAddr], count: usize, client_ip: &str) -> Vec<u16> {
    join_all((0..count).map(|index| {
        let address = addresses[index % addresses.len()];
        async move {
            send(
                client()
                    .post(format!("http://{address}{DEPLOYS}"))
                    .header("content-type", "application/json")
                    .header("authorization", format!("Bearer {SECRET}"))
                    .header("x-test-client", client_ip)
                    .body(json!({"action": "list_flows"}).to_string()),
            )
            .await
            .status
        }
    }))
    .await
}

fn rate_limited(requests_per_window: u64) -> WebhookLimits {
    WebhookLimits {
        requests_per_window,
        // An hour: a burst never straddles the window's edge in practice.
        rate_window: Duration::from_secs(3600),
        max_in_flight: 1000,
        ..WebhookLimits::default()
    }
}

/// Sends `count` requests at once with a wrong secret (every other one)
/// or none, spread over `addresses`, from `client_ip` (or no address);
/// the statuses.
async fn without_the_secret(
    addresses: &[SocketAddr],
    count: usize,
    client_ip: Option<&str>,
) -> Vec<u16> {
    join_all((0..count).map(|index| {
        let address = addresses[index % addresses.len()];
        let mut request = client()
            .post(format!("http://{address}{DEPLOYS}"))
            .header("content-type", "application/json")
            .body(json!({"action": "list_flows"}).to_string());
        if let Some(client_ip) = client_ip {
            request = request.header("x-test-client", client_ip);
        }
        if index % 2 == 0 {
            request = request.header("authorization", "Bearer wrong-secret-0123456789");
        }
        async move { send(request).await.status }
    }))
    .await
}

async fn rate_window_holds(addresses: &[SocketAddr]) {
    // More requests without the secret than the window holds: each is 401
    // and none counts, so the client's own requests still find the whole
    // window free.
    let strangers = without_the_secret(addresses, 25, Some("10.0.0.1")).await;
    assert!(
        strangers.iter().all(|&status| status == 401),
        "{strangers:?}"
    );
    let statuses = burst(addresses, 40, "10.0.0.1").await;
    assert_eq!(
        statuses.iter().filter(|&&status| status == 200).count(),
        10,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&status| status == 429).count(),
        30,
        "{statuses:?}"
    );
    let refused = send(
        client()
            .post(format!("http://{}{DEPLOYS}", addresses[0]))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {SECRET}"))
            .header("x-test-client", "10.0.0.1")
            .body("{}"),
    )
    .await;
    assert_eq!(
        (refused.status, &refused.body["code"]),
        (429, &json!("rate_limited"))
    );
    // With the window spent, a request without the secret is still told
    // 401: the secret is checked before the window.
    assert_eq!(
        without_the_secret(addresses, 2, Some("10.0.0.1")).await,
        [401, 401]
    );
    let retry_after: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3600).contains(&retry_after));
    // Another client has its own window.
    assert_eq!(burst(addresses, 1, "10.0.0.2").await, [200]);
}

/// An address blocked for its wrong secrets is refused before its secret
/// is compared: a right guess after the block gets 429 too, while another
/// address with the secret is served.
#[tokio::test]
async fn a_blocked_address_is_refused_before_its_secret_is_compared() {
    let failures = modelgate::auth::AuthFailures::new(modelgate::auth::AuthFailureLimit {
        max_failures: 3,
        window_seconds: 3600,
        ..modelgate::auth::AuthFailureLimit::default()
    })
    .unwrap();
    let address = serve_routes(|routes| {
        WebhookSecretLayer::new(memory(), routes)
            .limits(generous())
            .failure_limit(failures)
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.extend(without_the_secret(&[address], 1, Some("10.0.0.9")).await);
    }
    assert_eq!(statuses, [401, 401, 401, 429]);
    let guessed = |from: &'static str| {
        send(
            client()
                .post(format!("http://{address}{DEPLOYS}"))
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {SECRET}"))
                .header("x-test-client", from)
                .body(json!({"action": "list_flows"}).to_string()),
        )
    };
    let blocked = guessed("10.0.0.9").await;
    assert_eq!(
        (blocked.status, &blocked.body["code"]),
        (429, &json!("auth_failures")),
        "{:?}",
        blocked.body
    );
    assert!(blocked.headers.contains_key("retry-after"));
    assert_eq!(guessed("10.0.0.10").await.status, 200);
}

#[tokio::test]
async fn the_rate_window_admits_exactly_its_limit_on_memory() {
    rate_window_holds(&[start(memory(), rate_limited(10)).await]).await;
}

#[tokio::test]
async fn the_rate_window_holds_across_two_instances_on_redis() {
    let server = RedisServer::start();
    let first = start(redis(&server).await, rate_limited(10)).await;
    let second = start(redis(&server).await, rate_limited(10)).await;
    rate_window_holds(&[first, second]).await;
}

/// A request whose body is held back until the returned sender is dropped
/// or written to.
fn stalled(address: SocketAddr) -> Held {
    let (sender, receiver) = futures::channel::mpsc::unbounded::<Result<Bytes, Infallible>>();
    let request = client()
        .post(format!("http://{address}{DEPLOYS}"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {SECRET}"))
        .body(reqwest::Body::wrap_stream(receiver));
    (sender, tokio::spawn(send(request)))
}

type Held = (
    futures::channel::mpsc::UnboundedSender<Result<Bytes, Infallible>>,
    tokio::task::JoinHandle<Reply>,
);

/// Holds `count` stalled requests spread over `addresses` and probes until
/// one more is refused: then all of them hold their slots, whichever
/// instance they are on. A held request that raced a probe for the last
/// slot was itself refused (correctly) and is sent again. The refused probe.
async fn hold_slots(addresses: &[SocketAddr], count: usize) -> (Vec<Held>, Reply) {
    let held: std::cell::RefCell<Vec<Held>> = std::cell::RefCell::new(
        (0..count)
            .map(|index| stalled(addresses[index % addresses.len()]))
            .collect(),
    );
    let probe = common::wait::wait_for(common::wait::PATIENCE, || async {
        let finished = held
            .borrow()
            .iter()
            .position(|(_, reply)| reply.is_finished());
        if let Some(index) = finished {
            let replacement = stalled(addresses[index % addresses.len()]);
            let (_, finished) = std::mem::replace(&mut held.borrow_mut()[index], replacement);
            let finished = finished.await.unwrap();
            assert_eq!(
                (finished.status, &finished.body["code"]),
                (429, &json!("too_many_in_flight"))
            );
        }
        let probe = post(
            addresses[addresses.len() - 1],
            DEPLOYS,
            SECRET,
            json!({"action": "list_flows"}),
        )
        .await;
        assert!(matches!(probe.status, 200 | 429), "{}", probe.body);
        if probe.status == 429 && held.borrow().iter().all(|(_, reply)| !reply.is_finished()) {
            Ok(probe)
        } else {
            Err(format!("{count} stalled requests never held every slot"))
        }
    })
    .await;
    (held.into_inner(), probe)
}

async fn in_flight_bound_holds(addresses: &[SocketAddr]) {
    let limit = 3;
    let (held, refused) = hold_slots(addresses, limit).await;
    // The checks before the in-flight count still answer first.
    let url = format!("http://{}{DEPLOYS}", addresses[0]);
    let wrong_type = send(
        client()
            .post(&url)
            .header("content-type", "text/plain")
            .header("authorization", format!("Bearer {SECRET}"))
            .body("{}"),
    )
    .await;
    assert_eq!(wrong_type.status, 415);
    assert_eq!(send(client().put(&url)).await.status, 405);
    // The same client without the secret: 401, not 429, and no slot taken
    // or needed.
    let strangers = without_the_secret(addresses, 2 * limit, None).await;
    assert!(
        strangers.iter().all(|&status| status == 401),
        "{strangers:?}"
    );
    assert_eq!(refused.body["code"], "too_many_in_flight");
    assert!(refused.headers.contains_key("retry-after"));
    for (sender, reply) in held {
        sender
            .unbounded_send(Ok(Bytes::from(
                json!({"action": "create_flow", "goal": "held"}).to_string(),
            )))
            .unwrap();
        drop(sender);
        assert_eq!(reply.await.unwrap().status, 201);
    }
    // Every slot was given back: the same client may have `limit` in flight
    // again. Each stalled one takes its slot before its body arrives.
    let held: Vec<Held> = (0..limit)
        .map(|index| stalled(addresses[index % addresses.len()]))
        .collect();
    for (sender, reply) in held {
        sender
            .unbounded_send(Ok(Bytes::from(json!({"action": "list_flows"}).to_string())))
            .unwrap();
        drop(sender);
        assert_eq!(reply.await.unwrap().status, 200);
    }
    // Refusals after the slot was taken give it back too (a bad payload
    // here), and wrong secrets never take one.
    for _ in 0..limit + 2 {
        let bad = post(addresses[0], DEPLOYS, SECRET, json!({})).await;
        assert_eq!(bad.status, 400, "{}", bad.body);
        let wrong = post(addresses[0], DEPLOYS, "wrong-secret-0123456789", json!({})).await;
        assert_eq!(wrong.status, 401);
    }
    let (held, _) = hold_slots(addresses, limit).await;
    for (sender, reply) in held {
        drop(sender);
        let _ = reply.await;
    }
}

fn in_flight_limited() -> WebhookLimits {
    WebhookLimits {
        max_in_flight: 3,
        ..generous()
    }
}

#[tokio::test]
async fn the_in_flight_bound_holds_on_memory() {
    in_flight_bound_holds(&[start(memory(), in_flight_limited()).await]).await;
}

#[tokio::test]
async fn the_in_flight_bound_holds_across_two_instances_on_redis() {
    let server = RedisServer::start();
    let first = start(redis(&server).await, in_flight_limited()).await;
    let second = start(redis(&server).await, in_flight_limited()).await;
    in_flight_bound_holds(&[first, second]).await;
}

#[tokio::test]
async fn a_client_that_leaves_mid_body_gives_its_slot_back() {
    let limits = WebhookLimits {
        max_in_flight: 1,
        ..generous()
    };
    let address = start(memory(), limits).await;
    let (mut held, refused) = hold_slots(&[address], 1).await;
    assert_eq!(refused.body["code"], "too_many_in_flight");
    let (sender, reply) = held.pop().unwrap();
    reply.abort();
    drop(sender);
    common::wait::wait_until(
        common::wait::PATIENCE,
        "the slot of a request that was abandoned given back",
        || async {
            post(address, DEPLOYS, SECRET, json!({"action": "list_flows"}))
                .await
                .status
                == 200
        },
    )
    .await;
}

fn flow_bounded(max_flows_per_session: u64) -> WebhookLimits {
    WebhookLimits {
        ended_flow_retention: HOUR,
        idle_flow_retention: 24 * HOUR,
        max_flows_per_session,
        ..generous()
    }
}

const HOUR: Duration = Duration::from_secs(3600);

/// Creates `count` flows at once on the deploys route, spread over
/// `addresses`; the replies.
async fn create_flows(addresses: &[SocketAddr], count: usize) -> Vec<Reply> {
    join_all((0..count).map(|index| {
        post(
            addresses[index % addresses.len()],
            DEPLOYS,
            SECRET,
            json!({"action": "create_flow", "goal": format!("g{index}")}),
        )
    }))
    .await
}

async fn flow_count(address: SocketAddr, path: &str, secret: &str) -> u64 {
    let listed = post(
        address,
        path,
        secret,
        json!({"action": "list_flows", "limit": 100}),
    )
    .await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    listed.body["result"]["count"].as_u64().unwrap()
}

async fn the_flow_cap_holds_under_concurrent_creates(addresses: &[SocketAddr]) {
    let replies = create_flows(addresses, 30).await;
    let created = replies.iter().filter(|reply| reply.status == 201).count();
    assert_eq!(created, 5);
    for reply in replies.iter().filter(|reply| reply.status != 201) {
        assert_eq!(
            (reply.status, &reply.body["code"], &reply.body["ok"]),
            (409, &json!("too_many_flows"), &json!(false)),
            "{}",
            reply.body
        );
        assert_eq!(reply.body["routeId"], "deploys");
        let error = reply.body["error"].as_str().unwrap();
        assert!(
            error.contains("5 flows") && error.contains("1 hour"),
            "{error}"
        );
    }
    for &address in addresses {
        assert_eq!(flow_count(address, DEPLOYS, SECRET).await, 5);
    }
    // The cap is the session's: another session still has room.
    let elsewhere = post(
        addresses[0],
        OTHER,
        OTHER_SECRET,
        json!({"action": "create_flow", "goal": "elsewhere"}),
    )
    .await;
    assert_eq!(elsewhere.status, 201, "{}", elsewhere.body);
}

#[tokio::test]
async fn the_flow_cap_holds_under_concurrent_creates_on_memory() {
    the_flow_cap_holds_under_concurrent_creates(&[start(memory(), flow_bounded(5)).await]).await;
}

#[tokio::test]
async fn the_flow_cap_holds_across_two_instances_on_redis() {
    let server = RedisServer::start();
    let first = start(redis(&server).await, flow_bounded(5)).await;
    let second = start(redis(&server).await, flow_bounded(5)).await;
    the_flow_cap_holds_under_concurrent_creates(&[first, second]).await;
}

/// Serves the routes over `store` with `limits`, on `clock`.
async fn start_on(store: SharedStore, limits: WebhookLimits, clock: &ManualClock) -> SocketAddr {
    let clock = Arc::new(clock.clone());
    serve_routes(|routes| {
        WebhookSecretLayer::new(store, routes)
            .limits(limits)
            .clock(clock)
    })
    .await
}

async fn flows_expire_after_their_retention(addresses: &[SocketAddr], clock: &ManualClock) {
    let [first, second] = [addresses[0], addresses[addresses.len() - 1]];
    let ids: Vec<String> = create_flows(&[first], 2)
        .await
        .iter()
        .map(|reply| {
            assert_eq!(reply.status, 201, "{}", reply.body);
            reply.body["result"]["flow"]["flowId"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(create_flows(&[second], 1).await[0].status, 409);
    let finished = post(
        second,
        DEPLOYS,
        SECRET,
        json!({"action": "finish_flow", "flowId": ids[0], "expectedRevision": 1}),
    )
    .await;
    assert_eq!(finished.status, 200, "{}", finished.body);
    // Ended, it still counts for its hour of retention, to the second.
    clock.advance(HOUR - Duration::from_secs(1));
    assert_eq!(create_flows(&[first], 1).await[0].status, 409);
    let kept = post(
        second,
        DEPLOYS,
        SECRET,
        json!({"action": "get_flow", "flowId": ids[0]}),
    )
    .await;
    assert_eq!(kept.body["result"]["flow"]["status"], "succeeded");
    clock.advance(Duration::from_secs(1));
    let gone = post(
        second,
        DEPLOYS,
        SECRET,
        json!({"action": "get_flow", "flowId": ids[0]}),
    )
    .await;
    assert_eq!(
        (gone.status, &gone.body["code"]),
        (404, &json!("not_found"))
    );
    // Its place is free.
    assert_eq!(create_flows(&[first], 1).await[0].status, 201);
    assert_eq!(flow_count(second, DEPLOYS, SECRET).await, 2);
    // Live flows nobody changes for a day are removed too; a change keeps
    // one a day more.
    clock.advance(12 * HOUR);
    let touched = post(
        first,
        DEPLOYS,
        SECRET,
        json!({"action": "set_waiting", "flowId": ids[1], "expectedRevision": 1}),
    )
    .await;
    assert_eq!(touched.status, 200, "{}", touched.body);
    clock.advance(12 * HOUR);
    assert_eq!(flow_count(second, DEPLOYS, SECRET).await, 1);
    clock.advance(12 * HOUR);
    assert_eq!(flow_count(first, DEPLOYS, SECRET).await, 0);
    let latest = post(
        second,
        DEPLOYS,
        SECRET,
        json!({"action": "find_latest_flow"}),
    )
    .await;
    assert_eq!(latest.status, 404);
}

#[tokio::test]
async fn flows_expire_after_their_retention_on_memory() {
    let clock = ManualClock::new(Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap());
    let address = start_on(memory(), flow_bounded(2), &clock).await;
    flows_expire_after_their_retention(&[address], &clock).await;
}

#[tokio::test]
async fn flows_expire_after_their_retention_across_two_instances_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap());
    let first = start_on(redis(&server).await, flow_bounded(2), &clock).await;
    let second = start_on(redis(&server).await, flow_bounded(2), &clock).await;
    flows_expire_after_their_retention(&[first, second], &clock).await;
}

#[tokio::test]
async fn two_instances_share_flows_and_one_revision_has_one_winner() {
    let server = RedisServer::start();
    let first = start(redis(&server).await, generous()).await;
    let second = start(redis(&server).await, generous()).await;
    let created = post(
        first,
        DEPLOYS,
        SECRET,
        json!({"action": "create_flow", "goal": "shared"}),
    )
    .await;
    let flow_id = created.body["result"]["flow"]["flowId"]
        .as_str()
        .unwrap()
        .to_owned();
    let seen = post(
        second,
        DEPLOYS,
        SECRET,
        json!({"action": "get_flow", "flowId": flow_id}),
    )
    .await;
    assert_eq!(seen.body["result"]["flow"]["goal"], "shared");
    let replies = join_all((0..12).map(|index| {
        let address = if index % 2 == 0 { first } else { second };
        let flow_id = flow_id.clone();
        async move {
            post(
                address,
                DEPLOYS,
                SECRET,
                json!({"action": "set_waiting", "flowId": flow_id,
                "expectedRevision": 1, "currentStep": format!("writer {index}")}),
            )
            .await
        }
    }))
    .await;
    let winners = replies.iter().filter(|reply| reply.status == 200).count();
    assert_eq!(winners, 1);
    for reply in replies.iter().filter(|reply| reply.status != 200) {
        assert_eq!(
            (reply.status, &reply.body["code"]),
            (409, &json!("revision_conflict"))
        );
        assert_eq!(reply.body["result"]["flow"]["revision"], 2);
    }
    // Concurrent run_task calls need no revision: every one lands, none is lost.
    let tasks = join_all((0..10).map(|index| {
        let address = if index % 2 == 0 { first } else { second };
        let flow_id = flow_id.clone();
        async move {
            post(address, DEPLOYS, SECRET, json!({"action": "run_task", "flowId": flow_id, "runtime": "acp", "task": format!("t{index}")})).await.status
        }
    }))
    .await;
    let created = tasks.iter().filter(|&&status| status == 201).count();
    let summary = post(
        first,
        DEPLOYS,
        SECRET,
        json!({"action": "get_task_summary", "flowId": flow_id}),
    )
    .await;
    assert_eq!(summary.body["result"]["total"], json!(created));
    assert!(
        tasks.iter().all(|&status| status == 201 || status == 409),
        "{tasks:?}"
    );
}

#[tokio::test]
async fn the_example_serves_secrets_from_its_providers_and_skips_unresolvable_routes() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::PermissionsExt;

    let directory = tempfile::tempdir().unwrap();
    let plain = directory.path().join("plain-secret");
    std::fs::write(&plain, "file-secret-0123456789\n").unwrap();
    let nested = directory.path().join("secrets.json");
    std::fs::write(&nested, r#"{"hooks": {"json": "json-secret-0123456789"}}"#).unwrap();
    let exec = directory.path().join("secret-command");
    // Answers only when given its arguments as configured.
    std::fs::write(
        &exec,
        "#!/bin/sh\n[ \"$1\" = --profile ] && [ \"$2\" = hooks ] || exit 5\ncat > /dev/null\necho '{\"values\": {\"hook\": \"exec-secret-0123456789\"}}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&exec, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = json!({
        "secrets": {"providers": {
            "whole": {"source": "file", "path": plain, "mode": "singleValue"},
            "vault": {"source": "file", "path": nested, "mode": "json"},
            "keyring": {"source": "exec", "command": exec, "args": ["--profile", "hooks"], "timeoutMs": 5000}
        }},
        "plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {
            "env": {"sessionKey": "agent:env", "secret": {"source": "env", "provider": "default", "id": "WEBHOOK_TEST_SECRET"}},
            "file": {"sessionKey": "agent:file", "secret": {"source": "file", "provider": "whole", "id": "value"}},
            "json": {"sessionKey": "agent:json", "secret": {"source": "file", "provider": "vault", "id": "/hooks/json"}},
            "exec": {"sessionKey": "agent:exec", "secret": {"source": "exec", "provider": "keyring", "id": "hook"}},
            "broken": {"sessionKey": "agent:broken", "secret": {"source": "env", "provider": "default", "id": "WEBHOOK_TEST_UNSET"}},
            "undeclared": {"sessionKey": "agent:undeclared", "secret": {"source": "file", "provider": "nowhere", "id": "/hooks/json"}},
            // The way refs were written before providers had names.
            "oldstyle": {"sessionKey": "agent:oldstyle", "secret": {"source": "file", "provider": plain, "id": "value"}}
        }}}}}
    });
    let config_path = directory.path().join("webhooks.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    // In a directory of its own: with no --store it keeps its state in
    // modelgate.db where it runs.
    let mut child = std::process::Command::new(common::examples::binary("webhooks"))
        .current_dir(directory.path())
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&config_path)
        .env("WEBHOOK_TEST_SECRET", "env-secret-0123456789")
        .env_remove("WEBHOOK_TEST_UNSET")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    // The banner, then one line per served route.
    for _ in 0..5 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        lines.push(line.trim().to_owned());
    }
    let address: SocketAddr = lines[0]
        .strip_prefix("webhooks listening on http://")
        .unwrap()
        .parse()
        .unwrap();
    let mut routes = lines[1..].to_vec();
    routes.sort();
    assert_eq!(
        routes,
        [
            "route env POST /plugins/webhooks/env",
            "route exec POST /plugins/webhooks/exec",
            "route file POST /plugins/webhooks/file",
            "route json POST /plugins/webhooks/json",
        ]
    );
    for (route, secret) in [
        ("env", "env-secret-0123456789"),
        ("file", "file-secret-0123456789"),
        ("json", "json-secret-0123456789"),
        ("exec", "exec-secret-0123456789"),
    ] {
        let path = format!("/plugins/webhooks/{route}");
        let reply = post(
            address,
            &path,
            secret,
            json!({"action": "create_flow", "goal": route}),
        )
        .await;
        assert_eq!(
            (reply.status, &reply.body["routeId"]),
            (201, &json!(route)),
            "{}",
            reply.body
        );
        assert_eq!(
            post(
                address,
                &path,
                "env-secret-0123456789x",
                json!({"action": "list_flows"})
            )
            .await
            .status,
            401
        );
    }
    for (route, secret) in [
        ("broken", "anything-at-all-here"),
        ("undeclared", "json-secret-0123456789"),
        ("oldstyle", "file-secret-0123456789"),
    ] {
        let skipped = post(
            address,
            &format!("/plugins/webhooks/{route}"),
            secret,
            json!({"action": "list_flows"}),
        )
        .await;
        assert_eq!(
            (skipped.status, &skipped.body["code"]),
            (404, &json!("not_found")),
            "{route}"
        );
    }
    std::process::Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    for (route, words) in [
        ("broken", "WEBHOOK_TEST_UNSET"),
        ("undeclared", "nowhere"),
        ("oldstyle", "a path is no longer a provider"),
    ] {
        let warning = stderr
            .lines()
            .find(|line| {
                line.contains("skipped") && line.contains(&format!("/plugins/webhooks/{route}"))
            })
            .unwrap_or_else(|| panic!("no warning for {route} in {stderr}"));
        assert!(warning.contains(words), "{warning}");
    }
    for secret in ["env-secret", "file-secret", "json-secret", "exec-secret"] {
        assert!(!stderr.contains(secret), "a secret was logged: {stderr}");
    }
}

#[tokio::test]
async fn the_proxy_serves_the_webhook_routes_of_its_config_before_the_gateway_layers() {
    use modelgate::proxy::{GatewayConfig, GatewayPlan, Upstream, UpstreamConfig, gateway};

    let config = GatewayConfig::from_json(
        &json!({"plugins": {"entries": {"webhooks": {"enabled": true, "config": {
            "routes": {"deploys": {"sessionKey": "agent:main", "secret": SECRET}},
            "limits": {"maxBodyBytes": 1024}
        }}}}})
        .to_string(),
    )
    .unwrap();
    let upstream = Upstream::new(&UpstreamConfig::new("http://127.0.0.1:9/v1")).unwrap();
    let service =
        gateway::<hyper::body::Incoming>(&GatewayPlan::new(&config).unwrap(), memory(), upstream);
    let address = serve(service).await;
    let created = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "create_flow", "goal": "via proxy"}),
    )
    .await;
    assert_eq!(
        (created.status, &created.body["ok"]),
        (201, &json!(true)),
        "{}",
        created.body
    );
    // The config's limits apply: this body is over 1 KiB.
    let large = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "create_flow", "goal": "x".repeat(2000)}),
    )
    .await;
    assert_eq!(large.body["code"], "payload_too_large");
    // Everything else still meets the gateway's layers.
    let unauthenticated = send(client().get(format!("http://{address}/api/v1/key"))).await;
    assert_eq!(unauthenticated.status, 401);
    assert_eq!(
        unauthenticated.body["error"]["type"],
        "authentication_error"
    );

    // A broken entry is refused as the config is read, naming the field.
    let error = GatewayConfig::from_json(
        &json!({"plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {"x": {"secret": SECRET}}}}}}}).to_string(),
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("plugins.entries.webhooks: webhooks route `x`: `sessionKey` is required"),
        "{error}"
    );
}

#[tokio::test]
async fn the_proxy_reads_route_secrets_from_its_secrets_providers_and_hides_an_undeclared_one() {
    use modelgate::proxy::{GatewayConfig, GatewayPlan, Upstream, UpstreamConfig, gateway};

    let directory = tempfile::tempdir().unwrap();
    let vault = directory.path().join("secrets.json");
    std::fs::write(
        &vault,
        json!({"hooks": {"deploys": SECRET, "other": OTHER_SECRET}}).to_string(),
    )
    .unwrap();
    let config = GatewayConfig::from_json(
        &json!({
            "secrets": {"providers": {"vault": {"source": "file", "path": vault, "mode": "json"}}},
            "plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {
                "deploys": {"sessionKey": "agent:main",
                            "secret": {"source": "file", "provider": "vault", "id": "/hooks/deploys"}},
                "other": {"sessionKey": "agent:other",
                          "secret": {"source": "file", "provider": "missing", "id": "/hooks/other"}}
            }}}}}
        })
        .to_string(),
    )
    .unwrap();
    let upstream = Upstream::new(&UpstreamConfig::new("http://127.0.0.1:9/v1")).unwrap();
    let service =
        gateway::<hyper::body::Incoming>(&GatewayPlan::new(&config).unwrap(), memory(), upstream);
    let address = serve(service).await;
    let created = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "create_flow", "goal": "from the vault"}),
    )
    .await;
    assert_eq!(
        (created.status, &created.body["routeId"]),
        (201, &json!("deploys")),
        "{}",
        created.body
    );
    let wrong = post(
        address,
        DEPLOYS,
        OTHER_SECRET,
        json!({"action": "list_flows"}),
    )
    .await;
    assert_eq!(
        (wrong.status, &wrong.body["code"]),
        (401, &json!("unauthorized")),
        "{}",
        wrong.body
    );
    // Not a webhook route: its path meets the gateway's layers like any
    // path the gateway does not serve, and its secret is no gateway key.
    let hidden = post(
        address,
        OTHER,
        OTHER_SECRET,
        json!({"action": "list_flows"}),
    )
    .await;
    assert_eq!(hidden.status, 401, "{}", hidden.body);
    assert_eq!(hidden.body["error"]["type"], "authentication_error");
    assert!(hidden.body.get("routeId").is_none(), "{}", hidden.body);
}

/// Starts every task running and stops one only when the test says so.
struct PendingRunner;

#[async_trait::async_trait]
impl TaskRunner for PendingRunner {
    async fn start(&self, _: &TaskLaunch) -> Result<Option<TaskStatus>, TaskRunnerError> {
        Ok(Some(FlowStatus::Running))
    }

    async fn cancel(&self, _: &TaskLaunch) -> CancelOutcome {
        CancelOutcome::Pending
    }
}

#[tokio::test]
async fn cancel_flow_is_pending_while_a_task_runs_and_terminal_once_ended() {
    let store = memory();
    let layer = std::sync::Mutex::new(None);
    let address = serve_routes(|routes| {
        let built = WebhookSecretLayer::new(store, routes)
            .limits(generous())
            .task_runner(Arc::new(PendingRunner));
        *layer.lock().unwrap() = Some(built.clone());
        built
    })
    .await;
    let actions = layer.lock().unwrap().take().unwrap().actions().clone();
    let created = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "create_flow", "goal": "g"}),
    )
    .await;
    let flow_id = created.body["result"]["flow"]["flowId"]
        .as_str()
        .unwrap()
        .to_owned();
    let task = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "run_task", "flowId": flow_id, "runtime": "acp", "task": "t"}),
    )
    .await;
    assert_eq!(task.body["result"]["task"]["status"], "running");
    let task_id = task.body["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let pending = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "cancel_flow", "flowId": flow_id}),
    )
    .await;
    assert_eq!(pending.status, 202, "{}", pending.body);
    assert_eq!(pending.body["ok"], true);
    assert_eq!(pending.body["result"]["outcome"], "cancel_pending");
    assert_eq!(pending.body["result"]["activeTasks"], 1);
    // No new task while the cancellation is under way.
    let refused = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "run_task", "flowId": flow_id, "runtime": "acp", "task": "t2"}),
    )
    .await;
    assert_eq!(
        (refused.status, &refused.body["code"]),
        (409, &json!("cancel_requested"))
    );
    // The host's runner reports the task stopped: the flow is cancelled.
    let update = actions
        .set_task_status(
            "agent:main",
            &flow_id,
            &task_id,
            FlowStatus::Cancelled,
            None,
        )
        .await
        .unwrap();
    assert_eq!(update, TaskUpdate::Updated);
    let flow = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "get_flow", "flowId": flow_id}),
    )
    .await;
    assert_eq!(flow.body["result"]["flow"]["status"], "cancelled");
    let again = post(
        address,
        DEPLOYS,
        SECRET,
        json!({"action": "cancel_flow", "flowId": flow_id}),
    )
    .await;
    assert_eq!(
        (again.status, &again.body["code"]),
        (409, &json!("terminal"))
    );
    assert_eq!(again.body["result"]["flow"]["status"], "cancelled");
}

#[tokio::test]
async fn a_store_that_is_down_gives_503_closed_or_open() {
    let mut server = RedisServer::start();
    let store = redis(&server).await;
    let closed = serve_routes(|routes| {
        WebhookSecretLayer::new(store, routes)
            .limits(generous())
            .failure_policy(FailurePolicy::FailClosed)
    })
    .await;
    let open = start(redis(&server).await, generous()).await;
    assert_eq!(
        post(closed, DEPLOYS, SECRET, json!({"action": "list_flows"}))
            .await
            .status,
        200
    );
    server.stop();
    // Fail closed: the limits cannot be checked, so nothing runs.
    let refused = post(closed, DEPLOYS, SECRET, json!({"action": "list_flows"})).await;
    assert_eq!(
        (refused.status, &refused.body["code"]),
        (503, &json!("unavailable"))
    );
    assert!(refused.body["error"].as_str().unwrap().contains("limits"));
    // A wrong secret never reaches the store: 401, not the 503 above.
    let wrong = post(closed, DEPLOYS, "wrong-secret-0123456789", json!({})).await;
    assert_eq!(
        (wrong.status, &wrong.body["code"]),
        (401, &json!("unauthorized"))
    );
    // Fail open (the default): the limits let it through, the flows cannot answer.
    let unanswered = post(open, DEPLOYS, SECRET, json!({"action": "list_flows"})).await;
    assert_eq!(
        (unanswered.status, &unanswered.body["code"]),
        (503, &json!("unavailable"))
    );
    assert!(
        unanswered.body["error"]
            .as_str()
            .unwrap()
            .contains("flow store")
    );
}
