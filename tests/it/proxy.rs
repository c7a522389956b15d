//! The whole gateway over real HTTP in front of the mock upstream: chat,
//! streaming byte for byte, every upstream error status, a retry after a
//! 503, two instances on one Redis; and the proxy example as a process.

use crate::common;
use crate::mock;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::http_server::{RefusingPort, serve};
use common::mock_ids::{mock_ids, without_ids};
use common::redis_server::RedisServer;
use futures::future::join_all;
use modelgate::clock::ManualClock;
use modelgate::keys::{ByokDirectory, KeyDirectory, NewKey, SharedStore};
use modelgate::proxy::{GatewayConfig, GatewayPlan, Upstream, gateway_with_clock};
use modelgate::store::{MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig};
use serde_json::{Value, json};

const CONFIG: &str = r#"{
    "pricing": {"default": {"prompt_per_million": 1, "completion_per_million": 2},
                "free_models": ["meta-llama/llama-3.1-8b-instruct:free"]},
    "rate_limits": {"account": {"gcra": {"requests": 6000, "period_seconds": 60, "burst": 600}}},
    "retry": {"max_attempts": 1}
}"#;

/// One gateway instance on `store` in front of the upstream at `base`.
async fn instance(store: SharedStore, base: &str, config: &str, clock: &ManualClock) -> SocketAddr {
    let config = GatewayConfig::from_json(config).unwrap();
    let upstream = Upstream::new(&config.upstream_config(Some(base)).unwrap()).unwrap();
    let service = gateway_with_clock(
        &GatewayPlan::new(&config).unwrap(),
        store,
        upstream,
        Arc::new(clock.clone()),
        Duration::from_secs(1),
    );
    serve(service).await
}

/// A key of an account with credits.
async fn funded_key(store: &SharedStore, account: &str) -> String {
    store.top_up(account, 100 * NANOS_PER_CREDIT).await.unwrap();
    let new = NewKey {
        account: account.to_owned(),
        ..NewKey::named("client")
    };
    KeyDirectory::new(store.clone())
        .create_key(new)
        .await
        .unwrap()
        .0
        .expose()
        .to_owned()
}

fn chat_body(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 16, "messages": [{"role": "user", "content": "Hi there"}]})
}

async fn post(url: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    request.send().await.unwrap()
}

fn t0() -> ManualClock {
    ManualClock::new(
        chrono::TimeZone::with_ymd_and_hms(&chrono::Utc, 2026, 11, 18, 12, 0, 0).unwrap(),
    )
}

