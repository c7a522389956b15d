//! The mock's OpenAI Responses API (`POST {prefix}/responses`), as OpenAI
//! answers it: a response object whose `output` holds a `message` item of
//! `output_text`, or a `function_call` item, and `usage` in the Responses
//! names; streamed (`"stream": true`) as OpenAI's typed events, each
//! `event: TYPE` with a `data` holding its `type` and `sequence_number`.
//!
//! - Stateless, as the gateway is: `store: true` and `previous_response_id`
//!   are refused 400, naming the field (an absent `store` is taken as
//!   `false`).
//! - `…/status-NNN` answers that status; `…/echo-body` answers the body it
//!   received as its text.
//! - Tool calls follow the chat mock's rules (its module docs): a
//!   `mock-tool: NAME {json}` directive in the last user message calls the
//!   offered function `NAME` with that input as its `arguments` string; an
//!   agent's request (a directive, or the model `agent`) gets text
//!   otherwise; any other request with function tools calls the one
//!   `tool_choice` names, else the first; once the last item is a
//!   `function_call_output` the answer is text ("… You said: OUTPUT").
//! - Usage: `input_tokens` counted as the chat mock counts (a quarter of
//!   the characters of `instructions` and the input's text), half of them
//!   `cached_tokens` when the request sets `prompt_cache_key`;
//!   `output_tokens` the answer's words (within `max_output_tokens`), half
//!   of them `reasoning_tokens` when the request sets `reasoning`.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::{
    BoxError, MockBody, ToolCall, directed_call, invalid, json_response, last_turn, message_text,
    status_answer,
};

/// The most words an answer has when the request sets no
/// `max_output_tokens` (Codex sets none), as the chat mock's default.
const DEFAULT_MAX_OUTPUT_WORDS: u64 = 64;

/// The output tokens a function call counts (its arguments are the
/// directive's, not generated words), within the request's bound.
const FUNCTION_CALL_OUTPUT_TOKENS: u64 = 8;

/// All the text a request carries (`instructions`, and the input's
/// texts, arguments and outputs), joined by spaces as the chat mock joins
/// its messages, for its token counts.
fn prompt_text(request: &Value) -> String {
    fn collect(value: &Value, out: &mut String) {
        match value {
            Value::String(text) => {
                if !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(text);
            }
            Value::Array(items) => items.iter().for_each(|item| collect(item, out)),
            Value::Object(fields) => fields
                .iter()
                .filter(|(name, _)| {
                    matches!(
                        name.as_str(),
                        "content" | "text" | "arguments" | "output" | "summary"
                    )
                })
                .for_each(|(_, value)| collect(value, out)),
            _ => {}
        }
    }
    let mut out = String::new();
    collect(&request["instructions"], &mut out);
    collect(&request["input"], &mut out);
    out
}

