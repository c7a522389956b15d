//! `examples/embed.rs` run as a user runs it: an axum service of its own
//! with the layers on one route, on a SQLite file, started twice.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use crate::common::examples::binary;
use crate::common::wait::{PATIENCE, wait_for};

/// The example running as a process, killed when dropped.
struct Embedded {
    child: Child,
    address: String,
    /// What it printed before its address.
    printed: Vec<String>,
}

impl Embedded {
    fn start(store: &str, imported_key: &str) -> Embedded {
        let mut child = Command::new(binary("embed"))
            .env("MODELGATE_STORE", store)
            .env("EMBED_LISTEN", "127.0.0.1:0")
            .env("EMBED_IMPORTED_KEY", imported_key)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut printed = Vec::new();
        loop {
            let Some(Ok(line)) = lines.next() else {
                panic!("the example ended before it listened: {:?}", child.wait());
            };
            if let Some(address) = line.strip_prefix("listening on ") {
                return Embedded {
                    child,
                    address: address.to_owned(),
                    printed,
                };
            }
            printed.push(line);
        }
    }

    fn key_shown(&self) -> Option<String> {
        self.printed
            .iter()
            .find_map(|line| line.strip_prefix("key (shown once): "))
            .map(str::to_owned)
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn chat(
    client: &reqwest::Client,
    service: &Embedded,
    key: &str,
    model: &str,
) -> reqwest::Response {
    client
        .post(format!("{}/v1/chat/completions", service.address))
        .bearer_auth(key)
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "Hi there"}]}))
        .send()
        .await
        .unwrap()
}

async fn get_json(client: &reqwest::Client, url: String, key: &str) -> Value {
    let response = client.get(url).bearer_auth(key).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

#[tokio::test]
async fn an_axum_service_gates_its_model_route_on_its_own_terms_and_a_restart_mints_nothing() {
    let directory = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", directory.path().join("embed.db").display());
    let imported = "sk-acme-issued-long-before-modelgate-0001";
    let client = reqwest::Client::new();

    let first = Embedded::start(&store, imported);
    let key = first.key_shown().expect("the first start shows its key");

    // The service's own route: a bad key does not reach it, nothing reads one.
    let hello = client
        .get(format!("{}/hello", first.address))
        .bearer_auth("not-a-key")
        .send()
        .await
        .unwrap();
    assert_eq!(hello.status(), 200);
    assert_eq!(hello.text().await.unwrap(), "hello");

    // A bad key on the gated route: the service's realm and words.
    let refused = chat(&client, &first, "sk-acme-unknown", "gpt-4o-mini").await;
    assert_eq!(refused.status(), 401);
    assert!(
        refused.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .contains("realm=\"acme\"")
    );
    let refused: Value = refused.json().await.unwrap();
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(!message.contains("modelgate"), "{message}");

    // A bare id the client sends is the aliased model: priced and recorded so.
    let balance_before =
        get_json(&client, format!("{}/billing/credits", first.address), &key).await;
    assert_eq!(balance_before["data"]["total_credits"], json!(10));
    let answered = chat(&client, &first, &key, "gpt-4o-mini").await;
    assert_eq!(answered.status(), 200);
    let answered: Value = answered.json().await.unwrap();
    assert_eq!(answered["model"], "openai/gpt-4o-mini");
    // Another bare id goes to the default provider, at the default price.
    assert_eq!(chat(&client, &first, &key, "small").await.status(), 200);
    // A key the service issued before, known by its hash alone.
    let by_imported = chat(&client, &first, imported, "claude-sonnet").await;
    assert_eq!(by_imported.status(), 200);
    let by_imported: Value = by_imported.json().await.unwrap();
    assert_eq!(by_imported["model"], "anthropic/claude-sonnet");

    // The service's own refusal passes as written and is charged nothing.
    let own = chat(&client, &first, &key, "gpt-4o-mini:unsupported").await;
    assert_eq!(own.status(), 422);
    assert_eq!(
        own.json::<Value>().await.unwrap(),
        json!({"detail": "this service does not run that variant"})
    );
    // Another method on the route is axum's 405, before any layer.
    let wrong_method = client
        .get(format!("{}/v1/chat/completions", first.address))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);

    // Each answered call charged exactly its usage: "Hi there" is 8
    // characters, 2 prompt tokens, and 1 completion token; a price per
    // million tokens in credits is that many thousand nano-credits a token.
    let spent = |prompt_per_million: i64, completion_per_million: i64| {
        (2 * prompt_per_million + completion_per_million) * 1_000
    };
    let spent_nanos = spent(150, 600) + 2 * spent(1000, 1000);
    let models_recorded = |records: Value| -> Vec<String> {
        let mut models: Vec<String> = records["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|record| record["model"].as_str().unwrap().to_owned())
            .collect();
        models.sort();
        models
    };
    let generations = format!("{}/billing/generations", first.address);
    // The refused call reached the handler: it has its record, at no cost.
    // Its settlement may wait a moment for an admission to ride on.
    let expected_models = [
        "acme/gpt-4o-mini:unsupported",
        "acme/small",
        "openai/gpt-4o-mini",
    ];
    let own_records = wait_for(PATIENCE, || async {
        let records = get_json(&client, generations.clone(), &key).await;
        let models = models_recorded(records.clone());
        if models == expected_models {
            Ok(records)
        } else {
            Err(format!("records of {models:?}"))
        }
    })
    .await;
    let refused_record = own_records["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|record| record["status"] == 422)
        .expect("the handler's 422 is recorded");
    assert_eq!(refused_record["total_cost"], json!(0), "{refused_record}");
    assert_eq!(
        models_recorded(get_json(&client, generations, imported).await),
        ["anthropic/claude-sonnet"]
    );
    let usage_nanos =
        |credits: &Value| (credits["data"]["total_usage"].as_f64().unwrap() * 1e9).round() as i64;
    crate::common::wait::wait_until(
        crate::common::wait::PATIENCE,
        "the three calls settled",
        || async {
            let credits =
                get_json(&client, format!("{}/billing/credits", first.address), &key).await;
            usage_nanos(&credits) == spent_nanos
        },
    )
    .await;
    drop(first);

    // A restart on the same file: no new key, no second grant, the old keys live.
    let second = Embedded::start(&store, imported);
    assert_eq!(second.key_shown(), None, "{:?}", second.printed);
    assert!(
        second
            .printed
            .iter()
            .any(|line| line == "key: made at an earlier start")
    );
    let credits = get_json(&client, format!("{}/billing/credits", second.address), &key).await;
    assert_eq!(credits["data"]["total_credits"], json!(10));
    assert_eq!(usage_nanos(&credits), spent_nanos);
    assert_eq!(
        chat(&client, &second, imported, "gpt-4o-mini")
            .await
            .status(),
        200
    );
}
