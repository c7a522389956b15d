//! A chat-completions stream as the Responses API's events, event by
//! event, however the upstream's bytes are chunked.

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value, json};

use super::responses_response::{function_call_item, message_item, output_text, response_object};
use super::stream::{CUT_SHORT, EventReader, Item, anthropic_event, broken, event_data};
use super::usage::{responses_status_of, responses_usage_of_chat};

/// One item of the answer's `output`, in the order it was added.
#[derive(Debug)]
enum Output {
    /// A message's text (a refusal's included), as one `output_text` part.
    Message { text: String, open: bool },
    /// A tool call, by its chat index.
    Call {
        chat_index: u64,
        call_id: String,
        name: String,
        arguments: String,
        open: bool,
    },
}

/// A chat-completions stream as the Responses API's events, each
/// `event: <type>` with its data (`type`, `sequence_number` from 0 up):
///
/// - `response.created` and `response.in_progress` first;
/// - text: `response.output_item.added` (a `message`),
///   `response.content_part.added`, the `response.output_text.delta`s,
///   then `response.output_text.done`, `response.content_part.done` and
///   `response.output_item.done` with the whole text once something else
///   begins or the answer finishes;
/// - each tool call (by its chat `index`): `response.output_item.added` (a
///   `function_call`), its `response.function_call_arguments.delta`s, and
///   at the finish `response.function_call_arguments.done` and
///   `response.output_item.done` with the whole arguments (calls stay open
///   till then, as chat may interleave their deltas);
/// - `response.completed` (or `response.incomplete` for a `length` or
///   `content_filter` finish) with the whole output and the usage, sent
///   once both the finish reason and the usage after it have come (chat
///   sends its usage in a last chunk; a running usage before the finish
///   would undercharge), or at `[DONE]`.
///
/// A stream whose usage never comes, or cannot be read, ends with
/// `usage: null`: unknown, which the gateway charges as such (its hold),
/// never a smaller number. A chat error chunk becomes `response.failed`
/// (its `error.code` chat's string code, else `rate_limit_exceeded` for a
/// 429 and `server_error` for the rest), as does a stream cut short before
/// its finish or one that cannot be read; a failed response carries the
/// usage only when the final one had come.
#[derive(Debug, Default)]
pub(crate) struct ChatToResponsesEvents {
    reader: EventReader,
    sequence: u64,
    started: bool,
    id: String,
    model: String,
    created_at: u64,
    output: Vec<Output>,
    finish_reason: Option<String>,
    /// `None` until a usage came; `Some(None)` when it could not be read.
    usage: Option<Option<Value>>,
    /// A usage came with the finish reason or after it: the final one.
    usage_final: bool,
    ended: bool,
}

impl ChatToResponsesEvents {
    /// A translation at the stream's start.
    pub(crate) fn new() -> Self {
        ChatToResponsesEvents::default()
    }

