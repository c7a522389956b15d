//! Real clients against the real proxy: the OpenAI and Anthropic Python
//! SDKs (the scripts in `tests/clients/`, run with the venv that
//! `scripts/clients.sh` installs), Claude Code and Codex headless, each
//! through the proxy example running as a process in front of the mock
//! upstream; and the mock itself: its directives, which give an agent a
//! tool turn it can finish, and its Responses API and embeddings, checked
//! with the same clients straight against it.
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

fn codex() -> PathBuf {
    client("node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex")
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
    setup_with(|mock| config(mock, native)).await
}

/// [`Setup`], the gateway configured with `config(mock's URL)`.
async fn setup_with(config: impl FnOnce(&str) -> Value) -> Setup {
    let mock = mock::start(mock::MockConfig::default()).await;
    let gateway = Gateway::start(config(&mock)).await;
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

/// The data of each event of an SSE `text`, checking that each names its
/// `type` in its `event:` line and that their `sequence_number`s count
/// from 0.
fn responses_events(text: &str) -> Vec<Value> {
    let events: Vec<Value> = text
        .split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .map(|event| {
            let (kind, data) = event
                .strip_prefix("event: ")
                .and_then(|rest| rest.split_once("\ndata: "))
                .unwrap_or_else(|| panic!("an event without `event:` then `data:`: {event:?}"));
            let data: Value = serde_json::from_str(data).unwrap();
            assert_eq!(data["type"], kind, "{event}");
            data
        })
        .collect();
    for (at, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], at, "{text}");
    }
    events
}

