//! A whole (non-streamed) chat completion as a Responses answer. An answer
//! that cannot be read is a 502, as for the Messages translation.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::response::untranslatable;
use super::usage::{responses_status_of, responses_usage_of_chat};
use crate::error::GatewayError;

/// A chat completion as a Responses answer (`"object": "response"`): the
/// first choice's text (and refusal) as a `message` item of one
/// `output_text` part, each tool call as a `function_call` item with its
/// arguments as sent, the finish reason as the `status` (`length` is
/// `incomplete` with `incomplete_details.reason: "max_output_tokens"`,
/// `content_filter` `incomplete` for `content_filter`), and the usage in
/// the Responses API's words (left out when it cannot be read, so it is
/// unknown rather than smaller). `created_at` is chat's `created`.
pub(crate) fn chat_response_to_responses(body: &[u8]) -> Result<Bytes, GatewayError> {
    let answer: Value =
        serde_json::from_slice(body).map_err(|_| untranslatable("it is not JSON"))?;
    let choice = answer
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first())
        .ok_or_else(|| untranslatable("it has no choice"))?;
    let message = choice.get("message").unwrap_or(&Value::Null);
    let mut output = Vec::new();
    // A refusal is text, as the stream's translation says it.
    let mut text = String::new();
    for field in ["content", "refusal"] {
        if let Some(part) = message.get(field).and_then(Value::as_str) {
            text.push_str(part);
        }
    }
    if !text.is_empty() {
        output.push(message_item("msg_0", "completed", vec![output_text(&text)]));
    }
    for (index, call) in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let call_id = match call.get("id").and_then(Value::as_str) {
            Some(id) => id.to_owned(),
            None => format!("call_{index}"),
        };
        let name = call
            .pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let arguments = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or_default();
        output.push(function_call_item(&call_id, name, arguments, "completed"));
    }
    let finish_reason = choice.get("finish_reason").and_then(Value::as_str);
    let (status, incomplete) = responses_status_of(finish_reason);
    let mut out = response_object(
        &string_or(&answer, "id", "resp"),
        answer.get("created").and_then(Value::as_u64).unwrap_or(0),
        &string_or(&answer, "model", ""),
        status,
    );
    out.insert("output".into(), Value::Array(output));
    if let Some(reason) = incomplete {
        out.insert("incomplete_details".into(), json!({"reason": reason}));
    }
    if let Some(usage) = answer.get("usage").and_then(responses_usage_of_chat) {
        out.insert("usage".into(), usage);
    }
    Ok(Bytes::from(Value::Object(out).to_string()))
}

fn string_or(answer: &Value, field: &str, default: &str) -> String {
    answer
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or(default)
        .to_owned()
}

/// A response object with no output yet: what `response.created` carries,
/// and what the final answer fills.
pub(super) fn response_object(
    id: &str,
    created_at: u64,
    model: &str,
    status: &str,
) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("id".into(), json!(id));
    out.insert("object".into(), json!("response"));
    out.insert("created_at".into(), json!(created_at));
    out.insert("status".into(), json!(status));
    out.insert("model".into(), json!(model));
    out.insert("output".into(), json!([]));
    out.insert("error".into(), Value::Null);
    out.insert("incomplete_details".into(), Value::Null);
    out.insert("usage".into(), Value::Null);
    out
}

pub(super) fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

pub(super) fn message_item(id: &str, status: &str, content: Vec<Value>) -> Value {
    json!({"id": id, "type": "message", "status": status, "role": "assistant", "content": content})
}

pub(super) fn function_call_item(
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    json!({"id": format!("fc_{call_id}"), "type": "function_call", "status": status,
           "call_id": call_id, "name": name, "arguments": arguments})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credit::ResponsesUsage;

    fn json_of(bytes: Bytes) -> Value {
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn a_chat_completion_becomes_a_response() {
        let body = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_000, "model": "gpt-4o",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Let me look.",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "read", "arguments": ""}},
                ]}}],
            "usage": {"prompt_tokens": 2000, "completion_tokens": 50, "total_tokens": 2050,
                "prompt_tokens_details": {"cached_tokens": 1500},
                "completion_tokens_details": {"reasoning_tokens": 20}},
        });
        let response = json_of(chat_response_to_responses(body.to_string().as_bytes()).unwrap());
        assert_eq!(
            response,
            json!({
                "id": "chatcmpl-1", "object": "response", "created_at": 1_700_000_000,
                "status": "completed", "model": "gpt-4o", "error": null, "incomplete_details": null,
                "output": [
                    {"id": "msg_0", "type": "message", "status": "completed", "role": "assistant",
                     "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
                    {"id": "fc_call_1", "type": "function_call", "status": "completed",
                     "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
                    {"id": "fc_call_2", "type": "function_call", "status": "completed",
                     "call_id": "call_2", "name": "read", "arguments": ""},
                ],
                // The cache stays in the input, the reasoning in the output.
                "usage": {"input_tokens": 2000, "input_tokens_details": {"cached_tokens": 1500},
                          "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 20},
                          "total_tokens": 2050},
            })
        );
        let mut usage = ResponsesUsage::default();
        usage.merge_response(&response);
        let usage = usage.usage().unwrap();
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.cache_read_tokens,
                usage.completion_tokens,
                usage.reasoning_tokens
            ),
            (2000, 1500, 50, 20)
        );
    }

    #[test]
    fn a_cut_or_filtered_completion_is_incomplete_and_an_unreadable_usage_is_left_out() {
        for (finish, reason) in [
            ("length", "max_output_tokens"),
            ("content_filter", "content_filter"),
        ] {
            let body = json!({"id": "c", "model": "m", "choices": [{"message": {"content": "Hi", "refusal": "No."},
                "finish_reason": finish}], "usage": {"prompt_tokens": 5, "completion_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 6}}});
            let response =
                json_of(chat_response_to_responses(body.to_string().as_bytes()).unwrap());
            assert_eq!(response["status"], "incomplete");
            assert_eq!(response["incomplete_details"]["reason"], reason);
            assert_eq!(
                response["output"][0]["content"],
                json!([{"type": "output_text", "text": "HiNo.", "annotations": []}])
            );
            assert!(response["usage"].is_null(), "unknown, not smaller");
            let mut usage = ResponsesUsage::default();
            usage.merge_response(&response);
            assert_eq!(usage.usage(), None);
        }
    }

    #[test]
    fn an_unreadable_chat_completion_is_a_502() {
        for body in [&b"not json"[..], br#"{"choices": []}"#, b"[]"] {
            let error = chat_response_to_responses(body).unwrap_err();
            assert_eq!(error.status(), 502, "{}", String::from_utf8_lossy(body));
        }
    }
}