    /// The client's events for the next bytes of the upstream's stream.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Bytes {
        let mut items = Vec::new();
        self.reader.push(bytes, &mut items);
        self.translate(items)
    }

    /// The client's last events, at the end of the upstream's stream.
    pub(crate) fn finish(&mut self) -> Bytes {
        let mut items = Vec::new();
        self.reader.finish(&mut items);
        let mut out = BytesMut::from(&self.translate(items)[..]);
        if !self.ended {
            if self.started && self.finish_reason.is_some() {
                // Ended without `[DONE]`, but whole.
                self.end(&mut out);
            } else {
                let error = broken(CUT_SHORT);
                self.fail(&mut out, "server_error", error.message());
            }
        }
        out.freeze()
    }

    fn translate(&mut self, items: Vec<Item>) -> Bytes {
        let mut out = BytesMut::new();
        for item in items {
            if self.ended {
                break;
            }
            if matches!(&item, Item::Data(data) if data.trim_ascii() == b"[DONE]") {
                self.start(&mut out, &Value::Null);
                self.end(&mut out);
                continue;
            }
            match event_data(item) {
                Ok(chunk) => self.chunk(&mut out, &chunk),
                Err(error) => self.fail(&mut out, "server_error", error.message()),
            }
        }
        out.freeze()
    }

    fn chunk(&mut self, out: &mut BytesMut, chunk: &Value) {
        if let Some(error) = chunk.get("error").filter(|error| !error.is_null()) {
            let code = match error.get("code") {
                Some(Value::String(code)) if !code.is_empty() => code.clone(),
                Some(code) if code.as_u64() == Some(429) => "rate_limit_exceeded".into(),
                _ => "server_error".into(),
            };
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("the upstream's stream failed")
                .to_owned();
            self.fail(out, &code, &message);
            return;
        }
        self.start(out, chunk);
        if let Some(choice) = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|choices| choices.first())
        {
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            for field in ["content", "refusal"] {
                if let Some(text) = delta.get(field).and_then(Value::as_str)
                    && !text.is_empty()
                {
                    self.text(out, text);
                }
            }
            for (position, call) in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                self.tool_call(out, position as u64, call);
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str)
                && self.finish_reason.is_none()
            {
                self.finish_reason = Some(reason.to_owned());
                self.close_all(out);
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|usage| !usage.is_null()) {
            self.usage = Some(responses_usage_of_chat(usage));
            self.usage_final = self.finish_reason.is_some();
        }
        if self.usage_final {
            self.end(out);
        }
    }

    fn event(&mut self, out: &mut BytesMut, kind: &str, mut data: Map<String, Value>) {
        data.insert("type".into(), json!(kind));
        data.insert("sequence_number".into(), json!(self.sequence));
        self.sequence += 1;
        anthropic_event(out, kind, &Value::Object(data));
    }

    fn response(&self, status: &str) -> Map<String, Value> {
        let id = if self.id.is_empty() { "resp" } else { &self.id };
        response_object(id, self.created_at, &self.model, status)
    }

    fn start(&mut self, out: &mut BytesMut, chunk: &Value) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        self.id = chunk
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("resp")
            .to_owned();
        self.model = chunk
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        self.created_at = chunk.get("created").and_then(Value::as_u64).unwrap_or(0);
        for kind in ["response.created", "response.in_progress"] {
            let response = Value::Object(self.response("in_progress"));
            self.event(out, kind, fields(json!({"response": response})));
        }
    }

    fn text(&mut self, out: &mut BytesMut, text: &str) {
        let index = match self.output.last() {
            Some(Output::Message { open: true, .. }) => self.output.len() - 1,
            _ => {
                self.close_message(out);
                let index = self.output.len();
                self.output.push(Output::Message {
                    text: String::new(),
                    open: true,
                });
                let id = message_id(index);
                let item = message_item(&id, "in_progress", Vec::new());
                self.event(
                    out,
                    "response.output_item.added",
                    fields(json!({"output_index": index, "item": item})),
                );
                self.event(
                    out,
                    "response.content_part.added",
                    fields(
                        json!({"item_id": id, "output_index": index, "content_index": 0,
                                  "part": output_text("")}),
                    ),
                );
                index
            }
        };
        if let Some(Output::Message { text: held, .. }) = self.output.get_mut(index) {
            held.push_str(text);
        }
        self.event(
            out,
            "response.output_text.delta",
            fields(json!({"item_id": message_id(index), "output_index": index,
                          "content_index": 0, "delta": text, "logprobs": []})),
        );
    }

    fn tool_call(&mut self, out: &mut BytesMut, position: u64, call: &Value) {
        let chat_index = call
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(position);
        let known = self.output.iter().position(
            |item| matches!(item, Output::Call { chat_index: known, open: true, .. } if *known == chat_index),
        );
        let name = call.pointer("/function/name").and_then(Value::as_str);
        let index = match known {
            Some(index) => {
                // A name sent after the call's first chunk.
                if let (Some(Output::Call { name: held, .. }), Some(name)) =
                    (self.output.get_mut(index), name)
                    && held.is_empty()
                {
                    name.clone_into(held);
                }
                index
            }
            None => {
                self.close_message(out);
                let call_id = match call.get("id").and_then(Value::as_str) {
                    Some(id) if !id.is_empty() => id.to_owned(),
                    _ => format!("call_{chat_index}"),
                };
                let name = name.unwrap_or_default().to_owned();
                let index = self.output.len();
                let item = function_call_item(&call_id, &name, "", "in_progress");
                self.output.push(Output::Call {
                    chat_index,
                    call_id,
                    name,
                    arguments: String::new(),
                    open: true,
                });
                self.event(
                    out,
                    "response.output_item.added",
                    fields(json!({"output_index": index, "item": item})),
                );
                index
            }
        };
        if let Some(arguments) = call.pointer("/function/arguments").and_then(Value::as_str)
            && !arguments.is_empty()
            && let Some(Output::Call {
                call_id,
                arguments: held,
                ..
            }) = self.output.get_mut(index)
        {
            held.push_str(arguments);
            let item_id = format!("fc_{call_id}");
            self.event(
                out,
                "response.function_call_arguments.delta",
                fields(json!({"item_id": item_id, "output_index": index, "delta": arguments})),
            );
        }
    }

    /// The open message's last events, if one is open.
    fn close_message(&mut self, out: &mut BytesMut) {
        let Some(index) = self
            .output
            .iter()
            .position(|item| matches!(item, Output::Message { open: true, .. }))
        else {
            return;
        };
        let text = match &mut self.output[index] {
            Output::Message { text, open } => {
                *open = false;
                text.clone()
            }
            Output::Call { .. } => return,
        };
        let id = message_id(index);
        self.event(
            out,
            "response.output_text.done",
            fields(
                json!({"item_id": id, "output_index": index, "content_index": 0,
                          "text": text, "logprobs": []}),
            ),
        );
        self.event(
            out,
            "response.content_part.done",
            fields(
                json!({"item_id": id, "output_index": index, "content_index": 0,
                          "part": output_text(&text)}),
            ),
        );
        let item = self.final_item(index);
        self.event(
            out,
            "response.output_item.done",
            fields(json!({"output_index": index, "item": item})),
        );
    }

    /// Every open item's last events, in output order.
    fn close_all(&mut self, out: &mut BytesMut) {
        self.close_message(out);
        for index in 0..self.output.len() {
            let Output::Call {
                call_id,
                name,
                arguments,
                open: open @ true,
                ..
            } = &mut self.output[index]
            else {
                continue;
            };
            *open = false;
            let data = json!({"item_id": format!("fc_{call_id}"), "output_index": index,
                              "name": name, "arguments": arguments});
            self.event(out, "response.function_call_arguments.done", fields(data));
            let item = self.final_item(index);
            self.event(
                out,
                "response.output_item.done",
                fields(json!({"output_index": index, "item": item})),
            );
        }
    }

    fn final_item(&self, index: usize) -> Value {
        match &self.output[index] {
            Output::Message { text, .. } => {
                message_item(&message_id(index), "completed", vec![output_text(text)])
            }
            Output::Call {
                call_id,
                name,
                arguments,
                ..
            } => function_call_item(call_id, name, arguments, "completed"),
        }
    }

    /// `response.completed` or `response.incomplete`, with the usage.
    fn end(&mut self, out: &mut BytesMut) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        self.close_all(out);
        let (status, incomplete) = responses_status_of(self.finish_reason.as_deref());
        let mut response = self.response(status);
        let output: Vec<Value> = (0..self.output.len())
            .map(|index| self.final_item(index))
            .collect();
        response.insert("output".into(), Value::Array(output));
        if let Some(reason) = incomplete {
            response.insert("incomplete_details".into(), json!({"reason": reason}));
        }
        // Unknown (null), never smaller, when it did not come or cannot be read.
        if let Some(usage) = self.usage.clone().flatten() {
            response.insert("usage".into(), usage);
        }
        let kind = if incomplete.is_some() {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.event(out, kind, fields(json!({"response": response})));
    }

    fn fail(&mut self, out: &mut BytesMut, code: &str, message: &str) {
        self.ended = true;
        let mut response = self.response("failed");
        response.insert("error".into(), json!({"code": code, "message": message}));
        if self.usage_final
            && let Some(usage) = self.usage.clone().flatten()
        {
            response.insert("usage".into(), usage);
        }
        self.event(
            out,
            "response.failed",
            fields(json!({"response": response})),
        );
    }
}

