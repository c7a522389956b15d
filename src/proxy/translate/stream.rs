//! Streams: an upstream's server-sent events in the other API's events,
//! event by event, however the upstream's bytes are chunked.

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};

use super::usage::{MessagesTokens, Tokens, finish_reason_of, stop_reason_of};
use crate::edit::{MAX_SSE_LINE_BYTES, SseLines, SsePiece};
use crate::error::GatewayError;

/// What an event of the upstream's stream held.
pub(super) enum Item {
    /// Its `data`, its lines joined by `\n`.
    Data(Vec<u8>),
    /// Data past [`MAX_SSE_LINE_BYTES`], which is not held.
    TooLong,
}

/// Cuts an event stream into events' data (`event:`, `id:` and comments
/// are not needed: each API's data says what it is).
#[derive(Debug, Default)]
pub(super) struct EventReader {
    lines: SseLines,
    data: Vec<u8>,
    has_data: bool,
    too_long: bool,
}

impl EventReader {
    pub(super) fn push(&mut self, bytes: &[u8], items: &mut Vec<Item>) {
        self.lines.push(bytes);
        while let Some(piece) = self.lines.next_piece() {
            self.piece(piece, items);
        }
    }

    /// At the body's end: its last line, and an event it did not end with
    /// a blank line.
    pub(super) fn finish(&mut self, items: &mut Vec<Item>) {
        if let Some(piece) = self.lines.finish() {
            self.piece(piece, items);
        }
        self.dispatch(items);
    }

    fn piece(&mut self, piece: SsePiece, items: &mut Vec<Item>) {
        match piece {
            SsePiece::Line(line) => self.line(&line, items),
            SsePiece::Long(_) => self.too_long = true,
            SsePiece::LineEnd(_) => {}
        }
    }

    fn line(&mut self, line: &[u8], items: &mut Vec<Item>) {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch(items);
            return;
        }
        let Some(value) = line.strip_prefix(b"data:") else {
            // `event:`, `id:`, `retry:`, comments.
            return;
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if self.has_data {
            self.data.push(b'\n');
        }
        self.has_data = true;
        if self.data.len() + value.len() > MAX_SSE_LINE_BYTES {
            self.too_long = true;
        } else {
            self.data.extend_from_slice(value);
        }
    }

    fn dispatch(&mut self, items: &mut Vec<Item>) {
        if std::mem::take(&mut self.too_long) {
            items.push(Item::TooLong);
        } else if self.has_data {
            items.push(Item::Data(std::mem::take(&mut self.data)));
        }
        self.data.clear();
        self.has_data = false;
    }
}

/// What went wrong reading a stream, said to the client in its own API.
pub(super) fn broken(why: &str) -> GatewayError {
    super::response::untranslatable(why)
}

pub(super) const CUT_SHORT: &str = "the upstream's stream ended before its answer did";

pub(super) fn event_data(item: Item) -> Result<Value, GatewayError> {
    match item {
        Item::Data(data) => {
            serde_json::from_slice(&data).map_err(|_| broken("an event of its stream is not JSON"))
        }
        Item::TooLong => Err(broken(&format!(
            "an event of its stream is longer than {MAX_SSE_LINE_BYTES} bytes"
        ))),
    }
}

/// Which block of the answer is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Text(u64),
    Tool(u64),
}

/// A chat-completions stream as Anthropic's Messages events:
/// `message_start`, each text or tool call as a content block
/// (`text_delta`, `input_json_delta`), then `message_delta` with the stop
/// reason and the usage once both are known (chat sends its usage in a
/// last chunk after the finish reason), and `message_stop`.
///
/// `message_start` says its counts are null: Anthropic's SDKs read null as
/// nothing yet, and a reader that takes each count's last value never
/// takes it for zero tokens. A stream whose usage never comes ends with
/// null counts too, so its usage stays unknown rather than zero. An error
/// chunk becomes an `error` event; a stream cut short ends with one.
#[derive(Debug, Default)]
pub(crate) struct ChatToMessagesEvents {
    reader: EventReader,
    started: bool,
    open: Option<Open>,
    next_block: u64,
    /// The chat index of each tool call, with its block's index.
    tool_blocks: Vec<(u64, u64)>,
    stop_reason: Option<&'static str>,
    /// `None` until a usage came; `Some(None)` when it could not be read.
    usage: Option<Option<Tokens>>,
    /// A usage came with the finish reason or after it: the final one (an
    /// upstream may report a running usage before).
    usage_final: bool,
    ended: bool,
}

