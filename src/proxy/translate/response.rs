//! Whole (non-streamed) successful answers, each API's in the other's
//! shape. An answer that cannot be read is a 502: the client gets an error
//! it can read instead of a body in the wrong shape.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::usage::{MessagesTokens, Tokens, finish_reason_of, stop_reason_of};
use crate::error::{ErrorKind, GatewayError};

/// 502: the upstream's answer could not be translated.
pub(super) fn untranslatable(why: &str) -> GatewayError {
    GatewayError::new(
        ErrorKind::Upstream,
        format!("the upstream's answer could not be translated for this API: {why}"),
    )
}

/// A chat tool call's `arguments` as the Messages API's `input` object (a
/// call without arguments may say ""), or `None` when they are not an
/// object.
pub(super) fn tool_input(arguments: &str) -> Option<Value> {
    if arguments.trim().is_empty() {
        return Some(Value::Object(Map::new()));
    }
    match serde_json::from_str(arguments) {
        Ok(input @ Value::Object(_)) => Some(input),
        _ => None,
    }
}

/// A chat completion as a Messages answer: the first choice's text and
/// tool calls as blocks, its finish reason as the stop reason, the usage
/// in Anthropic's convention (left out when it cannot be read).
pub(crate) fn chat_response_to_messages(body: &[u8]) -> Result<Bytes, GatewayError> {
    let answer: Value =
        serde_json::from_slice(body).map_err(|_| untranslatable("it is not JSON"))?;
    let choice = answer
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first())
        .ok_or_else(|| untranslatable("it has no choice"))?;
    let message = choice.get("message").unwrap_or(&Value::Null);
    let mut content = Vec::new();
    for field in ["content", "refusal"] {
        if let Some(text) = message.get(field).and_then(Value::as_str)
            && !text.is_empty()
        {
            content.push(json!({"type": "text", "text": text}));
        }
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let arguments = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let input = tool_input(arguments)
            .ok_or_else(|| untranslatable("a tool call's arguments are not a JSON object"))?;
        content.push(json!({
            "type": "tool_use",
            "id": call.get("id").cloned().unwrap_or_else(|| json!("")),
            "name": call.pointer("/function/name").cloned().unwrap_or_else(|| json!("")),
            "input": input,
        }));
    }
    let stop_reason = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(stop_reason_of);
    let mut out = Map::new();
    out.insert("id".into(), string_or(&answer, "id", "msg"));
    out.insert("type".into(), json!("message"));
    out.insert("role".into(), json!("assistant"));
    out.insert("model".into(), string_or(&answer, "model", ""));
    out.insert("content".into(), Value::Array(content));
    out.insert("stop_reason".into(), json!(stop_reason));
    out.insert("stop_sequence".into(), Value::Null);
    if let Some(tokens) = answer.get("usage").and_then(Tokens::from_chat) {
        out.insert("usage".into(), tokens.to_messages());
    }
    Ok(Bytes::from(Value::Object(out).to_string()))
}

fn string_or(answer: &Value, field: &str, default: &str) -> Value {
    match answer.get(field) {
        Some(Value::String(value)) => Value::String(value.clone()),
        _ => Value::String(default.to_owned()),
    }
}

