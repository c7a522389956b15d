//! Leaked keys over real HTTP: a signed secret-scanning alert (or an
//! operator's report) revokes the key on every instance sharing the store
//! at once, whatever their key caches hold, and its owner gets one e-mail
//! on an SMTP server the test runs; forged, replayed-and-changed or
//! malformed alerts change nothing. The key stays readable, cannot be
//! enabled again, and records its last use.

use crate::common;
use crate::mock;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::gateway::{chat, instance_with_cache, key_of};
use common::redis_server::RedisServer;
use common::smtp::SmtpServer;
use common::wait::{PATIENCE, wait_for, wait_until};
use modelgate::clock::SystemClock;
use modelgate::keys::{KeyDirectory, NewAccount, NewKey, SharedStore};
use modelgate::store::{MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig};
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{DerSignature, SigningKey};
use p256::elliptic_curve::Generate as _;
use p256::pkcs8::{EncodePublicKey as _, LineEnding};
use serde_json::{Value, json};

const CONFIG: &str = r#"{"retry": {"max_attempts": 1}}"#;

/// Long enough that only a bypass of the cache can explain a refusal.
const LONG_CACHE: Duration = Duration::from_secs(3600);

fn paid() -> Value {
    json!({"model": "openai/gpt-4o-mini", "max_tokens": 5,
           "messages": [{"role": "user", "content": "Hi"}]})
}

fn free() -> Value {
    json!({"model": "meta-llama/llama-3.1-8b-instruct:free",
           "messages": [{"role": "user", "content": "Hi"}]})
}

async fn redis_store(server: &RedisServer) -> SharedStore {
    Arc::new(
        RedisStore::connect(&server.url(), RedisStoreConfig::default())
            .await
            .unwrap(),
    )
}

async fn instances(stores: &[SharedStore]) -> Vec<SocketAddr> {
    instances_with(stores, CONFIG).await
}

async fn instances_with(stores: &[SharedStore], config: &str) -> Vec<SocketAddr> {
    let base = mock::start(mock::MockConfig::default()).await;
    let mut addresses = Vec::new();
    for store in stores {
        addresses.push(
            instance_with_cache(
                store.clone(),
                &base,
                config,
                Arc::new(SystemClock),
                LONG_CACHE,
            )
            .await,
        );
    }
    addresses
}

async fn operator_key(store: &SharedStore) -> String {
    let new = NewKey {
        management: true,
        ..NewKey::named("operator")
    };
    let (key, _) = KeyDirectory::new(store.clone())
        .create_key(new)
        .await
        .unwrap();
    key.expose().to_owned()
}

async fn call(
    method: reqwest::Method,
    address: SocketAddr,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("http://{address}{path}"))
        .header("authorization", format!("Bearer {key}"));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let reply = request.send().await.unwrap();
    let status = reply.status().as_u16();
    let text = reply.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn reason(body: &Value) -> &str {
    body["error"]["metadata"]["reason"]
        .as_str()
        .unwrap_or_default()
}

