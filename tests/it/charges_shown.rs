//! Every charge shows where charges are shown, and the small edges of what
//! a client reads, over real HTTP against a gateway in process (memory
//! store, the test's clock, the built-in mock upstream):
//!
//! - a lapsed hold's charge counts in `GET /api/v1/activity` (under the
//!   model `unknown`, marked as a charged hold), in the generations and in
//!   their CSV (with the reason in words);
//! - the CSV writes credits as plain decimals, never `4e-6`;
//! - a 429's `X-RateLimit-Reset` is its `Retry-After`, and every response
//!   of a rate rule names the rule in `X-RateLimit-Policy`;
//! - a request to a path nobody serves (a 404) spends no rate;
//! - the mock upstream answers `n` choices, calls a tool when asked, and
//!   gives each answer its own id.

use crate::common;
use crate::mock;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chrono::TimeZone;
use common::gateway::instance_with_clock;
use common::wait::{PATIENCE, wait_for};
use modelgate::clock::{Clock, ManualClock};
use modelgate::credit::MessagesUsage;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::store::{MemoryStore, NANOS_PER_CREDIT, RecordKeeping, ReserveRequest};
use serde_json::{Value, json};

fn noon() -> ManualClock {
    ManualClock::new(
        chrono::Utc
            .with_ymd_and_hms(2026, 11, 29, 12, 0, 0)
            .unwrap(),
    )
}

/// A key of `account` (a management key when `management`): its plaintext
/// and its hash.
async fn key(store: &SharedStore, account: &str, management: bool) -> (String, String) {
    let new = NewKey {
        account: account.to_owned(),
        management,
        scoped_to_account: management,
        ..NewKey::named(if management { "manager" } else { "client" })
    };
    let (key, record) = KeyDirectory::new(store.clone())
        .create_key(new)
        .await
        .unwrap();
    (key.expose().to_owned(), record.hash.to_hex())
}

async fn send(
    address: SocketAddr,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Option<&Value>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .request(method, format!("http://{address}{path}"))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(body);
    }
    request.send().await.unwrap()
}

async fn get_json(address: SocketAddr, path: &str, key: &str) -> Value {
    let reply = send(address, reqwest::Method::GET, path, key, None).await;
    assert_eq!(reply.status(), 200, "{path}");
    reply.json().await.unwrap()
}

fn ask(model: &str) -> Value {
    json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
}

/// Three requests cut by a crash (their holds renewed no more) lapse and
/// are charged in full: the activity counts them, marked, and the
/// generations and their CSV say why in words. Before, the activity
/// answered `{"data": []}` (the lapse's record names no model).
#[tokio::test]
async fn lapsed_holds_count_in_activity_and_the_csv_says_why() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let clock = noon();
    let base = mock::start(mock::MockConfig::default()).await;
    let gateway = instance_with_clock(
        store.clone(),
        &base,
        r#"{"retry": {"max_attempts": 1}}"#,
        Arc::new(clock.clone()),
    )
    .await;
    KeyDirectory::new(store.clone())
        .top_up("acme", 10 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let (_, client_hash) = key(&store, "acme", false).await;
    let (manager, _) = key(&store, "acme", true).await;
    let held = 134_000_000; // 0.134 credits each
    for id in 0..3u128 {
        let hold = ReserveRequest {
            account: "acme".to_owned(),
            key: client_hash.clone(),
            reservation_id: format!("{:032x}", 0xabc0 + id),
            amount_nanos: held,
            min_amount_nanos: None,
            key_limit: None,
            counts_against_key_limit: true,
            check_balance: true,
            covered_by_balance: true,
            ttl: Duration::from_secs(3),
            lapse_record: Some(RecordKeeping {
                retention: Duration::from_secs(30 * 86_400),
                max_per_account: 1000,
                model: Some("openai/gpt-4o".to_owned()),
            }),
        };
        store.reserve(&hold, clock.now()).await.unwrap();
    }
    // Its instance died: nothing renews the holds. Past their lifetime the
    // next ledger call charges them.
    clock.advance(Duration::from_secs(10));
    let usage = store
        .key_usage("acme", &client_hash, clock.now())
        .await
        .unwrap();
    assert_eq!(usage.total_nanos, 3 * held, "{usage:?}");

    let activity = get_json(gateway, "/api/v1/activity", &manager).await;
    let rows = activity["data"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{activity}");
    let row = &rows[0];
    assert_eq!(row["date"], "2026-11-29");
    assert_eq!(
        row["model"], "openai/gpt-4o",
        "a lapse counts under the model it asked for"
    );
    assert_eq!(row["requests"], 3);
    assert_eq!(row["usage"], json!(0.402));
    assert_eq!(row["hold_charged_requests"], 3);
    assert_eq!(row["hold_charged_usage"], json!(0.402));

    let generations = get_json(gateway, "/api/v1/generations?limit=10", &manager).await;
    let records = generations["data"].as_array().unwrap();
    assert_eq!(records.len(), 3, "{generations}");
    assert!(
        records
            .iter()
            .all(|record| record["cost_basis"] == "lapsed")
    );

    let csv = send(
        gateway,
        reqwest::Method::GET,
        "/api/v1/generations?limit=10&format=csv",
        &manager,
        None,
    )
    .await
    .text()
    .await
    .unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let headers = reader.headers().unwrap().clone();
    let column = |name: &str| headers.iter().position(|header| header == name).unwrap();
    let (cost, note) = (column("total_cost"), column("cost_note"));
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 3, "{csv}");
    for row in &rows {
        assert_eq!(&row[cost], "0.134", "{csv}");
        assert!(row[note].contains("charged its whole hold"), "{csv}");
        assert!(row[note].contains("lapsed"), "{csv}");
    }
}

