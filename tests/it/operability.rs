//! The proxy as an operator sees it, over real HTTP with a real Redis:
//! Prometheus metrics with their labels after a set of requests, a request
//! id on every response and a W3C trace context carried upstream,
//! `/healthz`, `/readyz` following redis-server down and back up, and no
//! key or secret anywhere in the logs or the metrics.

use crate::common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use common::redis_server::RedisServer;
use common::wait::{PATIENCE, wait_for, wait_until};
use serde_json::{Value, json};

const WEBHOOK_SECRET: &str = "ops-webhook-secret-0123456789";

struct Proxy {
    child: Child,
    address: String,
    admin: String,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl Proxy {
    fn start(redis_url: &str, config: &std::path::Path, admin_key: &str) -> Proxy {
        let mut child = Command::new(common::examples::binary("proxy"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--redis",
                redis_url,
                "--config",
            ])
            .arg(config)
            .env("MODELGATE_ADMIN_KEY", admin_key)
            .env("RUST_LOG", "debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Drained as it comes: a full pipe would stall the proxy.
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buffer = [0u8; 8192];
            while let Ok(read) = pipe.read(&mut buffer) {
                if read == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buffer[..read]);
            }
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let address = lines.next().unwrap().unwrap();
        let address = address
            .strip_prefix("modelgate listening on ")
            .unwrap()
            .to_owned();
        let admin = lines.next().unwrap().unwrap();
        let admin = admin
            .strip_prefix("admin (metrics, healthz, readyz) on ")
            .unwrap()
            .to_owned();
        Proxy {
            child,
            address,
            admin,
            stderr,
        }
    }

    fn logs(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

fn config_file(directory: &std::path::Path) -> std::path::PathBuf {
    let price = json!({"prompt_per_million": 1, "completion_per_million": 1});
    let config = json!({
        "pricing": {"models": {"openai/gpt-4o-mini": price, "openai/echo-headers": price,
                               "openai/ignores-bound": price}},
        "plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {
            "ops": {"sessionKey": "agent:ops", "secret": WEBHOOK_SECRET}
        }}}}}
    });
    let path = directory.join("gateway.json");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