/// The key's hash as the management API lists it.
async fn hash_of(address: SocketAddr, admin: &str, name: &str) -> String {
    let (status, keys) = call(
        reqwest::Method::GET,
        address,
        "/api/v1/keys?include_disabled=true",
        admin,
        None,
    )
    .await;
    assert_eq!(status, 200, "{keys}");
    keys["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|key| key["name"] == name)
        .unwrap_or_else(|| panic!("no key named {name}: {keys}"))["hash"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The operator reports a key through instance A; instance B, whose cache
/// holds the key as live for an hour, refuses it at once on every route.
async fn a_reported_key_is_refused_everywhere_at_once(stores: [SharedStore; 2]) {
    let addresses = instances(&stores).await;
    let (a, b) = (addresses[0], addresses[1]);
    let admin = operator_key(&stores[0]).await;
    stores[0]
        .top_up("default", 100 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let key = key_of(&stores[0], "default", None).await;
    // Both instances cache the key as live.
    for address in [a, b] {
        assert_eq!(chat(address, &key, &paid()).await.0, 200);
        assert_eq!(chat(address, &key, &free()).await.0, 200);
    }
    let hash = hash_of(a, &admin, "client").await;
    let (status, reported) = call(
        reqwest::Method::POST,
        a,
        &format!("/api/v1/keys/{hash}/leaked"),
        &admin,
        Some(json!({"url": "https://github.com/o/r/blob/main/.env", "source": "content"})),
    )
    .await;
    assert_eq!(status, 200, "{reported}");
    assert_eq!(reported["data"]["disabled"], true);
    assert_eq!(reported["data"]["leak"]["reported_by"], "operator");
    assert_eq!(
        reported["data"]["leak"]["url"],
        "https://github.com/o/r/blob/main/.env"
    );
    for address in [b, a] {
        for body in [paid(), free()] {
            let (status, refused) = chat(address, &key, &body).await;
            assert_eq!((status, reason(&refused)), (401, "leaked_key"), "{refused}");
        }
        let (status, refused) =
            call(reqwest::Method::GET, address, "/api/v1/key", &key, None).await;
        assert_eq!((status, reason(&refused)), (401, "leaked_key"), "{refused}");
    }
    // Its usage stays readable; it cannot be enabled again.
    let (status, read) = call(
        reqwest::Method::GET,
        b,
        &format!("/api/v1/keys/{hash}"),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, 200, "{read}");
    assert!(read["data"]["usage"].as_f64().unwrap() > 0.0, "{read}");
    assert!(read["data"]["leak"]["reported_at"].is_string(), "{read}");
    let (status, refused) = call(
        reqwest::Method::PATCH,
        b,
        &format!("/api/v1/keys/{hash}"),
        &admin,
        Some(json!({"disabled": false})),
    )
    .await;
    assert_eq!((status, reason(&refused)), (422, "leaked_key"), "{refused}");
    // Reported again: the first report stands.
    let (status, again) = call(
        reqwest::Method::POST,
        b,
        &format!("/api/v1/keys/{hash}/leaked"),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["data"]["leak"], reported["data"]["leak"]);
    // An unknown hash is 404; a malformed body names its field.
    let (status, _) = call(
        reqwest::Method::POST,
        a,
        &format!("/api/v1/keys/{}/leaked", "ab".repeat(32)),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, refused) = call(
        reqwest::Method::POST,
        a,
        &format!("/api/v1/keys/{hash}/leaked"),
        &admin,
        Some(json!({"url": 5})),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_key_is_refused_at_once_on_memory() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    a_reported_key_is_refused_everywhere_at_once([store.clone(), store]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_key_is_refused_at_once_on_two_instances_sharing_redis() {
    let server = RedisServer::start();
    a_reported_key_is_refused_everywhere_at_once([
        redis_store(&server).await,
        redis_store(&server).await,
    ])
    .await;
}

/// `last_used_at` is written on first use and then at most once a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_records_its_last_use_coarsely() {
    let server = RedisServer::start();
    let store = redis_store(&server).await;
    // The gateway's clock moves when told.
    let clock = modelgate::clock::ManualClock::new(chrono::Utc::now());
    let base = mock::start(mock::MockConfig::default()).await;
    let address = instance_with_cache(
        store.clone(),
        &base,
        CONFIG,
        Arc::new(clock.clone()),
        LONG_CACHE,
    )
    .await;
    let admin = operator_key(&store).await;
    let key = key_of(&store, "default", None).await;
    let hash = hash_of(address, &admin, "client").await;
    let read = |hash: String| last_used(address, admin.clone(), hash);
    assert_eq!(read(hash.clone()).await, Value::Null, "never used yet");
    for _ in 0..20 {
        let (status, _) = call(reqwest::Method::GET, address, "/api/v1/key", &key, None).await;
        assert_eq!(status, 200);
    }
    // The write happens in the background.
    let first = wait_for(PATIENCE, || async {
        let first = read(hash.clone()).await;
        if first.is_string() {
            Ok(first)
        } else {
            Err(format!("no last use written: {first}"))
        }
    })
    .await;
    let revision_before = redis_revision(&server, &hash);
    let revision_before: u64 = revision_before
        .parse()
        .unwrap_or_else(|_| panic!("the key record's revision is read: {revision_before:?}"));
    for _ in 0..20 {
        let (status, _) = call(reqwest::Method::GET, address, "/api/v1/key", &key, None).await;
        assert_eq!(status, 200);
    }
    // A minute later one use writes again: once that write is in, any
    // write the uses within the minute had made would be too.
    clock.advance(Duration::from_secs(61));
    let (status, _) = call(reqwest::Method::GET, address, "/api/v1/key", &key, None).await;
    assert_eq!(status, 200);
    let second = wait_for(PATIENCE, || async {
        let second = read(hash.clone()).await;
        if second != first {
            Ok(second)
        } else {
            Err(format!(
                "the last use of a minute later never written: {second}"
            ))
        }
    })
    .await;
    assert!(second.is_string(), "{second}");
    assert_eq!(
        redis_revision(&server, &hash),
        (revision_before + 1).to_string(),
        "no store write within the minute, one after it"
    );
}

async fn last_used(address: SocketAddr, admin: String, hash: String) -> Value {
    call(
        reqwest::Method::GET,
        address,
        &format!("/api/v1/keys/{hash}"),
        &admin,
        None,
    )
    .await
    .1["data"]["last_used_at"]
        .clone()
}

/// The key record's revision in Redis: it rises on every write.
fn redis_revision(server: &RedisServer, hash: &str) -> String {
    let output = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &server.port().to_string(),
            "HGET",
            // As docs/operating.md names it: the collection `r:keys`
            // percent-escaped inside the hash tag.
            "mg:{r%3Akeys}:revs",
            hash,
        ])
        .output()
        .unwrap();
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// The code host's side: a P-256 key pair, its public half published in
/// GitHub's shape in a file the gateway's config names.
struct Scanner {
    signing: SigningKey,
    identifier: String,
    _keys_file: tempfile::NamedTempFile,
    keys_path: String,
}

impl Scanner {
    fn new() -> Self {
        let signing = SigningKey::generate();
        let pem = signing
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap();
        let identifier = "a1".repeat(32);
        let document = json!({"public_keys": [
            {"key_identifier": "00".repeat(32), "key": pem, "is_current": false},
            {"key_identifier": identifier, "key": pem, "is_current": true},
        ]});
        let keys_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(keys_file.path(), document.to_string()).unwrap();
        let keys_path = keys_file.path().to_str().unwrap().to_owned();
        Scanner {
            signing,
            identifier,
            _keys_file: keys_file,
            keys_path,
        }
    }

    fn sign(&self, body: &[u8]) -> String {
        let signature: DerSignature = self.signing.sign(body);
        STANDARD.encode(signature.as_bytes())
    }
}

/// Posts `body` as an alert with the given signature headers.
async fn post_alert(
    address: SocketAddr,
    body: &[u8],
    identifier: Option<&str>,
    signature: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("http://{address}/api/v1/leaks"))
        .header("content-type", "application/json")
        .body(body.to_vec());
    if let Some(identifier) = identifier {
        request = request.header("github-public-key-identifier", identifier);
    }
    if let Some(signature) = signature {
        request = request.header("github-public-key-signature", signature);
    }
    let reply = request.send().await.unwrap();
    let status = reply.status().as_u16();
    let text = reply.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// A key of the account `acme` (whose owner is owner@acme.test), named `name`.
async fn acme_key(store: &SharedStore, name: &str) -> String {
    let directory = KeyDirectory::new(store.clone());
    let _ = directory
        .create_account(NewAccount {
            id: "acme".into(),
            name: "Acme".into(),
            email: Some("owner@acme.test".into()),
        })
        .await
        .unwrap();
    let new = NewKey {
        account: "acme".into(),
        ..NewKey::named(name)
    };
    directory
        .create_key(new)
        .await
        .unwrap()
        .0
        .expose()
        .to_owned()
}

/// The whole alert flow on two instances sharing `stores`' backend.
async fn alerts_revoke_live_keys_and_tell_their_owners(stores: [SharedStore; 2]) {
    let scanner = Scanner::new();
    let smtp = SmtpServer::start().await;
    let hook = HookReceiver::start().await;
    let config = json!({
        "retry": {"max_attempts": 1},
        "leak_scanning": {
            "public_keys": {"file": scanner.keys_path},
            "notify_webhook": {"url": hook.url, "secret": {"file": hook.secret_path}},
        },
        "email": {"smtp": smtp.url(), "from": "modelgate <keys@gateway.test>"},
    })
    .to_string();
    let addresses = instances_with(&stores, &config).await;
    let (a, b) = (addresses[0], addresses[1]);
    stores[0]
        .top_up("acme", 100 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let leaked = acme_key(&stores[0], "ci deploy").await;
    let bystander = acme_key(&stores[0], "laptop").await;
    for address in [a, b] {
        for key in [&leaked, &bystander] {
            assert_eq!(chat(address, key, &paid()).await.0, 200);
        }
    }

    // Forgeries change nothing: no key is revoked, nobody is told.
    let forged_body = json!([{"token": bystander, "type": "modelgate_api_key",
                              "url": "https://github.com/acme/app/blob/main/.env", "source": "content"}])
    .to_string();
    let other_signer = SigningKey::generate();
    let other_signature = {
        let signature: DerSignature = other_signer.sign(forged_body.as_bytes());
        STANDARD.encode(signature.as_bytes())
    };
    let good_signature = scanner.sign(forged_body.as_bytes());
    let mut changed = forged_body.clone().into_bytes();
    let last = changed.len() - 3;
    changed[last] ^= 0x01;
    let unknown_identifier = "b2".repeat(32);
    // Body, identifier, signature, status, reason.
    type Refusal<'a> = (&'a [u8], Option<&'a str>, Option<&'a str>, u16, &'a str);
    let refusals: [Refusal; 6] = [
        (forged_body.as_bytes(), None, None, 401, "unsigned_alert"),
        (
            forged_body.as_bytes(),
            Some(&scanner.identifier),
            None,
            401,
            "unsigned_alert",
        ),
        (
            forged_body.as_bytes(),
            Some(&scanner.identifier),
            Some(&other_signature),
            401,
            "bad_signature",
        ),
        (
            forged_body.as_bytes(),
            Some(&unknown_identifier),
            Some(&good_signature),
            401,
            "unknown_key_identifier",
        ),
        // A replay of a good alert with one byte changed.
        (
            &changed,
            Some(&scanner.identifier),
            Some(&good_signature),
            401,
            "bad_signature",
        ),
        (
            forged_body.as_bytes(),
            Some(&scanner.identifier),
            Some("not base64!"),
            401,
            "malformed_signature",
        ),
    ];
    for (body, identifier, signature, status, expected) in refusals {
        let (got, refused) = post_alert(a, body, identifier, signature).await;
        assert_eq!((got, reason(&refused)), (status, expected), "{refused}");
    }
    // Signed but malformed: 400 naming the problem.
    let malformed = br#"{"token": "not an array"}"#;
    let (status, refused) = post_alert(
        a,
        malformed,
        Some(&scanner.identifier),
        Some(&scanner.sign(malformed)),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("array"),
        "{refused}"
    );
    for address in [a, b] {
        assert_eq!(
            chat(address, &bystander, &paid()).await.0,
            200,
            "nothing changed"
        );
    }

    // A good alert: a live key, a well-formed key no one holds, a string
    // that only looks like a key (its checksum is wrong) and another token.
    let unknown_key = {
        let directory = KeyDirectory::new(Arc::new(MemoryStore::new()));
        directory
            .create_key(NewKey::named("elsewhere"))
            .await
            .unwrap()
            .0
            .expose()
            .to_owned()
    };
    let mut lookalike = leaked.clone();
    let last = lookalike.pop().unwrap();
    lookalike.push(if last == 'a' { 'b' } else { 'a' });
    let tokens = [
        leaked.as_str(),
        unknown_key.as_str(),
        lookalike.as_str(),
        "ghp_notours",
    ];
    let alert: Vec<Value> = tokens
        .iter()
        .map(|token| {
            json!({"token": token, "type": "modelgate_api_key",
                   "url": "https://github.com/acme/app/blob/main/.env", "source": "content"})
        })
        .collect();
    let body = serde_json::to_vec(&alert).unwrap();
    let (status, answer) = post_alert(
        a,
        &body,
        Some(&scanner.identifier),
        Some(&scanner.sign(&body)),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let labels: Vec<(&str, &str)> = answer
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["token_hash"].as_str().unwrap(),
                entry["label"].as_str().unwrap(),
            )
        })
        .collect();
    let hashes: Vec<String> = tokens.iter().map(|token| sha256_hex(token)).collect();
    assert_eq!(
        labels,
        vec![
            (hashes[0].as_str(), "true_positive"),
            (hashes[1].as_str(), "false_positive"),
            (hashes[2].as_str(), "false_positive"),
            (hashes[3].as_str(), "false_positive"),
        ]
    );
    assert!(
        !answer.to_string().contains(&leaked),
        "the key is never echoed"
    );

    // Refused at once on both instances, whose caches held it as live.
    for address in [b, a] {
        let (status, refused) = chat(address, &leaked, &paid()).await;
        assert_eq!((status, reason(&refused)), (401, "leaked_key"), "{refused}");
        let (status, refused) =
            call(reqwest::Method::GET, address, "/api/v1/key", &leaked, None).await;
        assert_eq!((status, reason(&refused)), (401, "leaked_key"), "{refused}");
        assert_eq!(chat(address, &bystander, &paid()).await.0, 200);
    }
    let admin = operator_key(&stores[0]).await;
    let hash = hash_of(b, &admin, "ci deploy").await;
    let (_, read) = call(
        reqwest::Method::GET,
        b,
        &format!("/api/v1/keys/{hash}"),
        &admin,
        None,
    )
    .await;
    assert_eq!(read["data"]["leak"]["reported_by"], "secret_scanning");
    assert_eq!(read["data"]["leak"]["source"], "content");
    assert_eq!(read["data"]["disabled"], true);

    // One e-mail to the owner: the key's name and hash prefix, where it was
    // found, what to do; never the key.
    let messages = smtp.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    assert_eq!(message.recipients, ["owner@acme.test"]);
    assert_eq!(message.from, "keys@gateway.test");
    let text = message.data.replace("=\r\n", "");
    assert!(text.contains("ci deploy"), "{text}");
    assert!(text.contains(&hash[..12]), "{text}");
    assert!(
        text.contains("https://github.com/acme/app/blob/main/.env"),
        "{text}"
    );
    assert!(text.contains("/settings"), "{text}");
    assert!(
        !text.contains(&leaked) && !text.contains("mg-v1-"),
        "{text}"
    );

    // The operator's webhook gets the same event, signed.
    let events = hook.wait_for(1).await;
    let (timestamp, signature, event) = &events[0];
    assert!(
        modelgate::notify::verify_webhook_signature(&hook.secret, *timestamp, event, signature),
        "the signature holds"
    );
    let event: Value = serde_json::from_slice(event).unwrap();
    assert_eq!(event["type"], "key.leaked");
    assert_eq!(event["data"]["key_name"], "ci deploy");
    assert_eq!(event["data"]["account"], "acme");
    assert!(!event.to_string().contains(&leaked));

    // The same alert again (GitHub retries): the same answer, no second e-mail.
    let (status, again) = post_alert(
        b,
        &body,
        Some(&scanner.identifier),
        Some(&scanner.sign(&body)),
    )
    .await;
    assert_eq!((status, &again), (200, &answer));
    // Then a leak of another key: its notices are taken after any the
    // repeat could have made, so once they are in, a second notice of the
    // first leak would be in too.
    let next = acme_key(&stores[0], "next leak").await;
    let next_alert = serde_json::to_vec(&json!([{"token": next, "type": "modelgate_api_key",
        "url": "https://github.com/acme/app/blob/main/.env", "source": "content"}]))
    .unwrap();
    let (status, _) = post_alert(
        b,
        &next_alert,
        Some(&scanner.identifier),
        Some(&scanner.sign(&next_alert)),
    )
    .await;
    assert_eq!(status, 200);
    let about = |text: &str| {
        if text.contains("next leak") {
            "next leak"
        } else if text.contains("ci deploy") {
            "ci deploy"
        } else {
            "other"
        }
    };
    let messages = smtp.wait_for(2, Duration::from_secs(10)).await;
    let told: Vec<&str> = messages
        .iter()
        .map(|message| about(&message.data.replace("=\r\n", "")))
        .collect();
    assert_eq!(told, ["ci deploy", "next leak"], "the owner is told once");
    let events = hook.wait_for(2).await;
    let events: Vec<&str> = events
        .iter()
        .map(|(_, _, event)| about(std::str::from_utf8(event).unwrap()))
        .collect();
    assert_eq!(events, ["ci deploy", "next leak"], "one event per leak");
}

/// (timestamp, signature header, body) of each event received.
type Received = Arc<std::sync::Mutex<Vec<(u64, String, Vec<u8>)>>>;

/// An operator's webhook on loopback, recording what it receives.
struct HookReceiver {
    url: String,
    secret: modelgate::secrets::Secret,
    secret_path: String,
    _secret_file: tempfile::NamedTempFile,
    received: Received,
}

impl HookReceiver {
    async fn start() -> Self {
        use axum::routing::post;
        let received = Received::default();
        let log = received.clone();
        let router = axum::Router::new().route(
            "/hooks/leaks",
            post(move |headers: http::HeaderMap, body: bytes::Bytes| {
                let log = log.clone();
                async move {
                    let header = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|value| value.to_str().ok())
                            .unwrap_or_default()
                            .to_owned()
                    };
                    let timestamp = header("x-modelgate-timestamp").parse().unwrap_or(0);
                    let signature = header("x-modelgate-signature");
                    log.lock()
                        .unwrap()
                        .push((timestamp, signature, body.to_vec()));
                    "ok"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        let text = "a-webhook-secret-of-enough-bytes";
        let secret_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(secret_file.path(), text).unwrap();
        HookReceiver {
            url: format!("http://{address}/hooks/leaks"),
            secret: modelgate::secrets::Secret::new(text.to_owned()),
            secret_path: secret_file.path().to_str().unwrap().to_owned(),
            _secret_file: secret_file,
            received,
        }
    }

    fn received(&self) -> Vec<(u64, String, Vec<u8>)> {
        self.received.lock().unwrap().clone()
    }

    async fn wait_for(&self, count: usize) -> Vec<(u64, String, Vec<u8>)> {
        wait_until(PATIENCE, format_args!("{count} events"), || async {
            self.received().len() >= count
        })
        .await;
        self.received()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_revoke_live_keys_on_memory() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    alerts_revoke_live_keys_and_tell_their_owners([store.clone(), store]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_revoke_live_keys_on_two_instances_sharing_redis() {
    let server = RedisServer::start();
    alerts_revoke_live_keys_and_tell_their_owners([
        redis_store(&server).await,
        redis_store(&server).await,
    ])
    .await;
}

/// Without `leak_scanning` the route is not served: it is an unknown path,
/// 401 without a key like any other request, 404 with one.
#[tokio::test]
async fn without_leak_scanning_the_route_is_not_served() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let key = acme_key(&store, "app").await;
    let addresses = instances(&[store]).await;
    let (status, refused) = post_alert(addresses[0], b"[]", Some("x"), Some("y")).await;
    assert_eq!(
        (status, reason(&refused)),
        (401, "missing_authorization"),
        "{refused}"
    );
    let reply = reqwest::Client::new()
        .post(format!("http://{}/api/v1/leaks", addresses[0]))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body("[]")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 404);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
}

/// An address past its failed authentications is refused before its
/// alert's body is read or its signature checked, as for keys and codes:
/// even a well-signed alert waits for the window's end.
#[tokio::test]
async fn a_blocked_address_gets_no_alert_read() {
    let scanner = Scanner::new();
    let config = json!({
        "leak_scanning": {"public_keys": {"file": scanner.keys_path}},
        "auth_failures": {"max_failures": 2, "window_seconds": 600},
    })
    .to_string();
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instances_with(&[store], &config).await[0];
    let body = b"[]";
    let signature = scanner.sign(body);
    // Signed right, from an address in good standing: read and verified
    // (then refused for listing no token, which counts no failure).
    let (status, answer) =
        post_alert(address, body, Some(&scanner.identifier), Some(&signature)).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.to_string().contains("lists no tokens"), "{answer}");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(post_alert(address, body, None, None).await.0);
    }
    assert_eq!(statuses, [401, 401, 429]);
    let (status, refused) =
        post_alert(address, body, Some(&scanner.identifier), Some(&signature)).await;
    assert_eq!(
        (status, reason(&refused)),
        (429, "auth_failures"),
        "{refused}"
    );
}
