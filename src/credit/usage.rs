//! [`UsageScanner`]: finds the upstream's `usage` in a response body as it
//! passes, without holding the body back: a JSON body (non-streaming) or a
//! server-sent event stream (`stream: true`), fed in chunks split anywhere.

use serde_json::Value;

use crate::keys::credits::nanos_from_json;

/// What the upstream reported a request used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.completion_tokens`.
    pub completion_tokens: u64,
    /// `usage.cost` in nano-credits, when the upstream states the cost.
    pub cost_nanos: Option<i64>,
}

impl Usage {
    /// The `usage` object of a chat-completions response or chunk, if it
    /// has token counts (a missing count reads as 0; a negative or
    /// fractional one makes the object unusable).
    pub fn from_response(body: &Value) -> Option<Usage> {
        let usage = body.get("usage")?.as_object()?;
        let count = |name: &str| match usage.get(name) {
            None | Some(Value::Null) => Some(0),
            Some(value) => value.as_u64(),
        };
        let prompt_tokens = count("prompt_tokens")?;
        let completion_tokens = count("completion_tokens")?;
        if !usage.contains_key("prompt_tokens") && !usage.contains_key("completion_tokens") {
            return None;
        }
        let cost_nanos = usage
            .get("cost")
            .and_then(|cost| nanos_from_json(cost).ok());
        Some(Usage {
            prompt_tokens,
            completion_tokens,
            cost_nanos,
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
    kind: BodyKind,
    max_buffered_bytes: usize,
    /// The JSON body so far, or the current SSE line.
    buffer: Vec<u8>,
    /// The data lines of the SSE event being read.
    event_data: Vec<u8>,
    /// A line or body over the bound: skipped to its end.
    overflowed: bool,
    /// A CR ended the last chunk; an LF starting the next belongs to it.
    after_cr: bool,
    /// The event being read lost data to the bound: it is not parsed.
    event_overflowed: bool,
    /// Bytes seen so far, to strip a byte-order mark at the very start.
    started: bool,
    usage: Option<Usage>,
    done: bool,
}

impl UsageScanner {
    /// A scanner for a body of `kind`, holding at most `max_buffered_bytes`
    /// (a JSON body larger than that, or an SSE line, is not read for usage).
    pub fn new(kind: BodyKind, max_buffered_bytes: usize) -> Self {
        UsageScanner {
            kind,
            max_buffered_bytes,
            buffer: Vec::new(),
            event_data: Vec::new(),
            overflowed: false,
            after_cr: false,
            event_overflowed: false,
            started: false,
            usage: None,
            done: false,
        }
    }

    /// Reads the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        match self.kind {
            BodyKind::Json => {
                if self.buffer.len() + chunk.len() > self.max_buffered_bytes {
                    self.overflowed = true;
                    self.buffer = Vec::new();
                } else if !self.overflowed {
                    self.buffer.extend_from_slice(chunk);
                }
            }
            BodyKind::EventStream => self.feed_event_stream(chunk),
        }
    }

    fn feed_event_stream(&mut self, mut chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        if !self.started {
            self.started = true;
            chunk = chunk.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(chunk);
        }
        if self.after_cr && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        while let Some(end) = chunk.iter().position(|byte| matches!(byte, b'\n' | b'\r')) {
            self.push_line_part(&chunk[..end]);
            self.end_line();
            let crlf = chunk[end] == b'\r' && chunk.get(end + 1) == Some(&b'\n');
            if chunk[end] == b'\r' && end + 1 == chunk.len() {
                self.after_cr = true;
            }
            chunk = &chunk[end + if crlf { 2 } else { 1 }..];
        }
        self.push_line_part(chunk);
    }

    fn push_line_part(&mut self, part: &[u8]) {
        if self.overflowed {
            return;
        }
        if self.buffer.len() + part.len() > self.max_buffered_bytes {
            self.overflowed = true;
            self.buffer.clear();
        } else {
            self.buffer.extend_from_slice(part);
        }
    }

    fn end_line(&mut self) {
        let line = std::mem::take(&mut self.buffer);
        if std::mem::take(&mut self.overflowed) {
            // A line too long to keep: if it was data, its event is lost.
            self.event_overflowed = true;
            return;
        }
        if line.is_empty() {
            self.dispatch_event();
            return;
        }
        // Lines starting with ':' are comments (keep-alives); other fields
        // than `data` do not carry chunks.
        let Some(value) = line.strip_prefix(b"data:") else {
            return;
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if !self.event_data.is_empty() {
            self.event_data.push(b'\n');
        }
        if self.event_data.len() + value.len() <= self.max_buffered_bytes {
            self.event_data.extend_from_slice(value);
        } else {
            self.event_data.clear();
            self.event_overflowed = true;
        }
    }

    fn dispatch_event(&mut self) {
        let data = std::mem::take(&mut self.event_data);
        // Part of this event was dropped: what is left is not the event.
        if std::mem::take(&mut self.event_overflowed) || data.is_empty() {
            return;
        }
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return;
        }
        // Most chunks carry no usage; only those naming it are parsed.
        if !contains(&data, b"\"usage\"") {
            return;
        }
        if let Some(usage) = usage_of(&data) {
            self.usage = Some(usage);
        }
    }

    /// Whether an event stream said `data: [DONE]`.
    pub fn saw_done(&self) -> bool {
        self.done
    }

    /// The usage the body reported, read at its end. For an event stream
    /// the last chunk with usage wins; a final event not followed by a
    /// blank line still counts.
    pub fn finish(mut self) -> Option<Usage> {
        match self.kind {
            BodyKind::Json => {
                if self.overflowed {
                    return None;
                }
                usage_of(&self.buffer)
            }
            BodyKind::EventStream => {
                if !self.buffer.is_empty() || self.overflowed {
                    self.end_line();
                }
                self.dispatch_event();
                self.usage
            }
        }
    }
}

/// The usage of one JSON document: only its top-level `usage` is built,
/// the rest is skipped unparsed into values (a completion's text, say).
fn usage_of(document: &[u8]) -> Option<Usage> {
    #[derive(serde::Deserialize)]
    struct UsageOnly {
        usage: Option<Value>,
    }
    let usage = serde_json::from_slice::<UsageOnly>(document).ok()?.usage?;
    Usage::from_response(&serde_json::json!({ "usage": usage }))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
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
            })
        );
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

    proptest! {
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
}