#[tokio::test]
async fn metrics_tracing_health_and_readiness() {
    let mut redis = RedisServer::start();
    let directory = tempfile::tempdir().unwrap();
    let admin_key = modelgate::auth::ApiKey::generate();
    let proxy = Proxy::start(
        &redis.url(),
        &config_file(directory.path()),
        admin_key.expose(),
    );
    let client = reqwest::Client::new();

    assert_eq!(get(&format!("{}/healthz", proxy.admin)).await.0, 200);
    let (status, ready) = get(&format!("{}/readyz", proxy.admin)).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(
        serde_json::from_str::<Value>(&ready).unwrap()["store"],
        "ok"
    );

    // A key, credits, a chat, a refused key, a webhook call.
    let created: Value = client
        .post(format!("{}/api/v1/keys", proxy.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({"name": "ops"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = created["key"].as_str().unwrap().to_owned();
    client
        .post(format!("{}/api/v1/accounts/default/credits", proxy.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({"amount": 10}))
        .send()
        .await
        .unwrap();
    let chat = |model: &str| json!({"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    let answered = client
        .post(format!("{}/api/v1/chat/completions", proxy.address))
        .bearer_auth(&key)
        .json(&chat("openai/gpt-4o-mini"))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    let request_id = answered.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(request_id.starts_with("mg-"), "{request_id}");
    let refused = client
        .post(format!("{}/api/v1/chat/completions", proxy.address))
        .bearer_auth(modelgate::auth::ApiKey::generate().expose())
        .json(&chat("openai/gpt-4o-mini"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    assert!(refused.headers().contains_key("x-request-id"));
    let hook = client
        .post(format!("{}/plugins/webhooks/ops", proxy.address))
        .bearer_auth(WEBHOOK_SECRET)
        .json(&json!({"action": "create_flow", "goal": "watch"}))
        .send()
        .await
        .unwrap();
    assert_eq!(hook.status(), 201);

    // The trace context and the request id travel upstream.
    let traced = client
        .post(format!("{}/api/v1/chat/completions", proxy.address))
        .bearer_auth(&key)
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .header("x-request-id", "client-req-42")
        .json(&chat("openai/echo-headers"))
        .send()
        .await
        .unwrap();
    assert_eq!(traced.headers()["x-request-id"], "client-req-42");
    let echoed: Value = traced.json().await.unwrap();
    let echoed: Value =
        serde_json::from_str(echoed["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    let traceparent = echoed["traceparent"].as_str().unwrap();
    assert!(
        traceparent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
        "{traceparent}"
    );
    assert!(
        !traceparent.contains("00f067aa0ba902b7"),
        "the gateway is the new parent"
    );
    assert_eq!(echoed["x-request-id"], "client-req-42");
    // An upstream that generates past the bound: charged, and counted.
    let overrun = client
        .post(format!("{}/api/v1/chat/completions", proxy.address))
        .bearer_auth(&key)
        .json(&chat("openai/ignores-bound"))
        .send()
        .await
        .unwrap();
    assert_eq!(overrun.status(), 200);
    overrun.bytes().await.unwrap();

    let (status, metrics) = get(&format!("{}/metrics", proxy.admin)).await;
    assert_eq!(status, 200);
    for expected in [
        r#"modelgate_requests_total{route="chat_completions",model="openai/gpt-4o-mini",status="200"} 1"#,
        r#"modelgate_requests_total{route="chat_completions",model="-",status="401"} 1"#,
        r#"modelgate_requests_total{route="webhooks",model="-",status="201"} 1"#,
        r#"modelgate_layer_decisions_total{layer="BearerAuth",decision="rejected",reason="authentication_error:unknown_key"} 1"#,
        r#"modelgate_layer_decisions_total{layer="WebhookSecret",decision="admitted",reason=""} 1"#,
        r#"modelgate_layer_decisions_total{layer="GlobalRateLimit",decision="admitted",reason=""}"#,
        r#"modelgate_store_call_duration_seconds_bucket{operation="admit",outcome="ok""#,
        r#"modelgate_upstream_duration_seconds_count{outcome="ok"} 3"#,
        r#"modelgate_layer_decisions_total{layer="CreditGuard",decision="admitted",reason=""} 3"#,
        r#"modelgate_charged_nanocredits_total{byok="false"}"#,
        "modelgate_cost_over_hold_nanocredits_total",
        "modelgate_requests_in_flight",
    ] {
        assert!(
            metrics.contains(expected),
            "missing {expected} in\n{metrics}"
        );
    }

    // Readiness follows the store.
    redis.stop();
    let readyz = format!("{}/readyz", proxy.admin);
    let unready = wait_for(PATIENCE, || async {
        match get(&readyz).await {
            (503, body) => Ok(body),
            (status, body) => Err(format!("ready with redis down: {status} {body}")),
        }
    })
    .await;
    let unready: Value = serde_json::from_str(&unready).unwrap();
    assert_ne!(unready["store"], "ok");
    // The failed pings open the store's circuit breaker, and readiness says so.
    let status = wait_for(PATIENCE, || async {
        let (status, body) = get(&readyz).await;
        if serde_json::from_str::<Value>(&body).unwrap()["store"] == "circuit_open" {
            Ok(status)
        } else {
            Err(format!("readiness never reports the open circuit: {body}"))
        }
    })
    .await;
    assert_eq!(status, 503);
    assert_eq!(
        get(&format!("{}/healthz", proxy.admin)).await.0,
        200,
        "alive all the same"
    );
    redis.restart();
    wait_until(PATIENCE, "ready again once redis is back", || async {
        get(&readyz).await.0 == 200
    })
    .await;
    let (_, metrics) = get(&format!("{}/metrics", proxy.admin)).await;
    for expected in [
        "modelgate_store_errors_total{operation=\"ping\"}",
        "modelgate_store_circuit_opens_total",
        "modelgate_store_circuit_refusals_total{operation=\"ping\"}",
    ] {
        assert!(
            metrics.contains(expected),
            "missing {expected} in\n{metrics}"
        );
    }
    // The breaker's warning and its all-clear (the pipe is drained by a thread).
    for expected in ["store circuit opened", "store circuit closed"] {
        wait_until(PATIENCE, format_args!("{expected} in the logs"), || async {
            proxy.logs().contains(expected)
        })
        .await;
    }

    // Nothing secret in what an operator collects.
    let logs = proxy.logs();
    assert!(
        logs.contains("client-req-42"),
        "request ids are in the logs"
    );
    for secret in [admin_key.expose(), key.as_str(), WEBHOOK_SECRET] {
        assert!(!logs.contains(secret), "a secret in the logs");
        assert!(!metrics.contains(secret), "a secret in the metrics");
    }
    // Each log line starts with its time in UTC to the microsecond, as
    // tracing writes it.
    let mut lines_read = 0;
    for line in logs.lines() {
        let mut words = line.split_whitespace();
        let (Some(time), Some("INFO" | "WARN" | "ERROR")) = (words.next(), words.next()) else {
            continue;
        };
        chrono::NaiveDateTime::parse_from_str(time, "%Y-%m-%dT%H:%M:%S%.6fZ")
            .unwrap_or_else(|error| panic!("{time:?} is not a log time: {error}"));
        assert_eq!(time.len(), "2026-11-30T18:03:50.123456Z".len(), "{line}");
        lines_read += 1;
    }
    assert!(lines_read > 5, "{logs}");
}