#[tokio::test]
async fn chat_and_stream_pass_through_unchanged() {
    let base = mock::start(mock::MockConfig::default()).await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(store.clone(), &base, CONFIG, &t0()).await;
    let key = funded_key(&store, "acme").await;
    let url = format!("http://{address}/api/v1/chat/completions");

    let reply = post(&url, Some(&key), &chat_body("openai/gpt-4o-mini", false)).await;
    assert_eq!(reply.status(), 200);
    assert!(
        reply.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .starts_with("mg-")
    );
    let body: Value = reply.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from openai/gpt-4o-mini! You said: Hi there"
    );

    // The stream, byte for byte what the upstream sends for the same body.
    let streamed = post(&url, Some(&key), &chat_body("openai/gpt-4o-mini", true)).await;
    assert_eq!(streamed.headers()["content-type"], "text/event-stream");
    let through_gateway = streamed.bytes().await.unwrap();
    let direct = post(
        &format!("{base}/chat/completions"),
        None,
        &chat_body("openai/gpt-4o-mini", true),
    )
    .await
    .bytes()
    .await
    .unwrap();
    // The same bytes but for the id, which the mock makes anew per answer.
    assert_ne!(mock_ids(&through_gateway), mock_ids(&direct));
    assert_eq!(without_ids(&through_gateway), without_ids(&direct));
    assert!(through_gateway.starts_with(b": keep-alive\n\n"));

    // Both were charged from their usage, and the key status says so.
    let status: Value = reqwest::Client::new()
        .get(format!("http://{address}/api/v1/key"))
        .header("authorization", format!("Bearer {key}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(status["data"]["usage"].as_f64().unwrap() > 0.0, "{status}");

    // Anything but the model calls is a canonical 404, not forwarded: the
    // legacy completions route names chat completions.
    let other = post(
        &format!("http://{address}/api/v1/completions"),
        Some(&key),
        &json!({"model": "a/b", "prompt": "x"}),
    )
    .await;
    assert_eq!(other.status(), 404);
    let body: Value = other.json().await.unwrap();
    assert_eq!(body["error"]["type"], "not_found_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("POST /api/v1/chat/completions"),
        "{message}"
    );
}

#[tokio::test]
async fn an_answer_neither_json_nor_a_stream_passes_as_it_came() {
    let base = mock::start(mock::MockConfig::default()).await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(store.clone(), &base, CONFIG, &t0()).await;
    let key = funded_key(&store, "acme").await;
    let url = format!("http://{address}/api/v1/chat/completions");
    let reply = post(&url, Some(&key), &chat_body("openai/plain-text", false)).await;
    assert_eq!(reply.status(), 200);
    assert_eq!(reply.headers()["content-type"], "text/plain");
    assert_eq!(reply.headers()["x-modelgate-model"], "openai/plain-text");
    assert_eq!(reply.text().await.unwrap(), "hello");
}

#[tokio::test]
async fn every_upstream_error_status_reaches_the_client_in_the_canonical_shape() {
    let base = mock::start(mock::MockConfig::default()).await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(store.clone(), &base, CONFIG, &t0()).await;
    let key = funded_key(&store, "acme").await;
    let url = format!("http://{address}/api/v1/chat/completions");
    for status in [
        400, 401, 402, 403, 404, 408, 409, 422, 429, 500, 502, 503, 504,
    ] {
        let reply = post(
            &url,
            Some(&key),
            &chat_body(&format!("mock/status-{status}"), false),
        )
        .await;
        let seen = reply.status().as_u16();
        let retry_after = reply.headers().get("retry-after").cloned();
        let body: Value = reply.json().await.unwrap();
        assert_eq!(
            body["error"]["metadata"]["upstream_status"], status,
            "{body}"
        );
        if matches!(status, 401..=403) {
            // The upstream refused the gateway's own credentials: a 502, and
            // the upstream's words (which may name the operator's key) are
            // not passed on.
            assert_eq!(seen, 502, "{body}");
            assert!(
                body["error"]["metadata"].get("upstream_message").is_none(),
                "{body}"
            );
            continue;
        }
        assert_eq!(seen, status);
        assert_eq!(body["error"]["code"], status, "{body}");
        assert_eq!(
            body["error"]["metadata"]["upstream_message"],
            format!("mock status {status}")
        );
        if status == 429 {
            assert_eq!(body["error"]["metadata"]["limit_source"], "upstream");
            assert!(retry_after.is_some());
        }
    }
    // A failed request costs nothing.
    let usage = store
        .key_usage(
            "acme",
            &modelgate::auth::KeyHash::of(&key).to_hex(),
            chrono::Utc::now(),
        )
        .await
        .unwrap();
    assert_eq!((usage.total_nanos, usage.reserved_nanos), (0, 0));
}

#[tokio::test]
async fn a_503_is_retried_and_the_retry_answers() {
    let config = mock::MockConfig {
        fail_first: 1,
        error_status: 503,
        ..mock::MockConfig::default()
    };
    let base = mock::start(config).await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let retrying = r#"{"pricing": {"default": {"prompt_per_million": 1, "completion_per_million": 2}},
                       "retry": {"max_attempts": 3, "max_wait_ms": 2000}}"#;
    let address = instance(store.clone(), &base, retrying, &t0()).await;
    let key = funded_key(&store, "acme").await;
    let reply = post(
        &format!("http://{address}/api/v1/chat/completions"),
        Some(&key),
        &chat_body("openai/gpt-4o-mini", false),
    )
    .await;
    assert_eq!(reply.status(), 200, "the second attempt answered");
    let body: Value = reply.json().await.unwrap();
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with("Hello")
    );
}

