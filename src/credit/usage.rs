//! [`UsageScanner`]: finds the upstream's `usage` in a response body as it
//! passes, without holding the body back: a JSON body (non-streaming) or a
//! server-sent event stream (`stream: true`), fed in chunks split anywhere.

use std::sync::LazyLock;

use bytes::BytesMut;
use memchr::memmem::Finder;
use serde_json::Value;

use super::stream::{StreamEdits, StreamReader};
use crate::edit::{JsonObject, MAX_NAMED_JSON_BYTES, MAX_SSE_LINE_BYTES, ServedModel, SseEvents};

use super::{MessagesUsage, ResponsesUsage};
use crate::context::ModelApi;
use crate::keys::credits::nanos_from_json;

/// What the upstream reported a request used.
///
/// The counts follow OpenAI's convention: `prompt_tokens` includes the
/// prompt tokens read from or written to the upstream's cache, and
/// `completion_tokens` includes the reasoning tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.completion_tokens`.
    pub completion_tokens: u64,
    /// `usage.cost` in nano-credits, when the upstream states the cost.
    pub cost_nanos: Option<i64>,
    /// Of the prompt, the tokens read from the cache
    /// (`prompt_tokens_details.cached_tokens`).
    pub cache_read_tokens: u64,
    /// Of the prompt, the tokens written to the cache for five minutes
    /// (`prompt_tokens_details.cache_write_tokens`).
    pub cache_write_tokens: u64,
    /// Of the prompt, the tokens written to the cache for an hour.
    pub cache_write_1h_tokens: u64,
    /// Of the completion, the reasoning tokens
    /// (`completion_tokens_details.reasoning_tokens`).
    pub reasoning_tokens: u64,
    /// Web searches the upstream ran for the request.
    pub web_search_requests: u64,
}

impl Usage {
    /// The `usage` object of a chat-completions response or chunk, if it
    /// has token counts (a missing count reads as 0; a negative or
    /// fractional one makes the object unusable).
    pub fn from_response(body: &Value) -> Option<Usage> {
        let usage = body.get("usage")?.as_object()?;
        Usage::from_fields(&UsageFields {
            prompt_tokens: usage.get("prompt_tokens").cloned(),
            completion_tokens: usage.get("completion_tokens").cloned(),
            cost: usage.get("cost").cloned(),
            prompt_tokens_details: usage.get("prompt_tokens_details").cloned(),
            completion_tokens_details: usage.get("completion_tokens_details").cloned(),
        })
    }

    /// The rules of [`Usage::from_response`], on the fields a `usage`
    /// object had. A detail (`prompt_tokens_details.cached_tokens`,
    /// `…cache_write_tokens`, `completion_tokens_details.reasoning_tokens`)
    /// is read as its count is: absent or null is 0, and one that is not a
    /// whole number, or details past the count they are part of, make the
    /// usage unusable, as a bad count does. A detail read wrong would
    /// charge its tokens at another rate.
    pub(super) fn from_fields(fields: &UsageFields) -> Option<Usage> {
        if fields.prompt_tokens.is_none() && fields.completion_tokens.is_none() {
            return None;
        }
        let count = |value: Option<&Value>| match value {
            None | Some(Value::Null) => Some(0),
            Some(value) => value.as_u64(),
        };
        let detail = |details: &Option<Value>, name: &str| match details {
            None | Some(Value::Null) => Some(0),
            Some(Value::Object(details)) => count(details.get(name)),
            Some(_) => None,
        };
        let prompt_tokens = count(fields.prompt_tokens.as_ref())?;
        let completion_tokens = count(fields.completion_tokens.as_ref())?;
        let cache_read_tokens = detail(&fields.prompt_tokens_details, "cached_tokens")?;
        let cache_write_tokens = detail(&fields.prompt_tokens_details, "cache_write_tokens")?;
        let reasoning_tokens = detail(&fields.completion_tokens_details, "reasoning_tokens")?;
        if cache_read_tokens.checked_add(cache_write_tokens)? > prompt_tokens
            || reasoning_tokens > completion_tokens
        {
            return None;
        }
        Some(Usage {
            prompt_tokens,
            completion_tokens,
            cost_nanos: fields
                .cost
                .as_ref()
                .and_then(|cost| nanos_from_json(cost).ok()),
            cache_read_tokens,
            cache_write_tokens,
            cache_write_1h_tokens: 0,
            reasoning_tokens,
            web_search_requests: 0,
        })
    }
}

/// How a body is read for usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// One JSON document (kept up to a size bound, then parsed at the end).
    Json,
    /// `text/event-stream`: `data:` lines, one JSON chunk per event.
    EventStream,
}

/// Reads usage out of a body fed chunk by chunk, in bounded memory.
#[derive(Debug)]
pub struct UsageScanner {
    reading: Reading,
}

#[derive(Debug)]
enum Reading {
    Json {
        max_buffered_bytes: usize,
        /// The body so far.
        buffer: Vec<u8>,
        /// Over the bound: not read.
        overflowed: bool,
        /// The model to name in the answer, which is held until its end
        /// (up to [`MAX_NAMED_JSON_BYTES`]) to be parsed once for both.
        naming: Option<ServedModel>,
        /// The API whose answer this is: how its usage is read.
        api: ModelApi,
    },
    /// Each event read once, by the reader that also makes the stream's
    /// edits (boxed: a JSON body's scanner stays small).
    EventStream(Box<StreamScan>),
}