impl ChatToMessagesEvents {
    /// A translation at the stream's start.
    pub(crate) fn new() -> Self {
        ChatToMessagesEvents::default()
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
            if self.started && self.stop_reason.is_some() {
                // Ended without `[DONE]`, but whole.
                self.end(&mut out);
            } else {
                self.fail(&mut out, &broken(CUT_SHORT));
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
                Err(error) => self.fail(&mut out, &error),
            }
        }
        out.freeze()
    }

    fn chunk(&mut self, out: &mut BytesMut, chunk: &Value) {
        if let Some(error) = chunk.get("error").filter(|error| !error.is_null()) {
            let status = error
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|code| u16::try_from(code).ok())
                .and_then(|code| http::StatusCode::from_u16(code).ok())
                .filter(|status| status.is_client_error() || status.is_server_error())
                .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("the upstream's stream failed");
            self.fail(
                out,
                &GatewayError::with_upstream_status(status, message.to_owned()),
            );
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
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.stop_reason = Some(stop_reason_of(reason));
                self.close(out);
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|usage| !usage.is_null()) {
            self.usage = Some(Tokens::from_chat(usage));
            self.usage_final = self.stop_reason.is_some();
        }
        if self.usage_final {
            self.end(out);
        }
    }

    fn start(&mut self, out: &mut BytesMut, chunk: &Value) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let text = |field: &str, default: &str| {
            chunk
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_owned()
        };
        anthropic_event(
            out,
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": text("id", "msg"), "type": "message", "role": "assistant",
                "model": text("model", ""), "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": null, "output_tokens": null},
            }}),
        );
    }

    fn text(&mut self, out: &mut BytesMut, text: &str) {
        let index = match self.open {
            Some(Open::Text(index)) => index,
            _ => {
                self.close(out);
                let index = self.open_block(out, json!({"type": "text", "text": ""}));
                self.open = Some(Open::Text(index));
                index
            }
        };
        anthropic_event(
            out,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": text}}),
        );
    }

    fn tool_call(&mut self, out: &mut BytesMut, position: u64, call: &Value) {
        let chat_index = call
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(position);
        let known = self
            .tool_blocks
            .iter()
            .find(|(chat, _)| *chat == chat_index)
            .map(|(_, block)| *block);
        let index = match known {
            Some(index) => index,
            None => {
                self.close(out);
                let id = match call.get("id").and_then(Value::as_str) {
                    Some(id) => id.to_owned(),
                    None => format!("call_{chat_index}"),
                };
                let name = call
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let index = self.open_block(
                    out,
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                );
                self.tool_blocks.push((chat_index, index));
                self.open = Some(Open::Tool(index));
                index
            }
        };
        if let Some(arguments) = call.pointer("/function/arguments").and_then(Value::as_str)
            && !arguments.is_empty()
        {
            anthropic_event(
                out,
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": arguments}}),
            );
        }
    }

    fn open_block(&mut self, out: &mut BytesMut, block: Value) -> u64 {
        let index = self.next_block;
        self.next_block += 1;
        anthropic_event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        index
    }

    fn close(&mut self, out: &mut BytesMut) {
        if let Some(Open::Text(index) | Open::Tool(index)) = self.open.take() {
            anthropic_event(
                out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            );
        }
    }

    /// `message_delta` and `message_stop`.
    fn end(&mut self, out: &mut BytesMut) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        self.close(out);
        let usage = match self.usage.flatten() {
            Some(tokens) => tokens.to_messages(),
            // Unknown, not zero.
            None => json!({"input_tokens": null, "output_tokens": null}),
        };
        anthropic_event(
            out,
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": self.stop_reason.unwrap_or("end_turn"), "stop_sequence": null},
                    "usage": usage}),
        );
        anthropic_event(out, "message_stop", &json!({"type": "message_stop"}));
    }

    fn fail(&mut self, out: &mut BytesMut, error: &GatewayError) {
        self.ended = true;
        let mut data = error.to_anthropic_json();
        // Anthropic's `error` event carries `type` and `message` only.
        if let Some(inner) = data.get_mut("error").and_then(Value::as_object_mut) {
            inner.remove("metadata");
        }
        anthropic_event(out, "error", &data);
    }
}

