//! Model ids on the service's terms, over real HTTP: the whole gateway in
//! front of two mock providers on loopback, configured with a
//! `default_provider` and `model_aliases`. A bare id and an alias are
//! priced, limited, charged, recorded and sent to the provider as the id
//! they resolve to, in every API; the models list shows the names.

use crate::common;
use crate::mock;

use std::net::SocketAddr;
use std::sync::Arc;

use common::http_server::serve;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::proxy::{GatewayConfig, GatewayPlan, Upstream, UpstreamConfig, build_gateway};
use modelgate::store::{MemoryStore, NANOS_PER_CREDIT};
use serde_json::{Value, json};

struct Gateway {
    address: SocketAddr,
    settlements: modelgate::credit::PendingSettlements,
    key: String,
    store: SharedStore,
}

/// `alpha` strips the provider prefix, `beta` keeps it; bare ids go to
/// alpha, `claude-*` to beta, `opus` is alpha's pricey model. `extra` is
/// merged into the top level of the config.
async fn start(extra: Value) -> Gateway {
    let alpha = mock::start(mock::MockConfig::default()).await;
    let beta = mock::start(mock::MockConfig::default()).await;
    let price = json!({"prompt_per_million": 1, "completion_per_million": 2});
    let mut config = json!({
        "providers": {
            "alpha": {"base_url": alpha, "api_key": {"env": "MODELGATE_TEST_ALPHA_KEY"}},
            "beta": {"base_url": beta, "api_key": {"env": "MODELGATE_TEST_ALPHA_KEY"},
                     "model_prefix": "keep"},
        },
        "pricing": {"models": {
            "alpha/m1": price, "beta/claude-x": price,
            "alpha/pricey": {"prompt_per_million": 1, "completion_per_million": 100_000},
        }},
        "default_provider": "alpha",
        "model_aliases": {"claude-*": "beta/", "opus": "alpha/pricey"},
        "retry": {"max_attempts": 1},
    });
    for (name, value) in extra.as_object().unwrap() {
        config[name] = value.clone();
    }
    let config = GatewayConfig::from_json(&config.to_string()).unwrap();
    let store: SharedStore = Arc::new(MemoryStore::new());
    let upstream = Upstream::new(&UpstreamConfig::new("http://127.0.0.1:9/v1")).unwrap();
    let built = build_gateway::<hyper::body::Incoming>(
        &GatewayPlan::new(&config).unwrap(),
        store.clone(),
        upstream,
        Arc::new(modelgate::clock::SystemClock),
        KeyDirectory::DEFAULT_CACHE_TTL,
    );
    let address = serve(built.service).await;
    let directory = KeyDirectory::new(store.clone());
    let new = NewKey {
        account: "acme".into(),
        ..NewKey::named("tests")
    };
    let (key, _) = directory.create_key(new).await.unwrap();
    directory
        .top_up("acme", 100 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    Gateway {
        address,
        settlements: built.settlements,
        key: key.expose().to_owned(),
        store,
    }
}

struct Reply {
    status: u16,
    model_header: Option<String>,
    body: Value,
    text: String,
}

impl Gateway {
    async fn post(&self, path: &str, body: Value) -> Reply {
        let response = reqwest::Client::new()
            .post(format!("http://{}{path}", self.address))
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let model_header = response
            .headers()
            .get("x-modelgate-model")
            .map(|value| value.to_str().unwrap().to_owned());
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        // Its cost lands just after its answer: tests read it next.
        assert!(
            self.settlements
                .flush(std::time::Duration::from_secs(10))
                .await
                .is_empty()
        );
        Reply {
            status,
            model_header,
            body,
            text,
        }
    }

    async fn chat(&self, model: &str) -> Reply {
        self.post(
            "/api/v1/chat/completions",
            json!({"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await
    }

    async fn balance_nanos(&self) -> i64 {
        self.store
            .account_balance("acme")
            .await
            .unwrap()
            .balance_nanos
    }

    /// The account's generation records, newest first.
    async fn records(&self) -> Vec<Value> {
        self.store
            .recent_generations("acme", 100, chrono::Utc::now())
            .await
            .unwrap()
            .iter()
            .map(|record| serde_json::from_slice(record).unwrap())
            .collect()
    }
}

fn answer_text(reply: &Reply) -> &str {
    reply.body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer in {}", reply.text))
}

#[tokio::test]
async fn a_bare_id_is_priced_charged_and_recorded_as_its_default_providers_model() {
    let gateway = start(json!({})).await;
    let before = gateway.balance_nanos().await;
    let bare = gateway.chat("m1").await;
    assert_eq!(bare.status, 200, "{}", bare.text);
    // Alpha strips its prefix: it was asked for its own `m1`.
    assert!(
        answer_text(&bare).starts_with("Hello from m1!"),
        "{}",
        bare.text
    );
    assert_eq!(bare.model_header.as_deref(), Some("alpha/m1"));
    assert_eq!(bare.body["model"], "alpha/m1");
    let bare_cost = before - gateway.balance_nanos().await;
    assert!(bare_cost > 0);
    // The same request naming the whole id costs the same.
    let before = gateway.balance_nanos().await;
    assert_eq!(gateway.chat("alpha/m1").await.status, 200);
    assert_eq!(before - gateway.balance_nanos().await, bare_cost);
    // An exact alias is priced as its target: alpha's pricey model.
    let before = gateway.balance_nanos().await;
    let alias = gateway.chat("opus").await;
    assert_eq!(
        alias.model_header.as_deref(),
        Some("alpha/pricey"),
        "{}",
        alias.text
    );
    assert!(
        answer_text(&alias).starts_with("Hello from pricey!"),
        "{}",
        alias.text
    );
    assert!(before - gateway.balance_nanos().await > 100 * bare_cost);
    let records = gateway.records().await;
    let models: Vec<(&str, &str)> = records
        .iter()
        .map(|record| {
            (
                record["model"].as_str().unwrap(),
                record["requested_model"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        models,
        [
            ("alpha/pricey", "alpha/pricey"),
            ("alpha/m1", "alpha/m1"),
            ("alpha/m1", "alpha/m1")
        ]
    );
}

#[tokio::test]
async fn a_pattern_reaches_its_provider_by_its_whole_id_under_the_providers_rule() {
    let gateway = start(json!({"rate_limits": {"models": [
        {"match": "beta/", "limit": {"rolling": {"requests": 1, "window_seconds": 3600}}}
    ]}}))
    .await;
    let reply = gateway.chat("claude-x").await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    // Beta keeps the prefix: it got the id the alias resolved to.
    assert!(
        answer_text(&reply).starts_with("Hello from beta/claude-x!"),
        "{}",
        reply.text
    );
    assert_eq!(reply.model_header.as_deref(), Some("beta/claude-x"));
    // The rule on `beta/` counted the alias: both spellings are refused now.
    for model in ["claude-x", "beta/claude-x"] {
        let refused = gateway.chat(model).await;
        assert_eq!(refused.status, 429, "{model}: {}", refused.text);
        assert_eq!(
            refused.body["error"]["metadata"]["limit_source"],
            "model_rate"
        );
    }
    // Alpha's models are not under beta's rule.
    assert_eq!(gateway.chat("m1").await.status, 200);
}

#[tokio::test]
async fn messages_and_responses_translated_for_a_chat_provider_carry_the_chosen_id() {
    let gateway = start(json!({})).await;
    // Claude Code's shape: an Anthropic Messages request with its own id.
    let messages = gateway
        .post(
            "/api/v1/messages",
            json!({"model": "opus", "max_tokens": 20,
                   "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(messages.status, 200, "{}", messages.text);
    assert_eq!(messages.model_header.as_deref(), Some("alpha/pricey"));
    let text = messages.body["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("Hello from pricey!"), "{text}");
    // Codex's shape: a Responses request with a bare id.
    let responses = gateway
        .post(
            "/api/v1/responses",
            json!({"model": "m1", "input": "hi", "max_output_tokens": 20}),
        )
        .await;
    assert_eq!(responses.status, 200, "{}", responses.text);
    assert_eq!(responses.model_header.as_deref(), Some("alpha/m1"));
    assert!(
        responses.text.contains("Hello from m1!"),
        "{}",
        responses.text
    );
    let records = gateway.records().await;
    let models: Vec<&str> = records
        .iter()
        .map(|record| record["model"].as_str().unwrap())
        .collect();
    assert_eq!(models, ["alpha/m1", "alpha/pricey"]);
}

#[tokio::test]
async fn the_models_list_shows_the_names_of_each_model() {
    let gateway = start(json!({})).await;
    let list: Value = reqwest::Client::new()
        .get(format!("http://{}/api/v1/models", gateway.address))
        .bearer_auth(&gateway.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let aliases = |id: &str| {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|model| model["id"] == id)
            .unwrap_or_else(|| panic!("{id} not in {list}"))["aliases"]
            .clone()
    };
    assert_eq!(aliases("alpha/m1"), json!(["m1"]));
    assert_eq!(aliases("alpha/pricey"), json!(["opus", "pricey"]));
    assert_eq!(aliases("beta/claude-x"), json!(["claude-x"]));
}

#[tokio::test]
async fn without_a_default_provider_an_unknown_bare_id_is_400_naming_the_aliases() {
    let gateway = start(json!({"default_provider": null})).await;
    let reply = gateway.chat("m1").await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("model aliases") && message.contains("opus, claude-*"),
        "{message}"
    );
    assert_eq!(reply.body["error"]["metadata"]["param"], "model");
    // Refused before anything counted.
    assert_eq!(gateway.balance_nanos().await, 100 * NANOS_PER_CREDIT);
    assert_eq!(gateway.chat("claude-x").await.status, 200);
}