#[derive(Debug)]
struct StreamScan {
    events: SseEvents,
    reader: StreamReader,
}

impl UsageScanner {
    /// A scanner for a body of `kind`, holding at most `max_buffered_bytes`
    /// (a JSON body larger than that, or an SSE event's data, is not read
    /// for usage; an SSE event is held up to the larger of that and
    /// [`MAX_SSE_LINE_BYTES`], and a longer one is counted, not read).
    pub fn new(kind: BodyKind, max_buffered_bytes: usize) -> Self {
        let reading = match kind {
            BodyKind::Json => Reading::Json {
                max_buffered_bytes,
                buffer: Vec::new(),
                overflowed: false,
                naming: None,
                api: ModelApi::Chat,
            },
            BodyKind::EventStream => {
                return UsageScanner::event_stream(StreamEdits::default(), max_buffered_bytes);
            }
        };
        UsageScanner { reading }
    }

    /// An event stream's scanner that also makes `edits`: then what goes
    /// on is what [`UsageScanner::feed_edited`] gives.
    pub(crate) fn event_stream(edits: StreamEdits, max_buffered_bytes: usize) -> Self {
        // An event is held as long as its data may be read for usage.
        let max_event_bytes = MAX_SSE_LINE_BYTES.max(max_buffered_bytes);
        let events = match edits.any() {
            true => SseEvents::editing(max_event_bytes),
            false => SseEvents::reading(max_event_bytes),
        };
        UsageScanner {
            reading: Reading::EventStream(Box::new(StreamScan {
                events,
                reader: StreamReader::new(edits, max_buffered_bytes),
            })),
        }
    }

    /// A JSON answer's scanner that also names `model` in it: then what
    /// goes on is what [`UsageScanner::feed_edited`] and
    /// [`UsageScanner::finish_edited`] give (the answer, at its end).
    pub(crate) fn json_naming(model: ServedModel, max_buffered_bytes: usize) -> Self {
        UsageScanner {
            reading: Reading::Json {
                max_buffered_bytes,
                buffer: Vec::new(),
                overflowed: false,
                naming: Some(model),
                api: ModelApi::Chat,
            },
        }
    }

    /// The same scanner reading usage as `api` reports it: Anthropic's
    /// Messages answers and events by [`MessagesUsage`]'s rules, the
    /// Responses API's by [`ResponsesUsage`]'s, embeddings as chat.
    pub(crate) fn in_api(mut self, api: ModelApi) -> Self {
        match &mut self.reading {
            Reading::Json { api: read_as, .. } => *read_as = api,
            Reading::EventStream(scan) => scan.reader.read_events_of(api),
        }
        self
    }