pub(super) fn anthropic_event(out: &mut BytesMut, name: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

fn chat_event(out: &mut BytesMut, data: &Value) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// The status an Anthropic error `type` stands for (an overload as 503,
/// the gateway's own overload).
fn status_of_anthropic_error(kind: &str) -> http::StatusCode {
    use http::StatusCode;
    match kind {
        "invalid_request_error" => StatusCode::BAD_REQUEST,
        "authentication_error" => StatusCode::UNAUTHORIZED,
        "billing_error" => StatusCode::PAYMENT_REQUIRED,
        "permission_error" => StatusCode::FORBIDDEN,
        "not_found_error" => StatusCode::NOT_FOUND,
        "request_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
        "rate_limit_error" => StatusCode::TOO_MANY_REQUESTS,
        "overloaded_error" => StatusCode::SERVICE_UNAVAILABLE,
        "timeout_error" => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Anthropic's Messages events as a chat-completions stream: a first chunk
/// with the role, text deltas as `delta.content`, each `tool_use` block as
/// a tool call (its id and name first, its `input_json_delta`s as argument
/// deltas), the stop reason as a finish-reason chunk, then a usage chunk
/// (`choices: []`, OpenAI's convention: the cache in the prompt) and
/// `data: [DONE]`. Thinking and `ping` are dropped; an `error` event
/// becomes a chunk `{"error": {…}}` in the gateway's error format; a stream
/// cut short ends with one. The usage chunk is left out when the usage
/// cannot be read, so it is unknown rather than smaller.
#[derive(Debug, Default)]
pub(crate) struct MessagesToChatEvents {
    reader: EventReader,
    id: String,
    model: String,
    started: bool,
    /// The index of each `tool_use` block, with its chat index.
    tool_calls: Vec<(u64, u64)>,
    usage: MessagesTokens,
    finished: bool,
    ended: bool,
}

impl MessagesToChatEvents {
    /// A translation at the stream's start.
    pub(crate) fn new() -> Self {
        MessagesToChatEvents::default()
    }

    /// The client's chunks for the next bytes of the upstream's stream.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Bytes {
        let mut items = Vec::new();
        self.reader.push(bytes, &mut items);
        self.translate(items)
    }

    /// The client's last chunks, at the end of the upstream's stream.
    pub(crate) fn finish(&mut self) -> Bytes {
        let mut items = Vec::new();
        self.reader.finish(&mut items);
        let mut out = BytesMut::from(&self.translate(items)[..]);
        if !self.ended {
            self.fail(&mut out, &broken(CUT_SHORT));
        }
        out.freeze()
    }

    fn translate(&mut self, items: Vec<Item>) -> Bytes {
        let mut out = BytesMut::new();
        for item in items {
            if self.ended {
                break;
            }
            match event_data(item) {
                Ok(event) => self.event(&mut out, &event),
                Err(error) => self.fail(&mut out, &error),
            }
        }
        out.freeze()
    }

    fn event(&mut self, out: &mut BytesMut, event: &Value) {
        match event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "message_start" => {
                let message = event.get("message").unwrap_or(&Value::Null);
                if let Some(id) = message.get("id").and_then(Value::as_str) {
                    self.id = id.to_owned();
                }
                if let Some(model) = message.get("model").and_then(Value::as_str) {
                    self.model = model.to_owned();
                }
                if let Some(usage) = message.get("usage") {
                    self.usage.merge(usage);
                }
                self.start(out);
            }
            "content_block_start" => {
                self.start(out);
                let block = event.get("content_block").unwrap_or(&Value::Null);
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(text) = block.get("text").and_then(Value::as_str)
                            && !text.is_empty()
                        {
                            self.delta(out, json!({"content": text}));
                        }
                    }
                    Some("tool_use") => {
                        let block_index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
                        let chat_index = self.tool_calls.len() as u64;
                        self.tool_calls.push((block_index, chat_index));
                        let arguments = match block.get("input") {
                            Some(Value::Object(input)) if !input.is_empty() => {
                                Value::Object(input.clone()).to_string()
                            }
                            _ => String::new(),
                        };
                        self.delta(
                            out,
                            json!({"tool_calls": [{
                                "index": chat_index,
                                "id": block.get("id").and_then(Value::as_str).unwrap_or_default(),
                                "type": "function",
                                "function": {
                                    "name": block.get("name").and_then(Value::as_str).unwrap_or_default(),
                                    "arguments": arguments,
                                },
                            }]}),
                        );
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                self.start(out);
                let delta = event.get("delta").unwrap_or(&Value::Null);
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        if let Some(text) = delta.get("text").and_then(Value::as_str)
                            && !text.is_empty()
                        {
                            self.delta(out, json!({"content": text}));
                        }
                    }
                    Some("input_json_delta") => {
                        let block_index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
                        let chat_index = self
                            .tool_calls
                            .iter()
                            .find(|(block, _)| *block == block_index)
                            .map(|(_, chat)| *chat);
                        if let Some(chat_index) = chat_index
                            && let Some(json) = delta.get("partial_json").and_then(Value::as_str)
                            && !json.is_empty()
                        {
                            self.delta(
                                out,
                                json!({"tool_calls": [{"index": chat_index, "function": {"arguments": json}}]}),
                            );
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                self.start(out);
                if let Some(usage) = event.get("usage") {
                    self.usage.merge(usage);
                }
                if let Some(reason) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.finish_reason(out, finish_reason_of(reason));
                }
            }
            "message_stop" => {
                self.start(out);
                self.finish_reason(out, "stop");
                if let Some(tokens) = self.usage.tokens() {
                    let usage_chunk = self.chunk(json!([]), Some(tokens.to_chat()));
                    chat_event(out, &usage_chunk);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                self.ended = true;
            }
            "error" => {
                let error = event.get("error").unwrap_or(&Value::Null);
                let kind = error
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let message = error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("the upstream's stream failed");
                self.fail(
                    out,
                    &GatewayError::with_upstream_status(
                        status_of_anthropic_error(kind),
                        message.to_owned(),
                    ),
                );
            }
            // `ping`, `content_block_stop`, newer events.
            _ => {}
        }
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let mut chunk = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": 0,
            "model": self.model, "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        chunk
    }

    fn start(&mut self, out: &mut BytesMut) {
        if !std::mem::replace(&mut self.started, true) {
            self.delta(out, json!({"role": "assistant", "content": ""}));
        }
    }

    fn delta(&self, out: &mut BytesMut, delta: Value) {
        let chunk = self.chunk(
            json!([{"index": 0, "delta": delta, "finish_reason": null}]),
            None,
        );
        chat_event(out, &chunk);
    }

    fn finish_reason(&mut self, out: &mut BytesMut, reason: &str) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let chunk = self.chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": reason}]),
            None,
        );
        chat_event(out, &chunk);
    }

    fn fail(&mut self, out: &mut BytesMut, error: &GatewayError) {
        self.ended = true;
        chat_event(out, &error.to_json());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credit::{MessagesUsage, Usage};
    use proptest::prelude::*;

    /// Each event of a stream: its `event:` name (if any) and its data.
    fn events(stream: &[u8]) -> Vec<(Option<String>, Value)> {
        let text = std::str::from_utf8(stream).unwrap();
        assert!(text.is_empty() || text.ends_with("\n\n"), "{text:?}");
        text.split("\n\n")
            .filter(|event| !event.is_empty())
            .map(|event| {
                let mut name = None;
                let mut data = None;
                for line in event.lines() {
                    if let Some(value) = line.strip_prefix("event: ") {
                        name = Some(value.to_owned());
                    } else if let Some(value) = line.strip_prefix("data: ") {
                        data = Some(if value == "[DONE]" {
                            json!("[DONE]")
                        } else {
                            serde_json::from_str(value).unwrap()
                        });
                    }
                }
                (name, data.unwrap())
            })
            .collect()
    }

    fn chat_to_messages(chunks: &[&[u8]]) -> Vec<u8> {
        let mut events = ChatToMessagesEvents::new();
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend_from_slice(&events.push(chunk));
        }
        out.extend_from_slice(&events.finish());
        out
    }

    fn messages_to_chat(chunks: &[&[u8]]) -> Vec<u8> {
        let mut events = MessagesToChatEvents::new();
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
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], "usage": null})
    }

    /// OpenAI's stream of a text and two tool calls, its usage last.
    fn sample_chat_stream() -> Vec<u8> {
        chat_stream(
            &[
                chat_chunk(json!({"role": "assistant", "content": ""}), None),
                chat_chunk(json!({"content": "Let me "}), None),
                chat_chunk(json!({"content": "look."}), None),
                chat_chunk(
                    json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "weather", "arguments": ""}}]}),
                    None,
                ),
                chat_chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}),
                    None,
                ),
                chat_chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
                    None,
                ),
                chat_chunk(
                    json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                    "function": {"name": "time", "arguments": "{}"}}]}),
                    None,
                ),
                chat_chunk(json!({}), Some("tool_calls")),
                json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o", "choices": [],
                       "usage": {"prompt_tokens": 2000, "completion_tokens": 60, "total_tokens": 2060,
                                 "prompt_tokens_details": {"cached_tokens": 1200},
                                 "completion_tokens_details": {"reasoning_tokens": 30}}}),
            ],
            true,
        )
    }

    #[test]
    fn a_chat_stream_becomes_messages_events() {
        let out = chat_to_messages(&[&sample_chat_stream()]);
        let expected = vec![
            (
                "message_start",
                json!({"type": "message_start", "message": {"id": "chatcmpl-1", "type": "message",
                "role": "assistant", "model": "gpt-4o", "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": null, "output_tokens": null}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "Let me "}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "look."}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 1,
                "content_block": {"type": "tool_use", "id": "call_1", "name": "weather", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "{\"city\":"}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "\"Paris\"}"}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 2,
                "content_block": {"type": "tool_use", "id": "call_2", "name": "time", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 2,
                "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 2}),
            ),
            // 2000 - 1200 read; the 30 reasoning tokens stay in the 60.
            (
                "message_delta",
                json!({"type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                "usage": {"input_tokens": 800, "cache_read_input_tokens": 1200,
                          "cache_creation_input_tokens": 0, "output_tokens": 60}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ];
        let got = events(&out);
        assert_eq!(
            got.len(),
            expected.len(),
            "{}",
            String::from_utf8_lossy(&out)
        );
        for ((name, data), (expected_name, expected_data)) in got.into_iter().zip(expected) {
            assert_eq!(name.as_deref(), Some(expected_name));
            assert_eq!(data, expected_data);
        }
        // The gateway's own reader of Anthropic usage charges what chat said.
        let mut usage = MessagesUsage::default();
        for (_, data) in events(&out) {
            usage.merge_event(&data);
        }
        let usage = usage.usage().unwrap();
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.cache_read_tokens,
                usage.completion_tokens
            ),
            (2000, 1200, 60)
        );
    }

    #[test]
    fn a_chat_stream_without_usable_usage_ends_with_its_usage_unknown() {
        for last in [
            None,
            Some(json!({"prompt_tokens": 10})),
            Some(
                json!({"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 11}}),
            ),
        ] {
            let mut chunks = vec![
                chat_chunk(json!({"content": "Hi"}), None),
                chat_chunk(json!({}), Some("length")),
            ];
            if let Some(usage) = &last {
                chunks.push(json!({"choices": [], "usage": usage}));
            }
            for done in [true, false] {
                let out = chat_to_messages(&[&chat_stream(&chunks, done)]);
                let got = events(&out);
                let names: Vec<_> = got.iter().map(|(name, _)| name.clone().unwrap()).collect();
                assert_eq!(
                    names,
                    [
                        "message_start",
                        "content_block_start",
                        "content_block_delta",
                        "content_block_stop",
                        "message_delta",
                        "message_stop"
                    ],
                    "{last:?}"
                );
                assert_eq!(got[4].1["delta"]["stop_reason"], "max_tokens");
                let mut usage = MessagesUsage::default();
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
        let mut read = MessagesUsage::default();
        for (_, data) in events(&chat_to_messages(&[&stream])) {
            read.merge_event(&data);
        }
        assert_eq!(read.usage().unwrap().completion_tokens, 7);
    }

    #[test]
    fn a_chat_error_chunk_becomes_an_error_event() {
        let stream = chat_stream(
            &[
                chat_chunk(json!({"content": "Hi"}), None),
                json!({"error": {"message": "Rate limit reached", "code": 429}}),
            ],
            false,
        );
        let got = events(&chat_to_messages(&[&stream]));
        let (name, data) = got.last().unwrap();
        assert_eq!(name.as_deref(), Some("error"));
        assert_eq!(
            data,
            &json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limit reached"}})
        );
        assert!(
            got.iter()
                .all(|(name, _)| name.as_deref() != Some("message_stop"))
        );
    }

    #[test]
    fn a_chat_stream_cut_short_or_unreadable_ends_with_an_error_event() {
        let cut = chat_stream(&[chat_chunk(json!({"content": "Hi"}), None)], false);
        let garbled = b"data: {\"choices\": [\n\ndata: [DONE]\n\n".to_vec();
        for (stream, error_type) in [
            (cut, "api_error"),
            (garbled, "api_error"),
            (Vec::new(), "api_error"),
        ] {
            let got = events(&chat_to_messages(&[&stream]));
            let (name, data) = got.last().unwrap();
            assert_eq!(name.as_deref(), Some("error"));
            assert_eq!(data["error"]["type"], error_type);
            assert_eq!(
                got.iter()
                    .filter(|(name, _)| name.as_deref() == Some("error"))
                    .count(),
                1
            );
        }
    }

    fn anthropic_stream(events: &[Value]) -> Vec<u8> {
        let mut stream = Vec::new();
        for event in events {
            let name = event["type"].as_str().unwrap();
            stream.extend_from_slice(format!("event: {name}\ndata: {event}\n\n").as_bytes());
        }
        stream
    }

    /// Anthropic's stream of thinking, a text and a tool call, with its
    /// cache and the input given at the start.
    fn sample_messages_stream() -> Vec<u8> {
        anthropic_stream(&[
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                "model": "claude-sonnet-4-5", "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 30, "output_tokens": 1, "cache_read_input_tokens": 5000,
                          "cache_creation_input_tokens": 700}}}),
            json!({"type": "ping"}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Checking."}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use",
                "id": "toolu_1", "name": "weather", "input": {}}}),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": "}}),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "\"Paris\"}"}}),
            json!({"type": "content_block_stop", "index": 2}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                   "usage": {"output_tokens": 88}}),
            json!({"type": "message_stop"}),
        ])
    }

    #[test]
    fn a_messages_stream_becomes_chat_chunks() {
        let out = messages_to_chat(&[&sample_messages_stream()]);
        let chunk = |choices: Value| {
            json!({"id": "msg_1", "object": "chat.completion.chunk", "created": 0,
            "model": "claude-sonnet-4-5", "choices": choices})
        };
        let delta =
            |delta: Value| chunk(json!([{"index": 0, "delta": delta, "finish_reason": null}]));
        let mut usage_chunk = chunk(json!([]));
        // 30 + 5000 read + 700 written.
        usage_chunk["usage"] = json!({"prompt_tokens": 5730, "completion_tokens": 88, "total_tokens": 5818,
            "prompt_tokens_details": {"cached_tokens": 5000, "cache_write_tokens": 700}});
        let expected = vec![
            delta(json!({"role": "assistant", "content": ""})),
            delta(json!({"content": "Checking."})),
            delta(
                json!({"tool_calls": [{"index": 0, "id": "toolu_1", "type": "function",
                "function": {"name": "weather", "arguments": ""}}]}),
            ),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]})),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]})),
            chunk(json!([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])),
            usage_chunk.clone(),
            json!("[DONE]"),
        ];
        let got: Vec<Value> = events(&out)
            .into_iter()
            .map(|(name, data)| {
                assert_eq!(name, None);
                data
            })
            .collect();
        assert_eq!(got, expected);
        // The gateway's own reader of chat usage charges what Anthropic said.
        let usage = Usage::from_response(&usage_chunk).unwrap();
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
                usage.completion_tokens
            ),
            (5730, 5000, 700, 88)
        );
    }

    #[test]
    fn a_messages_stream_takes_the_last_usage_and_leaves_out_one_it_cannot_read() {
        let start = |usage: Value| json!({"type": "message_start", "message": {"id": "m", "model": "c", "usage": usage}});
        let delta = |usage: Value| json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage});
        let usage_of = |events: &[Value]| {
            let out = messages_to_chat(&[&anthropic_stream(events)]);
            events_usage(&out)
        };
        // The input given only at the end (as OpenRouter does) counts.
        assert_eq!(
            usage_of(&[
                start(json!({"input_tokens": 0, "output_tokens": 0})),
                delta(
                    json!({"input_tokens": 5400, "output_tokens": 12, "cache_read_input_tokens": 100})
                ),
                json!({"type": "message_stop"})
            ]),
            Some(
                json!({"prompt_tokens": 5500, "completion_tokens": 12, "total_tokens": 5512,
                        "prompt_tokens_details": {"cached_tokens": 100}})
            )
        );
        assert_eq!(
            usage_of(&[
                start(json!({"output_tokens": 1})),
                delta(json!({"output_tokens": 12})),
                json!({"type": "message_stop"})
            ]),
            None,
            "no input count"
        );
        assert_eq!(
            usage_of(&[
                start(json!({"input_tokens": 3, "output_tokens": 1})),
                delta(json!({"output_tokens": -12})),
                json!({"type": "message_stop"})
            ]),
            None,
            "a negative count"
        );
    }

    fn events_usage(out: &[u8]) -> Option<Value> {
        events(out)
            .into_iter()
            .find_map(|(_, data)| data.get("usage").cloned())
    }

    #[test]
    fn a_messages_error_event_becomes_an_error_chunk() {
        let stream = anthropic_stream(&[
            json!({"type": "message_start", "message": {"id": "m", "model": "c", "usage": {"input_tokens": 3, "output_tokens": 1}}}),
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ]);
        let got = events(&messages_to_chat(&[&stream]));
        let (_, error) = got.last().unwrap();
        assert_eq!(error["error"]["message"], "Overloaded");
        assert_eq!(error["error"]["code"], 503);
        assert_eq!(error["error"]["type"], "service_unavailable");
        assert!(
            got.iter()
                .all(|(_, data)| data != "[DONE]" && data.get("usage").is_none())
        );
    }

    #[test]
    fn a_messages_stream_cut_short_ends_with_an_error_chunk_and_no_usage() {
        let stream = anthropic_stream(&[
            json!({"type": "message_start", "message": {"id": "m", "model": "c", "usage": {"input_tokens": 3, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        ]);
        let got = events(&messages_to_chat(&[&stream]));
        let (_, error) = got.last().unwrap();
        assert_eq!(error["error"]["code"], 502);
        assert!(
            got.iter()
                .all(|(_, data)| data != "[DONE]" && data.get("usage").is_none())
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

    fn with_line_endings(stream: &[u8], crlf: bool) -> Vec<u8> {
        if !crlf {
            return stream.to_vec();
        }
        String::from_utf8_lossy(stream)
            .replace('\n', "\r\n")
            .into_bytes()
    }

    proptest! {
        #[test]
        fn any_chunking_of_a_stream_gives_what_one_chunk_gives(
            cuts in prop::collection::vec(any::<usize>(), 0..12),
            crlf in any::<bool>(),
        ) {
            let chat = with_line_endings(&sample_chat_stream(), crlf);
            let pieces = cut(&chat, &cuts);
            let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(chat_to_messages(&pieces), chat_to_messages(&[&chat]));
            let messages = with_line_endings(&sample_messages_stream(), crlf);
            let pieces = cut(&messages, &cuts);
            let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(messages_to_chat(&pieces), messages_to_chat(&[&messages]));
        }

        #[test]
        fn arbitrary_streams_never_panic_and_chunk_alike(
            stream in prop::collection::vec(prop_oneof![
                Just(b"data: ".to_vec()), Just(b"event: ".to_vec()), Just(b"\n".to_vec()), Just(b"\r".to_vec()),
                Just(b"[DONE]".to_vec()), Just(b"{\"type\":\"message_start\",\"message\":{}}".to_vec()),
                Just(b"{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\"}}".to_vec()),
                Just(b"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]},\"finish_reason\":\"stop\"}]}".to_vec()),
                Just(b"{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}".to_vec()),
                Just(b"{\"type\":\"message_stop\"}".to_vec()), Just(b"{\"error\":{}}".to_vec()),
                prop::collection::vec(any::<u8>(), 0..8),
            ], 0..24).prop_map(|parts| parts.concat()),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
        ) {
            let pieces = cut(&stream, &cuts);
            let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(chat_to_messages(&pieces), chat_to_messages(&[&stream]));
            prop_assert_eq!(messages_to_chat(&pieces), messages_to_chat(&[&stream]));
        }
    }
}
