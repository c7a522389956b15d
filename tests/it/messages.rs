//! The Anthropic Messages API through the whole gateway over real HTTP, in
//! front of the mock upstream as a provider that serves Messages: `x-api-key`
//! or a bearer key, the answer and its stream as the upstream sent them, the
//! charge worked out by hand from the usage the client read (cache reads and
//! writes at their own rates), `count_tokens` passed on and never charged,
//! errors in Anthropic's shape with the gateway's statuses, and a burst of
//! streams that never overdraws the balance. A second provider serves only
//! chat completions: Messages calls to it are translated (tools, streams,
//! usage) and charged what the translated usage says, chat calls to the
//! Messages provider the reverse, and a fallback crosses from one to the
//! other.

use crate::common;
use crate::mock;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::gateway::{instance, key_of};
use common::wait::wait_for;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::store::{MemoryStore, NANOS_PER_CREDIT};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(10);

/// Credits per million tokens, large enough that every part of a charge
/// shows: prompt 3 000, completion 15 000, cache reads 300, five-minute
/// writes 3 750, one-hour writes 6 000; 0.5 a web search.
fn config(base: &str) -> String {
    let rates = json!({
        "prompt_per_million": 3000, "completion_per_million": 15000,
        "input_cache_read_per_million": 300, "input_cache_write_per_million": 3750,
        "input_cache_write_1h_per_million": 6000, "web_search": 0.5});
    let mut search = rates.clone();
    search["context_length"] = json!(200);
    json!({
        "retry": {"max_attempts": 1},
        "providers": {
            "anthropic": {"base_url": base, "apis": ["messages"]},
            // Serves chat completions only: Messages calls are translated.
            "openai": {"base_url": base},
        },
        "fallbacks": {"anthropic/status-503": ["openai/gpt-test"]},
        "pricing": {"models": {
            "anthropic/claude-test": rates.clone(),
            "anthropic/status-503": rates.clone(),
            "openai/gpt-test": rates.clone(),
            // A search's results are prompt tokens the request's bytes do
            // not bound: a model with server tools needs a context length.
            "anthropic/claude-search": search,
        }},
    })
    .to_string()
}

struct Gateway {
    address: SocketAddr,
    store: SharedStore,
    key: String,
}

async fn start(credits: i64) -> Gateway {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let base = mock::start(mock::MockConfig::default()).await;
    let address = instance(store.clone(), &base, &config(&base)).await;
    let key = key_of(&store, "acme", None).await;
    KeyDirectory::new(store.clone())
        .top_up("acme", credits * NANOS_PER_CREDIT)
        .await
        .unwrap();
    Gateway {
        address,
        store,
        key,
    }
}

impl Gateway {
    async fn balance(&self) -> i64 {
        self.store
            .account_balance("acme")
            .await
            .unwrap()
            .balance_nanos
    }

    /// `POST {path}` with the key as `x-api-key`, Anthropic's headers.
    async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("http://{}{path}", self.address))
            .header("x-api-key", &self.key)
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", "prompt-caching-2024-07-31")
            .json(body)
            .send()
            .await
            .unwrap()
    }

    async fn spent_exactly(&self, before: i64, expected: i64) {
        wait_for(PATIENCE, || async {
            let spent = before - self.balance().await;
            (spent == expected)
                .then_some(())
                .ok_or(format!("spent {spent}, expected {expected}"))
        })
        .await;
    }
}

/// What Anthropic's `usage` costs at [`config`]'s rates, in nano-credits:
/// each kind of token at its rate, rounded up once.
fn by_hand(usage: &Value) -> i64 {
    let count = |field: &str| usage[field].as_i64().unwrap_or(0) as i128;
    let hour = usage["cache_creation"]["ephemeral_1h_input_tokens"]
        .as_i64()
        .unwrap_or(0) as i128;
    let written = count("cache_creation_input_tokens");
    let millionths = count("input_tokens") * 3000
        + count("cache_read_input_tokens") * 300
        + (written - hour) * 3750
        + hour * 6000
        + count("output_tokens") * 15000;
    // Credits per million tokens: nano-credits per token, a thousandth each.
    let nanos = (millionths * i128::from(NANOS_PER_CREDIT) + 999_999) / 1_000_000;
    let searches = usage["server_tool_use"]["web_search_requests"]
        .as_i64()
        .unwrap_or(0) as i128;
    (nanos + searches * i128::from(NANOS_PER_CREDIT) / 2) as i64
}