    /// Reads the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.feed_edited(chunk, &mut BytesMut::new());
    }

    /// Reads the next chunk; an edited stream's bytes that may go on are
    /// added to `out`. `false`: the chunk goes on as it is.
    pub(crate) fn feed_edited(&mut self, chunk: &[u8], out: &mut BytesMut) -> bool {
        match &mut self.reading {
            Reading::Json {
                max_buffered_bytes,
                buffer,
                overflowed,
                naming,
                ..
            } => {
                if naming.is_some() {
                    if buffer.len() + chunk.len() <= MAX_NAMED_JSON_BYTES.max(*max_buffered_bytes) {
                        buffer.extend_from_slice(chunk);
                        return true;
                    }
                    // Too large to hold: what was held goes first, the rest
                    // passes as it comes, its model as the upstream wrote it.
                    *naming = None;
                    out.extend_from_slice(buffer);
                    out.extend_from_slice(chunk);
                    if buffer.len() > *max_buffered_bytes {
                        *overflowed = true;
                        *buffer = Vec::new();
                    }
                }
                if buffer.len() + chunk.len() > *max_buffered_bytes {
                    *overflowed = true;
                    *buffer = Vec::new();
                } else if !*overflowed {
                    buffer.extend_from_slice(chunk);
                }
                !out.is_empty()
            }
            Reading::EventStream(scan) => {
                let StreamScan { events, reader } = &mut **scan;
                events.feed(chunk, reader, out);
                events.is_editing()
            }
        }
    }

    /// Whether an event stream is passing an event too long to hold.
    pub(crate) fn is_passing(&self) -> bool {
        matches!(&self.reading, Reading::EventStream(scan) if scan.events.is_passing())
    }

    /// Whether the body's bytes are edited (and held to each event's end,
    /// or a JSON answer's).
    pub(crate) fn is_edited(&self) -> bool {
        match &self.reading {
            Reading::Json { naming, .. } => naming.is_some(),
            Reading::EventStream(scan) => scan.events.is_editing(),
        }
    }

    /// The completion tokens an event stream has carried so far, estimated
    /// generously for one that reports no usage: at least one a chunk, and
    /// at least one per 3 bytes of the text its chunks carried (content,
    /// reasoning, tool-call arguments).
    pub fn streamed_tokens(&self) -> u64 {
        match &self.reading {
            Reading::Json { .. } => 0,
            Reading::EventStream(scan) => scan.reader.streamed_tokens(),
        }
    }

    /// Whether an event stream's bytes so far end between two events: a
    /// line the gateway adds there cannot join the upstream's last one.
    pub fn between_events(&self) -> bool {
        match &self.reading {
            Reading::Json { buffer, .. } => buffer.is_empty(),
            Reading::EventStream(scan) => scan.events.between_events(),
        }
    }

    /// Whether the body is read as an event stream.
    pub fn is_event_stream(&self) -> bool {
        matches!(self.reading, Reading::EventStream(_))
    }

    /// Whether an event stream said `data: [DONE]`.
    pub fn saw_done(&self) -> bool {
        match &self.reading {
            Reading::Json { .. } => false,
            Reading::EventStream(scan) => scan.reader.saw_done(),
        }
    }

    /// The usage the body reported, read at its end. For an event stream
    /// the last chunk with usage wins; a final event not followed by a
    /// blank line still counts.
    pub fn finish(self) -> Option<Usage> {
        self.finish_edited(&mut BytesMut::new())
    }

    /// [`UsageScanner::finish`]; an edited stream's last bytes are added to
    /// `out`.
    pub(crate) fn finish_edited(self, out: &mut BytesMut) -> Option<Usage> {
        match self.reading {
            Reading::Json {
                buffer,
                overflowed,
                naming: Some(served),
                max_buffered_bytes,
                api,
            } => {
                let read = !overflowed && buffer.len() <= max_buffered_bytes;
                // One parse for the usage and the model.
                let Some(mut object) = JsonObject::parse(&buffer) else {
                    out.extend_from_slice(&buffer);
                    return read
                        .then(|| usage_of(&buffer))
                        .flatten()
                        .filter(|_| reads_as_chat(api));
                };
                let usage = usage_in_answer(&object, api).filter(|_| read);
                match served.name_in(&mut object) {
                    true => object.write_to(out),
                    false => out.extend_from_slice(&buffer),
                }
                usage
            }
            Reading::Json {
                buffer,
                overflowed,
                api,
                ..
            } => match overflowed {
                true => None,
                false if reads_as_chat(api) => usage_of(&buffer),
                false => {
                    JsonObject::parse(&buffer).and_then(|object| usage_in_answer(&object, api))
                }
            },
            Reading::EventStream(scan) => {
                let StreamScan {
                    mut events,
                    mut reader,
                } = *scan;
                events.finish(&mut reader, out);
                reader.usage()
            }
        }
    }
}

/// The bytes of the text strings a chunk carries (`content`, `reasoning`,
/// `arguments`), escapes counted as written: a scan, no parse.
pub(super) fn text_bytes(chunk: &[u8]) -> u64 {
    let mut total = 0u64;
    for field in TEXT_FIELDS.iter() {
        let mut rest = chunk;
        while let Some(start) = field.find(rest) {
            rest = &rest[start + field.needle().len()..];
            // To the closing quote: one not escaped by a backslash.
            let mut escaped = false;
            let mut length = rest.len();
            for (index, byte) in rest.iter().enumerate() {
                match byte {
                    b'\\' if !escaped => escaped = true,
                    b'"' if !escaped => {
                        length = index;
                        break;
                    }
                    _ => escaped = false,
                }
            }
            total += length as u64;
            rest = &rest[length..];
        }
    }
    total
}

/// Whether `document` is an object (or nothing JSON) in which every
/// `"usage"` is a member whose value is `null`, with no `\u` escape
/// anywhere: then [`usage_of`] finds none, so the document need not be
/// parsed. (Only `\u` can spell a name's letters, so without one a
/// top-level `usage` is among the plain `"usage"`s; a string `"usage"`, not
/// followed by `:`, sends the document to the parser, and so does an array,
/// which [`usage_of`] reads as the fields in order.)
pub(super) fn names_only_null_usage(document: &[u8]) -> bool {
    if document.trim_ascii_start().starts_with(b"[") || ESCAPE.find(document).is_some() {
        return false;
    }
    USAGE_FIELD.find_iter(document).all(|start| {
        let rest = &document[start + USAGE_FIELD.needle().len()..];
        let rest = rest.trim_ascii_start();
        rest.strip_prefix(b":")
            .is_some_and(|value| value.trim_ascii_start().starts_with(b"null"))
    })
}

/// The usage of one JSON document: only the three fields of its top-level
/// `usage` that count are built; everything else is skipped unparsed into
/// values (a completion's text, say), so a body costs no allocation.
pub(super) fn usage_of(document: &[u8]) -> Option<Usage> {
    // An object (the usual answer): its `usage` member read alone.
    if let Some(object) = JsonObject::parse(document) {
        return usage_in(&object);
    }
    #[derive(serde::Deserialize)]
    struct UsageOnly {
        usage: Option<UsageFields>,
    }
    let usage = crate::json_input::json_from_bytes::<UsageOnly>(document)
        .ok()?
        .usage?;
    Usage::from_fields(&usage)
}