/// A request costing a few millionths of a credit is `0.000004` in the CSV,
/// as in the JSON's meaning, never `4e-6`.
#[tokio::test]
async fn the_csv_gives_credits_as_plain_decimals() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let clock = noon();
    let base = mock::start(mock::MockConfig::default()).await;
    let config = json!({
        "retry": {"max_attempts": 1},
        "pricing": {"models": {"demo/cheap": {"prompt_per_million": 1, "completion_per_million": 1}}},
    })
    .to_string();
    let gateway = instance_with_clock(store.clone(), &base, &config, Arc::new(clock)).await;
    KeyDirectory::new(store.clone())
        .top_up("acme", NANOS_PER_CREDIT)
        .await
        .unwrap();
    let (client, _) = key(&store, "acme", false).await;
    let (manager, _) = key(&store, "acme", true).await;
    let reply = send(
        gateway,
        reqwest::Method::POST,
        "/api/v1/chat/completions",
        &client,
        Some(&ask("demo/cheap")),
    )
    .await;
    assert_eq!(reply.status(), 200);
    reply.bytes().await.unwrap();
    let record = wait_for(PATIENCE, || async {
        let page = get_json(gateway, "/api/v1/generations", &manager).await;
        match page["data"].as_array().unwrap().first() {
            Some(record) => Ok(record.clone()),
            None => Err(format!("never recorded: {page}")),
        }
    })
    .await;
    let cost = record["total_cost"].as_f64().unwrap();
    assert!(
        cost > 0.0 && cost < 1e-5,
        "a cost serde writes with an exponent: {record}"
    );
    let csv = send(
        gateway,
        reqwest::Method::GET,
        "/api/v1/generations?format=csv",
        &manager,
        None,
    )
    .await
    .text()
    .await
    .unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let cost_at = reader
        .headers()
        .unwrap()
        .iter()
        .position(|header| header == "total_cost")
        .unwrap();
    let row = reader.records().next().unwrap().unwrap();
    let written = &row[cost_at];
    assert!(
        written.starts_with("0.00000") && !written.contains('e'),
        "{written} in {csv}"
    );
    let parsed: f64 = written.parse().unwrap();
    assert!((parsed - cost).abs() < 1e-12, "{written} for {cost}");
    assert_eq!(row.get(row.len() - 1), Some(""), "no note for a plain cost");
}