#[tokio::test]
async fn two_instances_on_one_redis_share_keys_and_limits() {
    let base = mock::start(mock::MockConfig::default()).await;
    let server = RedisServer::start();
    let clock = t0();
    let mut addresses = Vec::new();
    let mut stores = Vec::new();
    for _ in 0..2 {
        let store: SharedStore = Arc::new(
            RedisStore::connect(&server.url(), RedisStoreConfig::default())
                .await
                .unwrap(),
        );
        addresses.push(instance(store.clone(), &base, CONFIG, &clock).await);
        stores.push(store);
    }
    // A key made through one instance works on the other.
    let key = funded_key(&stores[0], "acme").await;
    let client = reqwest::Client::new();
    let replies = join_all((0..60).map(|index| {
        let client = client.clone();
        let url = format!("http://{}/api/v1/chat/completions", addresses[index % 2]);
        let key = key.clone();
        async move {
            client
                .post(url)
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/json")
                .body(chat_body("meta-llama/llama-3.1-8b-instruct:free", false).to_string())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    }))
    .await;
    assert_eq!(
        replies.iter().filter(|status| **status == 200).count(),
        20,
        "{replies:?}"
    );
    assert_eq!(replies.iter().filter(|status| **status == 429).count(), 40);
}

/// The example binary, built by `cargo test` next to the test binaries.

#[test]
fn bad_flags_and_config_stop_the_proxy_before_it_listens() {
    for (args, words) in [
        (
            vec!["--lisen", "127.0.0.1:0"],
            "unexpected argument '--lisen'",
        ),
        (vec!["--listen", "nowhere"], "--listen"),
        (
            vec!["--config", "/nonexistent/modelgate.json"],
            "cannot read --config",
        ),
        (
            vec!["--upstream", "ftp://example/v1", "--listen", "127.0.0.1:0"],
            "not http or https",
        ),
        (vec!["--worker-threads", "0"], "--worker-threads"),
    ] {
        let directory = tempfile::tempdir().unwrap();
        let output = Command::new(common::examples::binary("proxy"))
            .args(&args)
            .current_dir(directory.path())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(words), "{args:?}: {stderr}");
        assert!(!String::from_utf8_lossy(&output.stdout).contains("listening"));
    }
}

