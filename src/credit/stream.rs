//! [`StreamReader`]: the one reader of a metered event stream. Each event
//! is parsed at most once, and that parse serves the three things the
//! gateway wants of it: the usage it reports, the usage the client must
//! not see ([`HiddenUsage`](super::HiddenUsage)), and the `model` it names.

use super::usage::{USAGE_FIELD, Usage, names_only_null_usage, text_bytes, usage_in, usage_of};
use super::{MessagesUsage, ResponsesUsage};
use crate::context::ModelApi;
use bytes::BytesMut;

use crate::edit::{
    DataLine, Event, EventData, EventEditor, JsonObject, ScanMemo, ServedModel, Verdict,
};

/// What a metered event stream's reader does to each event, besides
/// reading its usage.
#[derive(Debug, Default)]
pub(crate) struct StreamEdits {
    /// Take out the usage the gateway asked for on the client's behalf.
    pub(crate) hide_usage: bool,
    /// Name this model in each chunk's `model`.
    pub(crate) served_model: Option<ServedModel>,
}

impl StreamEdits {
    /// Whether any event may change.
    pub(crate) fn any(&self) -> bool {
        self.hide_usage || self.served_model.is_some()
    }
}

/// Reads the usage an event stream reports, and what it carried, as its
/// events pass through [`SseEvents`](crate::edit::SseEvents); makes the
/// [`StreamEdits`] on the way.
#[derive(Debug)]
pub(crate) struct StreamReader {
    edits: StreamEdits,
    max_read_bytes: usize,
    usage: Option<Usage>,
    /// How an API other than chat completions reports its usage, merged
    /// event by event.
    events_usage: EventsUsage,
    done: bool,
    // Chunks streamed (events other than `[DONE]`), and the bytes of the
    // text they carried: what a stream that reports no usage is charged by.
    streamed_chunks: u64,
    streamed_text_bytes: u64,
    // The last chunk's scan: the next one repeats most of its members.
    memo: ScanMemo,
}

impl StreamReader {
    /// A reader that parses no event's data longer than `max_read_bytes`.
    pub(crate) fn new(edits: StreamEdits, max_read_bytes: usize) -> Self {
        StreamReader {
            edits,
            max_read_bytes,
            usage: None,
            events_usage: EventsUsage::Chat,
            done: false,
            streamed_chunks: 0,
            streamed_text_bytes: 0,
            memo: ScanMemo::default(),
        }
    }

    /// Reads the stream as `api`'s events: Anthropic's usage merged field
    /// by field from `message_start` and each `message_delta`; the
    /// Responses API's from its last event (`response.completed`, …).
    pub(crate) fn read_events_of(&mut self, api: ModelApi) {
        self.events_usage = match api {
            ModelApi::Chat | ModelApi::Embeddings => EventsUsage::Chat,
            ModelApi::Messages => EventsUsage::Messages(MessagesUsage::default()),
            ModelApi::Responses => EventsUsage::Responses(ResponsesUsage::default()),
        };
    }

    /// The usage the stream reported: the last chunk with usage wins (an
    /// Anthropic stream's fields merged, each its last value).
    pub(crate) fn usage(&self) -> Option<Usage> {
        match &self.events_usage {
            EventsUsage::Chat => self.usage,
            EventsUsage::Messages(merged) => merged.usage(),
            EventsUsage::Responses(read) => read.usage(),
        }
    }

    /// Whether the stream said `data: [DONE]`.
    pub(crate) fn saw_done(&self) -> bool {
        self.done
    }

    /// The completion tokens the stream has carried so far, estimated
    /// generously for one that reports no usage: at least one a chunk, and
    /// at least one per 3 bytes of the text its chunks carried (content,
    /// reasoning, tool-call arguments).
    pub(crate) fn streamed_tokens(&self) -> u64 {
        self.streamed_chunks
            .max(self.streamed_text_bytes.div_ceil(3))
    }

