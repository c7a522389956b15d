//! Overload and flood protection through the proxy process over real HTTP:
//! a request without a key costs no body buffering; past `max_in_flight`
//! requests are answered 503 at once; slow bodies sent before
//! authentication hold none of those places; an address sending bad keys
//! meets 429 while its good keys are served, and once blocked costs no
//! store read; invented model names add no metric series.

use crate::common;
use crate::mock;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::examples::ProxyProcess;
use common::redis_server::RedisServer;
use common::wait::{PATIENCE, wait_for, wait_until};
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt as _};
use modelgate::auth::ApiKey;
use modelgate::keys::SharedStore;
use modelgate::oauth::AuthCode;
use modelgate::store::{RedisStore, RedisStoreConfig};
use p256::ecdsa::SigningKey;
use p256::elliptic_curve::Generate as _;
use p256::pkcs8::{EncodePublicKey as _, LineEnding};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

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

/// An OpenAI-compatible upstream whose chat answers wait until `true` is
/// sent on the returned gate: requests it holds are held for certain, for
/// as long as the test needs, however loaded the machine.
async fn gated_upstream() -> (String, tokio::sync::watch::Sender<bool>) {
    let (release, gate) = tokio::sync::watch::channel(false);
    let app = axum::Router::new().fallback(move |uri: http::Uri| {
        let mut gate = gate.clone();
        async move {
            let body = if uri.path().ends_with("/chat/completions") {
                let _ = gate.wait_for(|open| *open).await;
                json!({
                    "id": "chatcmpl-gated", "object": "chat.completion", "created": 1_767_225_600,
                    "model": "gpt-4o-mini",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                })
            } else {
                json!({"object": "list", "data": []})
            };
            (
                [(http::header::CONTENT_TYPE, "application/json")],
                body.to_string(),
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}/v1"), release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_in_flight_bound_requests_are_answered_503_at_once() {
    let (upstream, release) = gated_upstream().await;
    let admin_key = ApiKey::generate();
    let proxy = start_proxy(
        &json!({"max_in_flight": 8, "retry": {"max_attempts": 1}}),
        Some(&upstream),
        admin_key.expose(),
    );
    let key = proxy.create_key(admin_key.expose(), "load").await;
    let authorization = format!("Bearer {key}");
    let client = reqwest::Client::new();
    // The key is found live once first: its chats then skip the bound on
    // lookups of keys not known live, and only `max_in_flight` sheds them.
    let known = client
        .get(format!("{}/api/v1/key", proxy.address))
        .header("authorization", &authorization)
        .send()
        .await
        .unwrap();
    assert_eq!(known.status(), 200);

    // 50 chats at once; the upstream holds the 8 admitted until released.
    let mut pending: FuturesUnordered<_> = (0..50)
        .map(|_| {
            chat(
                &client,
                &proxy,
                Some(&authorization),
                hello("openai/gpt-4o-mini:free"),
                None,
            )
        })
        .collect();
    // "At once" as an order, not a duration: the other 42 are all
    // answered while the 8 are still held, so none of them was queued
    // behind a place.
    let mut shed = Vec::new();
    while shed.len() < 42 {
        let answer = tokio::time::timeout(Duration::from_secs(60), pending.next())
            .await
            .expect("42 refusals while 8 chats are held upstream")
            .unwrap();
        assert_eq!(
            answer.0, 503,
            "answered before the upstream was released: {answer:?}"
        );
        shed.push(answer);
    }
    release.send(true).unwrap();
    let mut served = Vec::new();
    while let Some(answer) = pending.next().await {
        served.push(answer);
    }
    assert_eq!(served.len(), 8);
    for answer in &served {
        assert_eq!(answer.0, 200, "{answer:?}");
    }
    for (_, retry_after, body) in &shed {
        assert_eq!(retry_after.as_deref(), Some("1"), "{body}");
        assert_eq!(body["error"]["type"], "service_unavailable", "{body}");
        assert_eq!(reason_of(body), "overloaded", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("8 requests are already in flight"),
            "{body}"
        );
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
    // The key in use: once blocked, the address's keys are looked up only
    // when the instance has found them live before.
    let served = chat(
        &client,
        &proxy,
        Some(&good),
        hello("openai/gpt-4o-mini:free"),
        None,
    )
    .await;
    assert_eq!(served.0, 200, "{served:?}");

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
    // Labels come from a fixed set (the configured models, else "other"),
    // not from a count: 250 more names, each new, show it as well as more
    // would.
    send(10..260).await;
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
    // The address is blocked before its secret is compared: the right
    // secret is refused too (else a right guess among many wrong ones would
    // pass); a wrong key is 429 now too.
    let (status, _, body) = hook(SECRET).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "auth_failures", "{body}");
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

/// A request from `from` that declares a 4000-byte JSON body and sends
/// only its first byte, `{`, on a raw connection held open until read.
async fn slow_body(
    from: IpAddr,
    proxy: &ProxyProcess,
    path: &str,
    headers: &[(&str, &str)],
) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let target: SocketAddr = proxy.address.trim_start_matches("http://").parse().unwrap();
    let mut stream = socket.connect(target).await.unwrap();
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: {target}\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n{");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// The answer on a raw connection: status, `Retry-After`, JSON body.
async fn raw_answer(stream: &mut TcpStream) -> (u16, Option<String>, Value) {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let read_all = async {
        loop {
            if let Some(end) = received.windows(4).position(|window| window == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .map_or(0, |value| value.trim().parse().unwrap());
                if received.len() >= end + 4 + length {
                    return (head, received[end + 4..end + 4 + length].to_vec());
                }
            }
            let read = stream.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the connection closed before the answer");
            received.extend_from_slice(&buffer[..read]);
        }
    };
    let (head, body) = tokio::time::timeout(Duration::from_secs(30), read_all)
        .await
        .expect("an answer within 30 s");
    let status = head[9..12].parse().unwrap();
    let retry_after = head
        .lines()
        .find_map(|line| line.strip_prefix("retry-after:"))
        .map(|value| value.trim().to_owned());
    (
        status,
        retry_after,
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    )
}

/// The value of the metric line `series` (its name and labels, as the
/// proxy's `/metrics` writes them), if there is one.
async fn metric(proxy: &ProxyProcess, series: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", proxy.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.parse().unwrap())
}

/// Waits until the proxy has `count` requests in flight (begun and not yet
/// answered).
async fn in_flight_to_be(proxy: &ProxyProcess, count: u32) {
    wait_for(PATIENCE, || async {
        match metric(proxy, "modelgate_requests_in_flight").await {
            Some(now) if now == f64::from(count) => Ok(()),
            other => Err(format!("{other:?} requests in flight, not {count}")),
        }
    })
    .await;
}

/// `metadata.reason` of a canonical error, or a webhook answer's `code`.
fn reason_of(body: &Value) -> &str {
    body["error"]["metadata"]["reason"]
        .as_str()
        .or_else(|| body["code"].as_str())
        .unwrap_or_default()
}

/// A file of code-host public keys in GitHub's shape, with `identifier`.
fn scanning_keys_file(identifier: &str) -> tempfile::NamedTempFile {
    let pem = SigningKey::generate()
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    let document =
        json!({"public_keys": [{"key_identifier": identifier, "key": pem, "is_current": true}]});
    std::fs::write(file.path(), document.to_string()).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_unauthenticated_bodies_hold_no_place_of_a_good_key() {
    const SECRET: &str = "overload-webhook-secret-0123456789";
    let identifier = "b2".repeat(32);
    let keys_file = scanning_keys_file(&identifier);
    let admin_key = ApiKey::generate();
    // 40 places per unauthenticated endpoint, 4 per address; a body of
    // 4000 bytes is due within 2 s + 2 s: room enough for the chats below
    // to come first on a loaded machine (all is held, and the chats done,
    // about 0.2 s after the first body, with two cores busy with builds).
    let proxy = start_proxy(
        &json!({
            "max_in_flight": 64,
            "unauthenticated": {"max_in_flight": 40, "max_in_flight_per_address": 4,
                                "min_body_bytes_per_second": 2000, "body_grace_ms": 2000},
            "auth_failures": {"max_failures": 3, "window_seconds": 600},
            "leak_scanning": {"public_keys": {"file": keys_file.path()}},
            "plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {
                "ops": {"sessionKey": "agent:ops", "secret": SECRET}
            }}}}},
            "retry": {"max_attempts": 1}
        }),
        None,
        admin_key.expose(),
    );
    let key = proxy.create_key(admin_key.expose(), "good").await;
    let client = reqwest::Client::new();
    let address = |n: u8| IpAddr::from([127, 0, 0, n]);
    let bearer = format!("Bearer {SECRET}");
    let leak_headers = [
        ("github-public-key-identifier", identifier.as_str()),
        (
            "github-public-key-signature",
            "MEUCIQDnot-checked-before-the-body",
        ),
    ];

    // One address holds its 4 places on the exchange; its fifth is
    // refused before any of the four is answered.
    let mut crowd = Vec::new();
    for _ in 0..4 {
        let mut stream = slow_body(address(50), &proxy, "/api/v1/auth/keys", &[]).await;
        crowd.push(tokio::spawn(async move { raw_answer(&mut stream).await }));
    }
    // The four are held before the fifth comes (each connection is read
    // apart: the fifth could otherwise be taken in before the last of them).
    in_flight_to_be(&proxy, 4).await;
    let mut fifth = slow_body(address(50), &proxy, "/api/v1/auth/keys", &[]).await;
    let (status, retry_after, body) = raw_answer(&mut fifth).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(reason_of(&body), "too_many_in_flight", "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(
        crowd.iter().all(|held| !held.is_finished()),
        "the fifth was refused only once a held body was answered"
    );

    // 80 more from 20 addresses: 50 exchanges (36 places left), 15 alerts,
    // 15 webhook calls; 70 held, more than `max_in_flight`. Each answer is
    // read as it comes, with whether the good key's chats were done then.
    let chats_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (answered, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for n in 0..80u8 {
        let from = address(10 + n % 20);
        let (endpoint, mut stream) = match n {
            0..50 => (
                "exchange",
                slow_body(from, &proxy, "/api/v1/auth/keys", &[]).await,
            ),
            50..65 => (
                "leaks",
                slow_body(from, &proxy, "/api/v1/leaks", &leak_headers).await,
            ),
            _ => (
                "webhook",
                slow_body(
                    from,
                    &proxy,
                    "/plugins/webhooks/ops",
                    &[("authorization", bearer.as_str())],
                )
                .await,
            ),
        };
        let (answered, chats_done) = (answered.clone(), chats_done.clone());
        tokio::spawn(async move {
            let answer = raw_answer(&mut stream).await;
            let after_chats = chats_done.load(std::sync::atomic::Ordering::SeqCst);
            let _ = answered.send((from, endpoint, answer, after_chats));
        });
    }
    drop(answered);
    // The exchange is full once its 14 refusals are in: they come at once,
    // long before any held body is due.
    let mut shed = 0;
    while shed < 14 {
        let (from, endpoint, (status, retry_after, body), _) =
            tokio::time::timeout(Duration::from_secs(60), answers.recv())
                .await
                .expect("the exchange's refusals")
                .unwrap();
        assert_eq!(
            (status, reason_of(&body), endpoint),
            (503, "overloaded", "exchange"),
            "{from}: {body}"
        );
        assert_eq!(retry_after.as_deref(), Some("1"));
        shed += 1;
    }
    // The alerts and webhook calls sent last have reached their endpoints:
    // the 4 and the 66 bodies are all held.
    in_flight_to_be(&proxy, 70).await;
    // The good key is served while the bodies are held.
    for _ in 0..3 {
        let served = chat(
            &client,
            &proxy,
            Some(&format!("Bearer {key}")),
            hello("openai/gpt-4o-mini:free"),
            None,
        )
        .await;
        assert_eq!(served.0, 200, "{served:?}");
    }
    chats_done.store(true, std::sync::atomic::Ordering::SeqCst);

    let mut slow_per_address: HashMap<IpAddr, usize> = HashMap::new();
    while let Some((from, endpoint, (status, _, body), after_chats)) = answers.recv().await {
        assert!(
            matches!(
                (status, reason_of(&body)),
                (408, _) | (429, "auth_failures")
            ),
            "{endpoint} from {from}: {status} {body}"
        );
        assert!(
            after_chats,
            "{endpoint} from {from} was answered before the good key's chats: {status} {body}"
        );
        *slow_per_address.entry(from).or_default() += 1;
    }
    assert_eq!(slow_per_address.values().sum::<usize>(), 66);
    for held in crowd {
        assert!(matches!(held.await.unwrap().0, 408 | 429));
    }
    // Each body too slow counted as a failed authentication: an address
    // with more than 3 is refused at once now, whatever it sends.
    let blocked: Vec<_> = slow_per_address
        .iter()
        .filter(|&(_, &count)| count > 3)
        .map(|(from, _)| *from)
        .collect();
    assert!(!blocked.is_empty(), "{slow_per_address:?}");
    for from in blocked.into_iter().chain([address(50)]) {
        let client = reqwest::Client::builder()
            .local_address(from)
            .build()
            .unwrap();
        let (status, _, body) = chat(
            &client,
            &proxy,
            Some(&format!("Bearer {}", ApiKey::generate().expose())),
            hello("a/b:free"),
            None,
        )
        .await;
        assert_eq!(
            (status, reason_of(&body)),
            (429, "auth_failures"),
            "{from}: {body}"
        );
    }
}

/// Watches the Redis server on `port` with `MONITOR`: every command it
/// runs, clients' and scripts' alike, with its arguments, one a line.
struct RedisMonitor {
    reader: std::io::BufReader<std::net::TcpStream>,
    port: u16,
}

impl RedisMonitor {
    fn start(port: u16) -> Self {
        use std::io::{BufRead as _, Write as _};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = std::io::BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "+OK\r\n");
        RedisMonitor { reader, port }
    }

    /// The lines of the commands run since the start.
    fn lines(mut self) -> Vec<String> {
        use std::io::{BufRead as _, Write as _};
        let marker = "end-of-monitor-marker";
        let mut other = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        other
            .write_all(format!("ECHO {marker}\r\n").as_bytes())
            .unwrap();
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            if line.contains(marker) {
                return lines;
            }
            lines.push(line);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocked_address_costs_no_store_read_and_its_cached_key_is_served() {
    let redis = RedisServer::start();
    let store: SharedStore = Arc::new(
        RedisStore::connect(&redis.url(), RedisStoreConfig::default())
            .await
            .unwrap(),
    );
    let base = mock::start(mock::MockConfig::default()).await;
    // The default key cache (1 s): the good key stays known as found live
    // after its entry is stale. The gateway's clock moves when told.
    let clock = modelgate::clock::ManualClock::new(chrono::Utc::now());
    let gateway = common::gateway::instance_with_clock(
        store.clone(),
        &base,
        r#"{"auth_failures": {"max_failures": 5, "window_seconds": 600}, "retry": {"max_attempts": 1}}"#,
        Arc::new(clock.clone()),
    )
    .await;
    let good = common::gateway::key_of(&store, "default", None).await;
    let free = json!({"model": "openai/gpt-4o-mini:free", "messages": [{"role": "user", "content": "Hi"}]});
    let (status, body) = common::gateway::chat(gateway, &good, &free).await;
    assert_eq!(status, 200, "{body}");
    // Past the limit with malformed keys (no lookup needed to refuse them).
    for _ in 0..6 {
        let (status, _) = common::gateway::chat(gateway, "mg-v1-guess", &free).await;
        assert!(matches!(status, 401 | 429));
    }
    // Every command is watched, but only those naming a guessed key or
    // code count: what the good chat writes in the background (its
    // settlement, last use, app counts) may run meanwhile.
    let monitor = RedisMonitor::start(redis.port());
    let mut guessed_ids = Vec::new();
    let client = reqwest::Client::new();
    for n in 0..200 {
        let guess = ApiKey::generate();
        guessed_ids.push(guess.hash().to_hex());
        let reply = if n % 2 == 0 {
            client
                .post(format!("http://{gateway}/api/v1/chat/completions"))
                .bearer_auth(guess.expose())
                .json(&free)
        } else {
            client
                .get(format!("http://{gateway}/api/v1/key"))
                .bearer_auth(guess.expose())
        }
        .send()
        .await
        .unwrap();
        assert_eq!(reply.status(), 429);
        let body: Value = reply.json().await.unwrap();
        assert_eq!(reason_of(&body), "auth_failures", "{body}");
    }
    for _ in 0..200 {
        let code = AuthCode::generate();
        guessed_ids.push(code.hash_hex());
        let exchange = json!({"code": code.expose(), "code_verifier": "v".repeat(43)});
        let reply = client
            .post(format!("http://{gateway}/api/v1/auth/keys"))
            .json(&exchange)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 429);
        let body: Value = reply.json().await.unwrap();
        assert_eq!(reason_of(&body), "auth_failures", "{body}");
    }
    // The key the instance found live is still served once its 1 s cache
    // entry is stale: the entry is read again, which the watch must see.
    clock.advance(Duration::from_millis(1500));
    let (status, body) = common::gateway::chat(gateway, &good, &free).await;
    assert_eq!(status, 200, "{body}");
    let lines = monitor.lines();
    let good_id = ApiKey::parse(&good).unwrap().hash().to_hex();
    assert!(
        lines.iter().any(|line| line.contains(&good_id)),
        "the good key's lookup is not among {} watched commands",
        lines.len()
    );
    let reads: Vec<_> = lines
        .iter()
        .filter(|line| guessed_ids.iter().any(|id| line.contains(id.as_str())))
        .collect();
    assert!(
        reads.is_empty(),
        "400 refusals of a blocked address reached Redis: {reads:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lookups_of_unknown_keys_are_bounded_and_a_live_key_is_never_refused_by_it() {
    let redis = RedisServer::start();
    // The gateway's calls go through a relay that shows what they sent.
    let relay = common::relay::Relay::start(redis.port()).await;
    // Calls wait for a frozen Redis rather than time out: the lookups held
    // below are held until it thaws.
    let store: SharedStore = Arc::new(
        RedisStore::connect(
            &relay.url(),
            RedisStoreConfig {
                call_timeout: Duration::from_secs(120),
                ..RedisStoreConfig::default()
            },
        )
        .await
        .unwrap(),
    );
    let base = mock::start(mock::MockConfig::default()).await;
    // A long key cache: the live key's chat reads no key record.
    let gateway = common::gateway::instance_with_cache(
        store.clone(),
        &base,
        r#"{"unauthenticated": {"max_concurrent_key_lookups": 4}, "retry": {"max_attempts": 1}}"#,
        Arc::new(modelgate::clock::SystemClock),
        Duration::from_secs(600),
    )
    .await;
    let good = common::gateway::key_of(&store, "default", None).await;
    let free = json!({"model": "openai/gpt-4o-mini:free", "messages": [{"role": "user", "content": "Hi"}]});
    let (status, body) = common::gateway::chat(gateway, &good, &free).await;
    assert_eq!(status, 200, "{body}");

    redis.freeze();
    let client = reqwest::Client::new();
    let guess = |client: &reqwest::Client| {
        client
            .post(format!("http://{gateway}/api/v1/chat/completions"))
            .bearer_auth(ApiKey::generate().expose())
            .json(&free)
            .send()
    };
    // 20 unknown keys at once: 4 lookups wait on the frozen store, the
    // other 16 are refused without one, while those 4 still wait.
    let mut pending: FuturesUnordered<_> = (0..20).map(|_| guess(&client)).collect();
    for _ in 0..16 {
        let reply = tokio::time::timeout(Duration::from_secs(60), pending.next())
            .await
            .expect("16 refusals while Redis is frozen")
            .unwrap()
            .unwrap();
        assert_eq!(reply.status(), 503);
        assert_eq!(
            reply
                .headers()
                .get("retry-after")
                .map(|value| value.to_str().unwrap()),
            Some("1")
        );
        let body: Value = reply.json().await.unwrap();
        assert_eq!(reason_of(&body), "overloaded", "{body}");
    }
    // The bound is full; the live key takes no part of it: its chat waits
    // for the frozen ledger, not refused, and is served once Redis thaws.
    let good_hash = ApiKey::parse(&good).unwrap().hash().to_hex();
    let admissions_before = relay.sent_occurrences(good_hash.as_bytes());
    let live = tokio::spawn({
        let (good, free) = (good.clone(), free.clone());
        async move { common::gateway::chat(gateway, &good, &free).await }
    });
    // The live chat is past authentication while the bound is full: its
    // admission, naming its key, is sent to the frozen Redis.
    wait_until(
        PATIENCE,
        "the live chat's admission sent to Redis",
        || async { relay.sent_occurrences(good_hash.as_bytes()) > admissions_before },
    )
    .await;
    let still_full = guess(&client).await.unwrap();
    assert_eq!(still_full.status(), 503);
    redis.thaw();
    let (status, body) = live.await.unwrap();
    assert_eq!(status, 200, "{body}");
    // The 4 lookups that waited answer now: unknown keys.
    while let Some(reply) = pending.next().await {
        let reply = reply.unwrap();
        assert_eq!(reply.status(), 401);
    }
    // Their places are free again.
    let reply = guess(&client).await.unwrap();
    assert_eq!(reply.status(), 401);
}