/// The mock's Responses API and embeddings, straight to the mock: a
/// response object with its usage (cache reads with `prompt_cache_key`,
/// reasoning with `reasoning`), streamed as OpenAI's events; a directive's
/// function call, then text once its output is back; an agent's request
/// answered with text; what needs a stored response refused 400; and
/// deterministic unit vectors, as numbers or base64.
#[tokio::test]
async fn the_mock_answers_the_responses_api_and_embeddings_as_openai() {
    let base = mock::start(mock::MockConfig::default()).await;
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        let request = client.post(format!("{base}/{path}")).json(&body);
        async move {
            let reply = request.send().await.unwrap();
            let status = reply.status().as_u16();
            (status, reply.text().await.unwrap())
        }
    };
    let json_of = |(status, text): (u16, String)| {
        assert_eq!(status, 200, "{text}");
        serde_json::from_str::<Value>(&text).unwrap()
    };

    // Text, with the usage a cache key and reasoning make.
    let answer = json_of(
        post(
            "responses",
            json!({"model": "a/b", "input": "Hi there, how are you today?",
                   "prompt_cache_key": "k", "reasoning": {"effort": "low"}}),
        )
        .await,
    );
    assert_eq!(answer["object"], "response", "{answer}");
    assert_eq!(answer["status"], "completed");
    assert!(answer["id"].as_str().unwrap().starts_with("resp_"));
    let message = &answer["output"][0];
    assert_eq!(message["type"], "message", "{answer}");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["content"][0]["type"], "output_text");
    assert_eq!(
        message["content"][0]["text"],
        "Hello from a/b! You said: Hi there, how are you today?"
    );
    let usage = &answer["usage"];
    let input = usage["input_tokens"].as_u64().unwrap();
    assert_eq!(
        input,
        "Hi there, how are you today?".len().div_ceil(4) as u64
    );
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], input / 2);
    assert_eq!(usage["output_tokens"], 11, "a token a word");
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 5);
    assert_eq!(usage["total_tokens"], input + 11);
    // Neither without a cache key or reasoning; the words within the bound.
    let plain = json_of(
        post(
            "responses",
            json!({"model": "a/b", "input": "Hi there, how are you today?", "max_output_tokens": 16}),
        )
        .await,
    );
    assert_eq!(plain["usage"]["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        plain["usage"]["output_tokens_details"]["reasoning_tokens"],
        0
    );
    assert_eq!(plain["max_output_tokens"], 16);

    // Streamed: OpenAI's events in order, the text in deltas, the usage last.
    let (status, text) = post(
        "responses",
        json!({"model": "a/b", "input": "Hi there", "stream": true}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let events = responses_events(&text);
    let kinds: Vec<&str> = events
        .iter()
        .map(|event| event["type"].as_str().unwrap())
        .collect();
    let deltas = kinds
        .iter()
        .filter(|kind| **kind == "response.output_text.delta")
        .count();
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(kinds, expected);
    assert_eq!(events[0]["response"]["status"], "in_progress");
    assert_eq!(events[0]["response"]["usage"], Value::Null);
    let streamed: String = events
        .iter()
        .filter_map(|event| event["delta"].as_str())
        .collect();
    assert_eq!(streamed, "Hello from a/b! You said: Hi there");
    let last = events.last().unwrap();
    assert_eq!(last["response"]["status"], "completed");
    assert_eq!(
        last["response"]["output"][0]["content"][0]["text"],
        streamed
    );
    assert_eq!(last["response"]["usage"]["output_tokens"], 7, "{last}");

    // A directive's call, streamed and not, then text after its output.
    let tools = json!([
        {"type": "function", "name": "get_time", "parameters": {"type": "object"}},
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
    ]);
    let asked = json!([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": r#"Weather, please. mock-tool: get_weather {"city": "Paris"}"#}]},
    ]);
    let request = |input: &Value| json!({"model": "a/b", "tools": tools, "input": input});
    let called = json_of(post("responses", request(&asked)).await);
    let call = &called["output"][0];
    assert_eq!(call["type"], "function_call", "{called}");
    assert_eq!(call["name"], "get_weather");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    let mut streamed = request(&asked);
    streamed["stream"] = json!(true);
    let (_, text) = post("responses", streamed).await;
    let events = responses_events(&text);
    let arguments_done = events
        .iter()
        .find(|event| event["type"] == "response.function_call_arguments.done")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(arguments_done["arguments"], call["arguments"]);
    assert_eq!(
        events.last().unwrap()["response"]["output"][0]["call_id"]
            .as_str()
            .map(|id| id.starts_with("call_")),
        Some(true),
        "{text}"
    );
    let mut answered = asked.as_array().unwrap().clone();
    answered.push(call.clone());
    answered.push(
        json!({"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}),
    );
    let after = json_of(post("responses", request(&json!(answered))).await);
    assert_eq!(after["output"][0]["type"], "message", "{after}");
    assert_eq!(
        after["output"][0]["content"][0]["text"],
        "Hello from a/b! You said: sunny"
    );
    // Without a directive the first function, for anyone but an agent.
    let undirected = json!([{"role": "user", "content": "Weather?"}]);
    let first = json_of(post("responses", request(&undirected)).await);
    assert_eq!(first["output"][0]["name"], "get_time", "{first}");
    let mut agent = request(&undirected);
    agent["model"] = json!("a/agent");
    let text = json_of(post("responses", agent).await);
    assert_eq!(text["output"][0]["type"], "message", "{text}");

    // What would need a stored response; a status asked for.
    for (field, value) in [
        ("store", json!(true)),
        ("previous_response_id", json!("resp_1")),
    ] {
        let mut body = json!({"model": "a/b", "input": "Hi"});
        body[field] = value;
        let (status, text) = post("responses", body).await;
        assert_eq!(status, 400, "{field}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["error"]["param"], field, "{text}");
    }
    let (status, _) = post(
        "responses",
        json!({"model": "a/b", "input": "Hi", "store": false}),
    )
    .await;
    assert_eq!(status, 200, "store: false is stateless");
    let (status, _) = post("responses", json!({"model": "a/status-429", "input": "Hi"})).await;
    assert_eq!(status, 429);

    // Embeddings: one per input, in order, of unit length, the same
    // vector for the same input, `dimensions` long (8 by default).
    let embed = |body: Value| async { json_of(post("embeddings", body).await) };
    let both =
        embed(json!({"model": "a/e", "input": ["The food was delicious", "and the waiter..."]}))
            .await;
    assert_eq!(both["object"], "list", "{both}");
    assert_eq!(both["model"], "a/e");
    let vectors: Vec<Vec<f64>> = both["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(index, item)| {
            assert_eq!(item["object"], "embedding");
            assert_eq!(item["index"], index);
            serde_json::from_value(item["embedding"].clone()).unwrap()
        })
        .collect();
    assert_eq!(vectors.len(), 2);
    for vector in &vectors {
        assert_eq!(vector.len(), 8);
        let length: f64 = vector.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((length - 1.0).abs() < 1e-5, "{vector:?}");
    }
    assert_ne!(vectors[0], vectors[1]);
    assert_eq!(both["usage"]["prompt_tokens"], 6 + 5, "{both}");
    assert_eq!(both["usage"]["total_tokens"], 6 + 5);
    let one = embed(json!({"model": "a/e", "input": "The food was delicious"})).await;
    assert_eq!(one["data"][0]["embedding"], both["data"][0]["embedding"]);
    let other = embed(json!({"model": "a/f", "input": "The food was delicious"})).await;
    assert_ne!(other["data"][0]["embedding"], one["data"][0]["embedding"]);
    let short =
        embed(json!({"model": "a/e", "input": "The food was delicious", "dimensions": 3})).await;
    assert_eq!(short["data"][0]["embedding"].as_array().unwrap().len(), 3);
    let tokens = embed(json!({"model": "a/e", "input": [[1, 2, 3], [4]]})).await;
    assert_eq!(tokens["usage"]["prompt_tokens"], 4, "{tokens}");
    // base64: the little-endian f32s of the same vector.
    let encoded = embed(
        json!({"model": "a/e", "input": "The food was delicious", "encoding_format": "base64"}),
    )
    .await;
    let bytes = base64_decode(encoded["data"][0]["embedding"].as_str().unwrap());
    let decoded: Vec<f64> = bytes
        .chunks(4)
        .map(|chunk| f64::from(f32::from_le_bytes(chunk.try_into().unwrap())))
        .collect();
    assert_eq!(decoded.len(), 8);
    for (decoded, number) in decoded.iter().zip(&vectors[0]) {
        assert!((decoded - number).abs() < 1e-6, "{decoded} {number}");
    }
    for (body, param) in [
        (json!({"model": "a/e", "input": []}), "input"),
        (json!({"model": "a/e", "input": ""}), "input"),
        (
            json!({"model": "a/e", "input": "x", "dimensions": 0}),
            "dimensions",
        ),
        (
            json!({"model": "a/e", "input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
    ] {
        let (status, text) = post("embeddings", body).await;
        assert_eq!(status, 400, "{text}");
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap()["error"]["param"],
            param
        );
    }
}

/// Standard base64 (RFC 4648, padded) decoded: the test's own reading,
/// apart from the mock's encoder.
fn base64_decode(text: &str) -> Vec<u8> {
    let sextets: Vec<u32> = text
        .bytes()
        .filter(|byte| *byte != b'=')
        .map(|byte| match byte {
            b'A'..=b'Z' => u32::from(byte - b'A'),
            b'a'..=b'z' => u32::from(byte - b'a') + 26,
            b'0'..=b'9' => u32::from(byte - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {text}"),
        })
        .collect();
    let mut bytes = Vec::new();
    for group in sextets.chunks(4) {
        let bits = group
            .iter()
            .enumerate()
            .fold(0u32, |bits, (at, sextet)| bits | sextet << (18 - 6 * at));
        for at in 0..group.len() - 1 {
            bytes.push((bits >> (16 - 8 * at)) as u8);
        }
    }
    bytes
}

/// The gateway's config for the Responses API and embeddings: `native`
/// serves the Responses API itself, `chatonly` chat only (the gateway
/// translates), `openai` chat and embeddings (the default); every model
/// with a context length (Codex sends tools whose size the gateway cannot
/// measure, which only a context length bounds), and an embeddings model.
fn responses_config(mock: &str) -> Value {
    json!({
        "providers": {
            "native": {"base_url": mock, "apis": ["responses"]},
            "chatonly": {"base_url": mock, "apis": ["chat"]},
            "openai": {"base_url": mock},
        },
        "pricing": {
            "default": {"prompt_per_million": 1, "completion_per_million": 2, "context_length": 200_000},
            "models": {
                EMBEDDING_MODEL: {"prompt_per_million": 1, "completion_per_million": 0, "embeddings": true},
            },
        },
        "retry": {"max_attempts": 1},
    })
}

/// The embeddings model of [`responses_config`].
const EMBEDDING_MODEL: &str = "openai/text-embedding-3-small";

/// Runs `tests/clients/openai_responses.py` against `base` as `model`
/// (`extra`: the keys of the gateway's refusals) and checks what every
/// answer held: `served_as` is the model the upstream saw; `native` when
/// the upstream answered the Responses API itself (then its usage has
/// cache reads and reasoning, and its events are exactly OpenAI's).
async fn openai_responses_script(
    base: &str,
    model: &str,
    key: &str,
    extra: &[(&str, &str)],
    served_as: &str,
    native: bool,
) -> Value {
    let mut env = vec![
        ("MODELGATE_BASE_URL", base),
        ("MODELGATE_MODEL", model),
        ("MODELGATE_EMBEDDING_MODEL", EMBEDDING_MODEL),
        ("MODELGATE_KEY", key),
    ];
    env.extend_from_slice(extra);
    let out = script("openai_responses.py", &env).await;

    let hello = format!("Hello from {served_as}! You said: Hi there");
    let create = &out["create"];
    assert_eq!(create["text"], hello, "{out:#}");
    assert_eq!(create["status"], "completed");
    assert_eq!(create["model"], model);
    let usage = &create["usage"];
    let (input, output) = (
        usage["input_tokens"].as_u64().unwrap(),
        usage["output_tokens"].as_u64().unwrap(),
    );
    assert!(input > 0 && output > 0, "{out:#}");
    assert_eq!(usage["total_tokens"], input + output);

    let stream = &out["stream"];
    assert_eq!(stream["text"], hello, "{out:#}");
    let kinds: Vec<&str> = stream["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kind| kind.as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"response.created"), "{out:#}");
    assert_eq!(kinds.last(), Some(&"response.completed"), "{out:#}");
    for kind in [
        "response.output_item.added",
        "response.output_text.done",
        "response.output_item.done",
    ] {
        assert!(kinds.contains(&kind), "no {kind}: {out:#}");
    }
    let streamed = &stream["usage"];
    assert_eq!(streamed["output_tokens"], output, "{out:#}");
    if native {
        // The cache key and reasoning the streamed request sent.
        assert_eq!(
            streamed["input_tokens_details"]["cached_tokens"],
            streamed["input_tokens"].as_u64().unwrap() / 2,
            "{out:#}"
        );
        assert_eq!(
            streamed["output_tokens_details"]["reasoning_tokens"],
            output / 2
        );
    }
    let helper = &out["helper"];
    assert_eq!(helper["deltas"], hello, "{out:#}");
    assert_eq!(helper["text"], hello);
    assert_eq!(helper["usage"], create["usage"]);

    let tool = &out["tool"];
    assert_eq!(tool["types"], json!(["function_call"]), "{out:#}");
    assert_eq!(tool["name"], "get_weather");
    assert_eq!(tool["arguments"], json!({"city": "Paris"}));
    assert_eq!(tool["after_types"], json!(["message"]), "{out:#}");
    assert!(
        tool["after_text"]
            .as_str()
            .unwrap()
            .ends_with("You said: sunny, 21 C"),
        "{out:#}"
    );

    let embeddings = &out["embeddings"];
    let vectors = |name: &str| -> Vec<Vec<f64>> {
        serde_json::from_value(embeddings[name]["vectors"].clone())
            .unwrap_or_else(|_| panic!("{name}: {out:#}"))
    };
    let (one, list, float) = (vectors("one"), vectors("list"), vectors("float"));
    assert_eq!(one.len(), 1, "{out:#}");
    assert_eq!(one[0].len(), 8, "the mock's default dimensions");
    assert_eq!(list.len(), 2);
    assert!(list.iter().all(|vector| vector.len() == 4), "{out:#}");
    assert_eq!(embeddings["list"]["indexes"], json!([0, 1]));
    // As base64 (the SDK's default) and as numbers, the same vector.
    for (encoded, number) in one[0].iter().zip(&float[0]) {
        assert!((encoded - number).abs() < 1e-6, "{out:#}");
    }
    assert_eq!(embeddings["one"]["usage"]["prompt_tokens"], 6, "{out:#}");
    assert_eq!(embeddings["list"]["usage"]["prompt_tokens"], 6 + 5);
    assert_eq!(embeddings["one"]["model"], EMBEDDING_MODEL);

    let store = raised(&out["errors"], "400");
    assert_eq!(store["class"], "BadRequestError", "{store:#}");
    assert!(
        store["body"]["message"].as_str().unwrap().contains("store"),
        "{store:#}"
    );
    out
}

/// The OpenAI Python SDK and Codex straight to the mock (no gateway):
/// the clients take the mock's Responses API and embeddings as OpenAI's,
/// so that a failure through the gateway is the gateway's.
#[tokio::test]
async fn the_openai_sdk_and_codex_take_the_mocks_responses_as_openais() {
    let base = mock::start(mock::MockConfig::default()).await;
    let out = openai_responses_script(&base, "a/gpt", "sk-anything", &[], "a/gpt", true).await;
    assert_eq!(
        raised(&out["errors"], "400")["body"]["param"],
        "store",
        "{out:#}"
    );
    codex_turns(&base, "sk-anything", "a/agent", "a/agent").await;
}

/// The OpenAI Python SDK on `/api/v1/responses` and `/api/v1/embeddings`
/// as `model`: a response, streamed (events, and the SDK's stream helper),
/// a function call and the turn with its output, embeddings (one input, a
/// list, `dimensions`, base64 and floats); refusals raised as the SDK's
/// classes; the account charged exactly what its records say, each
/// record saying its API.
async fn the_openai_sdk_through_the_gateway(model: &str, native: bool) {
    let setup = setup_with(responses_config).await;
    let base = format!("{}/api/v1", setup.gateway.address());
    let out = openai_responses_script(
        &base,
        model,
        &setup.key,
        &[
            ("MODELGATE_BROKE_KEY", &setup.broke),
            ("MODELGATE_LIMITED_KEY", &setup.limited),
        ],
        model.rsplit('/').next().unwrap(),
        native,
    )
    .await;

    let errors = &out["errors"];
    // The gateway refuses `store` itself: the field named in its metadata.
    assert_eq!(
        raised(errors, "400")["body"]["metadata"]["param"],
        "store",
        "{errors:#}"
    );
    for (status, class) in [
        ("401", "AuthenticationError"),
        ("402", "APIStatusError"),
        ("429", "RateLimitError"),
        ("embeddings 402", "APIStatusError"),
    ] {
        let error = raised(errors, status);
        assert_eq!(error["class"], class, "{status}: {error:#}");
        assert!(status.ends_with(&error["status"].to_string()), "{error:#}");
    }
    assert_eq!(
        raised(errors, "402")["body"]["metadata"]["limit_source"],
        "credits"
    );
    assert_eq!(
        raised(errors, "429")["body"]["metadata"]["limit_source"],
        "key"
    );

    // Five responses and three embeddings answered, as many records; the
    // refused `store` made none and cost nothing.
    let ids = generation_ids(&out);
    assert_eq!(ids.len(), 8, "{out:#}");
    let records = setup
        .gateway
        .charged_as_recorded("acme", setup.before, &ids)
        .await;
    assert_eq!(records.len(), 8, "{records:#?}");
    for (at, id) in ids.iter().enumerate() {
        let record = records.iter().find(|record| record["id"] == *id).unwrap();
        let api = if at < 5 { "responses" } else { "embeddings" };
        assert_eq!(record["api"], api, "{record:#}");
    }
}

/// To a provider that serves the Responses API itself.
#[tokio::test]
async fn the_openai_sdk_speaks_responses_and_embeddings_to_a_responses_provider() {
    the_openai_sdk_through_the_gateway("native/gpt-5", true).await;
}

/// To a chat-only provider: the gateway translates the Responses API.
#[tokio::test]
async fn the_openai_sdk_speaks_responses_to_a_chat_only_provider() {
    the_openai_sdk_through_the_gateway("chatonly/gpt-5", false).await;
}

/// Codex headless (`codex exec`) against `base` (the gateway's `/api/v1`
/// or the mock's own) as `model`: a plain prompt whose answer it prints,
/// then a turn where the model calls `exec_command` (a directive) with a
/// command writing a file, Codex runs it in a throwaway folder and sends
/// its output back as a `function_call_output`, and prints the text the
/// mock answers only after it. `served_as` is the model the upstream saw.
async fn codex_turns(base: &str, key: &str, model: &str, served_as: &str) {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let codex_home = home.path().join("codex");
    std::fs::create_dir(&codex_home).unwrap();
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            "model = {model:?}\nmodel_provider = \"gateway\"\n\n[model_providers.gateway]\n\
             name = \"gateway\"\nbase_url = {base:?}\nenv_key = \"GATEWAY_KEY\"\nwire_api = \"responses\"\n"
        ),
    )
    .unwrap();
    let codex = |prompt: &str| {
        let mut command = tokio::process::Command::new(codex());
        command
            .args([
                "exec",
                "--skip-git-repo-check",
                // No sandbox: it needs namespaces a test machine may not give.
                "--dangerously-bypass-approvals-and-sandbox",
                prompt,
            ])
            .current_dir(work.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("CODEX_HOME", &codex_home)
            .env("GATEWAY_KEY", key);
        run(command)
    };

    let (success, stdout, stderr) = codex("Say hello to the gateway.").await;
    assert!(success, "codex exec failed:\n{stderr}\n{stdout}");
    assert_eq!(
        stdout.trim(),
        format!("Hello from {served_as}! You said: Say hello to the gateway."),
        "{stderr}"
    );

    let file = work.path().join("hello.txt");
    let input = json!({"cmd": format!("echo written through the gateway > '{}'", file.display())});
    let (success, stdout, stderr) =
        codex(&format!("Write the file. mock-tool: exec_command {input}")).await;
    assert!(success, "codex exec failed:\n{stderr}\n{stdout}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap_or_else(|error| panic!(
            "Codex wrote no {}: {error}\n{stdout}\n{stderr}",
            file.display()
        )),
        "written through the gateway\n"
    );
    // The text after the call's output, which names how the command ended.
    assert!(
        stdout.starts_with(&format!("Hello from {served_as}! You said:"))
            && stdout.contains("exited with code 0"),
        "the answer after the call's output: {stdout}\n{stderr}"
    );
}

/// Codex through the gateway as `model`: [`codex_turns`], then at least
/// its three requests (the prompt; the call, then its output) charged as
/// their records say, each a `responses` record.
async fn codex_through_the_gateway(model: &str) {
    let setup = setup_with(responses_config).await;
    let base = format!("{}/api/v1", setup.gateway.address());
    codex_turns(&base, &setup.key, model, model.rsplit('/').next().unwrap()).await;
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
    let records = setup
        .gateway
        .charged_as_recorded("acme", setup.before, &ids)
        .await;
    for record in &records {
        assert_eq!(record["api"], "responses", "{record:#}");
    }
}

/// Codex to a provider that serves the Responses API itself.
#[tokio::test]
async fn codex_runs_a_command_through_a_provider_serving_responses() {
    codex_through_the_gateway("native/agent").await;
}

/// Codex to a chat-only provider: the gateway translates.
#[tokio::test]
async fn codex_runs_a_command_through_a_chat_only_provider() {
    codex_through_the_gateway("chatonly/agent").await;
}

/// Claude Code and Codex with their own model names (no model override
/// for Claude Code; Codex as `gpt-5.5`) through a gateway whose
/// `model_aliases` send `claude-*` to `anthropic` (serving Messages) and
/// whose `default_provider` sends bare ids to `openai` (chat only: the
/// gateway translates Responses). Each writes a file through a tool call;
/// the records name the ids the aliases chose, charged as recorded.
#[tokio::test]
async fn claude_code_and_codex_run_with_their_own_model_names_through_aliases() {
    let setup = setup_with(|mock| {
        json!({
            "providers": {
                "anthropic": {"base_url": mock, "apis": ["chat", "messages"]},
                "openai": {"base_url": mock, "apis": ["chat"]},
            },
            "pricing": {"default": {"prompt_per_million": 1, "completion_per_million": 2,
                                    "context_length": 200_000}},
            "default_provider": "openai",
            "model_aliases": {"claude-*": "anthropic/"},
            "retry": {"max_attempts": 1},
        })
    })
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();

    // Claude Code: its default models, the key as a bearer token.
    let claude_file = work.path().join("claude.txt");
    let input = json!({"file_path": claude_file, "content": "written by claude\n"});
    let mut command = tokio::process::Command::new(claude_code());
    command
        .args([
            "-p",
            &format!("Write the file. mock-tool: Write {input}"),
            "--permission-mode",
            "acceptEdits",
        ])
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
        .env("ANTHROPIC_AUTH_TOKEN", &setup.key)
        .env("ANTHROPIC_API_KEY", "");
    let (success, stdout, stderr) = run(command).await;
    assert!(success, "claude -p failed:\n{stderr}\n{stdout}");
    assert_eq!(
        std::fs::read_to_string(&claude_file).ok().as_deref(),
        Some("written by claude\n"),
        "{stdout}\n{stderr}"
    );
    // The provider got Claude Code's own id, its prefix stripped.
    assert!(
        stdout.starts_with("Hello from claude-"),
        "{stdout}\n{stderr}"
    );

    // Codex: its own name for the model, over the Responses API.
    let codex_home = home.path().join("codex");
    std::fs::create_dir(&codex_home).unwrap();
    let base = format!("{}/api/v1", setup.gateway.address());
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            "model = \"gpt-5.5\"\nmodel_provider = \"gateway\"\n\n[model_providers.gateway]\n\
             name = \"gateway\"\nbase_url = {base:?}\nenv_key = \"GATEWAY_KEY\"\nwire_api = \"responses\"\n"
        ),
    )
    .unwrap();
    let codex_file = work.path().join("codex.txt");
    let input = json!({"cmd": format!("echo written by codex > '{}'", codex_file.display())});
    let mut command = tokio::process::Command::new(codex());
    command
        .args([
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            &format!("Write the file. mock-tool: exec_command {input}"),
        ])
        .current_dir(work.path())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("CODEX_HOME", &codex_home)
        .env("GATEWAY_KEY", &setup.key);
    let (success, stdout, stderr) = run(command).await;
    assert!(success, "codex exec failed:\n{stderr}\n{stdout}");
    assert_eq!(
        std::fs::read_to_string(&codex_file).ok().as_deref(),
        Some("written by codex\n"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stdout.starts_with("Hello from gpt-5.5! You said:"),
        "{stdout}\n{stderr}"
    );

    // Each request recorded and charged as the model its alias chose.
    let records = wait_for(PATIENCE, || async {
        let records = setup.gateway.records("acme").await;
        let codex_calls = records
            .iter()
            .filter(|record| record["api"] == "responses")
            .count();
        if records.len() >= 4 && codex_calls >= 2 {
            Ok(records)
        } else {
            Err(format!("not every turn recorded yet: {records:#?}"))
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
    let models: Vec<(&str, &str)> = records
        .iter()
        .map(|record| {
            (
                record["api"].as_str().unwrap(),
                record["model"].as_str().unwrap(),
            )
        })
        .collect();
    for (api, model) in &models {
        match *api {
            "messages" => assert!(model.starts_with("anthropic/claude-"), "{models:?}"),
            "responses" => assert_eq!(*model, "openai/gpt-5.5", "{models:?}"),
            other => panic!("a {other} call: {models:?}"),
        }
    }
    assert!(
        models.iter().any(|(api, _)| *api == "messages"),
        "{models:?}"
    );
    // Claude Code's own ids, for whoever reads a failure: the main model
    // and its small one.
    eprintln!("models recorded: {models:?}");
}
