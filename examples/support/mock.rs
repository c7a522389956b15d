//! An OpenAI-compatible upstream for demos, tests and benchmarks: a
//! deterministic reply with `usage`, SSE when asked, `n` choices, a tool
//! call when `tools` is given and `tool_choice` allows one, a new id per
//! answer, and injected latency and errors (chat only); beside it
//! Anthropic's Messages API (`mock_messages.rs`), OpenAI's Responses API
//! (`mock_responses.rs`) and embeddings (`mock_embeddings.rs`). Shared by
//! `examples/mock_upstream.rs`, `examples/proxy.rs` (which runs it in
//! process when no upstream is given) and the tests.
//!
//! Tool calls an agent can live with (Claude Code sends some 40 tools, and
//! a call of the first with no input would fail forever). In the three
//! APIs (chat, Messages, Responses):
//!
//! - A directive `mock-tool: NAME {JSON input}` in the text of the last
//!   user message has the mock call the offered tool `NAME` with that
//!   input (the last directive, when there are several); once the tool's
//!   result comes back (the last message, system messages aside, is a
//!   `tool` message, a user message holding a `tool_result`, or a
//!   `function_call_output` item), the answer is text.
//! - A conversation with a directive in any user message, or a request for
//!   a model named `agent` (`…/agent`), is an agent's: it gets a tool call
//!   only as a directive asks (and `tool_choice` allows), text otherwise.
//! - Any other request with `tools` keeps the simple rule: a call of the
//!   tool `tool_choice` names, else of the first tool, input `{}`; text
//!   once the tool's result is back.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use serde_json::{Value, json};
use tokio::net::TcpListener;

#[path = "mock_embeddings.rs"]
mod embeddings;
#[path = "mock_messages.rs"]
mod messages;
#[path = "mock_responses.rs"]
mod responses;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type MockBody = UnsyncBoxBody<Bytes, BoxError>;

/// How the mock behaves.
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// The path prefix of its API (`/v1`).
    pub prefix: String,
    /// Added before every answer.
    pub latency: Duration,
    /// The status of injected errors.
    pub error_status: u16,
    /// The share of chat requests answered with `error_status` (0 to 1).
    pub error_rate: f64,
    /// The first this many chat requests are answered with `error_status`.
    pub fail_first: u64,
    /// Between the events of a stream: a model that takes its time.
    pub event_delay: Duration,
    /// Chat requests are read, then (after `latency`) their connection is
    /// closed without an answer: an upstream that fails mid-request.
    pub reset_chats: bool,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            prefix: "/v1".to_owned(),
            latency: Duration::ZERO,
            error_status: 503,
            error_rate: 0.0,
            fail_first: 0,
            event_delay: Duration::ZERO,
            reset_chats: false,
        }
    }
}

/// The most choices a request may ask for (`n`), as OpenAI's API.
const MAX_CHOICES: u64 = 128;

/// A running mock's state.
#[derive(Debug)]
struct Mock {
    config: MockConfig,
    /// Chat requests so far; with `id_seed`, each answer's own id.
    chats: AtomicU64,
    /// Random per mock, so two mocks (or two runs) give no id twice.
    id_seed: u64,
    /// Requests received, counted before any latency.
    received: Arc<AtomicU64>,
}

/// Serves the mock on `listener` until the process ends.
pub async fn serve(listener: TcpListener, config: MockConfig) {
    serve_counted(listener, config, Arc::default()).await
}

async fn serve_counted(listener: TcpListener, config: MockConfig, received: Arc<AtomicU64>) {
    let mock = Arc::new(Mock {
        config,
        chats: AtomicU64::new(0),
        id_seed: rand::random::<u64>(),
        received,
    });
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let mock = Arc::clone(&mock);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let mock = Arc::clone(&mock);
                async move { mock.answer(request).await }
            });
            let _ = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Starts the mock on a free loopback port; returns its base URL
/// (`http://127.0.0.1:PORT/v1`).
pub async fn start(config: MockConfig) -> String {
    start_counted(config).await.0
}

/// [`start`], with a count of the requests the mock has received.
pub async fn start_counted(config: MockConfig) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let address: SocketAddr = listener.local_addr().expect("local address");
    let base = format!("http://{address}{}", config.prefix);
    let received = Arc::new(AtomicU64::new(0));
    tokio::spawn(serve_counted(listener, config, Arc::clone(&received)));
    (base, received)
}