    /// Reads one chunk's data, parsed once: counts it and the text it
    /// carried, and takes its usage (within the bound). The parsed object,
    /// for the edits; `None` for `[DONE]`, an empty chunk and data that is
    /// not a JSON object.
    fn read<'a>(&mut self, data: &'a [u8]) -> Option<JsonObject<'a>> {
        if data.is_empty() {
            return None;
        }
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return None;
        }
        self.streamed_chunks += 1;
        // Past the bound the usage is not read; the edits are made all the same.
        let read = data.len() <= self.max_read_bytes;
        let mut text = 0;
        // A chunk past the bound is not kept for the next one.
        let memo = match read {
            true => Some(&mut self.memo),
            false => {
                self.memo.forget();
                None
            }
        };
        let Some(object) = JsonObject::parse_after(data, &mut text, memo) else {
            // Not an object: its text found by its bytes, and an array's
            // usage read as the fields in order, as a document is read.
            self.streamed_text_bytes += text_bytes(data);
            if read && USAGE_FIELD.find(data).is_some() && !names_only_null_usage(data) {
                self.usage = usage_of(data).or(self.usage);
            }
            return None;
        };
        self.streamed_text_bytes += text;
        if !read {
            return Some(object);
        }
        match &mut self.events_usage {
            EventsUsage::Chat => self.usage = usage_in(&object).or(self.usage),
            EventsUsage::Messages(merged) => merge_messages_event(merged, &object),
            EventsUsage::Responses(read) => {
                // Only the last events carry it: the others are not parsed.
                let last = matches!(
                    object.get("type"),
                    Ok(Some(
                        "\"response.completed\""
                            | "\"response.incomplete\""
                            | "\"response.failed\""
                    ))
                );
                if let Some(event) = last
                    .then(|| serde_json::from_slice::<serde_json::Value>(data).ok())
                    .flatten()
                {
                    read.merge_event(&event);
                }
            }
        }
        Some(object)
    }

    /// The usual event: one `data` line.
    fn one(&mut self, lines: &[u8], data: &DataLine<'_>, out: &mut BytesMut) -> Verdict {
        let Some(mut object) = self.read(data.value) else {
            return Verdict::Keep;
        };
        let mut edited = false;
        if self.edits.hide_usage {
            match object.get("usage") {
                Ok(Some("null")) => edited |= object.remove("usage").is_ok(),
                // The chunk the gateway asked for: usage and no choices.
                Ok(Some(_)) if no_choices(object.get("choices").ok().flatten()) => {
                    return Verdict::Drop;
                }
                _ => {}
            }
        }
        if let Some(served) = &self.edits.served_model {
            edited |= served.name_in(&mut object);
        }
        if !edited {
            return Verdict::Keep;
        }
        data.write_replaced(lines, out, |out| object.write_to(out));
        Verdict::Written
    }

    /// An event with several `data` lines: its data (their values joined)
    /// is read; each line names the model on its own.
    fn many(&mut self, lines: &[u8], data: &[DataLine<'_>], out: &mut BytesMut) -> Verdict {
        let joined = data
            .iter()
            .map(|line| line.value)
            .collect::<Vec<_>>()
            .join(&b'\n');
        self.read(&joined);
        let Some(served) = &self.edits.served_model else {
            return Verdict::Keep;
        };
        // From the last line back, so each line's place is still right.
        let mut rewritten: Option<Vec<u8>> = None;
        for line in data.iter().rev() {
            let Some(mut object) = JsonObject::parse(line.value) else {
                continue;
            };
            if served.name_in(&mut object) {
                let current = rewritten.as_deref().unwrap_or(lines);
                rewritten = Some(line.replaced_in(current, &object.to_bytes()));
            }
        }
        let Some(rewritten) = rewritten else {
            return Verdict::Keep;
        };
        out.extend_from_slice(&rewritten);
        Verdict::Written
    }
}

impl EventEditor for StreamReader {
    fn event(&mut self, event: &Event<'_>, out: &mut BytesMut) -> Verdict {
        match &event.data {
            EventData::None => Verdict::Keep,
            EventData::One(data) => self.one(event.lines, data, out),
            EventData::Many(data) => self.many(event.lines, data, out),
        }
    }