fn message_id(index: usize) -> String {
    format!("msg_{index}")
}

fn fields(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(fields) => fields,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credit::{ResponsesUsage, Usage};
    use proptest::prelude::*;

    /// Each event of a stream: its `event:` name and its data, checked to
    /// agree on the type.
    fn events(stream: &[u8]) -> Vec<(String, Value)> {
        let text = std::str::from_utf8(stream).unwrap();
        assert!(text.is_empty() || text.ends_with("\n\n"), "{text:?}");
        text.split("\n\n")
            .filter(|event| !event.is_empty())
            .map(|event| {
                let (name, data) = event.split_once('\n').unwrap();
                let name = name.strip_prefix("event: ").unwrap().to_owned();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"], name);
                (name, data)
            })
            .collect()
    }

    fn to_responses(chunks: &[&[u8]]) -> Vec<u8> {
        let mut events = ChatToResponsesEvents::new();
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend_from_slice(&events.push(chunk));
        }
        out.extend_from_slice(&events.finish());
        out
    }

    fn chat_stream(chunks: &[Value], done: bool) -> Vec<u8> {
        let mut stream = Vec::new();
        for chunk in chunks {
            stream.extend_from_slice(format!("data: {chunk}\n\n").as_bytes());
        }
        if done {
            stream.extend_from_slice(b"data: [DONE]\n\n");
        }
        stream
    }

    fn chat_chunk(delta: Value, finish_reason: Option<&str>) -> Value {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": "gpt-4o",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], "usage": null})
    }

    fn chat_usage() -> Value {
        json!({"prompt_tokens": 20000, "completion_tokens": 640, "total_tokens": 20640,
               "prompt_tokens_details": {"cached_tokens": 19456},
               "completion_tokens_details": {"reasoning_tokens": 512}})
    }

    /// A chat stream of a text and two tool calls (their deltas
    /// interleaved), its usage last, as OpenAI sends it.
    fn sample_chat_stream() -> Vec<u8> {
        chat_stream(
            &[
                chat_chunk(json!({"role": "assistant", "content": ""}), None),
                chat_chunk(json!({"content": "Let me "}), None),
                chat_chunk(json!({"content": "look."}), None),
                chat_chunk(
                    json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "exec_command", "arguments": ""}}]}),
                    None,
                ),
                chat_chunk(
                    json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                    "function": {"name": "read", "arguments": "{}"}}]}),
                    None,
                ),
                chat_chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"cmd\":"}}]}),
                    None,
                ),
                chat_chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"ls\"}"}}]}),
                    None,
                ),
                chat_chunk(json!({}), Some("tool_calls")),
                json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o",
                       "choices": [], "usage": chat_usage()}),
            ],
            true,
        )
    }

    fn names(got: &[(String, Value)]) -> Vec<&str> {
        got.iter().map(|(name, _)| name.as_str()).collect()
    }

    #[test]
    fn a_chat_stream_becomes_responses_events() {
        let got = events(&to_responses(&[&sample_chat_stream()]));
        assert_eq!(
            names(&got),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (number, (_, data)) in got.iter().enumerate() {
            assert_eq!(data["sequence_number"], number as u64);
        }
        assert_eq!(
            got[0].1["response"],
            json!({"id": "chatcmpl-1", "object": "response", "created_at": 1_700_000_000,
                   "status": "in_progress", "model": "gpt-4o", "output": [], "error": null,
                   "incomplete_details": null, "usage": null})
        );
        assert_eq!(
            got[4].1,
            json!({"type": "response.output_text.delta", "sequence_number": 4, "item_id": "msg_0",
                   "output_index": 0, "content_index": 0, "delta": "Let me ", "logprobs": []})
        );
        let text_item = json!({"id": "msg_0", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]});
        assert_eq!(got[8].1["item"], text_item);
        assert_eq!(
            got[9].1["item"],
            json!({"id": "fc_call_1", "type": "function_call", "status": "in_progress",
                   "call_id": "call_1", "name": "exec_command", "arguments": ""})
        );
        // The second call's arguments came with its first chunk.
        assert_eq!(got[11].1["item_id"], "fc_call_2");
        assert_eq!(got[11].1["output_index"], 2);
        assert_eq!(got[12].1["delta"], "{\"cmd\":");
        let first_call = json!({"id": "fc_call_1", "type": "function_call", "status": "completed",
            "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"});
        let second_call = json!({"id": "fc_call_2", "type": "function_call", "status": "completed",
            "call_id": "call_2", "name": "read", "arguments": "{}"});
        assert_eq!(got[14].1["arguments"], "{\"cmd\":\"ls\"}");
        assert_eq!(got[15].1["item"], first_call);
        assert_eq!(got[17].1["item"], second_call);
        let completed = &got[18].1["response"];
        assert_eq!(completed["status"], "completed");
        assert_eq!(
            completed["output"],
            json!([text_item, first_call, second_call])
        );
        // The cache stays in the input, the reasoning in the output.
        assert_eq!(
            completed["usage"],
            json!({"input_tokens": 20000, "input_tokens_details": {"cached_tokens": 19456},
                   "output_tokens": 640, "output_tokens_details": {"reasoning_tokens": 512},
                   "total_tokens": 20640})
        );
        // The gateway's reader of Responses usage charges what chat said.
        let mut usage = ResponsesUsage::default();
        for (_, data) in &got {
            usage.merge_event(data);
        }
        assert_eq!(
            usage.usage(),
            Usage::from_response(&json!({"usage": chat_usage()}))
        );
    }

    #[test]
    fn a_length_finish_is_an_incomplete_response_with_its_usage() {
        let stream = chat_stream(
            &[
                chat_chunk(json!({"content": "Hi"}), None),
                chat_chunk(json!({}), Some("length")),
                json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}),
            ],
            true,
        );
        let got = events(&to_responses(&[&stream]));
        let (name, last) = got.last().unwrap();
        assert_eq!(name, "response.incomplete");
        assert_eq!(last["response"]["status"], "incomplete");
        assert_eq!(
            last["response"]["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(last["response"]["usage"]["input_tokens"], 9);
        assert_eq!(last["response"]["usage"]["output_tokens"], 1);
    }

    #[test]
    fn a_chat_stream_without_usable_usage_completes_with_its_usage_unknown() {
        for last in [
            None,
            Some(json!({"prompt_tokens": 10})),
            Some(
                json!({"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 11}}),
            ),
            Some(
                json!({"prompt_tokens": 10, "completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": 3}}),
            ),
        ] {
            let mut chunks = vec![
                chat_chunk(json!({"content": "Hi"}), None),
                chat_chunk(json!({}), Some("stop")),
            ];
            if let Some(usage) = &last {
                chunks.push(json!({"choices": [], "usage": usage}));
            }
            for done in [true, false] {
                let got = events(&to_responses(&[&chat_stream(&chunks, done)]));
                let (name, data) = got.last().unwrap();
                assert_eq!(name, "response.completed", "{last:?}");
                assert!(data["response"]["usage"].is_null(), "{last:?}");
                let mut usage = ResponsesUsage::default();
                for (_, data) in &got {
                    usage.merge_event(data);
                }
                assert_eq!(usage.usage(), None, "unknown, not zero: {last:?}");
            }
        }
    }

    #[test]
    fn a_running_usage_before_the_finish_is_not_taken_for_the_final_one() {
        let usage = |prompt: u64, completion: u64| json!({"prompt_tokens": prompt, "completion_tokens": completion});
        let mut first = chat_chunk(json!({"content": "Hi"}), None);
        first["usage"] = usage(10, 1);
        let stream = chat_stream(
            &[
                first,
                chat_chunk(json!({}), Some("stop")),
                json!({"choices": [], "usage": usage(10, 7)}),
            ],
            true,
        );
        let got = events(&to_responses(&[&stream]));
        assert_eq!(
            got.iter()
                .filter(|(name, _)| name == "response.completed")
                .count(),
            1
        );
        let mut read = ResponsesUsage::default();
        for (_, data) in &got {
            read.merge_event(data);
        }
        assert_eq!(read.usage().unwrap().completion_tokens, 7);
    }

    #[test]
    fn a_chat_error_chunk_becomes_a_failed_response() {
        for (error, code) in [
            (
                json!({"message": "Rate limit reached", "code": 429}),
                "rate_limit_exceeded",
            ),
            (
                json!({"message": "Too long", "code": "context_length_exceeded"}),
                "context_length_exceeded",
            ),
            (json!({"message": "Boom"}), "server_error"),
        ] {
            let stream = chat_stream(
                &[
                    chat_chunk(json!({"content": "Hi"}), None),
                    json!({"error": error}),
                ],
                false,
            );
            let got = events(&to_responses(&[&stream]));
            let (name, data) = got.last().unwrap();
            assert_eq!(name, "response.failed");
            assert_eq!(data["response"]["status"], "failed");
            assert_eq!(data["response"]["error"]["code"], code);
            assert_eq!(data["response"]["error"]["message"], error["message"]);
            assert!(data["response"]["usage"].is_null());
            assert!(
                got.iter()
                    .all(|(name, _)| name != "response.completed" && name != "response.incomplete")
            );
        }
    }

    #[test]
    fn a_chat_stream_cut_short_or_unreadable_ends_with_one_failed_response() {
        let cut = chat_stream(&[chat_chunk(json!({"content": "Hi"}), None)], false);
        let garbled = b"data: {\"choices\": [\n\ndata: [DONE]\n\n".to_vec();
        let too_long = format!(
            "data: {}\n\n",
            "x".repeat(crate::edit::MAX_SSE_LINE_BYTES + 1)
        )
        .into_bytes();
        for stream in [cut, garbled, too_long, Vec::new()] {
            let got = events(&to_responses(&[&stream]));
            let (name, data) = got.last().unwrap();
            assert_eq!(name, "response.failed");
            assert_eq!(data["response"]["error"]["code"], "server_error");
            assert_eq!(
                got.iter()
                    .filter(|(name, _)| name.starts_with("response.")
                        && matches!(
                            name.as_str(),
                            "response.failed" | "response.completed" | "response.incomplete"
                        ))
                    .count(),
                1
            );
            let mut usage = ResponsesUsage::default();
            for (_, data) in &got {
                usage.merge_event(data);
            }
            assert_eq!(usage.usage(), None);
        }
    }

    #[test]
    fn text_after_a_tool_call_is_a_new_message_and_a_late_name_is_kept() {
        let stream = chat_stream(
            &[
                chat_chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                    None,
                ),
                chat_chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}),
                    None,
                ),
                chat_chunk(json!({"refusal": "No."}), Some("stop")),
                json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
            ],
            true,
        );
        let got = events(&to_responses(&[&stream]));
        let output = &got.last().unwrap().1["response"]["output"];
        assert_eq!(
            output,
            &json!([
                {"id": "fc_call_0", "type": "function_call", "status": "completed",
                 "call_id": "call_0", "name": "f", "arguments": "{}"},
                {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "No.", "annotations": []}]},
            ])
        );
    }

    /// `stream` cut at `cuts` (positions, any order, repeats allowed).
    fn cut(stream: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut cuts: Vec<usize> = cuts.iter().map(|at| at % (stream.len() + 1)).collect();
        cuts.sort_unstable();
        let mut pieces = Vec::new();
        let mut from = 0;
        for at in cuts {
            pieces.push(stream[from..at].to_vec());
            from = at;
        }
        pieces.push(stream[from..].to_vec());
        pieces
    }

    proptest! {
        #[test]
        fn any_chunking_of_a_chat_stream_gives_what_one_chunk_gives(
            cuts in prop::collection::vec(any::<usize>(), 0..12),
            crlf in any::<bool>(),
        ) {
            let mut stream = sample_chat_stream();
            if crlf {
                stream = String::from_utf8_lossy(&stream).replace('\n', "\r\n").into_bytes();
            }
            let pieces = cut(&stream, &cuts);
            let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(to_responses(&pieces), to_responses(&[&stream]));
        }

        #[test]
        fn arbitrary_streams_never_panic_chunk_alike_and_end_once(
            stream in prop::collection::vec(prop_oneof![
                Just(b"data: ".to_vec()), Just(b"event: ".to_vec()), Just(b"\n".to_vec()), Just(b"\r".to_vec()),
                Just(b"[DONE]".to_vec()),
                Just(b"{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}".to_vec()),
                Just(b"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\"}}]},\"finish_reason\":\"stop\"}]}".to_vec()),
                Just(b"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"x\"}]},\"finish_reason\":null}]}".to_vec()),
                Just(b"{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}".to_vec()),
                Just(b"{\"error\":{}}".to_vec()),
                prop::collection::vec(any::<u8>(), 0..8),
            ], 0..24).prop_map(|parts| parts.concat()),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
        ) {
            let pieces = cut(&stream, &cuts);
            let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            let out = to_responses(&pieces);
            prop_assert_eq!(&out, &to_responses(&[&stream]));
            let got = events(&out);
            let last = got.iter().filter(|(name, _)| matches!(name.as_str(),
                "response.completed" | "response.incomplete" | "response.failed")).count();
            prop_assert_eq!(last, 1);
            prop_assert!(matches!(got.last().map(|(name, _)| name.as_str()),
                Some("response.completed" | "response.incomplete" | "response.failed")));
            for (number, (_, data)) in got.iter().enumerate() {
                prop_assert_eq!(&data["sequence_number"], &json!(number));
            }
        }
    }
}