/// A rule of 6 requests per 60 s in bursts of 2: the third request at once
/// is refused for 10 s (a request's worth of rate), and its
/// `X-RateLimit-Reset` says the same as its `Retry-After` (before: 20, the
/// time until the burst is whole again). Each answer names the rule.
#[tokio::test]
async fn a_429s_headers_agree_with_each_other_and_the_rule() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let clock = noon();
    let base = mock::start(mock::MockConfig::default()).await;
    let config = json!({
        "retry": {"max_attempts": 1},
        "rate_limits": {"account": {"gcra": {"requests": 6, "period_seconds": 60, "burst": 2}}},
    })
    .to_string();
    let gateway = instance_with_clock(store.clone(), &base, &config, Arc::new(clock)).await;
    KeyDirectory::new(store.clone())
        .top_up("acme", NANOS_PER_CREDIT)
        .await
        .unwrap();
    let (client, _) = key(&store, "acme", false).await;
    let header = |reply: &reqwest::Response, name: &str| {
        reply
            .headers()
            .get(name)
            .map(|value| value.to_str().unwrap().to_owned())
    };
    for remaining in ["1", "0"] {
        let reply = send(
            gateway,
            reqwest::Method::POST,
            "/api/v1/chat/completions",
            &client,
            Some(&ask("demo/paid")),
        )
        .await;
        assert_eq!(reply.status(), 200);
        assert_eq!(header(&reply, "x-ratelimit-limit").as_deref(), Some("2"));
        assert_eq!(
            header(&reply, "x-ratelimit-remaining").as_deref(),
            Some(remaining)
        );
        assert_eq!(
            header(&reply, "x-ratelimit-policy").as_deref(),
            Some("6;w=60;burst=2")
        );
    }
    let refused = send(
        gateway,
        reqwest::Method::POST,
        "/api/v1/chat/completions",
        &client,
        Some(&ask("demo/paid")),
    )
    .await;
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("10"));
    assert_eq!(header(&refused, "x-ratelimit-reset").as_deref(), Some("10"));
    assert_eq!(
        header(&refused, "x-ratelimit-remaining").as_deref(),
        Some("0")
    );
    assert_eq!(
        header(&refused, "x-ratelimit-policy").as_deref(),
        Some("6;w=60;burst=2")
    );
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["metadata"]["limit_source"], "account_rate");
}

/// Requests to paths the gateway does not serve are 404s and spend none
/// of the account's rate: after ten of them the account's 3 a minute are
/// all there (before, the 404s had spent them and the chats were 429s).
#[tokio::test]
async fn a_404_spends_no_rate() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let clock = noon();
    let base = mock::start(mock::MockConfig::default()).await;
    let config = json!({
        "retry": {"max_attempts": 1},
        "rate_limits": {"account": {"rolling": {"requests": 3, "window_seconds": 60}}},
    })
    .to_string();
    let gateway = instance_with_clock(store.clone(), &base, &config, Arc::new(clock)).await;
    KeyDirectory::new(store.clone())
        .top_up("acme", NANOS_PER_CREDIT)
        .await
        .unwrap();
    let (client, _) = key(&store, "acme", false).await;
    for (method, path) in [
        (reqwest::Method::POST, "/api/v1/images/generations"),
        (reqwest::Method::GET, "/api/v1/no-such-route"),
        (reqwest::Method::POST, "/v1/chat/completions"),
        (reqwest::Method::GET, "/api/v1/chat/completions"),
        (reqwest::Method::POST, "/api/v1/completions"),
    ] {
        for _ in 0..2 {
            let reply = send(
                gateway,
                method.clone(),
                path,
                &client,
                Some(&ask("demo/paid")),
            )
            .await;
            assert_eq!(reply.status(), 404, "{method} {path}");
            assert!(reply.headers().get("x-ratelimit-remaining").is_none());
        }
    }
    for remaining in ["2", "1", "0"] {
        let reply = send(
            gateway,
            reqwest::Method::POST,
            "/api/v1/chat/completions",
            &client,
            Some(&ask("demo/paid")),
        )
        .await;
        assert_eq!(reply.status(), 200, "{:?}", reply.text().await);
        assert_eq!(reply.headers()["x-ratelimit-remaining"], remaining);
    }
    let refused = send(
        gateway,
        reqwest::Method::POST,
        "/api/v1/chat/completions",
        &client,
        Some(&ask("demo/paid")),
    )
    .await;
    assert_eq!(refused.status(), 429, "the rule still holds");
}

