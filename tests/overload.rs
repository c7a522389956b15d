//! Overload and flood protection through the proxy process over real HTTP:
//! a request without a key costs no body buffering; past `max_in_flight`
//! requests are answered 503 at once; an address sending bad keys meets
//! 429 while its good keys are served; invented model names add no metric
//! series.

mod common;
#[path = "../examples/support/mock.rs"]
mod mock;

use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::examples::ProxyProcess;
use futures::future::join_all;
use modelgate::auth::ApiKey;
use serde_json::{json, Value};

/// The proxy on the embedded store, in front of `upstream` (the built-in
/// mock when `None`), configured by `config`.
fn start_proxy(config: &Value, upstream: Option<&str>, admin_key: &str) -> ProxyProcess {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), config.to_string()).unwrap();
    let mut command = Command::new(common::examples::binary("proxy"));
    command
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(file.path())
        .env("MODELGATE_ADMIN_KEY", admin_key)
        .env("RUST_LOG", "warn");
    if let Some(upstream) = upstream {
        command.args(["--upstream", upstream]);
    }
    let proxy = ProxyProcess::spawn(command);
    // The config is read at start-up; the file may go.
    drop(file);
    proxy
}

/// The proxy's peak resident memory so far, in KiB.
fn peak_resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

async fn chat(
    client: &reqwest::Client,
    proxy: &ProxyProcess,
    authorization: Option<&str>,
    body: impl Into<reqwest::Body>,
    forwarded_for: Option<&str>,
) -> (u16, Option<String>, Value) {
    let mut request = client
        .post(format!("{}/api/v1/chat/completions", proxy.address))
        .header("content-type", "application/json")
        .body(body);
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    if let Some(forwarded_for) = forwarded_for {
        request = request.header("x-forwarded-for", forwarded_for);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap().to_owned());
    let body = response.json().await.unwrap_or(Value::Null);
    (status, retry_after, body)
}