fn json_response(status: u16, body: Value) -> Response<MockBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .expect("a valid response")
}

fn openai_error(status: u16, message: &str, kind: &str) -> Response<MockBody> {
    json_response(
        status,
        json!({"error": {"message": message, "type": kind, "code": null}}),
    )
}

/// An OpenAI error naming the request's field `param` (none: the body).
fn invalid(message: &str, param: &str) -> Response<MockBody> {
    let param = (!param.is_empty()).then_some(param);
    json_response(
        400,
        json!({"error": {"message": message, "type": "invalid_request_error",
                          "param": param, "code": null}}),
    )
}

/// The answer of a model named `…/status-NNN`: that status, as an OpenAI
/// error (with `retry-after` on a 429 or a 503), for tests of every error.
fn status_answer(model: &str) -> Option<Response<MockBody>> {
    let status = model
        .rsplit('/')
        .next()
        .and_then(|name| name.strip_prefix("status-"))
        .and_then(|code| code.parse::<u16>().ok())
        .filter(|code| StatusCode::from_u16(*code).is_ok())?;
    let mut response = openai_error(status, &format!("mock status {status}"), "server_error");
    if status == 429 || status == 503 {
        response
            .headers_mut()
            .insert("retry-after", "1".parse().expect("a header value"));
    }
    Some(response)
}