/// The mock answers `n` choices (usage for all of them), a tool call when
/// `tools` is given and `tool_choice` allows one (streamed too), and a new
/// id each time.
#[tokio::test]
async fn the_mock_honours_n_and_tools_with_an_id_per_answer() {
    let base = mock::start(mock::MockConfig::default()).await;
    let post = |body: Value| {
        let url = format!("{base}/chat/completions");
        async move {
            let reply = reqwest::Client::new()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap();
            (reply.status().as_u16(), reply.text().await.unwrap())
        }
    };
    let parse = |text: &str| serde_json::from_str::<Value>(text).unwrap();
    let one = parse(&post(ask("a/b")).await.1);
    let three = {
        let mut body = ask("a/b");
        body["n"] = json!(3);
        parse(&post(body).await.1)
    };
    assert_eq!(one["choices"].as_array().unwrap().len(), 1);
    let choices = three["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{three}");
    for (index, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], index);
        assert_eq!(
            choice["message"]["content"],
            one["choices"][0]["message"]["content"]
        );
    }
    assert_eq!(
        three["usage"]["completion_tokens"].as_u64().unwrap(),
        3 * one["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let again = parse(&post(ask("a/b")).await.1);
    assert_ne!(one["id"], again["id"], "an id per answer");
    assert_ne!(one["id"], three["id"]);
    let mut zero = ask("a/b");
    zero["n"] = json!(0);
    assert_eq!(post(zero).await.0, 400);

    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
    ]);
    for (choice, called) in [
        (Value::Null, Some("get_weather")),
        (json!("auto"), Some("get_weather")),
        (json!("required"), Some("get_weather")),
        (
            json!({"type": "function", "function": {"name": "get_time"}}),
            Some("get_time"),
        ),
        (json!("none"), None),
    ] {
        let mut body = ask("a/b");
        body["tools"] = tools.clone();
        if !choice.is_null() {
            body["tool_choice"] = choice.clone();
        }
        let answer = parse(&post(body.clone()).await.1);
        let first = &answer["choices"][0];
        match called {
            Some(name) => {
                assert_eq!(first["finish_reason"], "tool_calls", "{choice}: {answer}");
                let call = &first["message"]["tool_calls"][0];
                assert_eq!(call["function"]["name"], name, "{choice}");
                assert_eq!(call["type"], "function");
                assert!(call["id"].as_str().unwrap().starts_with("call_"));
                assert!(first["message"]["content"].is_null());
            }
            None => {
                assert_eq!(first["finish_reason"], "stop", "{choice}: {answer}");
                assert!(first["message"]["tool_calls"].is_null());
            }
        }
        if called.is_some() {
            body["stream"] = json!(true);
            let streamed = post(body).await.1;
            assert!(streamed.contains("\"tool_calls\""), "{streamed}");
            assert!(
                streamed.contains("\"finish_reason\":\"tool_calls\""),
                "{streamed}"
            );
            assert!(streamed.ends_with("data: [DONE]\n\n"));
        }
    }
}

/// Waits until acme's balance is `expected` below `before`, its request settled.
async fn spent_exactly(store: &SharedStore, before: i64, expected: i64) {
    wait_for(PATIENCE, || async {
        let spent = before - store.account_balance("acme").await.unwrap().balance_nanos;
        (spent == expected)
            .then_some(())
            .ok_or(format!("spent {spent}, expected {expected}"))
    })
    .await;
}

