//! Leak notices over real sockets: e-mail through a loopback SMTP server
//! (`common::smtp`), the signed webhook to a loopback HTTP server; retries
//! after temporary failures, no retry after a permanent one, a notice
//! without an address, unreachable servers, the bounds on attempts in
//! flight and notices waiting, and the metric's outcomes.

use crate::common;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use chrono::{TimeZone, Utc};
use common::http_server::serve;
use common::smtp::{SmtpServer, closed_address};
use hmac::{Hmac, Mac};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use modelgate::notify::{EmailSettings, LeakNotice, Notifier, WebhookSettings};
use modelgate::secrets::Secret;
use sha2::Sha256;
use tokio::sync::{Semaphore, watch};

const FROM: &str = "modelgate <keys@example.com>";
const WEBHOOK_SECRET: &str = "notify-test-webhook-secret-0123";
/// Long enough for any delivery on a loaded machine; a failing test waits
/// this long at most.
const PATIENCE: Duration = Duration::from_secs(20);

fn notice(email: Option<&str>) -> LeakNotice {
    LeakNotice {
        account: "acct_leaky".into(),
        email: email.map(str::to_owned),
        key_name: "ci deploys".into(),
        key_hash_prefix: "3f9a0c1b2d4e".into(),
        token_type: "modelgate_api_key".into(),
        url: Some("https://github.com/octo/app/blob/main/.env".into()),
        source: Some("content".into()),
        reported_at: Utc.with_ymd_and_hms(2025, 3, 1, 12, 30, 5).unwrap(),
        reported_by: "secret_scanning".into(),
    }
}

fn email_settings(server: &SmtpServer) -> EmailSettings {
    EmailSettings::new(&server.url(), FROM).unwrap()
}

fn webhook_settings(address: SocketAddr) -> WebhookSettings {
    WebhookSettings::new(
        &format!("http://{address}/hooks/modelgate"),
        Secret::new(WEBHOOK_SECRET.into()),
    )
    .unwrap()
}

async fn idle(notifier: &Notifier) {
    tokio::time::timeout(PATIENCE, notifier.idle())
        .await
        .expect("the notifier is idle once its sends are done");
}

/// One request the webhook receiver got.
#[derive(Clone, Debug)]
struct Received {
    content_type: String,
    timestamp: String,
    signature: String,
    body: Bytes,
}

/// A webhook receiver on loopback: records each request, answers the
/// statuses queued (then 204), and holds each answer until a place is
/// released when started held.
#[derive(Clone)]
struct Receiver {
    address: SocketAddr,
    received: Arc<watch::Sender<Vec<Received>>>,
    /// Requests that arrived, answered or not.
    arrived: Arc<watch::Sender<usize>>,
    gate: Arc<Semaphore>,
}

impl Receiver {
    async fn start(answers: &[u16]) -> Self {
        Receiver::start_with_gate(answers, Semaphore::MAX_PERMITS).await
    }

    /// Every request waits for [`Receiver::release`] before its answer.
    async fn start_held() -> Self {
        Receiver::start_with_gate(&[], 0).await
    }

    async fn start_with_gate(answers: &[u16], places: usize) -> Self {
        let received = Arc::new(watch::Sender::new(Vec::new()));
        let arrived = Arc::new(watch::Sender::new(0));
        let answers = Arc::new(Mutex::new(answers.iter().copied().collect::<VecDeque<_>>()));
        let gate = Arc::new(Semaphore::new(places));
        let (on_received, on_arrived, queued, held) = (
            Arc::clone(&received),
            Arc::clone(&arrived),
            Arc::clone(&answers),
            Arc::clone(&gate),
        );
        let service = tower::service_fn(move |request: Request<Incoming>| {
            let (on_received, on_arrived, queued, held) = (
                Arc::clone(&on_received),
                Arc::clone(&on_arrived),
                Arc::clone(&queued),
                Arc::clone(&held),
            );
            async move {
                on_arrived.send_modify(|count| *count += 1);
                let header = |name: &str| {
                    request
                        .headers()
                        .get(name)
                        .and_then(|value| value.to_str().ok())
                        .unwrap_or("")
                        .to_owned()
                };
                let (content_type, timestamp, signature) = (
                    header("content-type"),
                    header("x-modelgate-timestamp"),
                    header("x-modelgate-signature"),
                );
                let body = request.into_body().collect().await.unwrap().to_bytes();
                if let Ok(place) = held.acquire().await {
                    place.forget();
                }
                on_received.send_modify(|all| {
                    all.push(Received {
                        content_type,
                        timestamp,
                        signature,
                        body,
                    })
                });
                let status = queued.lock().unwrap().pop_front().unwrap_or(204);
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(status)
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                )
            }
        });
        let address = serve(service).await;
        Receiver {
            address,
            received,
            arrived,
            gate,
        }
    }

    fn received(&self) -> Vec<Received> {
        self.received.borrow().clone()
    }

    fn arrived(&self) -> usize {
        *self.arrived.borrow()
    }

    async fn wait_for_arrivals(&self, count: usize) {
        let mut arrived = self.arrived.subscribe();
        tokio::time::timeout(PATIENCE, arrived.wait_for(|arrived| *arrived >= count))
            .await
            .expect("requests arrive")
            .unwrap();
    }

    fn release(&self) {
        self.gate.add_permits(1000);
    }
}