/// The input as items: a string input is one user message.
fn input_items(request: &Value) -> Vec<Value> {
    match &request["input"] {
        Value::String(text) => vec![json!({"type": "message", "role": "user", "content": text})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

/// The text of an item: a message's, or a function call's output.
fn item_text(item: &Value) -> String {
    if item["type"] == "function_call_output" {
        return match &item["output"] {
            Value::String(text) => text.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|part| part["text"].as_str())
                .collect(),
            _ => String::new(),
        };
    }
    message_text(item)
}

/// The function the model calls, if any (see the module docs).
fn tool_called(request: &Value, items: &[Value], model: &str) -> Option<ToolCall> {
    let tools = request["tools"].as_array()?;
    if request["tool_choice"] == "none" {
        return None;
    }
    let functions = || {
        tools
            .iter()
            .filter(|tool| tool["type"] == "function")
            .filter_map(|tool| tool["name"].as_str())
    };
    let answered = last_turn(items).is_some_and(|last| last["type"] == "function_call_output");
    let user_texts = items
        .iter()
        .filter(|item| item["role"] == "user")
        .map(message_text);
    let offered = |name: &str| functions().any(|function| function == name);
    if let Some(directed) = directed_call(model, user_texts, answered, offered) {
        return directed;
    }
    if answered {
        return None;
    }
    match &request["tool_choice"] {
        Value::Null => functions().next().map(ToolCall::bare),
        Value::String(choice) if choice == "auto" || choice == "required" => {
            functions().next().map(ToolCall::bare)
        }
        Value::Object(choice) if choice.get("type") == Some(&json!("function")) => choice
            .get("name")
            .and_then(Value::as_str)
            .map(ToolCall::bare),
        _ => None,
    }
}

/// The answer to a Responses request; `id` is the new response's own.
pub(super) async fn answer(
    request: Request<Incoming>,
    id: String,
    event_delay: Duration,
) -> Response<MockBody> {
    let Ok(body) = request.into_body().collect().await else {
        return invalid("unreadable body", "");
    };
    let body = body.to_bytes();
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return invalid("invalid JSON", "");
    };
    let Some(model) = request["model"].as_str().map(str::to_owned) else {
        return invalid("Missing required parameter: 'model'.", "model");
    };
    if let Some(response) = status_answer(&model) {
        return response;
    }
    // Stateless, as the gateway: what would need a stored response.
    if request["store"] == true {
        return invalid(
            "This upstream keeps no responses: send 'store': false (or leave it out).",
            "store",
        );
    }
    if !request["previous_response_id"].is_null() {
        return invalid(
            "This upstream keeps no responses: send the whole conversation in 'input' instead of 'previous_response_id'.",
            "previous_response_id",
        );
    }
    let items = input_items(&request);
    if items.is_empty() {
        return invalid("Missing required parameter: 'input'.", "input");
    }
    let max_output_tokens = match &request["max_output_tokens"] {
        Value::Null => DEFAULT_MAX_OUTPUT_WORDS,
        bound => match bound.as_u64() {
            Some(bound @ 16..) => bound,
            _ => {
                return invalid(
                    "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16.",
                    "max_output_tokens",
                );
            }
        },
    };
    let last = last_turn(&items).map(item_text).unwrap_or_default();
    let tool = tool_called(&request, &items, &model);
    let text = if model.rsplit('/').next() == Some("echo-body") {
        String::from_utf8_lossy(&body).into_owned()
    } else {
        format!("Hello from {model}! You said: {last}")
            .split_whitespace()
            .take(usize::try_from(max_output_tokens).unwrap_or(usize::MAX))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let output_tokens = match &tool {
        Some(_) => FUNCTION_CALL_OUTPUT_TOKENS.min(max_output_tokens),
        None => (text.split_whitespace().count() as u64).clamp(1, max_output_tokens),
    };
    let input_tokens = prompt_text(&request).len().div_ceil(4) as u64;
    let cached_tokens = if request["prompt_cache_key"].is_string() {
        input_tokens / 2
    } else {
        0
    };
    let reasoning_tokens = if request["reasoning"].is_object() {
        output_tokens / 2
    } else {
        0
    };
    let usage = json!({
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    });
    let suffix = id.trim_start_matches("resp_");
    let item = match &tool {
        Some(call) => json!({"id": format!("fc_{suffix}"), "type": "function_call",
            "status": "completed", "call_id": format!("call_{suffix}"), "name": call.name,
            "arguments": call.input.to_string()}),
        None => json!({"id": format!("msg_{suffix}"), "type": "message", "status": "completed",
            "role": "assistant", "content": [output_text(&text)]}),
    };
    let done = response_object(
        &request,
        &id,
        &model,
        "completed",
        vec![item.clone()],
        usage,
    );
    if request["stream"] != true {
        return json_response(200, done);
    }
    let started = response_object(
        &request,
        &id,
        &model,
        "in_progress",
        Vec::new(),
        Value::Null,
    );
    stream(started, done, &item, event_delay)
}

/// An `output_text` content part holding `text`.
fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A response object as OpenAI's: what the request set, echoed.
fn response_object(
    request: &Value,
    id: &str,
    model: &str,
    status: &str,
    output: Vec<Value>,
    usage: Value,
) -> Value {
    let or = |field: &str, default: Value| match &request[field] {
        Value::Null => default,
        value => value.clone(),
    };
    json!({
        "id": id,
        "object": "response",
        "created_at": 1_767_225_600,
        "status": status,
        "error": null,
        "incomplete_details": null,
        "instructions": or("instructions", Value::Null),
        "max_output_tokens": or("max_output_tokens", Value::Null),
        "model": model,
        "output": output,
        "parallel_tool_calls": or("parallel_tool_calls", json!(true)),
        "previous_response_id": null,
        "reasoning": or("reasoning", json!({"effort": null, "summary": null})),
        "store": false,
        "temperature": 1.0,
        "text": or("text", json!({"format": {"type": "text"}})),
        "tool_choice": or("tool_choice", json!("auto")),
        "tools": or("tools", json!([])),
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    })
}

/// The answer streamed as OpenAI streams it: the response created and in
/// progress, its one output item added, its content (text deltas, or the
/// call's arguments) and the item done, and the response completed with
/// its usage.
fn stream(started: Value, done: Value, item: &Value, event_delay: Duration) -> Response<MockBody> {
    let mut data = vec![
        json!({"type": "response.created", "response": started}),
        json!({"type": "response.in_progress", "response": started}),
    ];
    let item_id = &item["id"];
    let mut added = item.clone();
    added["status"] = json!("in_progress");
    if item["type"] == "function_call" {
        added["arguments"] = json!("");
        data.push(json!({"type": "response.output_item.added", "output_index": 0, "item": added}));
        data.push(
            json!({"type": "response.function_call_arguments.delta", "item_id": item_id,
            "output_index": 0, "delta": item["arguments"]}),
        );
        data.push(
            json!({"type": "response.function_call_arguments.done", "item_id": item_id,
            "output_index": 0, "name": item["name"], "arguments": item["arguments"]}),
        );
    } else {
        added["content"] = json!([]);
        data.push(json!({"type": "response.output_item.added", "output_index": 0, "item": added}));
        let at = json!({"item_id": item_id, "output_index": 0, "content_index": 0});
        let with = |fields: Value| {
            let mut event = at.clone();
            event
                .as_object_mut()
                .expect("an object")
                .extend(fields.as_object().expect("an object").clone());
            event
        };
        data.push(with(
            json!({"type": "response.content_part.added", "part": output_text("")}),
        ));
        let text = item["content"][0]["text"].as_str().unwrap_or_default();
        for (index, word) in text.split(' ').enumerate() {
            let delta = if index == 0 {
                word.to_owned()
            } else {
                format!(" {word}")
            };
            data.push(with(
                json!({"type": "response.output_text.delta", "delta": delta, "logprobs": []}),
            ));
        }
        data.push(with(
            json!({"type": "response.output_text.done", "text": text, "logprobs": []}),
        ));
        data.push(with(
            json!({"type": "response.content_part.done", "part": output_text(text)}),
        ));
    }
    data.push(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
    data.push(json!({"type": "response.completed", "response": done}));
    let events: Vec<String> = data
        .into_iter()
        .enumerate()
        .map(|(sequence_number, mut data)| {
            data["sequence_number"] = json!(sequence_number);
            let kind = data["type"].as_str().unwrap_or_default().to_owned();
            format!("event: {kind}\ndata: {data}\n\n")
        })
        .collect();
    let frames = futures_util::stream::iter(events).then(move |event| async move {
        if !event_delay.is_zero() {
            tokio::time::sleep(event_delay).await;
        }
        Ok::<_, BoxError>(http_body::Frame::data(Bytes::from(event)))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(StreamBody::new(frames).boxed_unsync())
        .expect("a valid response")
}
