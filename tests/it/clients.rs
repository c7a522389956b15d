//! Real clients against the real proxy: the OpenAI and Anthropic Python
//! SDKs (the scripts in `tests/clients/`, run with the venv that
//! `scripts/clients.sh` installs) and Claude Code headless, each through
//! the proxy example running as a process in front of the mock upstream;
//! and the mock's directives, which give an agent a tool turn it can
//! finish.
//!
//! The clients live in `$MODELGATE_CLIENTS_DIR` (`scripts/test.sh` sets
//! it), else in `target/clients`; a test that needs one fails, naming
//! `scripts/clients.sh`, when it is missing.

use crate::common;
use crate::mock;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::examples::{ProxyProcess, binary};
use common::wait::{PATIENCE, wait_for};
use serde_json::{Value, json};

/// The longest a client's whole run may take: far past what it takes on a
/// loaded machine, so that only a client that hangs fails.
const CLIENT_PATIENCE: Duration = Duration::from_secs(240);

/// Where `scripts/clients.sh` installed the clients.
fn clients_dir() -> PathBuf {
    std::env::var_os("MODELGATE_CLIENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/clients"))
}

/// The installed client at `relative` in the clients' folder.
fn client(relative: &str) -> PathBuf {
    let path = clients_dir().join(relative);
    assert!(
        path.exists(),
        "{} is missing: run scripts/clients.sh to install the clients (or set MODELGATE_CLIENTS_DIR to where it installed them)",
        path.display()
    );
    path
}

fn python() -> PathBuf {
    client("venv/bin/python")
}

fn claude_code() -> PathBuf {
    client("node_modules/@anthropic-ai/claude-code-linux-x64/claude")
}