    fn long_piece(&mut self, piece: &[u8]) {
        // Too long to hold and read: every byte counts as text, generously.
        self.streamed_text_bytes += piece.len() as u64;
    }
}

/// How a stream's usage is read, by its API.
#[derive(Debug)]
enum EventsUsage {
    /// Chat completions: the last chunk with usage.
    Chat,
    Messages(MessagesUsage),
    Responses(ResponsesUsage),
}

/// Merges the usage an Anthropic event carries: `message_start`'s
/// `message.usage`, `message_delta`'s `usage`.
fn merge_messages_event(merged: &mut MessagesUsage, object: &JsonObject<'_>) {
    let usage = match object.get("type") {
        Ok(Some("\"message_start\"")) => object
            .get("message")
            .ok()
            .flatten()
            .and_then(|message| serde_json::from_str::<serde_json::Value>(message).ok())
            .and_then(|mut message| message.get_mut("usage").map(serde_json::Value::take)),
        Ok(Some("\"message_delta\"")) => object
            .get("usage")
            .ok()
            .flatten()
            .and_then(|usage| serde_json::from_str::<serde_json::Value>(usage).ok()),
        _ => None,
    };
    if let Some(serde_json::Value::Object(usage)) = usage {
        merged.merge_usage(&usage);
    }
}