/// A Messages answer as a chat completion: its text blocks as the
/// message's content, its `tool_use` blocks as `tool_calls` (thinking is
/// dropped), its stop reason as the finish reason, the usage in OpenAI's
/// convention (left out when it cannot be read). `created` is 0: the
/// Messages API does not say when, and a translation reads no clock.
pub(crate) fn messages_response_to_chat(body: &[u8]) -> Result<Bytes, GatewayError> {
    let answer: Value =
        serde_json::from_slice(body).map_err(|_| untranslatable("it is not JSON"))?;
    let blocks = answer
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| untranslatable("it has no content"))?;
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => calls.push(json!({
                "id": block.get("id").cloned().unwrap_or_else(|| json!("")),
                "type": "function",
                "function": {
                    "name": block.get("name").cloned().unwrap_or_else(|| json!("")),
                    "arguments": block.get("input").cloned().unwrap_or_else(|| json!({})).to_string(),
                },
            })),
            _ => {}
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    let has_text = !text.is_empty() || calls.is_empty();
    message.insert(
        "content".into(),
        if has_text {
            Value::String(text)
        } else {
            Value::Null
        },
    );
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let finish_reason = answer
        .get("stop_reason")
        .and_then(Value::as_str)
        .map(finish_reason_of);
    let mut out = Map::new();
    out.insert("id".into(), string_or(&answer, "id", "chatcmpl"));
    out.insert("object".into(), json!("chat.completion"));
    out.insert("created".into(), json!(0));
    out.insert("model".into(), string_or(&answer, "model", ""));
    out.insert(
        "choices".into(),
        json!([{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": null}]),
    );
    let mut usage = MessagesTokens::default();
    if let Some(reported) = answer.get("usage") {
        usage.merge(reported);
    }
    if let Some(tokens) = usage.tokens() {
        out.insert("usage".into(), tokens.to_chat());
    }
    Ok(Bytes::from(Value::Object(out).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_of(bytes: Bytes) -> Value {
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn a_chat_completion_becomes_a_message() {
        let body = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Let me look.",
                "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
            "usage": {"prompt_tokens": 2000, "completion_tokens": 50,
                "prompt_tokens_details": {"cached_tokens": 1500},
                "completion_tokens_details": {"reasoning_tokens": 20}},
        });
        let message = json_of(chat_response_to_messages(body.to_string().as_bytes()).unwrap());
        assert_eq!(
            message,
            json!({
                "id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "gpt-4o",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
                "stop_reason": "tool_use", "stop_sequence": null,
                // 2000 - 1500 read; the 20 reasoning tokens stay in the 50.
                "usage": {"input_tokens": 500, "cache_read_input_tokens": 1500,
                          "cache_creation_input_tokens": 0, "output_tokens": 50},
            })
        );
    }

    #[test]
    fn a_chat_completion_without_usable_usage_has_none() {
        for usage in [
            json!(null),
            json!({"prompt_tokens": 5}),
            json!({"prompt_tokens": 5, "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 6}}),
        ] {
            let body = json!({"choices": [{"message": {"content": "hi"}, "finish_reason": "length"}], "usage": usage});
            let message = json_of(chat_response_to_messages(body.to_string().as_bytes()).unwrap());
            assert!(message.get("usage").is_none(), "{usage}");
            assert_eq!(message["stop_reason"], "max_tokens");
        }
    }

    #[test]
    fn an_unreadable_chat_completion_is_a_502() {
        for body in [
            &b"not json"[..],
            br#"{"choices": []}"#,
            br#"{"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}}]}"#,
        ] {
            let error = chat_response_to_messages(body).unwrap_err();
            assert_eq!(error.status(), 502, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn a_message_becomes_a_chat_completion() {
        let body = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 100, "output_tokens": 40, "cache_read_input_tokens": 900,
                      "cache_creation_input_tokens": 50},
        });
        let chat = json_of(messages_response_to_chat(body.to_string().as_bytes()).unwrap());
        assert_eq!(
            chat,
            json!({
                "id": "msg_1", "object": "chat.completion", "created": 0, "model": "claude-sonnet-4-5",
                "choices": [{"index": 0, "logprobs": null, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": "Calling.",
                    "tool_calls": [{"id": "toolu_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
                // 100 + 900 read + 50 written.
                "usage": {"prompt_tokens": 1050, "completion_tokens": 40, "total_tokens": 1090,
                          "prompt_tokens_details": {"cached_tokens": 900, "cache_write_tokens": 50}},
            })
        );
    }

    #[test]
    fn a_message_without_usable_usage_has_none() {
        for usage in [
            json!(null),
            json!({"output_tokens": 3}),
            json!({"input_tokens": 3, "output_tokens": -1}),
        ] {
            let body = json!({"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn", "usage": usage});
            let chat = json_of(messages_response_to_chat(body.to_string().as_bytes()).unwrap());
            assert!(chat.get("usage").is_none(), "{usage}");
            assert_eq!(chat["choices"][0]["finish_reason"], "stop");
            assert_eq!(chat["choices"][0]["message"]["content"], "hi");
        }
        assert_eq!(messages_response_to_chat(b"[]").unwrap_err().status(), 502);
    }
}