/// A model that reads from and writes to its cache and reasons is charged
/// each kind of token at its own rate, streamed or not: the charge is
/// worked out here by hand from the usage the client read.
#[tokio::test]
async fn cached_and_reasoning_tokens_are_charged_at_their_own_rates() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let clock = noon();
    let base = mock::start(mock::MockConfig::default()).await;
    // Credits per million: prompt 2, completion 8, cache reads 0.5, writes
    // 3, reasoning 20; 0.001 a request.
    let config = json!({"retry": {"max_attempts": 1},
        "pricing": {"models": {"openai/cached-reasoner": {
            "prompt_per_million": 2, "completion_per_million": 8,
            "input_cache_read_per_million": 0.5, "input_cache_write_per_million": 3,
            "internal_reasoning_per_million": 20, "request": 0.001}}}});
    let gateway = instance_with_clock(
        store.clone(),
        &base,
        &config.to_string(),
        Arc::new(clock.clone()),
    )
    .await;
    let directory = KeyDirectory::new(store.clone());
    directory
        .top_up("acme", 10 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let (client, _) = key(&store, "acme", false).await;
    let prompt = "Tell me everything about caches and how they are priced, at length.";
    let body = |stream: bool| {
        json!({"model": "openai/cached-reasoner", "max_tokens": 12, "stream": stream,
               "stream_options": {"include_usage": true},
               "messages": [{"role": "user", "content": prompt}]})
    };
    // Nano-credits for a usage: a thousand per token per credit-per-million.
    let by_hand = |usage: &Value| {
        let count = |value: &Value| value.as_i64().unwrap_or(0);
        let prompt = count(&usage["prompt_tokens"]);
        let completion = count(&usage["completion_tokens"]);
        let read = count(&usage["prompt_tokens_details"]["cached_tokens"]);
        let written = count(&usage["prompt_tokens_details"]["cache_write_tokens"]);
        let reasoning = count(&usage["completion_tokens_details"]["reasoning_tokens"]);
        assert!(read > 0 && written > 0 && reasoning > 0, "{usage}");
        let millionths = (prompt - read - written) * 2_000_000_000
            + read * 500_000_000
            + written * 3_000_000_000
            + (completion - reasoning) * 8_000_000_000
            + reasoning * 20_000_000_000;
        (millionths + 999_999) / 1_000_000 + 1_000_000
    };
    let balance = || async { store.account_balance("acme").await.unwrap().balance_nanos };
    let before = balance().await;
    let reply = send(
        gateway,
        reqwest::Method::POST,
        "/api/v1/chat/completions",
        &client,
        Some(&body(false)),
    )
    .await;
    assert_eq!(reply.status(), 200);
    let answer: Value = reply.json().await.unwrap();
    let expected = by_hand(&answer["usage"]);
    spent_exactly(&store, before, expected).await;

    let before = balance().await;
    let reply = send(
        gateway,
        reqwest::Method::POST,
        "/api/v1/chat/completions",
        &client,
        Some(&body(true)),
    )
    .await;
    assert_eq!(reply.status(), 200);
    let text = reply.text().await.unwrap();
    let usage = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find(|chunk| chunk["usage"].is_object())
        .map(|chunk| chunk["usage"].clone())
        .expect("the stream's usage chunk");
    let expected = by_hand(&usage);
    spent_exactly(&store, before, expected).await;
    // The record says what the usage held.
    let (manager, _) = key(&store, "acme", true).await;
    let records = get_json(gateway, "/api/v1/generations?limit=1", &manager).await;
    let record = &records["data"][0];
    let details = [
        (
            "native_tokens_cached",
            &usage["prompt_tokens_details"]["cached_tokens"],
        ),
        (
            "native_tokens_cache_write",
            &usage["prompt_tokens_details"]["cache_write_tokens"],
        ),
        (
            "native_tokens_reasoning",
            &usage["completion_tokens_details"]["reasoning_tokens"],
        ),
    ];
    for (field, reported) in details {
        assert_eq!(&record[field], reported, "{field} in {record}");
    }
    assert_eq!(record["web_search_requests"], 0, "{record}");
    // The activity sums them by day and model; the CSV has their columns.
    let activity = get_json(gateway, "/api/v1/activity", &manager).await;
    let row = &activity["data"][0];
    let detail = |usage: &Value, group: &str, field: &str| usage[group][field].as_u64().unwrap();
    assert_eq!(
        row["cached_tokens"],
        detail(&answer["usage"], "prompt_tokens_details", "cached_tokens")
            + detail(&usage, "prompt_tokens_details", "cached_tokens"),
        "{activity}"
    );
    assert_eq!(
        row["reasoning_tokens"],
        detail(
            &answer["usage"],
            "completion_tokens_details",
            "reasoning_tokens"
        ) + detail(&usage, "completion_tokens_details", "reasoning_tokens"),
    );
    let csv = send(
        gateway,
        reqwest::Method::GET,
        "/api/v1/generations?format=csv",
        &manager,
        None,
    )
    .await
    .text()
    .await
    .unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let column = header
        .iter()
        .position(|name| *name == "native_tokens_reasoning")
        .unwrap();
    let newest: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(
        newest[column],
        detail(&usage, "completion_tokens_details", "reasoning_tokens").to_string(),
        "{csv}"
    );
}