/// Whether `choices` is there (once) and an empty array.
fn no_choices(choices: Option<&str>) -> bool {
    let Some(choices) = choices else {
        return false;
    };
    choices
        .strip_prefix('[')
        .and_then(|inside| inside.strip_suffix(']'))
        .is_some_and(|inside| inside.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edit::{PARSES, SseEvents};
    use bytes::BytesMut;
    use proptest::prelude::*;

    /// What `edits` make of `stream` fed in `chunks`, and what was read.
    fn read(stream: &[u8], cuts: &[usize], edits: StreamEdits) -> (Vec<u8>, StreamReader) {
        let mut events = match edits.any() {
            true => SseEvents::editing(64 * 1024),
            false => SseEvents::reading(64 * 1024),
        };
        let mut reader = StreamReader::new(edits, 64 * 1024);
        let mut out = BytesMut::new();
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut % (stream.len() + 1)).collect();
        cuts.sort_unstable();
        let mut start = 0;
        for cut in cuts.into_iter().chain([stream.len()]) {
            events.feed(&stream[start..cut], &mut reader, &mut out);
            start = cut;
        }
        events.finish(&mut reader, &mut out);
        (out.to_vec(), reader)
    }

    fn both(model: &str) -> StreamEdits {
        StreamEdits {
            hide_usage: true,
            served_model: Some(ServedModel::new(model)),
        }
    }

    const ASKED: &str = concat!(
        ": keep-alive\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-4o-2024\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
        "id: 7\ndata: {\"model\":\"gpt-4o-2024\",\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n",
        "data: {\"model\":\"gpt-4o-2024\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n",
        "data: [DONE]\n\n",
    );

    #[test]
    fn one_pass_reads_the_usage_hides_it_and_names_the_model() {
        let (out, reader) = read(ASKED.as_bytes(), &[], both("openai/gpt-4o"));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            concat!(
                ": keep-alive\n\n",
                "data: {\"id\":\"c1\",\"model\":\"openai/gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
                "id: 7\ndata: {\"model\":\"openai/gpt-4o\",\"choices\":[{\"delta\":{}}]}\n\n",
                "data: [DONE]\n\n",
            )
        );
        assert_eq!(
            reader.usage(),
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 1,
                cost_nanos: None,
                ..Usage::default()
            })
        );
        assert!(reader.saw_done());
        assert_eq!(
            reader.streamed_tokens(),
            3,
            "three chunks, two bytes of text"
        );
    }

    #[test]
    fn each_chunk_is_parsed_once_for_all_three_readings() {
        let parses = || PARSES.with(|parses| parses.get());
        let before = parses();
        read(ASKED.as_bytes(), &[5, 40, 90, 200], both("openai/gpt-4o"));
        assert_eq!(parses() - before, 3, "three JSON chunks, one parse each");

        // A chunk that names neither usage nor the model: the same parse
        // counts its text.
        let before = parses();
        let plain = "data: {\"choices\":[{\"delta\":{\"content\": \"Hello\"}}]}\n\n";
        let (out, reader) = read(plain.as_bytes(), &[], both("openai/gpt-4o"));
        assert_eq!(parses() - before, 1);
        assert_eq!(out, plain.as_bytes());
        assert_eq!(reader.streamed_tokens(), 2, "5 bytes of text");
    }

    #[test]
    fn a_model_already_served_and_usage_asked_for_leave_every_byte() {
        let asked = ASKED.replace("gpt-4o-2024", "openai/gpt-4o");
        let edits = StreamEdits {
            hide_usage: false,
            served_model: Some(ServedModel::new("openai/gpt-4o")),
        };
        let (out, reader) = read(asked.as_bytes(), &[17, 33], edits);
        assert_eq!(out, asked.as_bytes());
        assert!(reader.usage().is_some());
    }

    #[test]
    fn several_data_lines_are_read_joined_and_named_line_by_line() {
        let stream = "data: {\"model\":\"a\",\ndata: \"usage\":{\"prompt_tokens\":2}}\n\ndata: {\"model\":\"a\"}\r\ndata: {\"model\":\"b\"}\r\n\r\n";
        let (out, reader) = read(stream.as_bytes(), &[], both("m"));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "data: {\"model\":\"a\",\ndata: \"usage\":{\"prompt_tokens\":2}}\n\ndata: {\"model\":\"m\"}\r\ndata: {\"model\":\"m\"}\r\n\r\n"
        );
        assert_eq!(reader.usage().map(|usage| usage.prompt_tokens), Some(2));
    }

    const EVENT: &str = "(: ka\n\n|id: 1\n|data: \\{\"model\":\"(up|m)\",\"choices\":\\[(\\{\"d\":1\\})?\\],\"usage\":(null|\\{\"prompt_tokens\":[0-9]\\})\\}\n\n|data: \\{\"choices\":\\[\\],\"content\":\"ab\"\\}\n\n|data: \\[DONE\\]\n\n|data: x\n\n|\n)";

    proptest! {
        /// The parse counts a chunk's text as the byte scan a chunk that
        /// is not an object falls back on counts it.
        #[test]
        fn the_parse_counts_the_text_the_byte_scan_counts(
            texts in proptest::collection::vec("([a-z \u{e9}\u{1F600}]|\\\\[nt\"\\\\]|\\\\u00[0-9a-f]{2}){0,8}", 4),
            other in "[a-z]{0,6}",
        ) {
            let chunk = format!(
                "{{\"choices\":[{{\"delta\":{{\"content\":\"{}\",\"tool_calls\":[{{\"function\":{{\"arguments\":\"{}\"}}}}]}}}}],\"x\":{{\"reasoning\":\"{}\",\"{other}\":\"{}\"}},\"content\":[\"{}\"]}}",
                texts[0], texts[1], texts[2], texts[3], texts[0]
            );
            let mut counted = 0;
            prop_assert!(JsonObject::parse_counting_text(chunk.as_bytes(), &mut counted).is_some(), "{}", chunk);
            prop_assert_eq!(counted, text_bytes(chunk.as_bytes()));
        }

        /// Reading only, nothing is written; editing, a stream none of
        /// whose events need a change comes back byte for byte.
        #[test]
        fn what_needs_no_change_passes_byte_for_byte(
            events in proptest::collection::vec(EVENT, 0..10),
            cuts in proptest::collection::vec(0usize..400, 0..8),
        ) {
            let stream = events.concat();
            let (out, _) = read(stream.as_bytes(), &cuts, StreamEdits::default());
            prop_assert!(out.is_empty());
            let served = StreamEdits { hide_usage: false, served_model: Some(ServedModel::new("up")) };
            let (out, _) = read(stream.as_bytes(), &cuts, served);
            prop_assert_eq!(out, stream.replace("\"m\"", "\"up\"").into_bytes());
        }
    }
}
