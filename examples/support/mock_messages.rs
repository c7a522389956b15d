//! The mock's Anthropic Messages API (`POST {prefix}/messages` and
//! `…/messages/count_tokens`), as Anthropic answers it: `anthropic-version`
//! and `max_tokens` required, text or a `tool_use` block, usage with the
//! cache reads and writes a request with `cache_control` makes, streamed
//! as Anthropic's events.
//!
//! - `…/status-NNN` answers that status with an Anthropic error body.
//! - With `tools` (and `tool_choice` not `none`), a request whose last
//!   message holds no `tool_result` is answered with a call of the tool
//!   `tool_choice` names (else the first), input `{}`; the next, holding
//!   its result, with text. An agent's request (a `mock-tool:` directive,
//!   or the model `agent`: the chat mock's module docs) calls only the
//!   tool a directive names, with its input.
//! - A request with `cache_control` anywhere reads half its prompt from
//!   the cache and writes a quarter (for an hour when a `ttl` of `1h`
//!   asks).

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::{BoxError, MockBody, ToolCall, directed_call, json_response, last_turn, message_text};

fn anthropic_error(status: u16, kind: &str, message: &str) -> Response<MockBody> {
    json_response(
        status,
        json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

/// All the text a request carries (system, messages, tool inputs and
/// results), for its token counts.
fn prompt_text(request: &Value) -> String {
    fn collect(value: &Value, out: &mut String) {
        match value {
            Value::String(text) => {
                out.push_str(text);
                out.push(' ');
            }
            Value::Array(items) => items.iter().for_each(|item| collect(item, out)),
            Value::Object(fields) => fields
                .iter()
                .filter(|(name, _)| *name != "type" && *name != "cache_control")
                .for_each(|(_, value)| collect(value, out)),
            _ => {}
        }
    }
    let mut out = String::new();
    collect(&request["system"], &mut out);
    collect(&request["messages"], &mut out);
    out
}

/// Whether `value` has a `cache_control` anywhere; and whether one asks
/// for an hour.
fn cache_control(value: &Value) -> (bool, bool) {
    match value {
        Value::Object(fields) => {
            let own = fields.get("cache_control");
            let hour = own.is_some_and(|control| control["ttl"] == "1h");
            fields
                .values()
                .map(cache_control)
                .fold((own.is_some(), hour), |(any, hour), (more, more_hour)| {
                    (any || more, hour || more_hour)
                })
        }
        Value::Array(items) => items
            .iter()
            .map(cache_control)
            .fold((false, false), |(a, b), (c, d)| (a || c, b || d)),
        _ => (false, false),
    }
}

/// The tool the model calls, if any (see the module docs).
fn tool_called(request: &Value, model: &str) -> Option<ToolCall> {
    let tools = request["tools"].as_array()?;
    if request["tool_choice"]["type"] == "none" {
        return None;
    }
    let messages = request["messages"].as_array()?;
    let answered = last_turn(messages)
        .and_then(|last| last["content"].as_array())
        .is_some_and(|blocks| blocks.iter().any(|block| block["type"] == "tool_result"));
    let user_texts = messages
        .iter()
        .filter(|message| message["role"] == "user")
        .map(message_text);
    let offered = |name: &str| tools.iter().any(|tool| tool["name"].as_str() == Some(name));
    if let Some(directed) = directed_call(model, user_texts, answered, offered) {
        return directed;
    }
    if answered {
        return None;
    }
    match request["tool_choice"]["type"].as_str() {
        Some("tool") => request["tool_choice"]["name"].as_str().map(ToolCall::bare),
        _ => tools
            .iter()
            .find_map(|tool| tool["name"].as_str())
            .map(ToolCall::bare),
    }
}

/// The answer to a Messages request (or its `count_tokens`).
pub(super) async fn answer(
    request: Request<Incoming>,
    count_tokens: bool,
    event_delay: Duration,
) -> Response<MockBody> {
    if request.headers().get("anthropic-version").is_none() {
        return anthropic_error(
            400,
            "invalid_request_error",
            "anthropic-version: header is required",
        );
    }
    let Ok(body) = request.into_body().collect().await else {
        return anthropic_error(400, "invalid_request_error", "unreadable body");
    };
    let Ok(body) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
        return anthropic_error(400, "invalid_request_error", "invalid JSON");
    };
    let model = body["model"].as_str().unwrap_or("unknown").to_owned();
    let prompt_tokens = prompt_text(&body).len().div_ceil(4) as u64;
    if count_tokens {
        return json_response(200, json!({"input_tokens": prompt_tokens}));
    }
    if let Some(status) = model
        .rsplit('/')
        .next()
        .and_then(|name| name.strip_prefix("status-"))
        .and_then(|code| code.parse::<u16>().ok())
        .filter(|code| (400..600).contains(code))
    {
        return anthropic_error(status, "api_error", &format!("mock status {status}"));
    }
    let Some(max_tokens) = body["max_tokens"].as_u64() else {
        return anthropic_error(400, "invalid_request_error", "max_tokens: Field required");
    };
    let last_text = body["messages"]
        .as_array()
        .and_then(|messages| last_turn(messages))
        .map(message_text)
        .unwrap_or_default();
    let (cached, for_an_hour) = cache_control(&body);
    let (read, written) = if cached {
        (prompt_tokens / 2, prompt_tokens / 4)
    } else {
        (0, 0)
    };
    let input = prompt_tokens - read - written;
    let tool = tool_called(&body, &model);
    let words: Vec<String> = format!("Hello from {model}! You said: {last_text}")
        .split_whitespace()
        .take(usize::try_from(max_tokens.max(1)).unwrap_or(usize::MAX))
        .map(str::to_owned)
        .collect();
    let output = if tool.is_some() {
        8
    } else {
        words.len() as u64
    };
    let split = if for_an_hour {
        json!({"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": written})
    } else {
        json!({"ephemeral_5m_input_tokens": written, "ephemeral_1h_input_tokens": 0})
    };
    let usage = json!({"input_tokens": input, "output_tokens": output,
        "cache_read_input_tokens": read, "cache_creation_input_tokens": written,
        "cache_creation": split});
    let id = format!("msg_mock_{:08x}", rand::random::<u32>());
    let tool_id = format!("toolu_mock_{:08x}", rand::random::<u32>());
    let (content, stop_reason) = match &tool {
        Some(call) => (
            json!([{"type": "tool_use", "id": tool_id, "name": call.name, "input": call.input}]),
            "tool_use",
        ),
        None => (
            json!([{"type": "text", "text": words.join(" ")}]),
            "end_turn",
        ),
    };
    if body["stream"].as_bool() != Some(true) {
        return json_response(
            200,
            json!({"id": id, "type": "message", "role": "assistant", "model": model,
                    "content": content, "stop_reason": stop_reason, "stop_sequence": null,
                    "usage": usage}),
        );
    }
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut start_usage = usage.clone();
    start_usage["output_tokens"] = json!(1);
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
               "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
               "usage": start_usage}}),
    )];
    match &tool {
        Some(call) => {
            events.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block":
                       {"type": "tool_use", "id": tool_id, "name": call.name, "input": {}}}),
            ));
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "input_json_delta", "partial_json": call.input.to_string()}}),
            ));
        }
        None => {
            events.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
            ));
            events.push(event("ping", json!({"type": "ping"})));
            for (index, word) in words.iter().enumerate() {
                let text = if index == 0 {
                    word.clone()
                } else {
                    format!(" {word}")
                };
                events.push(event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": text}}),
                ));
            }
        }
    }
    events.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": output}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
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