/// Runs `command` to its end (within [`CLIENT_PATIENCE`]); its status, stdout and stderr.
async fn run(mut command: tokio::process::Command) -> (bool, String, String) {
    command
        .kill_on_drop(true)
        .stdin(std::process::Stdio::null());
    let output = tokio::time::timeout(CLIENT_PATIENCE, command.output())
        .await
        .unwrap_or_else(|_| panic!("{command:?} did not end within {CLIENT_PATIENCE:?}"))
        .unwrap_or_else(|error| panic!("{command:?} did not start: {error}"));
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs the script `tests/clients/<name>` with `env` (and nothing else of
/// this process's environment: no stray `ANTHROPIC_API_KEY`); the JSON it
/// printed last.
async fn script(name: &str, env: &[(&str, &str)]) -> Value {
    let home = tempfile::tempdir().unwrap();
    let mut command = tokio::process::Command::new(python());
    command
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/clients")
                .join(name),
        )
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .envs(env.iter().copied());
    let (success, stdout, stderr) = run(command).await;
    assert!(success, "{name} failed:\n{stderr}\n{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|_| panic!("{name} printed no JSON: {stdout}"))
}

/// The proxy example as a process, configured with `config`, and its
/// operator's key.
struct Gateway {
    proxy: ProxyProcess,
    admin: String,
    _config: tempfile::TempDir,
}

/// The gateway's config: `openai` and `chatonly` serve chat only (the
/// gateway translates Messages for them), `native` (with `native`) the
/// Messages API too; every model at one price.
fn config(mock: &str, native: bool) -> Value {
    let mut config = json!({
        "providers": {
            "chatonly": {"base_url": mock},
            "openai": {"base_url": mock},
        },
        "pricing": {"default": {"prompt_per_million": 1, "completion_per_million": 2}},
        "retry": {"max_attempts": 1},
    });
    if native {
        config["providers"]["native"] = json!({"base_url": mock, "apis": ["chat", "messages"]});
    }
    config
}

impl Gateway {
    async fn start(config: Value) -> Gateway {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("gateway.json");
        std::fs::write(&path, config.to_string()).unwrap();
        let admin = modelgate::auth::ApiKey::generate().expose().to_owned();
        let mut command = std::process::Command::new(binary("proxy"));
        command
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .arg("--config")
            .arg(&path)
            .env("MODELGATE_ADMIN_KEY", &admin);
        Gateway {
            proxy: ProxyProcess::spawn(command),
            admin,
            _config: folder,
        }
    }

    /// `http://127.0.0.1:PORT`.
    fn address(&self) -> &str {
        &self.proxy.address
    }

    /// An API call with the operator's key; its answer, which must be a success.
    async fn api(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = reqwest::Client::new()
            .request(method, format!("{}{path}", self.address()))
            .bearer_auth(&self.admin);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let reply = request.send().await.unwrap();
        let status = reply.status();
        let text = reply.text().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Makes the account `id` with `credits`.
    async fn account(&self, id: &str, credits: u32) {
        self.api(
            reqwest::Method::POST,
            "/api/v1/accounts",
            Some(json!({ "id": id })),
        )
        .await;
        if credits > 0 {
            self.api(
                reqwest::Method::POST,
                &format!("/api/v1/accounts/{id}/credits"),
                Some(json!({ "amount": credits })),
            )
            .await;
        }
    }

    /// A new key as `fields` describe it (`account`, `rate_limit`, …).
    async fn key(&self, fields: Value) -> String {
        let mut body = json!({"name": "client"});
        body.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        let created = self
            .api(reqwest::Method::POST, "/api/v1/keys", Some(body))
            .await;
        created["key"].as_str().unwrap().to_owned()
    }

    /// The account's balance, in nano-credits.
    async fn balance_nanos(&self, account: &str) -> i64 {
        let answer = self
            .api(
                reqwest::Method::GET,
                &format!("/api/v1/accounts/{account}"),
                None,
            )
            .await;
        nanos(&answer["data"]["balance"])
    }

    /// The account's generation records (its newest 100).
    async fn records(&self, account: &str) -> Vec<Value> {
        let answer = self
            .api(
                reqwest::Method::GET,
                &format!("/api/v1/generations?limit=100&account={account}"),
                None,
            )
            .await;
        answer["data"].as_array().unwrap().clone()
    }

    /// Waits until the account's records hold every one of `ids` (settled:
    /// a record is written with its charge, a moment after the answer);
    /// then checks that the account's balance fell from `before` by
    /// exactly the records' `total_cost`. The records.
    async fn charged_as_recorded(&self, account: &str, before: i64, ids: &[&str]) -> Vec<Value> {
        let records = wait_for(PATIENCE, || async {
            let records = self.records(account).await;
            let missing: Vec<&&str> = ids
                .iter()
                .filter(|id| !records.iter().any(|record| record["id"] == **id))
                .collect();
            if missing.is_empty() {
                Ok(records)
            } else {
                Err(format!("no record yet of {missing:?} among {records:?}"))
            }
        })
        .await;
        let recorded: i64 = records
            .iter()
            .map(|record| nanos(&record["total_cost"]))
            .sum();
        let spent = before - self.balance_nanos(account).await;
        assert_eq!(spent, recorded, "{records:#?}");
        assert!(spent > 0, "the answered requests cost something");
        records
    }
}

/// Credits (a JSON number) in nano-credits.
fn nanos(credits: &Value) -> i64 {
    let credits = credits
        .as_f64()
        .unwrap_or_else(|| panic!("credits: {credits}"));
    (credits * 1e9).round() as i64
}

/// The generation ids a script collected, each one present.
fn generation_ids(out: &Value) -> Vec<&str> {
    out["generation_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| {
            id.as_str()
                .unwrap_or_else(|| panic!("an answer without X-Generation-Id: {out}"))
        })
        .collect()
}

/// A mock, a gateway in front of it, and the keys a script needs:
/// `acme` funded, `broke` without credits, `rated` funded for a key
/// whose own rate limit admits one request, and a key of acme's that may
/// call `other/*` only.
struct Setup {
    gateway: Gateway,
    key: String,
    broke: String,
    limited: String,
    forbidden: String,
    /// acme's balance before the script, in nano-credits.
    before: i64,
}

/// [`Setup`], with the provider `native` serving Messages when `native`.
async fn setup(native: bool) -> Setup {
    let mock = mock::start(mock::MockConfig::default()).await;
    let gateway = Gateway::start(config(&mock, native)).await;
    gateway.account("acme", 100).await;
    gateway.account("broke", 0).await;
    gateway.account("rated", 100).await;
    let key = gateway.key(json!({"account": "acme"})).await;
    let broke = gateway.key(json!({"account": "broke"})).await;
    let limited = gateway
        .key(json!({"account": "rated", "rate_limit": {"requests": 1, "window_seconds": 3600}}))
        .await;
    let forbidden = gateway
        .key(json!({"account": "acme", "allowed_models": ["other/"]}))
        .await;
    let before = gateway.balance_nanos("acme").await;
    Setup {
        gateway,
        key,
        broke,
        limited,
        forbidden,
        before,
    }
}

/// What the SDK raised for the refusal `status`.
fn raised<'a>(errors: &'a Value, status: &str) -> &'a Value {
    let error = &errors[status];
    assert!(error.is_object(), "no refusal {status} in {errors:#}");
    error
}