#[test]
fn help_lists_every_flag_with_its_default_the_commands_and_the_environment() {
    let output = Command::new(common::examples::binary("proxy"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let help = String::from_utf8(output.stdout).unwrap();
    for expected in [
        "--listen <ADDR>",
        "[default: 127.0.0.1:8080]",
        "--admin-listen <ADDR>",
        "[default: 127.0.0.1:9091]",
        "--store <STORE>",
        "[default: sqlite:modelgate.db]",
        "--upstream <URL>",
        "--redis <URL>",
        "--config <FILE>",
        "--bare",
        "--worker-threads <N>",
        "keygen",
        "reset-operator-key",
        "migrate-store",
        "MODELGATE_ADMIN_KEY",
        "RUST_LOG",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "upstream.api_key_env",
    ] {
        assert!(help.contains(expected), "{expected} missing from:\n{help}");
    }
}

#[test]
fn bare_warns_that_no_key_is_checked() {
    let mut child = Command::new(common::examples::binary("proxy"))
        .args([
            "--bare",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(["--store", "memory"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let warned = stderr
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("WARN"));
        let _ = sender.send(warned);
    });
    let warned = receiver.recv_timeout(Duration::from_secs(30));
    child.kill().unwrap();
    child.wait().unwrap();
    let warned = warned
        .ok()
        .flatten()
        .expect("a warning within 30 s of the start");
    assert!(warned.contains("--bare: no key is checked"), "{warned}");
}

#[tokio::test]
async fn the_proxy_runs_prints_its_address_and_stops_gracefully_on_sigterm() {
    let mut child = Command::new(common::examples::binary("proxy"))
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--store", "memory"])
        .env_remove("MODELGATE_ADMIN_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let admin = lines.next().unwrap().unwrap();
    let admin = admin
        .strip_prefix("operator key (shown once): ")
        .unwrap()
        .to_owned();
    let listening = lines.next().unwrap().unwrap();
    let address = listening
        .strip_prefix("modelgate listening on ")
        .unwrap()
        .to_owned();
    // The walk-through of the README: a key, money, a chat.
    let created: Value = post(
        &format!("{address}/api/v1/keys"),
        Some(&admin),
        &json!({"name": "demo"}),
    )
    .await
    .json()
    .await
    .unwrap();
    let key = created["key"].as_str().unwrap();
    post(
        &format!("{address}/api/v1/accounts/default/credits"),
        Some(&admin),
        &json!({"amount": 10}),
    )
    .await;
    let reply = post(
        &format!("{address}/api/v1/chat/completions"),
        Some(key),
        &chat_body("openai/gpt-4o-mini", false),
    )
    .await;
    assert_eq!(reply.status(), 200);
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert_eq!(exit.code(), Some(0), "a graceful stop exits 0");
}

/// `--worker-threads N`: the runtime serves on N threads (one more than
/// the machine's cores here, so never the default), and serves as ever.
#[tokio::test]
async fn worker_threads_sets_the_threads_that_serve() {
    let threads = std::thread::available_parallelism().map_or(1, |cores| cores.get()) + 1;
    let mut command = Command::new(common::examples::binary("proxy"));
    command
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--worker-threads", &threads.to_string()])
        .env_remove("MODELGATE_ADMIN_KEY");
    let proxy = common::examples::ProxyProcess::spawn_watched(command);
    let log = proxy.wait_for_log("serving worker_threads=");
    assert!(
        log.contains(&format!("serving worker_threads={threads}\n")),
        "{log}"
    );
    let admin = proxy.printed_before[0]
        .strip_prefix("operator key (shown once): ")
        .unwrap();
    let created: Value = post(
        &format!("{}/api/v1/keys", proxy.address),
        Some(admin),
        &json!({"name": "demo"}),
    )
    .await
    .json()
    .await
    .unwrap();
    post(
        &format!("{}/api/v1/accounts/default/credits", proxy.address),
        Some(admin),
        &json!({"amount": 10}),
    )
    .await;
    let reply = post(
        &format!("{}/api/v1/chat/completions", proxy.address),
        Some(created["key"].as_str().unwrap()),
        &chat_body("openai/gpt-4o-mini", false),
    )
    .await;
    assert_eq!(reply.status(), 200);
}

#[tokio::test]
async fn only_the_checked_path_and_allowed_headers_reach_the_upstream() {
    let base = mock::start(mock::MockConfig::default()).await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let config = GatewayConfig::from_json(CONFIG).unwrap();
    let mut upstream_config = config.upstream_config(Some(&base)).unwrap();
    upstream_config.api_key = Some("sk-upstream".into());
    let service = gateway_with_clock(
        &GatewayPlan::new(&config).unwrap(),
        store.clone(),
        Upstream::new(&upstream_config).unwrap(),
        Arc::new(t0()),
        Duration::from_secs(1),
    );
    let address = serve(service).await;
    let key = funded_key(&store, "acme").await;
    let reply = reqwest::Client::new()
        .post(format!(
            "http://{address}/API/V1//Chat/./Completions?api-version=evil"
        ))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .header("cookie", "session=client")
        .header("openai-organization", "org-chosen-by-client")
        .header("accept-encoding", "gzip")
        .header("http-referer", "https://app.example")
        .header("x-gateway-title", "My App")
        .body(chat_body("mock/echo-headers", false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    assert!(reply.headers().get("set-cookie").is_none());
    assert!(reply.headers().get("openai-organization").is_none());
    let body: Value = reply.json().await.unwrap();
    let seen: Value =
        serde_json::from_str(body["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(seen["path"], "/v1/chat/completions", "normalised, no query");
    assert_eq!(
        seen["authorization"], "Bearer sk-upstream",
        "the upstream's key, never the client's"
    );
    assert_eq!(seen["accept-encoding"], "identity");
    assert_eq!(seen["http-referer"], "https://app.example");
    assert_eq!(seen["x-gateway-title"], "My App");
    for absent in ["cookie", "openai-organization"] {
        assert!(
            seen.get(absent).is_none(),
            "{absent} reached the upstream: {seen}"
        );
    }
    // Anything in front of or between the segments is not chat completions.
    for path in [
        "/api/v1/foo/chat/completions",
        "/api/v1/chat/completions/x/../../embeddings/chat/completions",
    ] {
        let reply = post(
            &format!("http://{address}{path}"),
            Some(&key),
            &chat_body("openai/gpt-4o-mini", false),
        )
        .await;
        assert_eq!(reply.status(), 404, "{path}");
    }
}

#[tokio::test]
async fn an_upstream_that_cannot_be_reached_is_a_502_that_costs_nothing() {
    let refusing = RefusingPort::bind();
    let base = refusing.base_url();
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(store.clone(), &base, CONFIG, &t0()).await;
    let key = funded_key(&store, "acme").await;
    let reply = post(
        &format!("http://{address}/api/v1/chat/completions"),
        Some(&key),
        &chat_body("openai/gpt-4o-mini", false),
    )
    .await;
    assert_eq!(reply.status(), 502);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["error"]["metadata"]["upstream_failure"], "connect");
    let usage = store
        .key_usage(
            "acme",
            &modelgate::auth::KeyHash::of(&key).to_hex(),
            chrono::Utc::now(),
        )
        .await
        .unwrap();
    assert_eq!((usage.total_nanos, usage.reserved_nanos), (0, 0));
}

#[tokio::test]
async fn a_request_in_flight_finishes_when_the_proxy_is_told_to_stop() {
    let slow = mock::MockConfig {
        latency: Duration::from_millis(1500),
        ..mock::MockConfig::default()
    };
    let (base, received) = mock::start_counted(slow).await;
    let admin = modelgate::auth::ApiKey::generate();
    let mut child = Command::new(common::examples::binary("proxy"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--upstream",
            &base,
            "--store",
            "memory",
        ])
        .env("MODELGATE_ADMIN_KEY", admin.expose())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = lines.next().unwrap().unwrap();
    let address = listening
        .strip_prefix("modelgate listening on ")
        .unwrap_or_else(|| panic!("with MODELGATE_ADMIN_KEY set no key is printed: {listening}"))
        .to_owned();
    let created: Value = post(
        &format!("{address}/api/v1/keys"),
        Some(admin.expose()),
        &json!({"name": "demo"}),
    )
    .await
    .json()
    .await
    .unwrap();
    let key = created["key"].as_str().unwrap().to_owned();
    post(
        &format!("{address}/api/v1/accounts/default/credits"),
        Some(admin.expose()),
        &json!({"amount": 10}),
    )
    .await;
    let in_flight = tokio::spawn({
        let address = address.clone();
        async move {
            post(
                &format!("{address}/api/v1/chat/completions"),
                Some(&key),
                &chat_body("openai/gpt-4o-mini", false),
            )
            .await
            .status()
            .as_u16()
        }
    });
    // The signal arrives once the request is at the slow upstream.
    common::wait::wait_until(
        common::wait::PATIENCE,
        "the request at the slow upstream",
        || async { received.load(std::sync::atomic::Ordering::SeqCst) > 0 },
    )
    .await;
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert_eq!(
        in_flight.await.unwrap(),
        200,
        "the request in flight finished"
    );
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0));
}

/// A management key on `store`.
async fn management_key(store: &SharedStore) -> String {
    let new = NewKey {
        management: true,
        ..NewKey::named("operator")
    };
    KeyDirectory::new(store.clone())
        .create_key(new)
        .await
        .unwrap()
        .0
        .expose()
        .to_owned()
}

#[tokio::test]
async fn with_one_upstream_no_account_key_is_taken_and_nothing_is_byok() {
    let base = mock::start(mock::MockConfig::default()).await;
    let store: SharedStore = Arc::new(MemoryStore::new());
    let config = GatewayConfig::from_json(CONFIG).unwrap();
    let mut upstream_config = config.upstream_config(Some(&base)).unwrap();
    upstream_config.api_key = Some("sk-upstream".into());
    let built = modelgate::proxy::build_gateway(
        &GatewayPlan::new(&config).unwrap(),
        store.clone(),
        Upstream::new(&upstream_config).unwrap(),
        Arc::new(t0()),
        Duration::from_secs(1),
    );
    let address = serve(built.service).await;
    let key = funded_key(&store, "acme").await;
    let admin = management_key(&store).await;
    let client = reqwest::Client::new();
    let byok_url = format!("http://{address}/api/v1/accounts/acme/byok/mock");

    // The one upstream always gets the gateway's key: setting one is refused.
    let reply = client
        .put(&byok_url)
        .bearer_auth(&admin)
        .json(&json!({"key": "sk-acme-own-key-0001"}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 400);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["metadata"]["reason"], "byok_needs_providers");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("its own upstream key") && message.contains("`providers` section"),
        "{message}"
    );

    // Listing and deleting stay open, for cleaning up.
    let listed = client
        .get(format!("http://{address}/api/v1/accounts/acme/byok"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    assert_eq!(listed.json::<Value>().await.unwrap(), json!({"data": []}));
    let deleted = client
        .delete(&byok_url)
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(
        deleted.status(),
        404,
        "allowed, and there is nothing to delete"
    );

    // A key stored before (an older version took it) is neither sent nor
    // makes the account's requests BYOK: the balance pays.
    ByokDirectory::new(store.clone())
        .set("acme", "mock", "sk-acme-own-key-0001")
        .await
        .unwrap();
    let url = format!("http://{address}/api/v1/chat/completions");
    let reply = post(&url, Some(&key), &chat_body("mock/echo-headers", false)).await;
    assert_eq!(reply.status(), 200);
    let body: Value = reply.json().await.unwrap();
    let seen: Value =
        serde_json::from_str(body["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(seen["authorization"], "Bearer sk-upstream");
    assert!(
        built
            .settlements
            .flush(Duration::from_secs(10))
            .await
            .is_empty()
    );
    let status: Value = client
        .get(format!("http://{address}/api/v1/key"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["data"]["byok_usage"], 0, "{status}");
    assert!(status["data"]["usage"].as_f64().unwrap() > 0.0, "{status}");
    let balance = store.account_balance("acme").await.unwrap();
    assert!(balance.balance_nanos < 100 * NANOS_PER_CREDIT);
}

/// What the proxy says on stderr when `config_text` keeps it from starting:
/// it exits 2 and never listens.
fn refused_start(config_text: &str) -> String {
    let directory = tempfile::tempdir().unwrap();
    let config = directory.path().join("gateway.json");
    std::fs::write(&config, config_text).unwrap();
    let output = Command::new(common::examples::binary("proxy"))
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--upstream", "http://127.0.0.1:9/v1", "--config"])
        .arg(&config)
        .current_dir(directory.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{config_text}");
    assert!(output.stdout.is_empty(), "it never started listening");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_proxy_refuses_a_bad_value_naming_its_path_before_it_listens() {
    for (text, words) in [
        (
            r#"{"pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": -1, "completion_per_million": 10}}}}"#,
            r#"config: pricing.models["openai/gpt-4o"].prompt_per_million must be a number of credits from 0 to 1000000"#,
        ),
        (
            r#"{"providers": {"openai": {"base_url": "https://api.openai.com/v1", "api_key": "sk-inline-0123456789"}}}"#,
            "config: providers.openai.api_key: must be {\"env\": \"VAR\"}",
        ),
    ] {
        let stderr = refused_start(text);
        assert!(stderr.contains(words), "{text}: {stderr}");
        assert!(!stderr.contains("sk-inline"), "{stderr}");
    }
}

#[test]
fn the_proxy_refuses_to_start_with_credit_byok_and_says_what_to_do() {
    let stderr = refused_start(r#"{"credit": {"byok": {"acme": ["openai"]}}}"#);
    assert!(
        stderr.contains("credit.byok is no longer accepted")
            && stderr.contains("`providers` section")
            && stderr.contains("PUT /api/v1/accounts/{id}/byok/{provider}"),
        "{stderr}"
    );
}