/// Recomputes the signature apart from the crate's own function.
fn expected_signature(timestamp: &str, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(WEBHOOK_SECRET.as_bytes()).unwrap();
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Logs written while a test runs (current-thread runtime: its tasks log
/// on the test's thread).
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn install(&self, level: tracing::Level) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(level)
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }
}

#[tokio::test]
async fn a_notice_reaches_the_owner_as_one_email_naming_everything_but_the_key() {
    let server = SmtpServer::start().await;
    let notifier = Notifier::new(Some(email_settings(&server)), None).with_retry_waits(Vec::new());
    notifier.leak_detected(notice(Some("owner@example.com")));
    idle(&notifier).await;

    let messages = server.wait_for(1, PATIENCE).await;
    assert_eq!(messages.len(), 1, "{messages:#?}");
    let message = &messages[0];
    assert_eq!(message.from, "keys@example.com");
    assert_eq!(message.recipients, ["owner@example.com"]);
    assert_eq!(message.header("from").as_deref(), Some(FROM));
    assert_eq!(message.header("to").as_deref(), Some("owner@example.com"));
    assert_eq!(
        message.header("subject").as_deref(),
        Some("Your modelgate API key \"ci deploys\" was found leaked")
    );
    let body = message.body();
    for words in [
        "\"ci deploys\"",
        "3f9a0c1b2d4e",
        "acct_leaky",
        "https://github.com/octo/app/blob/main/.env",
        "content",
        "2025-03-01 12:30:05 UTC",
        "GitHub secret scanning",
        "disabled",
        "/settings",
        "delete the leaked key",
        "create a new one",
        "environment variable",
        "repository",
        "browser",
    ] {
        assert!(body.contains(words), "{words:?} missing from\n{body}");
    }
    assert!(!message.data.contains("mg-v1-"), "{}", message.data);
    assert_eq!(server.transactions(), 1);
}

#[tokio::test]
async fn a_temporary_smtp_failure_is_retried_and_delivers_exactly_once() {
    let server = SmtpServer::start().await;
    server.fail_next(1);
    let notifier = Notifier::new(Some(email_settings(&server)), None)
        .with_retry_waits(vec![Duration::from_millis(5), Duration::from_millis(5)]);
    notifier.leak_detected(notice(Some("owner@example.com")));
    idle(&notifier).await;

    assert_eq!(server.transactions(), 2, "the 451, then the retry");
    let messages = server.messages();
    assert_eq!(messages.len(), 1, "{messages:#?}");
    assert_eq!(messages[0].recipients, ["owner@example.com"]);
}

#[tokio::test]
async fn a_permanent_smtp_refusal_is_not_retried_and_is_logged_for_a_human() {
    let logs = CapturedLogs::default();
    let _guard = logs.install(tracing::Level::WARN);
    let server = SmtpServer::start().await;
    server.refuse_next(1);
    let notifier = Notifier::new(Some(email_settings(&server)), None)
        .with_retry_waits(vec![Duration::from_millis(5), Duration::from_millis(5)]);
    notifier.leak_detected(notice(Some("gone@example.com")));
    idle(&notifier).await;

    assert_eq!(server.transactions(), 1, "a 550 is final");
    assert!(server.messages().is_empty());
    let text = logs.text();
    assert!(text.contains("ERROR"), "{text}");
    assert!(text.contains("550"), "{text}");
    assert!(text.contains("gone@example.com"), "{text}");
}