impl Mock {
    async fn answer(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<MockBody>, std::io::Error> {
        self.received.fetch_add(1, Ordering::SeqCst);
        if !self.config.latency.is_zero() {
            tokio::time::sleep(self.config.latency).await;
        }
        let path = request.uri().path().to_owned();
        let chat_path = format!("{}/chat/completions", self.config.prefix);
        let models_path = format!("{}/models", self.config.prefix);
        if path == models_path && request.method() == Method::GET {
            return Ok(json_response(
                200,
                json!({"object": "list", "data": [
                    {"id": "openai/gpt-4o-mini", "object": "model"},
                    {"id": "meta-llama/llama-3.1-8b-instruct:free", "object": "model"},
                ]}),
            ));
        }
        let messages_path = format!("{}/messages", self.config.prefix);
        if request.method() == Method::POST
            && (path == messages_path || path == format!("{messages_path}/count_tokens"))
        {
            self.chats.fetch_add(1, Ordering::SeqCst);
            return Ok(
                messages::answer(request, path != messages_path, self.config.event_delay).await,
            );
        }
        if request.method() == Method::POST && path == format!("{}/responses", self.config.prefix) {
            let count = self.chats.fetch_add(1, Ordering::SeqCst);
            let id = format!("resp_mock_{:016x}{count:08x}", self.id_seed);
            return Ok(responses::answer(request, id, self.config.event_delay).await);
        }
        if request.method() == Method::POST && path == format!("{}/embeddings", self.config.prefix)
        {
            self.chats.fetch_add(1, Ordering::SeqCst);
            return Ok(match request.into_body().collect().await {
                Ok(body) => embeddings::answer(&body.to_bytes()),
                Err(_) => openai_error(400, "unreadable body", "invalid_request_error"),
            });
        }
        if path != chat_path || request.method() != Method::POST {
            return Ok(openai_error(
                404,
                &format!("no route {path}"),
                "invalid_request_error",
            ));
        }
        let count = self.chats.fetch_add(1, Ordering::SeqCst);
        let received: serde_json::Map<String, Value> = request
            .headers()
            .iter()
            .map(|(name, value)| (name.to_string(), Value::from(value.to_str().unwrap_or("?"))))
            .chain(std::iter::once((
                "path".to_owned(),
                Value::from(request.uri().to_string()),
            )))
            .collect();
        let mut received = received;
        let body = match request.into_body().collect().await {
            Ok(body) => body.to_bytes(),
            Err(_) => {
                return Ok(openai_error(
                    400,
                    "unreadable body",
                    "invalid_request_error",
                ));
            }
        };
        if self.config.reset_chats {
            // An error from the service: the connection closes unanswered.
            return Err(std::io::Error::other("reset"));
        }
        let Ok(chat) = serde_json::from_slice::<Value>(&body) else {
            return Ok(openai_error(400, "invalid JSON", "invalid_request_error"));
        };
        let model = chat["model"].as_str().unwrap_or("unknown").to_owned();
        received.insert("model".to_owned(), Value::from(model.clone()));
        received.insert(
            "body_fields".to_owned(),
            Value::from(
                chat.as_object()
                    .map(|fields| fields.keys().cloned().collect::<Vec<_>>().join(","))
                    .unwrap_or_default(),
            ),
        );
        if let Some(response) = status_answer(&model) {
            return Ok(response);
        }
        // `…/echo-headers` answers with what it received (headers, path and
        // the model it was asked for), for tests of what crosses the
        // gateway; it also sets a cookie the gateway must drop.
        if model.rsplit('/').next() == Some("echo-headers") {
            let mut response = json_response(
                200,
                json!({
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": Value::Object(received).to_string()}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                }),
            );
            response
                .headers_mut()
                .insert("set-cookie", "upstream=1".parse().expect("a header value"));
            response.headers_mut().insert(
                "openai-organization",
                "org-operator".parse().expect("a header value"),
            );
            return Ok(response);
        }
        // `…/plain-text` answers 200 in `text/plain`: an answer that is
        // neither JSON nor a stream passes the gateway as is.
        if model.rsplit('/').next() == Some("plain-text") {
            return Ok(Response::builder()
                .header("content-type", "text/plain")
                .header("content-length", "5")
                .body(
                    Full::new(Bytes::from_static(b"hello"))
                        .map_err(|never| match never {})
                        .boxed_unsync(),
                )
                .expect("a valid response"));
        }
        // `…/echo-body` answers with the body it received, for tests of
        // what the gateway sends (the completion bound it writes).
        if model.rsplit('/').next() == Some("echo-body") {
            return Ok(json_response(
                200,
                json!({
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": String::from_utf8_lossy(&body)}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                }),
            ));
        }
        let inject = count < self.config.fail_first
            || (self.config.error_rate > 0.0 && rand::random::<f64>() < self.config.error_rate);
        if inject {
            let mut response =
                openai_error(self.config.error_status, "injected error", "server_error");
            response
                .headers_mut()
                .insert("retry-after", "1".parse().expect("a header value"));
            return Ok(response);
        }
        let prompt: String = chat["messages"]
            .as_array()
            .map(|messages| {
                messages
                    .iter()
                    .filter_map(|message| message["content"].as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let last = chat["messages"]
            .as_array()
            .and_then(|messages| last_turn(messages))
            .map(message_text)
            .unwrap_or_default();
        // Like an OpenAI upstream: either bound is obeyed; `…/ignores-bound`
        // is an upstream that reports a million completion tokens whatever
        // the bound.
        let max_tokens = chat["max_completion_tokens"]
            .as_u64()
            .or_else(|| chat["max_tokens"].as_u64())
            .unwrap_or(64) as usize;
        let ignores_bound = model.rsplit('/').next() == Some("ignores-bound");
        let choices = match &chat["n"] {
            Value::Null => 1,
            n => match n.as_u64() {
                Some(n @ 1..=MAX_CHOICES) => n as usize,
                _ => {
                    return Ok(openai_error(
                        400,
                        &format!("n must be an integer from 1 to {MAX_CHOICES}"),
                        "invalid_request_error",
                    ));
                }
            },
        };
        let tool = tool_called(&chat, &model);
        let words: Vec<String> = format!("Hello from {model}! You said: {last}")
            .split_whitespace()
            .take(max_tokens.max(1))
            .map(str::to_owned)
            .collect();
        let completion_tokens = if ignores_bound {
            1_000_000
        } else {
            words.len() * choices
        };
        let prompt_tokens = prompt.len().div_ceil(4);
        let mut usage = json!({
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        });
        // A model that caches and reasons: half its prompt read from the
        // cache, a quarter written to it, half its completion reasoning.
        if model.rsplit('/').next() == Some("cached-reasoner") {
            usage["prompt_tokens_details"] = json!({"cached_tokens": prompt_tokens / 2, "cache_write_tokens": prompt_tokens / 4});
            usage["completion_tokens_details"] = json!({"reasoning_tokens": completion_tokens / 2});
        }
        // A new id per answer, as a real upstream gives.
        let id = format!("chatcmpl-mock-{:016x}{count:08x}", self.id_seed);
        let answer = Answer {
            words,
            choices,
            tool,
        };
        if chat["stream"].as_bool() == Some(true) {
            // As OpenAI: usage only when asked for, in a last chunk of its
            // own, and `"usage": null` in every other chunk then.
            let with_usage = chat["stream_options"]["include_usage"].as_bool() == Some(true);
            return Ok(self.stream(&id, &model, &answer, with_usage.then_some(usage)));
        }
        let message = match &answer.tool {
            Some(call) => json!({"role": "assistant", "content": null,
                "tool_calls": [tool_call_json(&id, call)]}),
            None => json!({"role": "assistant", "content": answer.words.join(" ")}),
        };
        let choices: Vec<Value> = (0..answer.choices)
            .map(|index| json!({"index": index, "message": message, "finish_reason": answer.finish_reason()}))
            .collect();
        Ok(json_response(
            200,
            json!({
                "id": id,
                "object": "chat.completion",
                "created": 1_767_225_600,
                "model": model,
                "choices": choices,
                "usage": usage,
            }),
        ))
    }

    fn stream(
        &self,
        id: &str,
        model: &str,
        answer: &Answer,
        usage: Option<Value>,
    ) -> Response<MockBody> {
        let words = &answer.words;
        // Members in the order OpenAI writes them (`id` first, `usage`
        // last), which a `Value` would sort: gateways read chunks in it.
        let head = format!(
            "{{\"id\":{},\"object\":\"chat.completion.chunk\",\"created\":1767225600,\"model\":{}",
            Value::from(id),
            Value::from(model)
        );
        let chunk = |choice: usize, delta: Value, finish: Value| {
            let usage = if usage.is_some() {
                ",\"usage\":null"
            } else {
                ""
            };
            format!(
                "{head},\"choices\":[{{\"index\":{choice},\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]{usage}}}"
            )
        };
        let mut events = vec![": keep-alive\n\n".to_owned()];
        for choice in 0..answer.choices {
            if let Some(tool) = &answer.tool {
                let mut call = tool_call_json(id, tool);
                call["index"] = json!(0);
                events.push(format!(
                    "data: {}\n\n",
                    chunk(
                        choice,
                        json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                        Value::Null
                    )
                ));
                continue;
            }
            events.push(format!(
                "data: {}\n\n",
                chunk(
                    choice,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null
                )
            ));
            for (index, word) in words.iter().enumerate() {
                let text = if index == 0 {
                    word.clone()
                } else {
                    format!(" {word}")
                };
                events.push(format!(
                    "data: {}\n\n",
                    chunk(choice, json!({"content": text}), Value::Null)
                ));
            }
        }
        for choice in 0..answer.choices {
            events.push(format!(
                "data: {}\n\n",
                chunk(choice, json!({}), json!(answer.finish_reason()))
            ));
        }
        if let Some(usage) = usage {
            events.push(format!(
                "data: {head},\"choices\":[],\"usage\":{usage}}}\n\n"
            ));
        }
        events.push("data: [DONE]\n\n".to_owned());
        let delay = self.config.event_delay;
        let frames = futures_util::stream::iter(events).then(move |event| async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Ok::<_, BoxError>(http_body::Frame::data(Bytes::from(event)))
        });
        Response::builder()
            .header("content-type", "text/event-stream")
            .header("cache-control", "no-cache")
            .body(StreamBody::new(frames).boxed_unsync())
            .expect("a valid response")
    }
}

/// What the mock answers a chat request with.
struct Answer {
    /// The words of each choice's text.
    words: Vec<String>,
    /// How many choices (`n`).
    choices: usize,
    /// The function each choice calls instead, when one is.
    tool: Option<ToolCall>,
}

impl Answer {
    fn finish_reason(&self) -> &'static str {
        if self.tool.is_some() {
            "tool_calls"
        } else {
            "stop"
        }
    }
}

/// A tool the mock calls: its name and input.
#[derive(Clone, Debug, PartialEq)]
struct ToolCall {
    name: String,
    input: Value,
}

impl ToolCall {
    /// A call of `name` with no input (`{}`).
    fn bare(name: &str) -> ToolCall {
        ToolCall {
            name: name.to_owned(),
            input: json!({}),
        }
    }
}

/// The model name (after the last `/`) of an agent's requests (module docs).
const AGENT_MODEL: &str = "agent";

/// What starts a directive (module docs).
const TOOL_DIRECTIVE: &str = "mock-tool:";

/// The last message that is no system instruction (`system` or
/// `developer`), else the last: Claude Code ends its Messages requests
/// with a `system` message, after the user's turn.
fn last_turn(messages: &[Value]) -> Option<&Value> {
    messages
        .iter()
        .rev()
        .find(|message| message["role"] != "system" && message["role"] != "developer")
        .or(messages.last())
}

/// The text of a message (chat or Messages): its content when a string,
/// else its parts' or blocks' `text`, joined.
fn message_text(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part["text"].as_str())
            .collect(),
        _ => String::new(),
    }
}

/// The last `mock-tool: NAME {input}` in `text`; none when it is
/// malformed (no name, or no JSON object after it).
fn tool_directive(text: &str) -> Option<ToolCall> {
    let (_, rest) = text.rsplit_once(TOOL_DIRECTIVE)?;
    let rest = rest.trim_start();
    let name_end = rest
        .find(|c: char| c.is_whitespace() || c == '{')
        .unwrap_or(rest.len());
    let (name, rest) = rest.split_at(name_end);
    // The JSON object alone: text may follow it.
    let input = serde_json::Deserializer::from_str(rest.trim_start())
        .into_iter::<Value>()
        .next()?
        .ok()?;
    (!name.is_empty() && input.is_object()).then(|| ToolCall {
        name: name.to_owned(),
        input,
    })
}

/// The tool an agent's request has the mock call (module docs), given
/// whether its tool's result is back, its last user message's text and
/// the tools it offers; `None` when the request is no agent's.
fn directed_call(
    model: &str,
    user_texts: impl Iterator<Item = String>,
    answered: bool,
    offered: impl Fn(&str) -> bool,
) -> Option<Option<ToolCall>> {
    let texts: Vec<String> = user_texts.collect();
    let directed = model.rsplit('/').next() == Some(AGENT_MODEL)
        || texts.iter().any(|text| text.contains(TOOL_DIRECTIVE));
    if !directed {
        return None;
    }
    if answered {
        return Some(None);
    }
    Some(
        texts
            .last()
            .and_then(|last| tool_directive(last))
            .filter(|call| offered(&call.name)),
    )
}

/// The function a request's `tools` and `tool_choice` have the mock call,
/// as an OpenAI model would: the one `tool_choice` names, else the first
/// function when `tool_choice` is absent, `"auto"` or `"required"`; none
/// for `"none"`, without tools, or once a tool's result is back; an
/// agent's as the module docs say.
fn tool_called(chat: &Value, model: &str) -> Option<ToolCall> {
    let tools = chat["tools"].as_array()?;
    if chat["tool_choice"] == "none" {
        return None;
    }
    let messages = chat["messages"].as_array()?;
    let user_texts = messages
        .iter()
        .filter(|message| message["role"] == "user")
        .map(message_text);
    let answered = last_turn(messages)
        .is_some_and(|last| last["role"] == "tool" || last["role"] == "function");
    let offered = |name: &str| {
        tools
            .iter()
            .any(|tool| tool["function"]["name"].as_str() == Some(name))
    };
    if let Some(directed) = directed_call(model, user_texts, answered, offered) {
        return directed;
    }
    if answered {
        return None;
    }
    let first = tools
        .iter()
        .find_map(|tool| tool["function"]["name"].as_str())?;
    match &chat["tool_choice"] {
        Value::Null => Some(ToolCall::bare(first)),
        Value::String(choice) if choice == "auto" || choice == "required" => {
            Some(ToolCall::bare(first))
        }
        Value::Object(choice) => choice
            .get("function")
            .and_then(|function| function["name"].as_str())
            .map(ToolCall::bare),
        _ => None,
    }
}

/// A call of the function `call` names with its input as arguments, its
/// id from the answer's.
fn tool_call_json(answer_id: &str, call: &ToolCall) -> Value {
    let call_id = format!("call_{}", answer_id.trim_start_matches("chatcmpl-"));
    json!({"id": call_id, "type": "function",
           "function": {"name": call.name, "arguments": call.input.to_string()}})
}