fn cached_request(stream: bool) -> Value {
    json!({
        "model": "anthropic/claude-test",
        "max_tokens": 64,
        "stream": stream,
        "system": [{"type": "text", "text": "You are terse. ".repeat(40),
                    "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [{"role": "user", "content": "Say hello."}],
    })
}

/// The usage a stream's events carry, merged field by field as Anthropic
/// means them (`message_start`, then each `message_delta`).
fn stream_usage(text: &str) -> Value {
    let mut usage = json!({});
    for data in text.lines().filter_map(|line| line.strip_prefix("data: ")) {
        let event: Value = serde_json::from_str(data).unwrap();
        let part = match event["type"].as_str() {
            Some("message_start") => event["message"]["usage"].clone(),
            Some("message_delta") => event["usage"].clone(),
            _ => continue,
        };
        for (field, value) in part.as_object().unwrap() {
            usage[field] = value.clone();
        }
    }
    usage
}

#[tokio::test]
async fn a_messages_call_goes_natively_and_is_charged_its_cache_usage_exactly() {
    let gateway = start(100).await;
    let before = gateway.balance().await;
    let reply = gateway
        .post("/api/v1/messages?beta=true", &cached_request(false))
        .await;
    assert_eq!(reply.status(), 200);
    let answer: Value = reply.json().await.unwrap();
    assert_eq!(answer["type"], "message", "{answer}");
    assert!(answer["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0);
    assert!(
        answer["usage"]["cache_creation"]["ephemeral_1h_input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let expected = by_hand(&answer["usage"]);
    gateway.spent_exactly(before, expected).await;

    // Streamed: the events' usage, merged, is what is charged.
    let before = gateway.balance().await;
    let reply = gateway
        .post("/api/v1/messages", &cached_request(true))
        .await;
    assert_eq!(reply.status(), 200);
    assert!(
        reply.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = reply.text().await.unwrap();
    assert!(text.contains("event: message_stop"), "{text}");
    let usage = stream_usage(&text);
    assert!(usage["output_tokens"].as_u64().unwrap() > 1, "{usage}");
    gateway.spent_exactly(before, by_hand(&usage)).await;

    // The records say their API and their cache tokens.
    let (manager, _) = manager_of(&gateway).await;
    let records: Value = reqwest::Client::new()
        .get(format!(
            "http://{}/api/v1/generations?limit=2",
            gateway.address
        ))
        .bearer_auth(&manager)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let record = &records["data"][0];
    assert_eq!(record["api"], "messages", "{record}");
    assert_eq!(record["streamed"], true, "{record}");
    let read = usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(record["native_tokens_cached"], read, "{record}");
    let prompt = usage["input_tokens"].as_u64().unwrap()
        + read
        + usage["cache_creation_input_tokens"].as_u64().unwrap();
    assert_eq!(record["tokens_prompt"], prompt, "{record}");
    // The cost's parts: each kind of token at its rate, rounded up alone.
    let details = &record["cost_details"];
    let nanos = |value: &Value| (value.as_f64().unwrap() * NANOS_PER_CREDIT as f64).round() as i64;
    let parts: i64 = details.as_object().unwrap().values().map(nanos).sum();
    let total = nanos(&record["total_cost"]);
    assert!(
        parts >= total && parts - total <= 8,
        "{details} against {total}"
    );
    assert!(nanos(&details["cache_write_1h"]) > 0, "{details}");
    assert!(nanos(&details["cache_read"]) > 0, "{details}");
    assert_eq!(nanos(&details["web_search"]), 0, "{details}");
}

async fn manager_of(gateway: &Gateway) -> (String, String) {
    let new = NewKey {
        account: "acme".to_owned(),
        management: true,
        scoped_to_account: true,
        ..NewKey::named("manager")
    };
    let (key, record) = KeyDirectory::new(gateway.store.clone())
        .create_key(new)
        .await
        .unwrap();
    (key.expose().to_owned(), record.hash.to_hex())
}

#[tokio::test]
async fn count_tokens_is_passed_on_and_never_charged() {
    let gateway = start(100).await;
    let before = gateway.balance().await;
    let reply = gateway
        .post(
            "/api/v1/messages/count_tokens",
            &json!({"model": "anthropic/claude-test",
                    "messages": [{"role": "user", "content": "Count me."}]}),
        )
        .await;
    assert_eq!(reply.status(), 200);
    let counted: Value = reply.json().await.unwrap();
    assert!(counted["input_tokens"].as_u64().unwrap() > 0, "{counted}");
    assert_eq!(gateway.balance().await, before);
}

#[tokio::test]
async fn refusals_on_the_messages_route_are_in_anthropics_shape() {
    let gateway = start(1).await;
    let expect = |status: u16, kind: &'static str| {
        move |reply: (u16, Value)| {
            assert_eq!(reply.0, status, "{}", reply.1);
            assert_eq!(reply.1["type"], "error", "{}", reply.1);
            assert_eq!(reply.1["error"]["type"], kind, "{}", reply.1);
            assert!(
                reply.1["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty())
            );
            reply.1
        }
    };
    let send = |key: &'static str, body: Value| {
        let address = gateway.address;
        let key = if key.is_empty() {
            gateway.key.clone()
        } else {
            key.to_owned()
        };
        async move {
            let reply = reqwest::Client::new()
                .post(format!("http://{address}/api/v1/messages"))
                .header("x-api-key", key)
                .header("anthropic-version", "2023-06-01")
                .json(&body)
                .send()
                .await
                .unwrap();
            (
                reply.status().as_u16(),
                reply.json::<Value>().await.unwrap(),
            )
        }
    };
    expect(401, "authentication_error")(send("mg-v1-nope", cached_request(false)).await);
    let invalid = json!({"model": "anthropic/claude-test", "max_tokens": 0,
                         "messages": [{"role": "user", "content": "Hi"}]});
    expect(422, "invalid_request_error")(send("", invalid).await);
    let unbounded_search = json!({"model": "anthropic/claude-test", "max_tokens": 10,
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "messages": [{"role": "user", "content": "Hi"}]});
    let refused = expect(400, "invalid_request_error")(send("", unbounded_search).await);
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_uses"),
        "{refused}"
    );
    // 1 credit pays for about 66 completion tokens: 10 000 000 it does not.
    let before = gateway.balance().await;
    let dear = json!({"model": "anthropic/claude-test", "max_tokens": 10_000_000,
                      "messages": [{"role": "user", "content": "Hi"}]});
    let refused = expect(402, "billing_error")(send("", dear).await);
    assert!(
        refused["error"]["metadata"]["affordable_tokens"]
            .as_u64()
            .is_some(),
        "{refused}"
    );
    assert_eq!(gateway.balance().await, before, "a refusal costs nothing");
}

/// Web searches are held at their fee times `max_uses`, and charged per
/// search the usage reports.
#[tokio::test]
async fn a_web_search_is_held_by_its_max_uses() {
    let gateway = start(2).await;
    // 0.5 a search: with the prompt and 10 tokens, 3 searches cannot be
    // held with 2 credits; 1 can.
    let searching = |uses: u64| {
        json!({"model": "anthropic/claude-search", "max_tokens": 10,
            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": uses}],
            "tool_choice": {"type": "none"},
            "messages": [{"role": "user", "content": "Hi"}]})
    };
    let refused = gateway.post("/api/v1/messages", &searching(3)).await;
    assert_eq!(refused.status(), 402);
    let before = gateway.balance().await;
    let admitted = gateway.post("/api/v1/messages", &searching(1)).await;
    assert_eq!(admitted.status(), 200);
    let answer: Value = admitted.json().await.unwrap();
    gateway
        .spent_exactly(before, by_hand(&answer["usage"]))
        .await;
}

/// Many Messages streams at once, each able to cost more than its share:
/// the balance is never taken below zero, and what was spent is exactly
/// what the answered ones' usage costs.
#[tokio::test]
async fn a_burst_of_messages_streams_never_overdraws() {
    let gateway = Arc::new(start(3).await);
    let mut tasks = Vec::new();
    for _ in 0..24 {
        let gateway = Arc::clone(&gateway);
        tasks.push(tokio::spawn(async move {
            // Its hold: about 0.3 credits (20 completion tokens at 0.015).
            let body = json!({"model": "anthropic/claude-test", "max_tokens": 20,
                "stream": true, "messages": [{"role": "user", "content": "Hi"}]});
            let reply = gateway.post("/api/v1/messages", &body).await;
            let status = reply.status().as_u16();
            let text = reply.text().await.unwrap();
            (status, text)
        }));
    }
    let mut expected = 0;
    let mut admitted = 0;
    for task in tasks {
        let (status, text) = task.await.unwrap();
        match status {
            200 => {
                admitted += 1;
                expected += by_hand(&stream_usage(&text));
            }
            402 => {}
            other => panic!("{other}: {text}"),
        }
    }
    // Each holds about 0.45 credits and costs less: a few fit, never all.
    assert!(
        admitted >= 2,
        "the balance holds several at once: {admitted}"
    );
    assert!(admitted < 24, "not all fit in 3 credits");
    gateway.spent_exactly(3 * NANOS_PER_CREDIT, expected).await;
    assert!(gateway.balance().await >= 0);
}

/// `Authorization: Bearer` works as well as `x-api-key`; both at once
/// and different is refused.
#[tokio::test]
async fn a_bearer_key_works_and_two_different_keys_are_refused() {
    let gateway = start(10).await;
    let client = reqwest::Client::new();
    let url = format!("http://{}/api/v1/messages", gateway.address);
    let bearer = client
        .post(&url)
        .bearer_auth(&gateway.key)
        .header("anthropic-version", "2023-06-01")
        .json(&cached_request(false))
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 200);
    let other = key_of(&gateway.store, "acme", None).await;
    let both = client
        .post(&url)
        .bearer_auth(&gateway.key)
        .header("x-api-key", other)
        .json(&cached_request(false))
        .send()
        .await
        .unwrap();
    assert_eq!(both.status(), 401);
    let body: Value = both.json().await.unwrap();
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");
}

/// `max_tokens` is optional here, as on OpenRouter: the gateway writes the
/// bound its hold pays for (the mock upstream, as Anthropic, refuses a
/// request without one). With thinking, the bound stays above its budget,
/// and a balance that cannot pay for that is refused, naming it.
#[tokio::test]
async fn a_missing_max_tokens_is_written_and_stays_above_a_thinking_budget() {
    let gateway = start(100).await;
    let reply = gateway
        .post(
            "/api/v1/messages",
            &json!({"model": "anthropic/claude-test",
                    "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap());

    // 0.015 a completion token: 1 025 of them cost about 15.4 credits.
    let poor = start(10).await;
    let thinking = json!({"model": "anthropic/claude-test",
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": "Think."}]});
    let before = poor.balance().await;
    let refused = poor.post("/api/v1/messages", &thinking).await;
    assert_eq!(refused.status(), 402);
    let body: Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("1025 completion tokens"), "{message}");
    assert_eq!(poor.balance().await, before);
    let rich = start(100).await;
    let admitted = rich.post("/api/v1/messages", &thinking).await;
    assert_eq!(admitted.status(), 200, "{}", admitted.text().await.unwrap());
}

/// A Messages call to a provider that serves only chat completions: the
/// answer comes back in Anthropic's shape, JSON or events, a tool call as
/// a `tool_use` block and its result sent back as a tool message; each is
/// charged what the translated usage says.
#[tokio::test]
async fn a_messages_call_to_a_chat_provider_is_translated_both_ways() {
    let gateway = start(100).await;
    let ask = |stream: bool| {
        json!({"model": "openai/gpt-test", "max_tokens": 50, "stream": stream,
               "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]})
    };
    let before = gateway.balance().await;
    let reply = gateway.post("/api/v1/messages", &ask(false)).await;
    assert_eq!(reply.status(), 200);
    let answer: Value = reply.json().await.unwrap();
    assert_eq!(answer["type"], "message", "{answer}");
    assert_eq!(answer["role"], "assistant", "{answer}");
    assert_eq!(answer["content"][0]["type"], "text", "{answer}");
    assert_eq!(answer["stop_reason"], "end_turn", "{answer}");
    assert!(
        answer["usage"]["input_tokens"].as_u64().unwrap() > 0,
        "{answer}"
    );
    gateway
        .spent_exactly(before, by_hand(&answer["usage"]))
        .await;

    let before = gateway.balance().await;
    let reply = gateway.post("/api/v1/messages", &ask(true)).await;
    assert_eq!(reply.status(), 200);
    let text = reply.text().await.unwrap();
    for event in [
        "message_start",
        "content_block_delta",
        "message_delta",
        "message_stop",
    ] {
        assert!(
            text.contains(&format!("event: {event}")),
            "{event} in {text}"
        );
    }
    assert!(!text.contains("[DONE]"), "{text}");
    let usage = stream_usage(&text);
    assert!(usage["output_tokens"].as_u64().unwrap() > 0, "{usage}");
    gateway.spent_exactly(before, by_hand(&usage)).await;

    // A tool turn: the chat provider's tool call is a `tool_use` block.
    let tools = json!([{"name": "get_weather", "description": "The weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let call = json!({"model": "openai/gpt-test", "max_tokens": 50, "tools": tools,
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let answer: Value = gateway
        .post("/api/v1/messages", &call)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(answer["stop_reason"], "tool_use", "{answer}");
    let tool_use = answer["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|block| block["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use in {answer}"))
        .clone();
    assert_eq!(tool_use["name"], "get_weather");
    let result = json!({"model": "openai/gpt-test", "max_tokens": 50, "tools": tools,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [tool_use.clone()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"],
                                          "content": "Sunny, 21 C"}]}]});
    let answer: Value = gateway
        .post("/api/v1/messages", &result)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(answer["type"], "message", "{answer}");
    assert_eq!(answer["stop_reason"], "end_turn", "{answer}");
}

/// A chat call to a provider that serves only Messages: translated, the
/// answer a chat completion (or its chunks, ending `[DONE]`), charged what
/// the Messages usage says, cache reads and writes at their rates.
#[tokio::test]
async fn a_chat_call_to_a_messages_provider_is_translated_both_ways() {
    let gateway = start(100).await;
    let chat = |stream: bool| {
        let mut body = json!({"model": "anthropic/claude-test", "max_tokens": 50,
            "stream": stream,
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hi"}]});
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    };
    let send = |body: Value| {
        let address = gateway.address;
        let key = gateway.key.clone();
        async move {
            reqwest::Client::new()
                .post(format!("http://{address}/api/v1/chat/completions"))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    // Chat's usage at the same rates (cached tokens inside the prompt).
    let chat_cost = |usage: &Value| {
        let prompt = usage["prompt_tokens"].as_i64().unwrap();
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_i64()
            .unwrap_or(0);
        by_hand(
            &json!({"input_tokens": prompt - cached, "cache_read_input_tokens": cached,
                        "output_tokens": usage["completion_tokens"]}),
        )
    };
    let before = gateway.balance().await;
    let reply = send(chat(false)).await;
    assert_eq!(reply.status(), 200);
    let answer: Value = reply.json().await.unwrap();
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    assert_eq!(
        answer["choices"][0]["message"]["role"], "assistant",
        "{answer}"
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
    gateway
        .spent_exactly(before, chat_cost(&answer["usage"]))
        .await;

    let before = gateway.balance().await;
    let text = send(chat(true)).await.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let usage = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find(|chunk| chunk["usage"].is_object())
        .map(|chunk| chunk["usage"].clone())
        .unwrap_or_else(|| panic!("no usage chunk in {text}"));
    gateway.spent_exactly(before, chat_cost(&usage)).await;
}

/// A Messages call whose model fails falls back to the next model, on a
/// provider of the other API: the client still reads Anthropic's shape.
#[tokio::test]
async fn a_fallback_crosses_from_a_messages_provider_to_a_chat_one() {
    let gateway = start(100).await;
    let reply = gateway
        .post(
            "/api/v1/messages",
            &json!({"model": "anthropic/status-503", "max_tokens": 20,
                    "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(reply.status(), 200);
    assert_eq!(reply.headers()["x-modelgate-model"], "openai/gpt-test");
    let answer: Value = reply.json().await.unwrap();
    assert_eq!(answer["type"], "message", "{answer}");
    assert_eq!(answer["model"], "openai/gpt-test", "{answer}");
}

/// An account's own key for a provider that serves Messages goes as
/// `x-api-key`, alone (no gateway credential beside it), for a Messages
/// call and for a chat call translated to it; the requests are BYOK, not
/// charged to the balance.
#[tokio::test]
async fn an_accounts_own_key_goes_to_a_messages_provider_as_x_api_key() {
    use axum::routing::post;
    let seen = Arc::new(std::sync::Mutex::new(
        Vec::<(Option<String>, Option<String>)>::new(),
    ));
    let recorded = Arc::clone(&seen);
    let app = axum::Router::new().route(
        "/v1/messages",
        post(move |headers: http::HeaderMap| {
            let recorded = Arc::clone(&recorded);
            async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .map(|value| value.to_str().unwrap().to_owned())
                };
                recorded
                    .lock()
                    .unwrap()
                    .push((header("x-api-key"), header("authorization")));
                let answer = json!({"id": "msg_1", "type": "message", "role": "assistant",
                    "model": "claude", "content": [{"type": "text", "text": "Hi"}],
                    "stop_reason": "end_turn", "stop_sequence": null,
                    "usage": {"input_tokens": 5, "output_tokens": 2}});
                (
                    [(http::header::CONTENT_TYPE, "application/json")],
                    answer.to_string(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let config = json!({
        "retry": {"max_attempts": 1},
        "providers": {"anthropic": {"base_url": upstream, "apis": ["messages"], "byok": true,
                                    "api_key": {"env": "MODELGATE_TEST_ALPHA_KEY"}}},
        "pricing": {"models": {"anthropic/claude-test":
            {"prompt_per_million": 3000, "completion_per_million": 15000}}},
    });
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(store.clone(), &upstream, &config.to_string()).await;
    let key = key_of(&store, "acme", None).await;
    KeyDirectory::new(store.clone())
        .top_up("acme", NANOS_PER_CREDIT)
        .await
        .unwrap();
    modelgate::keys::ByokDirectory::new(store.clone())
        .set("acme", "anthropic", "sk-ant-acme-own-0001")
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let messages = client
        .post(format!("http://{address}/api/v1/messages"))
        .header("x-api-key", &key)
        .json(&json!({"model": "anthropic/claude-test", "max_tokens": 10,
                      "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(messages.status(), 200);
    let chat = client
        .post(format!("http://{address}/api/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&json!({"model": "anthropic/claude-test", "max_tokens": 10,
                      "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    let answer: Value = chat.json().await.unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "Hi", "{answer}");
    let seen = seen.lock().unwrap().clone();
    let own = (Some("sk-ant-acme-own-0001".to_owned()), None);
    assert_eq!(seen, vec![own.clone(), own]);
    let balance = store.account_balance("acme").await.unwrap().balance_nanos;
    assert_eq!(
        balance, NANOS_PER_CREDIT,
        "BYOK is not charged to the balance"
    );
}

/// A call no provider API can take (here a `count_tokens` for a model whose
/// provider serves only chat completions, and a server tool a chat model
/// cannot run) is refused before the admission: it spends no rate, so the
/// account's one request a minute still admits the next call.
#[tokio::test]
async fn a_call_no_provider_can_take_spends_no_rate() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let base = mock::start(mock::MockConfig::default()).await;
    let mut config: Value = serde_json::from_str(&config(&base)).unwrap();
    config["rate_limits"] =
        json!({"account": {"gcra": {"requests": 1, "period_seconds": 60, "burst": 1}}});
    config["pricing"]["models"]["openai/gpt-test"]["context_length"] = json!(1000);
    let address = instance(store.clone(), &base, &config.to_string()).await;
    let key = key_of(&store, "acme", None).await;
    KeyDirectory::new(store.clone())
        .top_up("acme", 100 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let gateway = Gateway {
        address,
        store,
        key,
    };
    let count = gateway
        .post(
            "/api/v1/messages/count_tokens",
            &json!({"model": "openai/gpt-test", "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(count.status(), 400);
    let searching = json!({"model": "openai/gpt-test", "max_tokens": 10,
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}],
        "messages": [{"role": "user", "content": "Hi"}]});
    let refused = gateway.post("/api/v1/messages", &searching).await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    let before = gateway.balance().await;
    assert_eq!(before, 100 * NANOS_PER_CREDIT, "nothing held or charged");
    let admitted = gateway
        .post(
            "/api/v1/messages",
            &json!({"model": "openai/gpt-test", "max_tokens": 10,
                    "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(admitted.status(), 200, "the refusals spent no rate");
    let limited = gateway
        .post(
            "/api/v1/messages",
            &json!({"model": "openai/gpt-test", "max_tokens": 10,
                    "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(limited.status(), 429, "the rule counts what it admits");
}