#[tokio::test]
async fn the_webhook_is_signed_and_a_500_is_retried() {
    let receiver = Receiver::start(&[500]).await;
    let notifier = Notifier::new(None, Some(webhook_settings(receiver.address)))
        .with_retry_waits(vec![Duration::from_millis(5), Duration::from_millis(5)]);
    notifier.leak_detected(notice(Some("owner@example.com")));
    idle(&notifier).await;

    let received = receiver.received();
    assert_eq!(received.len(), 2, "the 500, then the retry: {received:#?}");
    let now_seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for request in &received {
        assert_eq!(request.content_type, "application/json");
        let timestamp: u64 = request.timestamp.parse().unwrap();
        assert!(timestamp.abs_diff(now_seconds) < 60, "{timestamp}");
        assert_eq!(
            request.signature,
            expected_signature(&request.timestamp, &request.body)
        );
        assert!(modelgate::notify::verify_webhook_signature(
            &Secret::new(WEBHOOK_SECRET.into()),
            timestamp,
            &request.body,
            &request.signature
        ));
        let json: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(json["type"], "key.leaked");
        assert_eq!(json["data"]["account"], "acct_leaky");
        assert_eq!(json["data"]["email"], "owner@example.com");
        assert_eq!(json["data"]["key_name"], "ci deploys");
        assert_eq!(json["data"]["key_hash_prefix"], "3f9a0c1b2d4e");
        assert_eq!(json["data"]["token_type"], "modelgate_api_key");
        assert_eq!(json["data"]["source"], "content");
        assert_eq!(json["data"]["reported_at"], "2025-03-01T12:30:05Z");
        assert_eq!(json["data"]["reported_by"], "secret_scanning");
    }
    // One delivery id and one body for both attempts, so a receiver can
    // drop a repeat.
    assert_eq!(received[0].body, received[1].body);
}