/// The mock's agent directives, straight to the mock (both APIs): a
/// `mock-tool:` directive calls the tool it names with its input, the
/// answer after the tool's result is text, and an agent's request
/// without a directive (or naming a tool not offered) is answered with
/// text instead of a call of the first tool.
#[tokio::test]
async fn the_mock_calls_the_tool_a_directive_names_and_answers_an_agent_with_text() {
    let base = mock::start(mock::MockConfig::default()).await;
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        client
            .post(format!("{base}/{path}"))
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
    };
    let directive = r#"Weather, please. mock-tool: get_weather {"city": "Paris"} thanks"#;

    // Chat.
    let tools = json!([
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    ]);
    let chat = |model: &str, messages: Value| json!({"model": model, "max_tokens": 32, "tools": tools, "messages": messages});
    let asked = json!([{"role": "user", "content": [{"type": "text", "text": directive}]}]);
    let answer: Value = post("chat/completions", chat("a/b", asked.clone()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{answer}");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    let mut streamed = chat("a/b", asked.clone());
    streamed["stream"] = json!(true);
    let text = post("chat/completions", streamed)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#""arguments":"{\"city\":\"Paris\"}""#),
        "{text}"
    );
    // The tool's result back (a system message after it): text.
    let mut answered = asked.as_array().unwrap().clone();
    answered.push(choice["message"].clone());
    answered.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "sunny"}));
    answered.push(json!({"role": "system", "content": "Be brief."}));
    let after: Value = post("chat/completions", chat("a/b", json!(answered)))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(after["choices"][0]["finish_reason"], "stop", "{after}");
    assert!(
        after["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .ends_with("You said: sunny"),
        "{after}"
    );
    // Without a directive, the first tool, then text once its result is back.
    let undirected = json!([{"role": "user", "content": "Weather?"}]);
    let first: Value = post("chat/completions", chat("a/b", undirected.clone()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let call = &first["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_time", "{first}");
    let mut answered = undirected.as_array().unwrap().clone();
    answered.push(first["choices"][0]["message"].clone());
    answered.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "noon"}));
    let after: Value = post("chat/completions", chat("a/b", json!(answered)))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(after["choices"][0]["finish_reason"], "stop", "{after}");
    // An agent without a directive, and a directive naming no offered tool: text.
    for (model, text) in [("a/agent", "Say hi"), ("a/b", "mock-tool: Bash {}")] {
        let plain: Value = post(
            "chat/completions",
            chat(model, json!([{"role": "user", "content": text}])),
        )
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        assert_eq!(plain["choices"][0]["finish_reason"], "stop", "{plain}");
    }

    // Messages, as Claude Code sends them: the prompt among the user's
    // blocks, a system message last.
    let tools = json!([
        {"name": "get_time", "input_schema": {"type": "object"}},
        {"name": "get_weather", "input_schema": {"type": "object"}},
    ]);
    let messages = |model: &str, messages: Value| json!({"model": model, "max_tokens": 32, "tools": tools, "messages": messages});
    let asked = json!([
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                     {"type": "text", "text": directive}]},
        {"role": "system", "content": "Environment: a test."},
    ]);
    let call: Value = post("messages", messages("a/agent", asked.clone()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(call["stop_reason"], "tool_use", "{call}");
    let block = &call["content"][0];
    assert_eq!(block["name"], "get_weather", "{call}");
    assert_eq!(block["input"], json!({"city": "Paris"}));
    let mut streamed = messages("a/agent", asked.clone());
    streamed["stream"] = json!(true);
    let text = post("messages", streamed)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#""partial_json":"{\"city\":\"Paris\"}""#),
        "{text}"
    );
    let mut answered = asked.as_array().unwrap()[..1].to_vec();
    answered.push(json!({"role": "assistant", "content": [block]}));
    answered.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": block["id"], "content": "sunny"},
        {"type": "text", "text": "Done?"}]}));
    answered.push(json!({"role": "system", "content": "Environment: a test."}));
    let after: Value = post("messages", messages("a/agent", json!(answered)))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(after["stop_reason"], "end_turn", "{after}");
    assert_eq!(
        after["content"][0]["text"],
        "Hello from a/agent! You said: Done?"
    );
    let plain: Value = post(
        "messages",
        messages("a/agent", json!([{"role": "user", "content": "Say hi"}])),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(plain["stop_reason"], "end_turn", "{plain}");
}