/// The usage of an object's `usage` member, by the rules of [`usage_of`]
/// (a repeated `usage` is none).
pub(super) fn usage_in(object: &JsonObject<'_>) -> Option<Usage> {
    let raw = object.get("usage").ok()??;
    // Only an object counts; the usual other value, a stream chunk's
    // `"usage": null`, is not handed to serde_json, whose refusal would
    // format a message each time.
    if !raw.trim_start().starts_with('{') {
        return None;
    }
    let usage = serde_json::from_str::<UsageFields>(raw).ok()?;
    Usage::from_fields(&usage)
}

/// Whether `api`'s answers report usage as chat completions do
/// (embeddings do too).
fn reads_as_chat(api: ModelApi) -> bool {
    matches!(api, ModelApi::Chat | ModelApi::Embeddings)
}

/// The usage of a whole answer of `api` (a repeated `usage` is none).
fn usage_in_answer(object: &JsonObject<'_>, api: ModelApi) -> Option<Usage> {
    match api {
        ModelApi::Chat | ModelApi::Embeddings => usage_in(object),
        ModelApi::Messages => {
            let raw = object.get("usage").ok()??;
            let usage = serde_json::from_str::<serde_json::Map<String, Value>>(raw).ok()?;
            let mut merged = MessagesUsage::default();
            merged.merge_usage(&usage);
            merged.usage()
        }
        ModelApi::Responses => {
            // Its web searches are in its `output`: the whole answer is read.
            let answer = serde_json::from_slice::<Value>(&object.to_bytes()).ok()?;
            let mut read = ResponsesUsage::default();
            read.merge_response(&answer);
            read.usage()
        }
    }
}

/// A `usage` object's counted fields, as [`Usage::from_response`] reads
/// them from a whole `Value`: a repeated field's last value wins, and
/// anything but an object is refused.
#[derive(Default)]
pub(super) struct UsageFields {
    pub(super) prompt_tokens: Option<Value>,
    pub(super) completion_tokens: Option<Value>,
    pub(super) cost: Option<Value>,
    pub(super) prompt_tokens_details: Option<Value>,
    pub(super) completion_tokens_details: Option<Value>,
}

impl<'de> serde::Deserialize<'de> for UsageFields {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        enum Field {
            PromptTokens,
            CompletionTokens,
            Cost,
            PromptTokensDetails,
            CompletionTokensDetails,
            #[serde(other)]
            Other,
        }

        struct FieldsVisitor;

        impl<'de> serde::de::Visitor<'de> for FieldsVisitor {
            type Value = UsageFields;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a usage object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<UsageFields, A::Error> {
                let mut fields = UsageFields::default();
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::PromptTokens => fields.prompt_tokens = Some(map.next_value()?),
                        Field::CompletionTokens => {
                            fields.completion_tokens = Some(map.next_value()?)
                        }
                        Field::Cost => fields.cost = Some(map.next_value()?),
                        Field::PromptTokensDetails => {
                            fields.prompt_tokens_details = Some(map.next_value()?)
                        }
                        Field::CompletionTokensDetails => {
                            fields.completion_tokens_details = Some(map.next_value()?)
                        }
                        Field::Other => {
                            map.next_value::<CheckedValue>()?;
                        }
                    }
                }
                Ok(fields)
            }
        }

        deserializer.deserialize_map(FieldsVisitor)
    }
}

/// Any JSON value, checked as strictly as building a [`Value`] checks it
/// (string escapes and UTF-8, number range, nesting depth) and kept
/// nowhere. `IgnoredAny` skips more loosely: a usage object that a
/// `Value` refuses must be refused here too, or a malformed answer would
/// be charged by its tokens instead of as one without usage.
struct CheckedValue;

impl<'de> serde::Deserialize<'de> for CheckedValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Checked;

        impl<'de> serde::de::Visitor<'de> for Checked {
            type Value = CheckedValue;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("any JSON value")
            }

            fn visit_bool<E>(self, _: bool) -> Result<CheckedValue, E> {
                Ok(CheckedValue)
            }

            fn visit_i64<E>(self, _: i64) -> Result<CheckedValue, E> {
                Ok(CheckedValue)
            }

            fn visit_u64<E>(self, _: u64) -> Result<CheckedValue, E> {
                Ok(CheckedValue)
            }

            fn visit_f64<E>(self, _: f64) -> Result<CheckedValue, E> {
                Ok(CheckedValue)
            }

            fn visit_str<E>(self, _: &str) -> Result<CheckedValue, E> {
                Ok(CheckedValue)
            }

            fn visit_unit<E>(self) -> Result<CheckedValue, E> {
                Ok(CheckedValue)
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<CheckedValue, A::Error> {
                while seq.next_element::<CheckedValue>()?.is_some() {}
                Ok(CheckedValue)
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<CheckedValue, A::Error> {
                while map.next_entry::<CheckedValue, CheckedValue>()?.is_some() {}
                Ok(CheckedValue)
            }
        }

        deserializer.deserialize_any(Checked)
    }
}