/// A key pasted into a key's name is redacted in the webhook as in the
/// e-mail, for an alert and for a leak notice.
#[tokio::test]
async fn a_key_pasted_into_a_key_name_is_redacted_in_the_webhook() {
    let receiver = Receiver::start(&[]).await;
    let notifier = Notifier::new(None, Some(webhook_settings(receiver.address)));
    let pasted = "oops mg-v1-AbCdEf0123456789xyz pasted";
    notifier.leak_detected(LeakNotice {
        key_name: pasted.into(),
        ..notice(None)
    });
    notifier.alert(modelgate::notify::AlertNotice {
        id: "fedcba9876543210fedcba9876543210".into(),
        account: "acct_leaky".into(),
        email: None,
        alert: modelgate::notify::Alert::KeyLimitPercent {
            key_name: pasted.into(),
            key_hash_prefix: "3f9a0c1b2d4e".into(),
            percent: 80,
            usage: serde_json::json!(8),
            limit: serde_json::json!(10),
            period: None,
            period_start: None,
        },
        detected_at: Utc.with_ymd_and_hms(2025, 3, 20, 8, 0, 0).unwrap(),
    });
    idle(&notifier).await;
    let received = receiver.received();
    assert_eq!(received.len(), 2, "{received:#?}");
    for request in received {
        let text = String::from_utf8_lossy(&request.body);
        assert!(!text.contains("AbCdEf0123456789xyz"), "{text}");
        let json: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(
            json["data"]["key_name"], "oops [redacted key] pasted",
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_notice_without_an_address_goes_only_to_the_webhook() {
    let server = SmtpServer::start().await;
    let receiver = Receiver::start(&[]).await;
    let notifier = Notifier::new(
        Some(email_settings(&server)),
        Some(webhook_settings(receiver.address)),
    )
    .with_retry_waits(Vec::new());
    notifier.leak_detected(notice(None));
    idle(&notifier).await;

    assert_eq!(receiver.received().len(), 1);
    let json: serde_json::Value = serde_json::from_slice(&receiver.received()[0].body).unwrap();
    assert!(json["data"]["email"].is_null(), "{json}");
    assert_eq!(server.connections(), 0, "no e-mail, not even a connection");
}

#[tokio::test]
async fn an_unreachable_server_fails_every_attempt_without_holding_up_the_caller() {
    let logs = CapturedLogs::default();
    let _guard = logs.install(tracing::Level::WARN);
    let smtp_url = format!("smtp://mailer:hunter2-smtp-password@{}", closed_address());
    let email = EmailSettings::new(&smtp_url, FROM).unwrap();
    let notifier = Notifier::new(Some(email), Some(webhook_settings(closed_address())))
        .with_retry_waits(vec![Duration::from_millis(1), Duration::from_millis(1)]);

    let started = Instant::now();
    notifier.leak_detected(notice(Some("owner@example.com")));
    let returned_after = started.elapsed();
    // Generous for a loaded machine: the call only spawns a task.
    assert!(
        returned_after < Duration::from_millis(500),
        "leak_detected took {returned_after:?}"
    );
    idle(&notifier).await;

    let text = logs.text();
    for channel in ["email", "webhook"] {
        let warnings = text
            .lines()
            .filter(|line| {
                line.contains("WARN") && line.contains(&format!("channel=\"{channel}\""))
            })
            .count();
        assert_eq!(warnings, 2, "two failures retried on {channel}:\n{text}");
        let given_up: Vec<&str> = text
            .lines()
            .filter(|line| {
                line.contains("ERROR") && line.contains(&format!("channel=\"{channel}\""))
            })
            .collect();
        assert_eq!(given_up.len(), 1, "{text}");
        for words in [
            "attempts=3",
            "acct_leaky",
            "owner@example.com",
            "ci deploys",
            "key=\"3f9a0c1b\"",
            "https://github.com/octo/app/blob/main/.env",
            "by hand",
        ] {
            assert!(
                given_up[0].contains(words),
                "{words:?} missing: {}",
                given_up[0]
            );
        }
    }
    assert!(
        !text.contains("hunter2"),
        "the SMTP password in the logs:\n{text}"
    );
    assert!(!text.contains(WEBHOOK_SECRET), "{text}");
    assert!(
        !text.contains("/hooks/modelgate"),
        "the webhook's path: {text}"
    );
}

#[tokio::test]
async fn at_most_four_attempts_are_in_flight_at_once() {
    let receiver = Receiver::start_held().await;
    let notifier =
        Notifier::new(None, Some(webhook_settings(receiver.address))).with_retry_waits(Vec::new());
    for _ in 0..6 {
        notifier.leak_detected(notice(None));
    }
    receiver.wait_for_arrivals(4).await;
    // Until the runtime (this test's one thread) has nothing left to do:
    // with the clock paused, a sleep ends only once every task waits and
    // no I/O is ready, so the other two, were they sent, would have
    // arrived at the receiver on loopback by then.
    tokio::time::pause();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::time::resume();
    assert_eq!(receiver.arrived(), 4, "the other two wait for a place");

    receiver.release();
    idle(&notifier).await;
    assert_eq!(receiver.received().len(), 6);
}

#[tokio::test]
async fn past_the_pending_bound_a_notice_is_dropped_and_logged() {
    let logs = CapturedLogs::default();
    let _guard = logs.install(tracing::Level::WARN);
    let receiver = Receiver::start_held().await;
    let notifier = Notifier::new(None, Some(webhook_settings(receiver.address)))
        .with_retry_waits(Vec::new())
        .with_max_pending_notices(1);
    notifier.leak_detected(notice(None));
    let mut second = notice(None);
    second.account = "acct_second".into();
    notifier.leak_detected(second);
    receiver.wait_for_arrivals(1).await;

    receiver.release();
    idle(&notifier).await;
    assert_eq!(receiver.received().len(), 1);
    let text = logs.text();
    let dropped: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("dropped"))
        .collect();
    assert_eq!(dropped.len(), 1, "{text}");
    assert!(
        dropped[0].contains("ERROR") && dropped[0].contains("acct_second"),
        "{text}"
    );

    // A place is free again.
    notifier.leak_detected(notice(None));
    idle(&notifier).await;
    assert_eq!(receiver.received().len(), 2);
}

#[test]
fn each_outcome_is_counted_by_channel() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    // A local recorder and a current-thread runtime: the notifier's tasks
    // run, and count, on this thread.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        let notifier = runtime.block_on(async {
            let server = SmtpServer::start().await;
            server.fail_next(1);
            let notifier = Notifier::new(
                Some(email_settings(&server)),
                Some(webhook_settings(closed_address())),
            )
            .with_retry_waits(vec![Duration::from_millis(1)]);
            notifier.leak_detected(notice(Some("owner@example.com")));
            idle(&notifier).await;
            assert_eq!(server.messages().len(), 1);
            notifier
        });
        // Outside the runtime: nothing to send on, so dropped.
        notifier.leak_detected(notice(Some("owner@example.com")));
    });

    let text = metrics.render();
    for expected in [
        r#"modelgate_notices_total{channel="email",outcome="retried"} 1"#,
        r#"modelgate_notices_total{channel="email",outcome="sent"} 1"#,
        r#"modelgate_notices_total{channel="webhook",outcome="retried"} 1"#,
        r#"modelgate_notices_total{channel="webhook",outcome="failed"} 1"#,
        r#"modelgate_notices_total{channel="email",outcome="dropped"} 1"#,
        r#"modelgate_notices_total{channel="webhook",outcome="dropped"} 1"#,
    ] {
        assert!(text.contains(expected), "missing {expected} in\n{text}");
    }
    assert!(
        !text.contains("acct_leaky"),
        "no account in a label:\n{text}"
    );
}