fn hello(model: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": "Hi"}]}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_without_a_key_are_refused_before_their_body_is_read() {
    let admin_key = ApiKey::generate();
    // Enough failures allowed that every one of them is a 401.
    let proxy = start_proxy(
        &json!({"auth_failures": {"max_failures": 100000}}),
        None,
        admin_key.expose(),
    );
    let client = reqwest::Client::new();
    // A valid chat request just under the default 4 MiB limit, shared, so
    // the test itself holds one copy.
    let envelope = hello("openai/gpt-4o-mini:free");
    let padding = 4 * 1024 * 1024 - 1 - envelope.len();
    let body = Bytes::from(envelope.replacen("Hi", &format!("Hi{}", "a".repeat(padding)), 1));
    assert_eq!(body.len(), 4 * 1024 * 1024 - 1);
    let warm = chat(&client, &proxy, None, body.clone(), None).await;
    assert_eq!(warm.0, 401, "{warm:?}");
    let before_kib = peak_resident_kib(proxy.pid());

    let answers = join_all((0..200).map(|n| {
        let (client, body) = (client.clone(), body.clone());
        let proxy = &proxy;
        async move {
            // Missing, malformed and well-formed unknown keys alike.
            let authorization = match n % 3 {
                0 => None,
                1 => Some("Bearer not-a-key".to_owned()),
                _ => Some(format!("Bearer {}", ApiKey::generate().expose())),
            };
            chat(&client, proxy, authorization.as_deref(), body, None).await
        }
    }))
    .await;
    for answer in &answers {
        assert_eq!(answer.0, 401, "{answer:?}");
        assert_eq!(
            answer.2["error"]["type"], "authentication_error",
            "{answer:?}"
        );
    }
    let grown_kib = peak_resident_kib(proxy.pid()).saturating_sub(before_kib);
    println!("peak resident memory grew by {grown_kib} KiB over 200 unauthenticated 4 MiB bodies");
    assert!(
        grown_kib < 64 * 1024,
        "peak resident memory grew by {grown_kib} KiB: bodies were buffered before the key was checked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_in_flight_bound_requests_are_answered_503_at_once() {
    let upstream = mock::start(mock::MockConfig {
        latency: Duration::from_secs(2),
        ..mock::MockConfig::default()
    })
    .await;
    let admin_key = ApiKey::generate();
    let proxy = start_proxy(
        &json!({"max_in_flight": 8, "retry": {"max_attempts": 1}}),
        Some(&upstream),
        admin_key.expose(),
    );
    let key = proxy.create_key(admin_key.expose(), "load").await;
    let authorization = format!("Bearer {key}");
    let client = reqwest::Client::new();
    // Fifty connections open first: what is timed is the answer, not the
    // handshake.
    join_all((0..50).map(|_| {
        client
            .get(format!("{}/api/v1/models", proxy.address))
            .header("authorization", &authorization)
            .send()
    }))
    .await;

    let answers = join_all((0..50).map(|_| {
        let client = client.clone();
        let (proxy, authorization) = (&proxy, authorization.as_str());
        async move {
            let sent = Instant::now();
            let answer = chat(
                &client,
                proxy,
                Some(authorization),
                hello("openai/gpt-4o-mini:free"),
                None,
            )
            .await;
            (answer, sent.elapsed())
        }
    }))
    .await;
    let served: Vec<_> = answers
        .iter()
        .filter(|(answer, _)| answer.0 == 200)
        .collect();
    let shed: Vec<_> = answers
        .iter()
        .filter(|(answer, _)| answer.0 == 503)
        .collect();
    assert_eq!(served.len(), 8, "{answers:?}");
    assert_eq!(shed.len(), 42, "{answers:?}");
    let slowest_shed = shed.iter().map(|(_, elapsed)| *elapsed).max().unwrap();
    println!("slowest 503: {slowest_shed:?}");
    for ((status, retry_after, body), elapsed) in &shed {
        assert_eq!(*status, 503);
        assert_eq!(retry_after.as_deref(), Some("1"), "{body}");
        assert_eq!(body["error"]["type"], "service_unavailable", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("overloaded"),
            "{body}"
        );
        assert!(
            *elapsed < Duration::from_millis(100),
            "a shed request waited {elapsed:?}"
        );
    }
    for (_, elapsed) in &served {
        assert!(*elapsed >= Duration::from_secs(2), "{elapsed:?}");
    }
    // The places are free again once the answers have ended.
    let again = chat(
        &client,
        &proxy,
        Some(&authorization),
        hello("openai/gpt-4o-mini:free"),
        None,
    )
    .await;
    assert_eq!(again.0, 200, "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_address_sending_bad_keys_meets_429_while_its_good_key_is_served() {
    const MAX_FAILURES: usize = 20;
    let admin_key = ApiKey::generate();
    let proxy = start_proxy(
        &json!({"auth_failures": {"max_failures": MAX_FAILURES, "window_seconds": 600}}),
        None,
        admin_key.expose(),
    );
    let key = proxy.create_key(admin_key.expose(), "good").await;
    let good = format!("Bearer {key}");
    let client = reqwest::Client::new();

    let mut answers = Vec::new();
    for batch in 0..20 {
        answers.extend(
            join_all((0..50).map(|n| {
                let client = client.clone();
                let proxy = &proxy;
                async move {
                    let authorization = match (batch * 50 + n) % 4 {
                        0 => None,
                        1 => Some("Basic dXNlcjpwYXNz".to_owned()),
                        2 => Some("Bearer mg-v1-guess".to_owned()),
                        _ => Some(format!("Bearer {}", ApiKey::generate().expose())),
                    };
                    chat(
                        &client,
                        proxy,
                        authorization.as_deref(),
                        hello("a/b:free"),
                        None,
                    )
                    .await
                }
            }))
            .await,
        );
        if batch == 10 {
            // Well past the limit: the good key from the same address.
            let served = chat(
                &client,
                &proxy,
                Some(&good),
                hello("openai/gpt-4o-mini:free"),
                None,
            )
            .await;
            assert_eq!(served.0, 200, "{served:?}");
        }
    }
    let refused = answers.iter().filter(|answer| answer.0 == 401).count();
    let limited: Vec<_> = answers.iter().filter(|answer| answer.0 == 429).collect();
    assert_eq!(
        refused, MAX_FAILURES,
        "exactly the configured count is answered 401"
    );
    assert_eq!(limited.len(), 1000 - MAX_FAILURES);
    for (_, retry_after, body) in limited {
        let seconds: u64 = retry_after.as_deref().unwrap().parse().unwrap();
        assert!((1..=600).contains(&seconds), "{seconds}");
        assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
        assert_eq!(
            body["error"]["metadata"]["reason"], "auth_failures",
            "{body}"
        );
    }
    // The proxy trusts no proxy: a forged X-Forwarded-For does not give a
    // fresh address.
    let forged = chat(
        &client,
        &proxy,
        None,
        hello("a/b:free"),
        Some("198.51.100.7"),
    )
    .await;
    assert_eq!(forged.0, 429, "{forged:?}");
    let served = chat(
        &client,
        &proxy,
        Some(&good),
        hello("openai/gpt-4o-mini:free"),
        None,
    )
    .await;
    assert_eq!(served.0, 200, "{served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_trusted_proxy_each_forwarded_client_counts_alone() {
    let admin_key = ApiKey::generate();
    let proxy = start_proxy(
        &json!({
            "auth_failures": {"max_failures": 3},
            "trusted_proxies": ["127.0.0.0/8"]
        }),
        None,
        admin_key.expose(),
    );
    let client = reqwest::Client::new();
    let statuses = |forwarded_for: &'static str| {
        let (client, proxy) = (client.clone(), &proxy);
        async move {
            let mut statuses = Vec::new();
            for _ in 0..5 {
                statuses.push(
                    chat(&client, proxy, None, hello("a/b:free"), Some(forwarded_for))
                        .await
                        .0,
                );
            }
            statuses
        }
    };
    // The client forged the first entry; the trusted proxy appended the second.
    assert_eq!(
        statuses("6.6.6.6, 203.0.113.1").await,
        [401, 401, 401, 429, 429]
    );
    assert_eq!(
        statuses("6.6.6.6, 203.0.113.2").await,
        [401, 401, 401, 429, 429]
    );
    // Junk where the client's address should be is refused, not guessed.
    let junk = chat(
        &client,
        &proxy,
        None,
        hello("a/b:free"),
        Some("203.0.113.3, junk"),
    )
    .await;
    assert_eq!(junk.0, 400, "{junk:?}");
    assert_eq!(
        junk.2["error"]["metadata"]["reason"],
        "malformed_forwarded_for"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invented_model_names_add_no_metric_series() {
    let admin_key = ApiKey::generate();
    let proxy = start_proxy(
        &json!({
            "free_quota": {"requests_per_minute": 100000, "requests_per_day": 100000},
            "rate_limits": {"account": {"gcra": {"requests": 100000, "period_seconds": 60, "burst": 10000}}},
            "pricing": {
                "models": {"openai/gpt-4o-mini": {"prompt_per_million": 0.15, "completion_per_million": 0.6}},
                "free_models": ["openai/gpt-4o-mini:free"],
                "default": {"prompt_per_million": 1, "completion_per_million": 1}
            }
        }),
        None,
        admin_key.expose(),
    );
    let key = proxy.create_key(admin_key.expose(), "metrics").await;
    let authorization = format!("Bearer {key}");
    let client = reqwest::Client::new();
    // Invented names are served under the default price: the account pays.
    let funded = client
        .post(format!("{}/api/v1/accounts/default/credits", proxy.address))
        .bearer_auth(admin_key.expose())
        .json(&json!({"amount": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(funded.status(), 200);
    let series = |metrics: &str| -> std::collections::BTreeSet<String> {
        metrics
            .lines()
            .filter(|line| line.starts_with("modelgate_"))
            .filter_map(|line| line.rsplit_once(' ').map(|(series, _)| series.to_owned()))
            .collect()
    };
    let send = |range: std::ops::Range<usize>| {
        let (client, proxy, authorization) = (client.clone(), &proxy, authorization.clone());
        async move {
            for chunk in range.collect::<Vec<_>>().chunks(25) {
                let answers = join_all(chunk.iter().map(|n| {
                    // Served inventions (under the default price) with a
                    // `models` list naming more, and free variants no one
                    // configured, which are refused.
                    let served = json!({
                        "model": format!("invented/model-{n}"),
                        "models": [format!("invented/other-{n}:beta")],
                        "messages": [{"role": "user", "content": "Hi"}]
                    });
                    let unserved = json!({
                        "model": format!("invented/model-{n}:free"),
                        "messages": [{"role": "user", "content": "Hi"}]
                    });
                    let (client, authorization) = (&client, &authorization);
                    async move {
                        (
                            chat(client, proxy, Some(authorization), served.to_string(), None)
                                .await,
                            chat(
                                client,
                                proxy,
                                Some(authorization),
                                unserved.to_string(),
                                None,
                            )
                            .await,
                        )
                    }
                }))
                .await;
                for (served, unserved) in answers {
                    assert_eq!(served.0, 200, "{served:?}");
                    assert_eq!(unserved.0, 400, "{unserved:?}");
                }
            }
        }
    };
    let scrape = || async {
        reqwest::get(format!("{}/metrics", proxy.admin))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    send(0..10).await;
    let listed = chat(
        &client,
        &proxy,
        Some(&authorization),
        hello("openai/gpt-4o-mini:free"),
        None,
    )
    .await;
    assert_eq!(listed.0, 200);
    let before = series(&scrape().await);
    send(10..1010).await;
    let after_text = scrape().await;
    let after = series(&after_text);
    let added: Vec<_> = after.difference(&before).collect();
    assert!(added.is_empty(), "new series: {added:?}");
    assert!(!after_text.contains("invented"), "{after_text}");
    assert!(
        after_text.contains(r#"model="other""#),
        "served inventions are counted as other: {after_text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_webhook_secrets_and_wrong_keys_count_together() {
    const SECRET: &str = "overload-webhook-secret-0123456789";
    let admin_key = ApiKey::generate();
    let proxy = start_proxy(
        &json!({
            "auth_failures": {"max_failures": 4},
            "plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {
                "ops": {"sessionKey": "agent:ops", "secret": SECRET}
            }}}}}
        }),
        None,
        admin_key.expose(),
    );
    let client = reqwest::Client::new();
    let hook = |secret: &'static str| {
        let client = client.clone();
        let url = format!("{}/plugins/webhooks/ops", proxy.address);
        async move {
            let response = client
                .post(url)
                .bearer_auth(secret)
                .json(&json!({"action": "create_flow", "goal": "watch"}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").cloned();
            let body: Value = response.json().await.unwrap();
            (status, retry_after, body)
        }
    };
    for _ in 0..2 {
        assert_eq!(
            chat(
                &client,
                &proxy,
                Some("Bearer mg-v1-x"),
                hello("a/b:free"),
                None
            )
            .await
            .0,
            401
        );
        assert_eq!(hook("wrong-secret").await.0, 401);
    }
    // The fifth failure from this address, a wrong secret, is past the limit.
    let (status, retry_after, body) = hook("wrong-secret").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "auth_failures", "{body}");
    assert!(retry_after.is_some());
    // The right secret is still served; a wrong key is 429 now too.
    let (status, _, body) = hook(SECRET).await;
    assert_eq!(status, 201, "{body}");
    let wrong_key = chat(
        &client,
        &proxy,
        Some("Bearer mg-v1-x"),
        hello("a/b:free"),
        None,
    )
    .await;
    assert_eq!(wrong_key.0, 429, "{wrong_key:?}");
}