// Every streamed chunk is searched for these: their searchers are built
// once, as `memmem::find` would build one per call at more than the cost
// of searching a chunk.
/// A `\u` escape, the only one that can spell a name's letters.
static ESCAPE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\\u"));
pub(super) static USAGE_FIELD: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"usage\""));
static TEXT_FIELDS: LazyLock<[Finder<'static>; 6]> = LazyLock::new(|| {
    [
        b"\"content\":\"" as &[u8],
        b"\"reasoning\":\"",
        b"\"arguments\":\"",
        b"\"text\":\"",
        b"\"thinking\":\"",
        b"\"partial_json\":\"",
    ]
    .map(Finder::new)
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_without_usage_is_measured_by_what_it_carried() {
        let mut scanner = UsageScanner::new(BodyKind::EventStream, 1 << 20);
        scanner.feed(b": keep-alive\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n");
        assert_eq!(scanner.streamed_tokens(), 1, "at least one a chunk");
        // 30 bytes of text (an escaped quote counts as written) in one chunk.
        scanner.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"abcdefghij\\\"lmnopqrstuvwxyz012\"}}]}\n\n");
        scanner.feed(b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n");
        assert_eq!(scanner.streamed_tokens(), (2 + 30 + 2_u64).div_ceil(3));
        scanner.feed(b"data: [DONE]\n\n");
        assert_eq!(scanner.finish(), None);
    }
    use proptest::prelude::*;

    const STREAM: &str = ": keep-alive\n\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\r\n\r\n\
        : OPENROUTER PROCESSING\n\n\
        data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"cost\":0.00004}}\n\n\
        data: [DONE]\n\n";

    fn scan(kind: BodyKind, chunks: &[&[u8]]) -> (Option<Usage>, bool) {
        let mut scanner = UsageScanner::new(kind, 1 << 20);
        for chunk in chunks {
            scanner.feed(chunk);
        }
        let done = scanner.saw_done();
        (scanner.finish(), done)
    }

    /// Anthropic's answers: a whole message's `usage`, and a stream's
    /// fields merged from `message_start` and every `message_delta`, the
    /// last value of each winning, however the bytes are cut.
    #[test]
    fn messages_answers_and_streams_are_read_as_anthropic_reports_them() {
        let whole = br#"{"type":"message","content":[{"type":"text","text":"Hi"}],
            "usage":{"input_tokens":10,"output_tokens":4,"cache_read_input_tokens":90,
            "cache_creation_input_tokens":6,"cache_creation":{"ephemeral_1h_input_tokens":6}}}"#;
        let mut scanner = UsageScanner::new(BodyKind::Json, 1 << 16).in_api(ModelApi::Messages);
        scanner.feed(whole);
        let usage = scanner.finish().unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (106, 4));
        assert_eq!(
            (usage.cache_read_tokens, usage.cache_write_1h_tokens),
            (90, 6)
        );
        // The chat reading finds nothing it trusts there.
        let mut chat = UsageScanner::new(BodyKind::Json, 1 << 16);
        chat.feed(whole);
        assert_eq!(chat.finish().map(|usage| usage.prompt_tokens), None);

        let stream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":",
            "{\"input_tokens\":12,\"output_tokens\":1,\"cache_read_input_tokens\":100}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":",
            "{\"type\":\"text_delta\",\"text\":\"Hello there\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":",
            "{\"output_tokens\":9,\"server_tool_use\":{\"web_search_requests\":1}}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        )
        .as_bytes();
        for cut in [1, 7, 50, stream.len()] {
            let mut scanner =
                UsageScanner::new(BodyKind::EventStream, 1 << 16).in_api(ModelApi::Messages);
            for chunk in stream.chunks(cut) {
                scanner.feed(chunk);
            }
            // The text counts for a stream that would report none.
            assert!(scanner.streamed_tokens() >= 4);
            let usage = scanner.finish().unwrap();
            assert_eq!(
                (usage.prompt_tokens, usage.completion_tokens),
                (112, 9),
                "cut {cut}"
            );
            assert_eq!(
                (usage.cache_read_tokens, usage.web_search_requests),
                (100, 1)
            );
        }
    }

    #[test]
    fn the_usage_chunk_before_done_is_found() {
        let (usage, done) = scan(BodyKind::EventStream, &[STREAM.as_bytes()]);
        assert!(done);
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 2,
                cost_nanos: Some(40_000),
                ..Usage::default()
            })
        );
    }

    #[test]
    fn chunks_naming_only_null_usage_are_not_parsed_and_others_are() {
        for skipped in [
            &br#"{"choices":[{"delta":{}}],"usage":null}"#[..],
            br#"{"usage" :  null, "x": {"usage":null}}"#,
            // Invalid, so no usage either way.
            br#"{"usage":nullx"#,
        ] {
            assert!(names_only_null_usage(skipped), "{skipped:?}");
            assert_eq!(usage_of(skipped), None);
        }
        for parsed in [
            &br#"{"choices":[],"usage":{"prompt_tokens":1}}"#[..],
            br#"{"x":{"usage":null},"usage":{"prompt_tokens":1}}"#,
            // A string "usage", a name spelled with an escape, and an
            // array, which serde reads as the fields in order.
            br#"{"type":"usage","usage":null}"#,
            br#"{"usage":null,"\u0075sage":{"prompt_tokens":1}}"#,
            br#" [{"prompt_tokens":5,"x":{"usage":null}}]"#,
        ] {
            assert!(!names_only_null_usage(parsed), "{parsed:?}");
        }
    }

    #[test]
    fn a_json_body_reports_its_usage() {
        let body = br#"{"choices": [{"message": {"content": "Hi"}}], "usage": {"prompt_tokens": 5, "completion_tokens": 7}}"#;
        let (usage, _) = scan(BodyKind::Json, &[&body[..10], &body[10..]]);
        assert_eq!(
            usage.map(|u| (u.prompt_tokens, u.completion_tokens, u.cost_nanos)),
            Some((5, 7, None))
        );
    }

    #[test]
    fn no_usage_and_broken_usage_read_as_none() {
        assert_eq!(scan(BodyKind::Json, &[b"{\"choices\": []}"]).0, None);
        assert_eq!(scan(BodyKind::Json, &[b"not json"]).0, None);
        assert_eq!(
            scan(BodyKind::Json, &[br#"{"usage": {"prompt_tokens": -1}}"#]).0,
            None
        );
        assert_eq!(scan(BodyKind::Json, &[br#"{"usage": {}}"#]).0, None);
        let stream = "data: {\"usage\": {\"prompt_tokens\": 1.5}}\n\ndata: [DONE]\n\n";
        assert_eq!(scan(BodyKind::EventStream, &[stream.as_bytes()]).0, None);
    }

    #[test]
    fn a_body_over_the_bound_is_not_read() {
        let mut scanner = UsageScanner::new(BodyKind::Json, 16);
        scanner.feed(br#"{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}"#);
        assert_eq!(scanner.finish(), None);
        let mut scanner = UsageScanner::new(BodyKind::EventStream, 64);
        let long = format!("data: {{\"x\": \"{}\"}}\n\n", "y".repeat(100));
        scanner.feed(long.as_bytes());
        scanner.feed(b"data: {\"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 4}}\n\n");
        assert_eq!(
            scanner.finish().map(|u| u.completion_tokens),
            Some(4),
            "a long line does not stop the scan"
        );
    }

    #[test]
    fn a_bom_empty_chunks_and_a_cut_event_are_handled() {
        let stream =
            "\u{FEFF}data: {\"usage\": {\"prompt_tokens\": 2, \"completion_tokens\": 3}}\r\n\r\n";
        let bytes = stream.as_bytes();
        let cr = bytes.iter().position(|b| *b == b'\r').unwrap();
        let (usage, _) = scan(
            BodyKind::EventStream,
            &[&bytes[..cr + 1], b"", &bytes[cr + 1..]],
        );
        assert_eq!(usage.map(|u| u.completion_tokens), Some(3));
        // An event whose first data line overflowed is not parsed from its tail.
        let mut scanner = UsageScanner::new(BodyKind::EventStream, 48);
        scanner.feed(format!("data: {}\n", "x".repeat(60)).as_bytes());
        scanner.feed(b"data: {\"usage\": {\"prompt_tokens\": 9}}\n\n");
        assert_eq!(scanner.finish(), None);
    }

    #[test]
    fn a_last_event_without_its_blank_line_still_counts() {
        let (usage, _) = scan(
            BodyKind::EventStream,
            &[b"data: {\"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 4}}"],
        );
        assert_eq!(usage.map(|u| u.prompt_tokens), Some(3));
    }

    #[test]
    fn cache_and_reasoning_details_are_read_within_their_counts() {
        let usage = r#"{"prompt_tokens": 100, "completion_tokens": 50,
            "prompt_tokens_details": {"cached_tokens": 60, "cache_write_tokens": 30},
            "completion_tokens_details": {"reasoning_tokens": 40}}"#;
        let expected = Some(Usage {
            prompt_tokens: 100,
            completion_tokens: 50,
            cache_read_tokens: 60,
            cache_write_tokens: 30,
            reasoning_tokens: 40,
            ..Usage::default()
        });
        let body = format!(r#"{{"choices": [], "usage": {usage}}}"#);
        assert_eq!(scan(BodyKind::Json, &[body.as_bytes()]).0, expected);
        let stream = format!(
            "data: {{\"choices\": [], \"usage\": {}}}\n\ndata: [DONE]\n\n",
            usage.replace('\n', " ")
        );
        assert_eq!(
            scan(BodyKind::EventStream, &[stream.as_bytes()]).0,
            expected
        );
        let value: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(Usage::from_response(&value), expected);
        // A detail that is not a whole number, or details past their
        // count, make the usage unusable (charged as an answer without
        // usage), as a bad count does.
        for usage in [
            r#"{"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 9}}"#,
            r#"{"prompt_tokens": 10, "completion_tokens": 5, "completion_tokens_details": {"reasoning_tokens": 6}}"#,
            r#"{"prompt_tokens": 10, "completion_tokens": 5, "completion_tokens_details": {"reasoning_tokens": -3}}"#,
            r#"{"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": "4"}}"#,
            r#"{"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": 4}"#,
        ] {
            let body = format!(r#"{{"usage": {usage}}}"#);
            assert_eq!(scan(BodyKind::Json, &[body.as_bytes()]).0, None, "{usage}");
            let value: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(Usage::from_response(&value), None, "{usage}");
        }
        // Null details are none.
        let nulls = br#"{"usage": {"prompt_tokens": 10, "completion_tokens": 5,
            "prompt_tokens_details": null, "completion_tokens_details": {"reasoning_tokens": null}}}"#;
        assert_eq!(
            scan(BodyKind::Json, &[nulls]).0,
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn a_byte_order_mark_split_across_chunks_is_still_stripped() {
        let body =
            b"\xEF\xBB\xBFdata: {\"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 4}}\n\n";
        let expected = Some(Usage {
            prompt_tokens: 3,
            completion_tokens: 4,
            cost_nanos: None,
            ..Usage::default()
        });
        assert_eq!(scan(BodyKind::EventStream, &[body]), (expected, false));
        let bytewise: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(scan(BodyKind::EventStream, &bytewise), (expected, false));
        assert_eq!(
            scan(BodyKind::EventStream, &[&body[..2], &body[2..]]),
            (expected, false)
        );
        // Only at the very start: later it is part of a line.
        let later = b": hi\n\xEF\xBB\xBFdata: {\"usage\": {\"prompt_tokens\": 3}}\n\n";
        assert_eq!(scan(BodyKind::EventStream, &[later]).0, None);
    }

    #[test]
    fn a_usage_object_a_value_refuses_is_no_usage() {
        let document = |extra: &[u8]| {
            let mut document =
                br#"{"usage": {"prompt_tokens": 1, "completion_tokens": 2, "x": "#.to_vec();
            document.extend_from_slice(extra);
            document.extend_from_slice(b"}}");
            document
        };
        assert!(usage_of(&document(b"3")).is_some());
        for extra in [
            &b"1e400"[..],
            br#""\ud800""#,
            b"\"\xff\"",
            format!("{}{}", "[".repeat(130), "]".repeat(130)).as_bytes(),
        ] {
            let document = document(extra);
            assert!(serde_json::from_slice::<Value>(&document).is_err());
            assert_eq!(
                usage_of(&document),
                None,
                "{}",
                String::from_utf8_lossy(&document)
            );
        }
    }

    proptest! {
        /// A chunk left unparsed because it names only null usage never
        /// had a usage to read, whatever its members, spacing or cut.
        #[test]
        fn a_chunk_skipped_for_null_usage_has_none(
            members in proptest::collection::vec(
                prop_oneof![
                    Just(r#""usage":null"#),
                    Just(" \"usage\" :\n null "),
                    Just(r#""usage":{"prompt_tokens":3,"completion_tokens":4}"#),
                    Just(r#""usage": {}"#),
                    Just(r#""x":{"usage":null}"#),
                    Just(r#""x":{"usage":{"prompt_tokens":1}}"#),
                    Just(r#""type":"usage""#),
                    Just(r#""\u0075sage":{"prompt_tokens":5}"#),
                    Just(r#""content":"a \"usage\":{} b""#),
                    Just(r#""choices":[]"#),
                    // What an array's first element is read as.
                    Just(r#""prompt_tokens":5"#),
                ],
                0..6,
            ),
            cut in any::<proptest::sample::Index>(),
            whole in any::<bool>(),
            array in any::<bool>(),
        ) {
            let document = format!("{{{}}}", members.join(","));
            let document = if array { format!("[{document}]") } else { document };
            let document = if whole {
                document.as_bytes()
            } else {
                &document.as_bytes()[..cut.index(document.len() + 1)]
            };
            if names_only_null_usage(document) {
                prop_assert_eq!(usage_of(document), None);
            }
        }

        #[test]
        fn any_split_of_the_stream_reads_the_same(cuts in proptest::collection::vec(0usize..STREAM.len(), 0..12)) {
            let bytes = STREAM.as_bytes();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut start = 0;
            for cut in cuts {
                chunks.push(&bytes[start..cut]);
                start = cut;
            }
            chunks.push(&bytes[start..]);
            prop_assert_eq!(scan(BodyKind::EventStream, &chunks), scan(BodyKind::EventStream, &[bytes]));
        }

        #[test]
        fn line_endings_do_not_matter(ending in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")]) {
            let stream = STREAM.replace("\r\n", "\n").replace('\n', ending);
            prop_assert_eq!(scan(BodyKind::EventStream, &[stream.as_bytes()]), scan(BodyKind::EventStream, &[STREAM.as_bytes()]));
        }

        /// The streaming reader and the whole-`Value` reading agree on every
        /// `usage` object: repeated fields, nulls, negative, fractional,
        /// huge and string counts, and fields that do not count.
        #[test]
        fn the_typed_reader_agrees_with_the_value_reader(
            fields in proptest::collection::vec(
                (
                    prop_oneof![
                        Just("prompt_tokens"),
                        Just("completion_tokens"),
                        Just("cost"),
                        Just("total_tokens"),
                        Just("prompt_tokens_details"),
                    ],
                    prop_oneof![
                        Just("null".to_owned()),
                        Just("-1".to_owned()),
                        Just("1.5".to_owned()),
                        Just("18446744073709551616".to_owned()),
                        Just("\"12\"".to_owned()),
                        Just("{\"cached_tokens\": 2}".to_owned()),
                        Just("0.00004".to_owned()),
                        // Values a Value refuses: out of range, a lone
                        // surrogate, nested past serde_json's limit.
                        Just("1e400".to_owned()),
                        Just("\"\\ud800\"".to_owned()),
                        Just(format!("{}{}", "[".repeat(130), "]".repeat(130))),
                        (0u64..1_000_000).prop_map(|count| count.to_string()),
                    ],
                ),
                0..6,
            ),
            usage_is_an_object in any::<bool>(),
        ) {
            let usage = if usage_is_an_object {
                let members: Vec<String> = fields
                    .iter()
                    .map(|(name, value)| format!("\"{name}\": {value}"))
                    .collect();
                format!("{{{}}}", members.join(", "))
            } else {
                fields.first().map_or("null".to_owned(), |(_, value)| value.clone())
            };
            let document = format!("{{\"id\": \"x\", \"usage\": {usage}, \"model\": \"m\"}}");
            // A document a Value cannot hold has no usage either.
            let expected = serde_json::from_str::<Value>(&document)
                .ok()
                .and_then(|value| Usage::from_response(&value));
            prop_assert_eq!(usage_of(document.as_bytes()), expected, "{}", document);
        }

        #[test]
        fn no_input_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300), split in 0usize..300) {
            let split = split.min(bytes.len());
            for kind in [BodyKind::Json, BodyKind::EventStream] {
                let mut scanner = UsageScanner::new(kind, 64);
                scanner.feed(&bytes[..split]);
                scanner.feed(&bytes[split..]);
                let _ = scanner.finish();
            }
        }
    }

    #[test]
    fn a_json_answer_named_in_the_parse_that_reads_its_usage() {
        let answer =
            br#"{"model":"up","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
        let mut scanner = UsageScanner::json_naming(ServedModel::new("p/m"), 1 << 20);
        let mut out = BytesMut::new();
        for chunk in answer.chunks(7) {
            assert!(scanner.feed_edited(chunk, &mut out), "held");
            assert!(out.is_empty(), "nothing goes before the end");
        }
        assert!(scanner.is_edited());
        let usage = scanner.finish_edited(&mut out);
        assert_eq!(usage.map(|usage| usage.prompt_tokens), Some(3));
        assert_eq!(
            &out[..],
            br#"{"model":"p/m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#
        );

        // Already named, or not JSON: the bytes as they came.
        for body in [&br#"{"model":"p/m","usage":null}"#[..], b"not json"] {
            let mut scanner = UsageScanner::json_naming(ServedModel::new("p/m"), 1 << 20);
            let mut out = BytesMut::new();
            scanner.feed_edited(body, &mut out);
            assert_eq!(scanner.finish_edited(&mut out), None);
            assert_eq!(&out[..], body);
        }

        // Past the bound on holding: what was held goes at once, the rest
        // as it comes, unnamed; the usage bound is the scanner's own.
        let mut scanner = UsageScanner::json_naming(ServedModel::new("p/m"), 16);
        let mut out = BytesMut::new();
        let big = vec![b' '; MAX_NAMED_JSON_BYTES];
        let head = b"{\"model\":\"up\"";
        assert!(scanner.feed_edited(head, &mut out));
        assert!(scanner.feed_edited(&big, &mut out));
        assert_eq!(out.len(), head.len() + big.len());
        assert!(!scanner.is_edited());
        assert!(
            !scanner.feed_edited(b"}", &mut BytesMut::new()),
            "then passed on"
        );
        assert_eq!(scanner.finish(), None, "over the usage bound");
    }

    #[test]
    fn an_event_past_a_line_of_a_mebibyte_is_still_read_up_to_the_bound() {
        let text = "x".repeat(2 * MAX_SSE_LINE_BYTES);
        let event = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}],\"usage\":{{\"prompt_tokens\":4,\"completion_tokens\":9}}}}\n\n"
        );
        for edits in [
            StreamEdits::default(),
            StreamEdits {
                hide_usage: true,
                served_model: None,
            },
        ] {
            let mut scanner = UsageScanner::event_stream(edits, 8 * MAX_SSE_LINE_BYTES);
            for chunk in event.as_bytes().chunks(16 * 1024) {
                scanner.feed_edited(chunk, &mut BytesMut::new());
            }
            assert_eq!(
                scanner.finish().map(|usage| usage.completion_tokens),
                Some(9)
            );
        }

        // Past the bound: not read, and every byte counted as text.
        let mut scanner = UsageScanner::new(BodyKind::EventStream, 1024);
        for chunk in event.as_bytes().chunks(16 * 1024) {
            scanner.feed(chunk);
        }
        assert!(scanner.streamed_tokens() >= (text.len() as u64).div_ceil(3));
        assert_eq!(scanner.finish(), None);
    }

    #[test]
    fn between_events_is_true_only_where_a_new_event_can_start() {
        let mut scanner = UsageScanner::new(BodyKind::EventStream, 64);
        assert!(scanner.between_events(), "nothing read yet");
        for (chunk, between) in [
            (&b"data: {\"a\""[..], false),
            (b"}\n", false),
            (b"\n", true),
            (b": keep-alive\r", false),
            (b"\n\r", false),
            (b"\n", true),
        ] {
            scanner.feed(chunk);
            assert_eq!(scanner.between_events(), between, "after {chunk:?}");
        }
    }
}
