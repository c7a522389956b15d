//! The Responses API and embeddings through the whole gateway over real
//! HTTP, in front of a recording upstream that serves both natively: what
//! the upstream receives (the bound written as `max_output_tokens`, the
//! web searches the hold pays for as `max_tool_calls`, `store: false`), the
//! charge worked out by hand from the usage (cached and reasoning tokens
//! at their rates; an embeddings input at the prompt rate), refusals in
//! the OpenAI shape (a stateful request, a model of the other kind), and
//! records that say their API.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::gateway::{instance, key_of};
use common::wait::wait_for;
use modelgate::keys::{KeyDirectory, SharedStore};
use modelgate::store::{MemoryStore, NANOS_PER_CREDIT};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(10);

/// What the upstream received: each request's path and body, with its
/// `Authorization` under `"authorization"`.
type Received = Arc<Mutex<Vec<(String, Value)>>>;

/// An upstream serving the Responses API (an answer with cached and
/// reasoning tokens, JSON or its events) and embeddings.
async fn upstream() -> (String, Received) {
    use axum::routing::post;
    let received: Received = Arc::default();
    let (on_responses, on_embeddings) = (Arc::clone(&received), Arc::clone(&received));
    let usage = json!({"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 600},
        "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 200},
        "total_tokens": 1300});
    let app = axum::Router::new()
        .route(
            "/v1/responses",
            post(move |headers: http::HeaderMap, body: String| {
                let received = Arc::clone(&on_responses);
                let usage = usage.clone();
                async move {
                    let request: Value = serde_json::from_str(&body).unwrap();
                    let mut seen = request.clone();
                    seen["authorization"] = json!(headers
                        .get("authorization")
                        .map(|value| value.to_str().unwrap().to_owned()));
                    received.lock().unwrap().push(("/v1/responses".into(), seen));
                    let answer = json!({"id": "resp_1", "object": "response", "status": "completed",
                        "model": "m", "output": [{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": "Hi"}]}], "usage": usage});
                    if request["stream"] == true {
                        let events = format!(
                            "event: response.created\ndata: {}\n\nevent: response.output_text.delta\ndata: {}\n\nevent: response.completed\ndata: {}\n\n",
                            json!({"type": "response.created", "sequence_number": 0,
                                   "response": {"id": "resp_1", "status": "in_progress", "usage": null}}),
                            json!({"type": "response.output_text.delta", "sequence_number": 1, "delta": "Hi"}),
                            json!({"type": "response.completed", "sequence_number": 2, "response": answer}),
                        );
                        ([(http::header::CONTENT_TYPE, "text/event-stream")], events)
                    } else {
                        ([(http::header::CONTENT_TYPE, "application/json")], answer.to_string())
                    }
                }
            }),
        )
        .route(
            "/v1/embeddings",
            post(move |body: String| {
                let received = Arc::clone(&on_embeddings);
                async move {
                    let request: Value = serde_json::from_str(&body).unwrap();
                    received.lock().unwrap().push(("/v1/embeddings".into(), request));
                    let answer = json!({"object": "list", "model": "e",
                        "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}],
                        "usage": {"prompt_tokens": 7, "total_tokens": 7}});
                    ([(http::header::CONTENT_TYPE, "application/json")], answer.to_string())
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, received)
}

struct Gateway {
    address: SocketAddr,
    store: SharedStore,
    key: String,
    received: Received,
}

/// Credits per million: prompt 2 000, cached 500, completion 8 000,
/// reasoning 20 000; 0.25 a web search. The embeddings model: 100 a
/// million input tokens.
async fn start() -> Gateway {
    let (base, received) = upstream().await;
    let config = json!({
        "retry": {"max_attempts": 1},
        "providers": {"openai": {"base_url": base, "apis": ["chat", "responses", "embeddings"],
                                 "byok": true, "api_key": {"env": "MODELGATE_TEST_ALPHA_KEY"}}},
        "pricing": {"models": {
            "openai/reasoner": {"prompt_per_million": 2000, "completion_per_million": 8000,
                "input_cache_read_per_million": 500, "internal_reasoning_per_million": 20000,
                "web_search": 0.25, "context_length": 4000},
            "openai/embedder": {"prompt_per_million": 100, "completion_per_million": 0,
                "embeddings": true},
        }},
    });
    let store: SharedStore = Arc::new(MemoryStore::new());
    let address = instance(store.clone(), &base, &config.to_string()).await;
    let key = key_of(&store, "acme", None).await;
    KeyDirectory::new(store.clone())
        .top_up("acme", 100 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    Gateway {
        address,
        store,
        key,
        received,
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

    async fn post(&self, path: &str, body: &Value) -> (u16, String) {
        let reply = reqwest::Client::new()
            .post(format!("http://{}{path}", self.address))
            .bearer_auth(&self.key)
            .json(body)
            .send()
            .await
            .unwrap();
        (reply.status().as_u16(), reply.text().await.unwrap())
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

    fn last_received(&self) -> (String, Value) {
        self.received.lock().unwrap().last().cloned().unwrap()
    }
}

/// The upstream's usage at [`start`]'s rates: 400 uncached at 2 000, 600
/// cached at 500, 100 plain completion at 8 000, 200 reasoning at 20 000
/// credits a million, and `searches` at 0.25.
fn responses_cost(searches: i64) -> i64 {
    let millionths: i64 = 400 * 2000 + 600 * 500 + 100 * 8000 + 200 * 20000;
    millionths * (NANOS_PER_CREDIT / 1_000_000) + searches * NANOS_PER_CREDIT / 4
}

#[tokio::test]
async fn a_responses_call_goes_natively_bounded_stateless_and_charged_exactly() {
    let gateway = start().await;
    // Codex's shape: no max_output_tokens, store false, a web search tool.
    let codex = json!({"model": "openai/reasoner", "instructions": "Be brief.",
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "Hi"}]}],
        "tools": [{"type": "web_search"}], "reasoning": {"effort": "medium"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k"});
    let before = gateway.balance().await;
    let (status, text) = gateway.post("/api/v1/responses", &codex).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["object"], "response", "{answer}");
    let (path, sent) = gateway.last_received();
    assert_eq!(path, "/v1/responses");
    assert!(sent["max_output_tokens"].as_u64().unwrap() >= 1, "{sent}");
    assert_eq!(sent["max_tool_calls"], 8, "{sent}");
    assert_eq!(sent["store"], false, "{sent}");
    gateway.spent_exactly(before, responses_cost(0)).await;

    // Streamed: the usage of `response.completed`.
    let before = gateway.balance().await;
    let mut streamed = codex.clone();
    streamed["stream"] = json!(true);
    streamed["max_output_tokens"] = json!(500);
    streamed["max_tool_calls"] = json!(2);
    let (status, text) = gateway.post("/api/v1/responses", &streamed).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("response.completed"), "{text}");
    let (_, sent) = gateway.last_received();
    assert_eq!(sent["max_output_tokens"], 500, "{sent}");
    assert_eq!(
        sent["max_tool_calls"], 2,
        "the client's own bound stays: {sent}"
    );
    gateway.spent_exactly(before, responses_cost(0)).await;

    // The records say their API.
    let manager = manager_of(&gateway.store).await;
    let records: Value = reqwest::Client::new()
        .get(format!("http://{}/api/v1/generations", gateway.address))
        .bearer_auth(&manager)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let apis: Vec<&Value> = records["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["api"])
        .collect();
    assert_eq!(
        apis,
        [&json!("responses"), &json!("responses")],
        "{records}"
    );
}

async fn manager_of(store: &SharedStore) -> String {
    let new = modelgate::keys::NewKey {
        account: "acme".to_owned(),
        management: true,
        scoped_to_account: true,
        ..modelgate::keys::NewKey::named("manager")
    };
    let (key, _) = KeyDirectory::new(store.clone())
        .create_key(new)
        .await
        .unwrap();
    key.expose().to_owned()
}

/// Codex's request to a provider that serves only chat completions:
/// translated, its answer read back as a response object, charged what
/// the translated usage says.
#[tokio::test]
async fn a_responses_call_to_a_chat_provider_is_translated() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let base = crate::mock::start(crate::mock::MockConfig::default()).await;
    let config = json!({"retry": {"max_attempts": 1}, "pricing": {"models": {
        "openai/gpt-test": {"prompt_per_million": 1000, "completion_per_million": 1000,
                            "context_length": 4000}}}});
    let address = instance(store.clone(), &base, &config.to_string()).await;
    let key = key_of(&store, "acme", None).await;
    KeyDirectory::new(store.clone())
        .top_up("acme", 100 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let ask = |stream: bool| {
        json!({"model": "openai/gpt-test", "instructions": "Be brief.", "stream": stream,
               "store": false, "input": [{"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": "Hi"}]}],
               "tools": [{"type": "web_search"}]})
    };
    let before = store.account_balance("acme").await.unwrap().balance_nanos;
    let answer: Value = client
        .post(format!("http://{address}/api/v1/responses"))
        .bearer_auth(&key)
        .json(&ask(false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["object"], "response", "{answer}");
    assert_eq!(answer["status"], "completed", "{answer}");
    let usage = &answer["usage"];
    let tokens = usage["input_tokens"].as_i64().unwrap() + usage["output_tokens"].as_i64().unwrap();
    wait_for(PATIENCE, || async {
        let spent = before - store.account_balance("acme").await.unwrap().balance_nanos;
        let expected = tokens * 1000 * (NANOS_PER_CREDIT / 1_000_000);
        (spent == expected)
            .then_some(())
            .ok_or(format!("spent {spent}, expected {expected}"))
    })
    .await;
    let text = client
        .post(format!("http://{address}/api/v1/responses"))
        .bearer_auth(&key)
        .json(&ask(true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for event in [
        "response.created",
        "response.output_text.delta",
        "response.completed",
    ] {
        assert!(
            text.contains(&format!("event: {event}")),
            "{event} in {text}"
        );
    }
}

#[tokio::test]
async fn stateful_requests_and_models_of_the_other_kind_are_refused_and_cost_nothing() {
    let gateway = start().await;
    let before = gateway.balance().await;
    for (body, param) in [
        (
            json!({"model": "openai/reasoner", "input": "Hi", "store": true}),
            "store",
        ),
        (
            json!({"model": "openai/reasoner", "input": "Hi", "previous_response_id": "resp_0"}),
            "previous_response_id",
        ),
    ] {
        let (status, text) = gateway.post("/api/v1/responses", &body).await;
        assert_eq!(status, 400, "{text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["error"]["metadata"]["param"], param, "{error}");
    }
    let (status, text) = gateway
        .post(
            "/api/v1/embeddings",
            &json!({"model": "openai/reasoner", "input": "Hi"}),
        )
        .await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("not an embeddings model"), "{text}");
    let (status, text) = gateway
        .post(
            "/api/v1/chat/completions",
            &json!({"model": "openai/embedder", "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("a path ending in /embeddings"), "{text}");
    assert_eq!(gateway.balance().await, before);
    assert!(gateway.received.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_embeddings_call_is_held_by_its_input_and_charged_its_prompt_tokens() {
    let gateway = start().await;
    let before = gateway.balance().await;
    let (status, text) = gateway
        .post(
            "/api/v1/embeddings",
            &json!({"model": "openai/embedder", "input": ["one", "two"], "dimensions": 2}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let (path, sent) = gateway.last_received();
    assert_eq!(path, "/v1/embeddings");
    // Nothing is written into an embeddings request.
    assert_eq!(
        sent,
        json!({"model": "embedder", "input": ["one", "two"], "dimensions": 2})
    );
    // 7 prompt tokens at 100 credits a million.
    gateway
        .spent_exactly(before, 7 * 100 * NANOS_PER_CREDIT / 1_000_000)
        .await;
}

/// A Responses call whose model fails falls back to the next, translated
/// for the chat provider all the same; the models list says which API
/// each model is called on.
#[tokio::test]
async fn a_responses_call_falls_back_and_the_models_list_names_each_models_apis() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let base = crate::mock::start(crate::mock::MockConfig::default()).await;
    let price = json!({"prompt_per_million": 1000, "completion_per_million": 1000});
    let config = json!({"retry": {"max_attempts": 1},
        "fallbacks": {"openai/status-503": ["openai/gpt-test"]},
        "pricing": {"models": {"openai/status-503": price, "openai/gpt-test": price,
            "openai/embedder": {"prompt_per_million": 100, "completion_per_million": 0,
                                "embeddings": true}}}});
    let address = instance(store.clone(), &base, &config.to_string()).await;
    let key = key_of(&store, "acme", None).await;
    KeyDirectory::new(store.clone())
        .top_up("acme", 100 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let reply = client
        .post(format!("http://{address}/api/v1/responses"))
        .bearer_auth(&key)
        .json(&json!({"model": "openai/status-503", "input": "Hi", "max_output_tokens": 20}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    assert_eq!(reply.headers()["x-modelgate-model"], "openai/gpt-test");
    let answer: Value = reply.json().await.unwrap();
    assert_eq!(answer["object"], "response", "{answer}");
    let models: Value = client
        .get(format!("http://{address}/api/v1/models"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let apis = |id: &str| {
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|model| model["id"] == id)
            .map(|model| model["supported_apis"].clone())
    };
    assert_eq!(
        apis("openai/gpt-test"),
        Some(json!(["chat", "messages", "responses"]))
    );
    assert_eq!(apis("openai/embedder"), Some(json!(["embeddings"])));
}

/// An account's own key for the provider goes in place of the gateway's
/// on a Responses call, and the call is not charged to the balance.
#[tokio::test]
async fn a_responses_call_goes_with_the_accounts_own_key() {
    let gateway = start().await;
    modelgate::keys::ByokDirectory::new(gateway.store.clone())
        .set("acme", "openai", "sk-acme-own-0001")
        .await
        .unwrap();
    let before = gateway.balance().await;
    let (status, text) = gateway
        .post(
            "/api/v1/responses",
            &json!({"model": "openai/reasoner", "input": "Hi"}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let (_, sent) = gateway.last_received();
    assert_eq!(sent["authorization"], "Bearer sk-acme-own-0001");
    assert_eq!(
        gateway.balance().await,
        before,
        "BYOK is not charged to the balance"
    );
    // Another account's call goes with the gateway's own key.
    let other = key_of(&gateway.store, "other", None).await;
    KeyDirectory::new(gateway.store.clone())
        .top_up("other", NANOS_PER_CREDIT)
        .await
        .unwrap();
    let reply = reqwest::Client::new()
        .post(format!("http://{}/api/v1/responses", gateway.address))
        .bearer_auth(&other)
        .json(&json!({"model": "openai/reasoner", "input": "Hi", "max_output_tokens": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    let (_, sent) = gateway.last_received();
    assert_eq!(
        sent["authorization"],
        "Bearer alpha-provider-key-0123456789"
    );
}