/// The mock's Messages API answers as Anthropic does: `anthropic-version`
/// and `max_tokens` required, a tool call then text once its result is
/// sent, cache reads and writes for a request with `cache_control`, and
/// the same usage whether streamed (read by `MessagesUsage`) or not.
#[tokio::test]
async fn the_mock_speaks_messages_with_cache_usage_and_tool_turns() {
    let base = mock::start(mock::MockConfig::default()).await;
    let client = reqwest::Client::new();
    let post = |body: Value, version: bool| {
        let mut request = client.post(format!("{base}/messages")).json(&body);
        if version {
            request = request.header("anthropic-version", "2023-06-01");
        }
        request.send()
    };
    let ask = json!({"model": "anthropic/claude", "max_tokens": 50,
        "system": [{"type": "text", "text": "You are terse and helpful, always.",
                    "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [{"role": "user", "content": "Say hello to the gateway, please."}]});
    let refused = post(ask.clone(), false).await.unwrap();
    assert_eq!(refused.status(), 400);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["type"], "error");
    let mut unbounded = ask.clone();
    unbounded.as_object_mut().unwrap().remove("max_tokens");
    assert_eq!(post(unbounded, true).await.unwrap().status(), 400);

    let answer: Value = post(ask.clone(), true).await.unwrap().json().await.unwrap();
    assert_eq!(answer["stop_reason"], "end_turn", "{answer}");
    let usage = &answer["usage"];
    assert!(
        usage["cache_read_input_tokens"].as_u64().unwrap() > 0,
        "{usage}"
    );
    assert_eq!(usage["cache_creation"]["ephemeral_5m_input_tokens"], 0);
    assert_eq!(
        usage["cache_creation"]["ephemeral_1h_input_tokens"],
        usage["cache_creation_input_tokens"]
    );
    let mut whole = MessagesUsage::default();
    whole.merge_message(&answer);

    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let text = post(streamed, true).await.unwrap().text().await.unwrap();
    let mut read = MessagesUsage::default();
    for data in text.lines().filter_map(|line| line.strip_prefix("data: ")) {
        read.merge_event(&serde_json::from_str(data).unwrap());
    }
    assert!(text.contains("event: message_stop"), "{text}");
    assert_eq!(read.usage(), whole.usage());
    assert!(whole.usage().unwrap().cache_write_1h_tokens > 0);

    // A tool turn: the call, then text once its result comes back.
    let mut tooled = ask.clone();
    tooled["tools"] = json!([{"name": "Write", "input_schema": {"type": "object"}}]);
    let call: Value = post(tooled.clone(), true)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(call["stop_reason"], "tool_use", "{call}");
    let use_block = &call["content"][0];
    assert_eq!(use_block["name"], "Write");
    tooled["messages"] = json!([
        {"role": "user", "content": "Write it."},
        {"role": "assistant", "content": [use_block]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_block["id"], "content": "done"}]},
    ]);
    let after: Value = post(tooled, true).await.unwrap().json().await.unwrap();
    assert_eq!(after["stop_reason"], "end_turn", "{after}");
    let counted: Value = client
        .post(format!("{base}/messages/count_tokens"))
        .header("anthropic-version", "2023-06-01")
        .json(&ask)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(counted["input_tokens"].as_u64().unwrap() > 0, "{counted}");
}

/// A client that sends `anthropic-version` (Claude Code discovering a
/// gateway's models) gets the list in Anthropic's shape; others OpenAI's.
#[tokio::test]
async fn the_models_list_answers_anthropic_clients_in_their_shape() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let base = mock::start(mock::MockConfig::default()).await;
    let gateway = instance_with_clock(store.clone(), &base, "{}", Arc::new(noon())).await;
    let (client, _) = key(&store, "acme", false).await;
    let openai = get_json(gateway, "/api/v1/models", &client).await;
    let anthropic: Value = reqwest::Client::new()
        .get(format!("http://{gateway}/api/v1/models"))
        .header("x-api-key", &client)
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids = |list: &Value| -> Vec<Value> {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|model| model["id"].clone())
            .collect()
    };
    assert!(!ids(&openai).is_empty());
    assert_eq!(ids(&anthropic), ids(&openai));
    assert_eq!(anthropic["has_more"], false);
    assert_eq!(anthropic["first_id"], ids(&openai)[0]);
    let first = &anthropic["data"][0];
    assert_eq!(first["type"], "model");
    assert_eq!(first["display_name"], first["id"]);
    let created_at = first["created_at"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(created_at).is_ok(),
        "{created_at}"
    );
    assert_eq!(openai["object"], "list");
}
