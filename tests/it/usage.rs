//! Generation records, app attribution and activity over real HTTP: two
//! gateway instances sharing one store (MemoryStore in process, a real
//! redis-server), a real client, the built-in mock upstream.

use crate::common;
use crate::mock;

use std::net::SocketAddr;
use std::sync::Arc;

use common::gateway::{instance, instance_with_clock};
use common::redis_server::RedisServer;
use common::wait::{PATIENCE, wait_for, wait_until};
use modelgate::clock::ManualClock;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::store::{
    MemoryStore, NANOS_PER_CREDIT, RedisStore, RedisStoreConfig, Settlement, SettlementRecord,
    TimeSource,
};
use serde_json::{Value, json};

const CONFIG: &str = r#"{"retry": {"max_attempts": 1}}"#;

/// A chat request to send: key, headers, content.
type Sent<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

/// What a test sees of one answer.
struct Reply {
    status: u16,
    generation_id: Option<String>,
    body: Value,
}

async fn send(
    address: SocketAddr,
    method: reqwest::Method,
    path: &str,
    key: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Reply {
    let mut request = reqwest::Client::new()
        .request(method, format!("http://{address}{path}"))
        .header("authorization", format!("Bearer {key}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let reply = request.send().await.unwrap();
    let status = reply.status().as_u16();
    let generation_id = reply
        .headers()
        .get("x-generation-id")
        .map(|value| value.to_str().unwrap().to_owned());
    let text = reply.text().await.unwrap();
    Reply {
        status,
        generation_id,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

async fn get(address: SocketAddr, path: &str, key: &str) -> Reply {
    send(address, reqwest::Method::GET, path, key, &[], None).await
}

async fn chat(address: SocketAddr, key: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    send(
        address,
        reqwest::Method::POST,
        "/api/v1/chat/completions",
        key,
        headers,
        Some(body),
    )
    .await
}

fn paid(content: &str) -> Value {
    json!({"model": "demo/paid", "max_tokens": 5,
           "messages": [{"role": "user", "content": content}]})
}

/// Waits until `GET path` answers 200: a record appears once its request
/// is settled, just after the response ends.
async fn eventually(address: SocketAddr, path: &str, key: &str) -> Value {
    wait_for(PATIENCE, || async {
        let reply = get(address, path, key).await;
        if reply.status == 200 {
            return Ok(reply.body);
        }
        assert_eq!(reply.status, 404, "{}", reply.body);
        Err(format!("{path} never answered 200"))
    })
    .await
}

/// Waits until `check` holds for the answer of `GET path`.
async fn until(
    address: SocketAddr,
    path: &str,
    key: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    wait_for(PATIENCE, || async {
        let reply = get(address, path, key).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        if check(&reply.body) {
            Ok(reply.body)
        } else {
            Err(format!(
                "{path} never answered as expected; last: {}",
                reply.body
            ))
        }
    })
    .await
}

/// The first whole millisecond after now, once the clock has passed it:
/// a record of a request admitted before the call has a `created_at` (in
/// ms, never later than its admission) before it, one admitted after the
/// call, at or after it.
async fn millisecond_boundary() -> chrono::DateTime<chrono::Utc> {
    let now = chrono::Utc::now();
    let boundary = chrono::DateTime::from_timestamp_millis(now.timestamp_millis() + 1).unwrap();
    wait_until(PATIENCE, "the clock past the next millisecond", || async {
        chrono::Utc::now() >= boundary
    })
    .await;
    boundary
}

async fn new_key(
    store: &SharedStore,
    account: &str,
    management: bool,
    limit: Option<i64>,
) -> String {
    let new = NewKey {
        account: account.to_owned(),
        management,
        // An account's manager, or (on the default account) the operator.
        scoped_to_account: management && account != "default",
        limit_nanos: limit,
        ..NewKey::named(if management { "manager" } else { "client" })
    };
    let (key, _) = KeyDirectory::new(store.clone())
        .create_key(new)
        .await
        .unwrap();
    key.expose().to_owned()
}

async fn usage_credits(address: SocketAddr, key: &str) -> f64 {
    get(address, "/api/v1/key", key).await.body["data"]["usage"]
        .as_f64()
        .unwrap()
}

/// Each test runs on memory (both instances on one `MemoryStore`) and on
/// one real redis-server.
async fn on_every_store<F, Fut>(test: F)
where
    F: Fn(SharedStore, SharedStore) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let memory: SharedStore = Arc::new(MemoryStore::new());
    test(memory.clone(), memory).await;
    let server = RedisServer::start();
    let connect = || async {
        let store: SharedStore = Arc::new(
            RedisStore::connect(&server.url(), RedisStoreConfig::default())
                .await
                .unwrap(),
        );
        store
    };
    test(connect().await, connect().await).await;
}

#[tokio::test]
async fn every_admitted_response_names_its_record_on_every_instance() {
    on_every_store(|first, second| async move {
        let base = mock::start(mock::MockConfig::default()).await;
        let a = instance(first.clone(), &base, CONFIG).await;
        let b = instance(second.clone(), &base, CONFIG).await;
        KeyDirectory::new(first.clone())
            .top_up("acme", 100 * NANOS_PER_CREDIT)
            .await
            .unwrap();
        let client = new_key(&first, "acme", false, None).await;
        let colleague = new_key(&first, "acme", false, None).await;
        let manager = new_key(&first, "acme", true, None).await;
        let stranger = new_key(&first, "other", false, None).await;
        let operator = new_key(&first, "default", true, None).await;

        let before = usage_credits(a, &client).await;
        let reply = chat(
            a,
            &client,
            &[
                (
                    "http-referer",
                    "https://chat.example.com/app?session=secret",
                ),
                ("x-title", "Example Chat"),
            ],
            &paid("Hello there"),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let id = reply.generation_id.expect("an X-Generation-Id");
        assert!(id.starts_with("gen-") && id.len() == 36, "{id}");

        // Read on the other instance, by the key that made the request.
        let path = format!("/api/v1/generation?id={id}");
        let record = eventually(b, &path, &client).await["data"].clone();
        assert_eq!(record["id"], id);
        assert_eq!(record["model"], "demo/paid");
        assert_eq!(record["requested_model"], "demo/paid");
        assert_eq!(record["provider_name"], "demo");
        assert_eq!(record["streamed"], false);
        assert_eq!(record["is_byok"], false);
        assert_eq!(record["cancelled"], false);
        assert_eq!(record["status"], 200);
        assert_eq!(record["cost_basis"], "usage");
        assert_eq!(record["origin"], "https://chat.example.com/app");
        assert_eq!(record["app_id"], "chat.example.com/app");
        assert_eq!(record["app_title"], "Example Chat");
        assert_eq!(record["user_id"], "acme");
        let prompt = record["tokens_prompt"].as_u64().unwrap();
        let completion = record["tokens_completion"].as_u64().unwrap();
        assert!(prompt > 0 && (1..=5).contains(&completion), "{record}");
        assert!(record["latency"].as_u64().unwrap() >= record["generation_time"].as_u64().unwrap());
        assert!(record["created_at"].as_str().unwrap().ends_with('Z'));
        // The record's cost is what the key was charged: 1000 credits per
        // million tokens.
        let charged = usage_credits(b, &client).await - before;
        let total_cost = record["total_cost"].as_f64().unwrap();
        assert!(
            (total_cost - charged).abs() < 1e-12,
            "{total_cost} vs {charged}"
        );
        assert!((total_cost - (prompt + completion) as f64 * 0.001).abs() < 1e-12);

        // The account's management key reads it too; another key of the
        // account, another account's key and the operator (without naming
        // the account) get 404.
        assert_eq!(get(a, &path, &manager).await.status, 200);
        for other in [&colleague, &stranger, &operator] {
            let reply = get(b, &path, other).await;
            assert_eq!(reply.status, 404, "{}", reply.body);
        }
        let named = format!("{path}&account=acme");
        assert_eq!(get(b, &named, &operator).await.status, 200);
        assert_eq!(get(b, &named, &stranger).await.status, 403);
        // Bad ids are 400s naming the parameter.
        for bad in [
            "/api/v1/generation",
            "/api/v1/generation?id=chatcmpl-1",
            "/api/v1/generation?id=gen-XYZ",
        ] {
            let reply = get(a, bad, &client).await;
            assert_eq!(reply.status, 400, "{bad}: {}", reply.body);
            assert_eq!(reply.body["error"]["metadata"]["param"], "id");
        }

        // A stream is recorded as one, with what it streamed.
        let mut stream = paid("Stream please");
        stream["stream"] = json!(true);
        let reply = chat(a, &client, &[], &stream).await;
        assert_eq!(reply.status, 200);
        let streamed_id = reply.generation_id.unwrap();
        let streamed = eventually(b, &format!("/api/v1/generation?id={streamed_id}"), &client)
            .await["data"]
            .clone();
        assert_eq!(streamed["streamed"], true);
        assert_eq!(streamed["app_id"], Value::Null);
        assert!(streamed["tokens_completion"].as_u64().unwrap() > 0);

        // The newest first, to the account's manager; only its own to a key.
        let recent = get(b, "/api/v1/generations?limit=10", &manager).await;
        let ids: Vec<&str> = recent.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|record| record["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [streamed_id.as_str(), id.as_str()]);
        let own = get(b, "/api/v1/generations", &colleague).await;
        assert_eq!(own.body["data"], json!([]));
        // A key's own are found among the account's newest, even when
        // another key's come after them.
        let theirs = chat(a, &colleague, &[], &paid("Mine"))
            .await
            .generation_id
            .unwrap();
        eventually(b, &format!("/api/v1/generation?id={theirs}"), &colleague).await;
        let later = chat(a, &client, &[], &paid("Later"))
            .await
            .generation_id
            .unwrap();
        eventually(b, &format!("/api/v1/generation?id={later}"), &client).await;
        let own = get(b, "/api/v1/generations?limit=1", &colleague).await;
        assert_eq!(own.body["data"][0]["id"], theirs.as_str(), "{}", own.body);
        assert_eq!(own.body["data"].as_array().unwrap().len(), 1);
        assert_eq!(
            get(b, "/api/v1/generations?account=acme", &operator)
                .await
                .status,
            200
        );
        assert_eq!(get(b, "/api/v1/generations", &operator).await.status, 400);
    })
    .await;
}

#[tokio::test]
async fn refused_requests_have_no_record_and_cost_nothing() {
    on_every_store(|first, _| async move {
        let base = mock::start(mock::MockConfig::default()).await;
        let a = instance(first.clone(), &base, CONFIG).await;
        KeyDirectory::new(first.clone())
            .top_up("acme", 100 * NANOS_PER_CREDIT)
            .await
            .unwrap();
        // A key whose limit one request uses up.
        let capped = new_key(&first, "acme", false, Some(NANOS_PER_CREDIT / 100)).await;
        let manager = new_key(&first, "acme", true, None).await;
        // Malformed app headers: 400 naming the header, before anything counts.
        for (name, value) in [
            ("http-referer", "not a url"),
            ("http-referer", "javascript:alert(1)"),
            ("x-gateway-title", "   "),
            ("x-title", "tab\there"),
        ] {
            let reply = chat(a, &capped, &[(name, value)], &paid("Hi")).await;
            assert_eq!(reply.status, 400, "{name}: {value}: {}", reply.body);
            assert_eq!(reply.body["error"]["metadata"]["param"], name);
            assert_eq!(
                reply.body["error"]["metadata"]["reason"],
                "invalid_app_header"
            );
            assert_eq!(reply.generation_id, None);
        }
        assert_eq!(usage_credits(a, &capped).await, 0.0);
        // Past its cap: 402, no record.
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let reply = chat(a, &capped, &[], &paid("Hi")).await;
            assert_eq!(reply.generation_id.is_some(), reply.status == 200);
            statuses.push(reply.status);
        }
        assert!(statuses.contains(&402), "{statuses:?}");
        let admitted = statuses.iter().filter(|status| **status == 200).count();
        let records = until(a, "/api/v1/generations?limit=100", &manager, |body| {
            body["data"].as_array().unwrap().len() >= admitted
        })
        .await;
        assert_eq!(records["data"].as_array().unwrap().len(), admitted);
    })
    .await;
}

#[tokio::test]
async fn a_fallback_names_the_model_asked_and_the_model_served() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    // The first chat request fails upstream; the fallback model serves it.
    let base = mock::start(mock::MockConfig {
        fail_first: 1,
        ..mock::MockConfig::default()
    })
    .await;
    let config = r#"{"retry": {"max_attempts": 1},
                     "fallbacks": {"demo/paid": ["openai/gpt-4o-mini"]}}"#;
    let a = instance(store.clone(), &base, config).await;
    KeyDirectory::new(store.clone())
        .top_up("default", 10 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let key = new_key(&store, "default", false, None).await;
    let reply = chat(a, &key, &[], &paid("Hi")).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let id = reply.generation_id.unwrap();
    let record = eventually(a, &format!("/api/v1/generation?id={id}"), &key).await["data"].clone();
    assert_eq!(record["model"], "openai/gpt-4o-mini");
    assert_eq!(record["requested_model"], "demo/paid");
    assert_eq!(record["provider_name"], "openai");
    // The failed attempt has its own record, at no cost.
    let both = until(a, "/api/v1/generations", &key, |body| {
        body["data"].as_array().unwrap().len() == 2
    })
    .await;
    let failed = &both["data"][1];
    assert_eq!(failed["model"], "demo/paid");
    assert_eq!(failed["status"], 503);
    assert_eq!(failed["total_cost"], 0);
}

#[tokio::test]
async fn apps_are_ranked_by_tokens_per_period_on_every_instance() {
    on_every_store(|first, second| async move {
        let base = mock::start(mock::MockConfig::default()).await;
        let a = instance(first.clone(), &base, CONFIG).await;
        let b = instance(second.clone(), &base, CONFIG).await;
        for account in ["acme", "globex"] {
            KeyDirectory::new(first.clone())
                .top_up(account, 100 * NANOS_PER_CREDIT)
                .await
                .unwrap();
        }
        let acme = new_key(&first, "acme", false, None).await;
        let globex = new_key(&first, "globex", false, None).await;
        let operator = new_key(&first, "default", true, None).await;
        let big = "many words ".repeat(40);
        let sent: [Sent<'_>; 6] = [
            (
                &acme,
                &[
                    ("http-referer", "https://chat.example.com/"),
                    ("x-gateway-title", "Chat"),
                ],
                "Hi",
            ),
            (
                &acme,
                &[
                    ("http-referer", "https://chat.example.com/?x=1"),
                    ("x-title", "Chat"),
                ],
                "Hi",
            ),
            (
                &globex,
                &[("http-referer", "https://big.example.org")],
                big.as_str(),
            ),
            // Local: ranked only under its title.
            (&globex, &[("http-referer", "http://localhost:3000")], "Hi"),
            (
                &globex,
                &[
                    ("http-referer", "http://127.0.0.1:8080"),
                    ("x-title", "Local Tool"),
                ],
                "Hi",
            ),
            // No app at all.
            (&acme, &[], "Hi"),
        ];
        for (index, (key, headers, content)) in sent.iter().enumerate() {
            // Spread over both instances.
            let address = if index % 2 == 0 { a } else { b };
            let reply = chat(address, key, headers, &paid(content)).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
        // The other instance's counts arrive within its flush interval.
        // The gateway-wide ranking is the operator's.
        let ranking = until(b, "/api/v1/apps?period=day", &operator, |body| {
            let apps = body["data"]["apps"].as_array().unwrap();
            apps.len() == 3
                && apps
                    .iter()
                    .any(|app| app["id"] == "chat.example.com" && app["requests"] == 2)
        })
        .await["data"]
            .clone();
        let apps = ranking["apps"].as_array().unwrap();
        let ids: Vec<&str> = apps.iter().map(|app| app["id"].as_str().unwrap()).collect();
        assert_eq!(
            ids,
            ["big.example.org", "chat.example.com", "title:Local Tool"],
            "{ranking}"
        );
        assert_eq!(apps[0]["rank"], 1);
        assert_eq!(apps[0]["url"], "https://big.example.org/");
        assert_eq!(apps[1]["title"], "Chat");
        assert_eq!(
            apps[2]["url"],
            Value::Null,
            "a local address is never shown"
        );
        assert_eq!(apps[1]["models"][0]["model"], "demo/paid");
        assert_eq!(apps[1]["models"][0]["requests"], 2);
        let tokens = |app: &Value| app["tokens"].as_u64().unwrap();
        assert!(tokens(&apps[0]) > tokens(&apps[1]) && tokens(&apps[1]) > 0);
        for period in ["week", "month"] {
            let same = until(
                a,
                &format!("/api/v1/apps?period={period}"),
                &operator,
                |body| body["data"]["apps"].as_array().unwrap().len() == 3,
            )
            .await;
            assert_eq!(same["data"]["period"], period);
        }
        // One account's own apps; another account's are 403.
        let own = until(a, "/api/v1/apps?account=acme", &acme, |body| {
            body["data"]["apps"].as_array().unwrap().len() == 1
        })
        .await;
        assert_eq!(own["data"]["apps"][0]["id"], "chat.example.com");
        assert_eq!(
            get(a, "/api/v1/apps?account=globex", &acme).await.status,
            403
        );
        // Query values out of range are 422 `invalid_parameter`, as a body's are.
        for path in ["/api/v1/apps?period=year", "/api/v1/generations?limit=0"] {
            let refused = get(a, path, &acme).await;
            assert_eq!(refused.status, 422, "{path}");
            assert_eq!(refused.body["error"]["type"], "invalid_parameter", "{path}");
        }
    })
    .await;
}

/// A key's ranking shows its own account's apps, paths and titles
/// included; the gateway-wide one is the operator's, and with
/// `generations.public_ranking` any key's, by host only.
#[tokio::test]
async fn a_tenant_sees_its_own_apps_and_others_only_by_host_when_public() {
    on_every_store(|first, second| async move {
        let base = mock::start(mock::MockConfig::default()).await;
        let private = instance(first.clone(), &base, CONFIG).await;
        let public = instance(
            second.clone(),
            &base,
            r#"{"retry": {"max_attempts": 1}, "generations": {"public_ranking": true}}"#,
        )
        .await;
        for account in ["acme", "globex"] {
            KeyDirectory::new(first.clone())
                .top_up(account, 100 * NANOS_PER_CREDIT)
                .await
                .unwrap();
        }
        let acme = new_key(&first, "acme", false, None).await;
        let acme_manager = new_key(&first, "acme", true, None).await;
        let globex = new_key(&first, "globex", false, None).await;
        let operator = new_key(&first, "default", true, None).await;
        let apps: [(&str, &str, &str); 2] = [
            (
                &acme,
                "https://chat.example.com/acme/secret-merger",
                "Acme Merger Plan",
            ),
            (
                &globex,
                "https://tools.example.org/globex/layoffs",
                "Globex Layoffs",
            ),
        ];
        for (key, referer, title) in apps {
            let reply = chat(
                private,
                key,
                &[("http-referer", referer), ("x-title", title)],
                &paid("Hi"),
            )
            .await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
        // The operator sees every app, as it was named.
        let everything = until(private, "/api/v1/apps", &operator, |body| {
            body["data"]["apps"].as_array().unwrap().len() == 2
        })
        .await
        .to_string();
        for words in [
            "secret-merger",
            "Acme Merger Plan",
            "globex/layoffs",
            "Globex Layoffs",
        ] {
            assert!(everything.contains(words), "{words}: {everything}");
        }
        // A key of acme, and its manager, on either gateway: acme's own
        // app only, in full, whether or not it names the account.
        for (address, key) in [(private, &acme), (public, &acme), (private, &acme_manager)] {
            for path in ["/api/v1/apps", "/api/v1/apps?account=acme"] {
                let own = until(address, path, key, |body| {
                    body["data"]["apps"].as_array().unwrap().len() == 1
                })
                .await;
                let app = &own["data"]["apps"][0];
                assert_eq!(app["id"], "chat.example.com/acme/secret-merger", "{own}");
                assert_eq!(app["title"], "Acme Merger Plan");
                let text = own.to_string();
                assert!(
                    !text.contains("globex") && !text.contains("Globex"),
                    "{text}"
                );
            }
            // Another account's ranking: 403 other_account.
            let theirs = get(address, "/api/v1/apps?account=globex", key).await;
            assert_eq!(theirs.status, 403, "{}", theirs.body);
            assert_eq!(theirs.body["error"]["metadata"]["reason"], "other_account");
        }
        // The gateway-wide ranking is the operator's where it is not public.
        let refused = get(private, "/api/v1/apps?account=*", &acme).await;
        assert_eq!(refused.status, 403, "{}", refused.body);
        assert_eq!(refused.body["error"]["metadata"]["reason"], "operator_only");
        // Public: any key reads it, by host only: no path, no title.
        let hosts = until(
            public,
            "/api/v1/apps?account=*&period=week",
            &acme,
            |body| body["data"]["apps"].as_array().unwrap().len() == 2,
        )
        .await;
        let mut ids: Vec<&str> = hosts["data"]["apps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|app| app["id"].as_str().unwrap())
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, ["chat.example.com", "tools.example.org"], "{hosts}");
        for app in hosts["data"]["apps"].as_array().unwrap() {
            assert_eq!(app["title"], Value::Null, "{hosts}");
            let url = app["url"].as_str().unwrap();
            assert_eq!(url, format!("https://{}", app["id"].as_str().unwrap()));
        }
        let text = hosts.to_string();
        for hidden in ["secret-merger", "Merger", "layoffs", "Layoffs"] {
            assert!(!text.contains(hidden), "{hidden}: {text}");
        }
        // The operator still sees it whole on the public gateway.
        let whole = get(public, "/api/v1/apps?account=*", &operator).await;
        assert!(
            whole.body.to_string().contains("secret-merger"),
            "{}",
            whole.body
        );
    })
    .await;
}

#[tokio::test]
async fn generations_are_paged_filtered_and_exported_as_csv() {
    on_every_store(|first, second| async move {
        let base = mock::start(mock::MockConfig::default()).await;
        let a = instance(first.clone(), &base, CONFIG).await;
        let b = instance(second, &base, CONFIG).await;
        KeyDirectory::new(first.clone())
            .top_up("acme", 100 * NANOS_PER_CREDIT)
            .await
            .unwrap();
        let one = new_key(&first, "acme", false, None).await;
        let two = new_key(&first, "acme", false, None).await;
        let manager = new_key(&first, "acme", true, None).await;
        let hash = |key: &str| modelgate::auth::KeyHash::of(key).to_hex();
        // Seven by the first key, then five by the second on another model,
        // the last with a title a spreadsheet would run as a formula.
        for index in 0..7 {
            let reply = chat([a, b][index % 2], &one, &[], &paid("Hi")).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
        let split = millisecond_boundary().await;
        let mini = json!({"model": "openai/gpt-4o-mini", "max_tokens": 5,
                          "messages": [{"role": "user", "content": "Hi"}]});
        for index in 0..5 {
            let title: &[(&str, &str)] = if index == 4 {
                &[("x-title", "=1+1")]
            } else {
                &[]
            };
            let reply = chat([a, b][index % 2], &two, title, &mini).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
        until(a, "/api/v1/generations?limit=100", &manager, |body| {
            body["data"].as_array().unwrap().len() == 12
        })
        .await;

        // Pages of five, newest first, each naming the next.
        let mut ids = Vec::new();
        let mut offset = Some(0);
        let mut pages = 0;
        while let Some(at) = offset {
            let page = get(
                b,
                &format!("/api/v1/generations?limit=5&offset={at}"),
                &manager,
            )
            .await;
            assert_eq!(page.status, 200, "{}", page.body);
            ids.extend(
                page.body["data"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|record| record["id"].as_str().unwrap().to_owned()),
            );
            offset = page.body["next_offset"].as_u64();
            pages += 1;
        }
        assert_eq!((pages, ids.len()), (3, 12));
        let mut distinct = ids.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 12, "no record on two pages");

        // Filters, alone and together.
        let count = |body: &Value| body["data"].as_array().unwrap().len();
        let by_key = get(
            a,
            &format!("/api/v1/generations?limit=100&key={}", hash(&two)),
            &manager,
        )
        .await;
        assert_eq!(count(&by_key.body), 5);
        assert!(
            by_key.body["data"]
                .as_array()
                .unwrap()
                .iter()
                .all(|record| record["key_hash"] == hash(&two).as_str())
        );
        let by_model = get(a, "/api/v1/generations?limit=100&model=demo/paid", &manager).await;
        assert_eq!(count(&by_model.body), 7);
        let since = urlencode(&split.to_rfc3339());
        let later = get(
            a,
            &format!("/api/v1/generations?limit=100&from={since}"),
            &manager,
        )
        .await;
        assert_eq!(count(&later.body), 5);
        let earlier = get(
            a,
            &format!("/api/v1/generations?limit=100&to={since}"),
            &manager,
        )
        .await;
        assert_eq!(count(&earlier.body), 7);
        let none = get(
            a,
            &format!(
                "/api/v1/generations?limit=100&to={since}&key={}",
                hash(&two)
            ),
            &manager,
        )
        .await;
        assert_eq!(count(&none.body), 0);
        // An inference key pages through its own only.
        let own = get(a, "/api/v1/generations?limit=4&offset=4", &one).await;
        assert_eq!(count(&own.body), 3);
        assert_eq!(own.body["next_offset"], Value::Null);
        let bad = get(a, "/api/v1/generations?offset=9999&limit=5", &manager).await;
        assert_eq!(bad.status, 422);

        // The CSV: a header, a row per record, formulas defused.
        let csv = reqwest::Client::new()
            .get(format!(
                "http://{a}/api/v1/generations?limit=100&format=csv"
            ))
            .bearer_auth(&manager)
            .send()
            .await
            .unwrap();
        assert_eq!(csv.status(), 200);
        assert_eq!(csv.headers()["content-type"], "text/csv; charset=utf-8");
        assert!(
            csv.headers()["content-disposition"]
                .to_str()
                .unwrap()
                .contains("generations.csv")
        );
        let text = csv.text().await.unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 13, "{text}");
        assert!(
            lines[0].starts_with("id,created_at,api,model,requested_model,provider_name,key_hash,")
        );
        assert!(lines[1].starts_with(&ids[0]), "newest first: {}", lines[1]);
        assert_eq!(lines[1].split(',').nth(2), Some("chat"), "{}", lines[1]);
        // The app title defused, then an empty cost_note (a plain cost).
        assert!(lines[1].ends_with(",'=1+1,"), "{}", lines[1]);
    })
    .await;
}

#[tokio::test]
async fn a_keys_records_are_read_by_index_behind_any_number_of_another_keys() {
    on_every_store(|first, second| async move {
        let base = mock::start(mock::MockConfig::default()).await;
        let a = instance(first.clone(), &base, CONFIG).await;
        let b = instance(second, &base, CONFIG).await;
        KeyDirectory::new(first.clone())
            .top_up("acme", 100 * NANOS_PER_CREDIT)
            .await
            .unwrap();
        let quiet = new_key(&first, "acme", false, None).await;
        let busy = new_key(&first, "acme", false, None).await;
        let manager = new_key(&first, "acme", true, None).await;
        let hash = |key: &str| modelgate::auth::KeyHash::of(key).to_hex();
        for address in [a, b] {
            let reply = chat(address, &quiet, &[], &paid("Hi")).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
        until(a, "/api/v1/generations?limit=100", &quiet, |body| {
            body["data"].as_array().unwrap().len() == 2
        })
        .await;
        // Then more records of another key than any scan of the newest
        // would pass (written to the store as settlements write them).
        let busy_hash = hash(&busy);
        let now = chrono::Utc::now();
        for chunk in 0..11 {
            let settlements: Vec<Settlement> = (0..1_000)
                .map(|n| {
                    let id = format!("{:032x}", chunk * 1_000 + n);
                    Settlement {
                        account: "acme".into(),
                        key: busy_hash.clone(),
                        reservation_id: id.clone(),
                        hold_granted: false,
                        cost_nanos: 1,
                        byok: false,
                        record: Some(SettlementRecord {
                            bytes: json!({"id": format!("gen-{id}"), "user_id": "acme",
                                          "key_hash": busy_hash, "model": "openai/gpt-4o"})
                            .to_string()
                            .into(),
                            retention: std::time::Duration::from_secs(3600),
                            max_per_account: 100_000,
                        }),
                    }
                })
                .collect();
            first.settle_many(&settlements, now).await.unwrap();
        }
        // The quiet key's own, from either instance; and by a manager
        // naming it; the busy key's newest page behind it.
        for (address, key, path) in [
            (a, &quiet, "/api/v1/generations?limit=100".to_owned()),
            (
                b,
                &quiet,
                "/api/v1/generations?limit=100&offset=0".to_owned(),
            ),
            (
                b,
                &manager,
                format!("/api/v1/generations?limit=100&key={}", hash(&quiet)),
            ),
        ] {
            let page = get(address, &path, key).await;
            assert_eq!(page.status, 200, "{}", page.body);
            let records = page.body["data"].as_array().unwrap();
            assert_eq!(records.len(), 2, "{path}: {}", page.body);
            assert!(
                records
                    .iter()
                    .all(|record| record["key_hash"] == hash(&quiet))
            );
            assert_eq!(page.body["next_offset"], Value::Null);
        }
        // A normal key naming another key's records gets none of them,
        // nor its own.
        let path = format!("/api/v1/generations?limit=100&key={}", hash(&quiet));
        let page = get(a, &path, &busy).await;
        assert_eq!(page.status, 200, "{}", page.body);
        assert_eq!(page.body["data"], json!([]), "{}", page.body);
        let page = get(a, "/api/v1/generations?limit=100&offset=10900", &busy).await;
        assert_eq!(
            page.status, 422,
            "offsets stay within the newest 10,000: {}",
            page.body
        );
        let page = get(a, "/api/v1/generations?limit=3&offset=2", &busy).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let ids: Vec<&str> = page.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|record| record["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), 3);
        assert_eq!(page.body["next_offset"], 5);
    })
    .await;
}

fn urlencode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Credits of a JSON number as nano-credits (records and activity write
/// at most nine decimals).
fn nanos(value: &Value) -> i64 {
    (value.as_f64().unwrap() * NANOS_PER_CREDIT as f64).round() as i64
}

/// Per (UTC day, model): requests, prompt and completion tokens, usage
/// and BYOK usage in nanos.
type Figures = std::collections::BTreeMap<(String, String), (u64, u64, u64, i64, i64)>;

/// The activity rows as [`Figures`], checking they come by day, then model.
fn activity_figures(rows: &Value) -> Figures {
    let rows = rows["data"].as_array().unwrap();
    let keys: Vec<(String, String)> = rows
        .iter()
        .map(|row| {
            (
                row["date"].as_str().unwrap().to_owned(),
                row["model"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        keys.windows(2).all(|pair| pair[0] < pair[1]),
        "ordered: {keys:?}"
    );
    rows.iter()
        .zip(keys)
        .map(|(row, key)| {
            let figures = (
                row["requests"].as_u64().unwrap(),
                row["prompt_tokens"].as_u64().unwrap(),
                row["completion_tokens"].as_u64().unwrap(),
                nanos(&row["usage"]),
                nanos(&row["byok_usage_inference"]),
            );
            (key, figures)
        })
        .collect()
}

/// The same sums worked out here from the generation records.
fn record_figures(records: &[Value]) -> Figures {
    let mut figures = Figures::new();
    for record in records {
        let day = record["created_at"].as_str().unwrap()[..10].to_owned();
        let model = record["model"].as_str().unwrap().to_owned();
        let entry = figures.entry((day, model)).or_default();
        entry.0 += 1;
        entry.1 += record["tokens_prompt"].as_u64().unwrap();
        entry.2 += record["tokens_completion"].as_u64().unwrap();
        if record["is_byok"] == true {
            entry.4 += nanos(&record["total_cost"]);
        } else {
            entry.3 += nanos(&record["total_cost"]);
        }
    }
    figures
}

/// `GET /api/v1/activity` on memory and on Redis: requests over three UTC
/// days (the clock moved a day at a time), on two paid models and one
/// through the account's own provider key, sum per day and model to
/// exactly what the generation records say; `date` keeps one day. Only
/// management keys read it: an inference key is refused, the operator
/// names the account, another account's manager is refused it.
#[tokio::test]
async fn activity_is_the_sum_of_the_generation_records_per_day_and_model() {
    let server = RedisServer::start();
    // The gateway's clock decides every time, on Redis too: the records'
    // days are the ones the test sets.
    let redis: SharedStore = Arc::new(
        RedisStore::connect(
            &server.url(),
            RedisStoreConfig {
                time_source: TimeSource::Caller,
                ..RedisStoreConfig::default()
            },
        )
        .await
        .unwrap(),
    );
    let memory: SharedStore = Arc::new(MemoryStore::new());
    // MODELGATE_TEST_USAGE_OWN_KEY is set for the tests in .cargo/config.toml.
    for (name, store) in [("memory", memory), ("redis", redis)] {
        let base = mock::start(mock::MockConfig::default()).await;
        let price = json!({"prompt_per_million": 1000, "completion_per_million": 3000});
        let config = json!({
            "retry": {"max_attempts": 1},
            // A provider takes an account's own key in place of its own.
            "providers": {"demo": {"base_url": base},
                          "own": {"base_url": base, "byok": true,
                                  "api_key": {"env": "MODELGATE_TEST_USAGE_OWN_KEY"}}},
            "pricing": {"models": {"demo/paid": price, "demo/other": price, "own/model": price}},
        })
        .to_string();
        let today = chrono::Utc::now().date_naive();
        let noon = |days_ago: i64| {
            (today - chrono::Duration::days(days_ago))
                .and_hms_opt(12, 0, 0)
                .unwrap()
                .and_utc()
        };
        let clock = ManualClock::new(noon(2));
        let gateway =
            instance_with_clock(store.clone(), &base, &config, Arc::new(clock.clone())).await;
        KeyDirectory::new(store.clone())
            .top_up("acme", 100 * NANOS_PER_CREDIT)
            .await
            .unwrap();
        let one = new_key(&store, "acme", false, None).await;
        let two = new_key(&store, "acme", false, None).await;
        let manager = new_key(&store, "acme", true, None).await;
        let other_manager = new_key(&store, "globex", true, None).await;
        let operator = new_key(&store, "default", true, None).await;
        let set = send(
            gateway,
            reqwest::Method::PUT,
            "/api/v1/accounts/acme/byok/own",
            &manager,
            &[],
            Some(&json!({"key": "sk-acme-own-0123456789"})),
        )
        .await;
        assert_eq!(set.status, 200, "{name}: {}", set.body);
        let ask = |model: &str, words: &str| json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": words}]});
        // Two days ago, yesterday, today: (key, model, prompt) each.
        let days: [&[(&str, &str, &str)]; 3] = [
            &[
                (&one, "demo/paid", "Hi"),
                (&one, "demo/paid", "Hello there"),
                (&two, "demo/other", "Hey"),
            ],
            &[
                (&one, "demo/paid", "Good morning to you"),
                (&two, "own/model", "Hi"),
            ],
            &[
                (&two, "demo/other", "Hi"),
                (
                    &one,
                    "demo/other",
                    "A longer question, with more tokens in it",
                ),
                (&one, "own/model", "Hello"),
                (&two, "demo/paid", "Hi"),
            ],
        ];
        let mut sent = 0;
        for (at, requests) in days.iter().enumerate() {
            clock.set(noon(2 - at as i64));
            for (key, model, words) in requests.iter() {
                let reply = chat(gateway, key, &[], &ask(model, words)).await;
                assert_eq!(reply.status, 200, "{name} {model}: {}", reply.body);
                sent += 1;
            }
            // Settled before the clock moves on: a record takes its day
            // from its admission, but its settlement reads the clock too.
            until(gateway, "/api/v1/generations?limit=100", &manager, |body| {
                body["data"].as_array().unwrap().len() == sent
            })
            .await;
        }
        let records = get(gateway, "/api/v1/generations?limit=100", &manager)
            .await
            .body;
        let records = records["data"].as_array().unwrap();
        assert_eq!(records.len(), 9, "{name}");
        assert_eq!(
            records
                .iter()
                .filter(|record| record["is_byok"] == true)
                .count(),
            2,
            "{name}: the account's own key went upstream for own/model"
        );

        let activity = get(gateway, "/api/v1/activity", &manager).await;
        assert_eq!(activity.status, 200, "{name}: {}", activity.body);
        let figures = activity_figures(&activity.body);
        assert_eq!(
            figures,
            record_figures(records),
            "{name}: {}",
            activity.body
        );
        // Not a sum of nothing: three days, seven (day, model) rows, BYOK
        // spend apart from the balance's, tokens counted.
        let dates: std::collections::BTreeSet<&str> =
            figures.keys().map(|(date, _)| date.as_str()).collect();
        assert_eq!(dates.len(), 3, "{name}: {dates:?}");
        assert_eq!(figures.len(), 7, "{name}: {figures:?}");
        let yesterday = (today - chrono::Duration::days(1)).to_string();
        let byok = figures[&(yesterday.clone(), "own/model".to_owned())];
        assert!(byok.3 == 0 && byok.4 > 0 && byok.2 > 0, "{name}: {byok:?}");
        let paid = figures[&(noon(2).date_naive().to_string(), "demo/paid".to_owned())];
        assert!(paid.0 == 2 && paid.3 > 0 && paid.4 == 0, "{name}: {paid:?}");
        let balance_spent: i64 = figures.values().map(|figures| figures.3).sum();
        assert!(balance_spent > 0, "{name}");

        // One day only; the operator names the account and sees the same.
        let one_day = get(
            gateway,
            &format!("/api/v1/activity?date={yesterday}"),
            &manager,
        )
        .await;
        assert_eq!(one_day.status, 200, "{name}: {}", one_day.body);
        let expected: Figures = figures
            .iter()
            .filter(|((date, _), _)| *date == yesterday)
            .map(|(key, value)| (key.clone(), *value))
            .collect();
        assert_eq!(activity_figures(&one_day.body), expected, "{name}");
        let by_operator = get(gateway, "/api/v1/activity?account=acme", &operator).await;
        assert_eq!(by_operator.body, activity.body, "{name}");

        // Refusals, each saying why.
        let refusal = |reply: &Reply, status: u16, field: &str, value: &str| {
            assert_eq!(reply.status, status, "{name}: {}", reply.body);
            assert_eq!(
                reply.body["error"]["metadata"][field], value,
                "{name}: {}",
                reply.body
            );
        };
        let inference = get(gateway, "/api/v1/activity", &one).await;
        refusal(&inference, 403, "reason", "management_key_required");
        let unnamed = get(gateway, "/api/v1/activity", &operator).await;
        refusal(&unnamed, 400, "param", "account");
        let elsewhere = get(gateway, "/api/v1/activity?account=acme", &other_manager).await;
        refusal(&elsewhere, 403, "reason", "other_account");
        let gateway_wide = get(gateway, "/api/v1/activity?account=*", &operator).await;
        refusal(&gateway_wide, 422, "param", "account");
        for date in [
            "2026-1-05",
            "yesterday",
            &(today + chrono::Duration::days(1)).to_string(),
        ] {
            let bad = get(gateway, &format!("/api/v1/activity?date={date}"), &manager).await;
            refusal(&bad, 422, "param", "date");
        }
        let twice = get(
            gateway,
            &format!("/api/v1/activity?date={yesterday}&date={yesterday}"),
            &manager,
        )
        .await;
        refusal(&twice, 400, "param", "date");
        // Another account's manager reads its own: nothing yet.
        let own = get(gateway, "/api/v1/activity", &other_manager).await;
        assert_eq!(own.status, 200, "{name}: {}", own.body);
        assert_eq!(own.body["data"], json!([]), "{name}");
    }
}