/// The OpenAI Python SDK on the chat route: a completion, a stream with
/// its usage in a last chunk, a tool call and the turn with its result;
/// each refusal raised as the SDK's class for it; and the account charged
/// exactly what its records say, refusals nothing.
#[tokio::test]
async fn the_openai_sdk_chats_streams_calls_a_tool_and_raises_each_refusal() {
    let setup = setup(false).await;
    let base = format!("{}/api/v1", setup.gateway.address());
    let out = script(
        "openai_chat.py",
        &[
            ("MODELGATE_BASE_URL", &base),
            ("MODELGATE_MODEL", "openai/gpt-4o-mini"),
            ("MODELGATE_KEY", &setup.key),
            ("MODELGATE_BROKE_KEY", &setup.broke),
            ("MODELGATE_LIMITED_KEY", &setup.limited),
        ],
    )
    .await;

    let create = &out["create"];
    assert_eq!(
        create["text"], "Hello from gpt-4o-mini! You said: Hi there",
        "{out:#}"
    );
    assert_eq!(create["model"], "openai/gpt-4o-mini");
    assert_eq!(create["finish_reason"], "stop");
    assert!(create["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    let stream = &out["stream"];
    assert_eq!(stream["text"], create["text"], "{out:#}");
    assert_eq!(stream["usage_chunks"], 1, "usage in one last chunk");
    assert_eq!(stream["usage"], create["usage"]);
    let tool = &out["tool"];
    assert_eq!(tool["finish_reason"], "tool_calls", "{out:#}");
    assert_eq!(tool["name"], "get_weather");
    assert_eq!(tool["arguments"], json!({"city": "Paris"}));
    assert_eq!(tool["after_finish_reason"], "stop");
    assert!(
        tool["after_text"]
            .as_str()
            .unwrap()
            .ends_with("You said: sunny, 21 C"),
        "{out:#}"
    );

    let errors = &out["errors"];
    for (status, class) in [
        ("401", "AuthenticationError"),
        ("402", "APIStatusError"),
        ("429", "RateLimitError"),
        ("400", "BadRequestError"),
    ] {
        let error = raised(errors, status);
        assert_eq!(error["class"], class, "{status}: {error:#}");
        assert_eq!(error["status"].to_string(), status, "{error:#}");
    }
    assert_eq!(
        raised(errors, "402")["body"]["metadata"]["limit_source"],
        "credits"
    );
    assert_eq!(
        raised(errors, "429")["body"]["metadata"]["limit_source"],
        "key"
    );

    // Four answers, four records; the refused request of acme's key (400)
    // made none and cost nothing.
    let ids = generation_ids(&out);
    assert_eq!(ids.len(), 4);
    let records = setup
        .gateway
        .charged_as_recorded("acme", setup.before, &ids)
        .await;
    assert_eq!(records.len(), 4, "{records:#?}");
}

/// The Anthropic Python SDK on `/api/v1/messages`, with the key as
/// `x-api-key` and as `Authorization: Bearer`: a message, a stream with
/// its final usage, a tool turn and its result, `count_tokens`, and each
/// refusal raised as the SDK's class for it, in Anthropic's error shape.
#[tokio::test]
async fn the_anthropic_sdk_speaks_messages_through_the_gateway_with_either_header() {
    let setup = setup(true).await;
    let base = format!("{}/api", setup.gateway.address());
    let out = script(
        "anthropic_messages.py",
        &[
            ("MODELGATE_BASE_URL", &base),
            ("MODELGATE_MODEL", "native/claude"),
            ("MODELGATE_MISSING_MODEL", "native/status-404"),
            ("MODELGATE_KEY", &setup.key),
            ("MODELGATE_BROKE_KEY", &setup.broke),
            ("MODELGATE_LIMITED_KEY", &setup.limited),
            ("MODELGATE_FORBIDDEN_KEY", &setup.forbidden),
        ],
    )
    .await;
    for auth in ["api_key", "auth_token"] {
        let run = &out[auth];
        let create = &run["create"];
        assert_eq!(
            create["text"], "Hello from claude! You said: Hi there",
            "{auth}: {out:#}"
        );
        assert_eq!(create["stop_reason"], "end_turn");
        assert!(create["usage"]["input_tokens"].as_u64().unwrap() > 0);
        assert!(create["usage"]["output_tokens"].as_u64().unwrap() > 0);
        let stream = &run["stream"];
        assert_eq!(stream["text"], create["text"], "{auth}: {out:#}");
        assert_eq!(stream["stop_reason"], "end_turn");
        assert_eq!(
            stream["usage"]["output_tokens"], create["usage"]["output_tokens"],
            "{auth}: the final usage"
        );
        let tool = &run["tool"];
        assert_eq!(tool["stop_reason"], "tool_use", "{auth}: {out:#}");
        assert_eq!(tool["name"], "get_weather");
        assert_eq!(tool["input"], json!({"city": "Paris"}));
        assert_eq!(tool["after_stop_reason"], "end_turn");
        assert!(run["count_tokens"].as_u64().unwrap() > 0, "{auth}: {out:#}");

        let errors = &run["errors"];
        for (status, class, kind) in [
            ("401", "AuthenticationError", "authentication_error"),
            // This SDK's own subclass of APIStatusError for 402.
            ("402", "PaymentRequiredError", "billing_error"),
            ("403", "PermissionDeniedError", "permission_error"),
            ("404", "NotFoundError", "not_found_error"),
            ("429", "RateLimitError", "rate_limit_error"),
            ("400", "BadRequestError", "invalid_request_error"),
        ] {
            let error = raised(errors, status);
            assert_eq!(error["class"], class, "{auth} {status}: {error:#}");
            assert_eq!(error["status"].to_string(), status, "{error:#}");
            assert_eq!(error["body"]["type"], "error", "{error:#}");
            // The upstream's own 404 passes as it is; the gateway's refusals
            // have Anthropic's type for their status.
            if status != "404" {
                assert_eq!(error["body"]["error"]["type"], kind, "{auth}: {error:#}");
            }
        }
    }
    let ids = generation_ids(&out);
    assert_eq!(ids.len(), 8);
    setup
        .gateway
        .charged_as_recorded("acme", setup.before, &ids)
        .await;
}

/// Claude Code headless (`claude -p`) through the gateway as `model`: a
/// plain prompt whose answer it prints, then a turn where the model calls
/// its `Write` tool and Claude Code writes the file and sends the result
/// back (the mock's text answer comes only after that result). `bearer`
/// sends the key as `Authorization: Bearer`, else as `x-api-key`.
async fn claude_code_through_the_gateway(model: &str, bearer: bool) {
    let setup = setup(model.starts_with("native/")).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let claude = |prompt: String| {
        let mut command = tokio::process::Command::new(claude_code());
        command
            .args(["-p", &prompt, "--permission-mode", "acceptEdits"])
            .current_dir(work.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("DISABLE_TELEMETRY", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env(
                "ANTHROPIC_BASE_URL",
                format!("{}/api", setup.gateway.address()),
            )
            .env("ANTHROPIC_MODEL", model)
            .env("ANTHROPIC_SMALL_FAST_MODEL", model);
        if bearer {
            command
                .env("ANTHROPIC_AUTH_TOKEN", &setup.key)
                .env("ANTHROPIC_API_KEY", "");
        } else {
            command
                .env("ANTHROPIC_API_KEY", &setup.key)
                .env("ANTHROPIC_AUTH_TOKEN", "");
        }
        run(command)
    };
    let served_as = model.rsplit('/').next().unwrap();

    let (success, stdout, stderr) = claude("Say hello to the gateway.".to_owned()).await;
    assert!(success, "claude -p failed:\n{stderr}\n{stdout}");
    assert!(
        stdout.starts_with(&format!("Hello from {served_as}! You said: "))
            && stdout.contains("Say hello to the gateway."),
        "{stdout}\n{stderr}"
    );

    let file = work.path().join("hello.txt");
    let input = json!({"file_path": file, "content": "written through the gateway\n"});
    let (success, stdout, stderr) =
        claude(format!("Write the file. mock-tool: Write {input}")).await;
    assert!(success, "claude -p failed:\n{stderr}\n{stdout}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap_or_else(|error| panic!(
            "Claude Code wrote no {}: {error}\n{stdout}\n{stderr}",
            file.display()
        )),
        "written through the gateway\n"
    );
    assert!(
        stdout.starts_with(&format!("Hello from {served_as}! You said:")),
        "the answer after the tool's result: {stdout}\n{stderr}"
    );

    // At least the three requests above (the prompt; the call, then its
    // result), charged as their records say.
    let records = wait_for(PATIENCE, || async {
        let records = setup.gateway.records("acme").await;
        if records.len() >= 3 {
            Ok(records)
        } else {
            Err(format!("fewer than 3 records: {records:#?}"))
        }
    })
    .await;
    let ids: Vec<&str> = records
        .iter()
        .map(|record| record["id"].as_str().unwrap())
        .collect();
    setup
        .gateway
        .charged_as_recorded("acme", setup.before, &ids)
        .await;
}

/// Claude Code to a provider that serves the Messages API itself.
#[tokio::test]
async fn claude_code_writes_a_file_through_a_provider_serving_messages() {
    claude_code_through_the_gateway("native/agent", true).await;
}

/// Claude Code to a chat-only provider: the gateway translates.
#[tokio::test]
async fn claude_code_writes_a_file_through_a_chat_only_provider() {
    claude_code_through_the_gateway("chatonly/agent", false).await;
}
