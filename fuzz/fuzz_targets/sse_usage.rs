//! The usage scanner on arbitrary bodies split at an arbitrary point:
//! never panics, stays within its memory bound, and reads the same usage
//! however the body is split. A JSON body's usage is what reading its
//! `usage` as a `serde_json::Value` gives, and so is the usage of the
//! same document streamed as one chunk.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::credit::{BodyKind, Usage, UsageScanner};
use serde_json::Value;

/// The usage of a JSON body, read the plain way: its top-level `usage`
/// built as a `Value` (a repeated `usage` refused).
fn usage_through_value(body: &[u8]) -> Option<Usage> {
    #[derive(serde::Deserialize)]
    struct UsageOnly {
        usage: Option<Value>,
    }
    let usage = serde_json::from_slice::<UsageOnly>(body).ok()?.usage?;
    Usage::from_response(&serde_json::json!({ "usage": usage }))
}

fuzz_target!(|input: (bool, u16, &[u8])| {
    let (event_stream, split, body) = input;
    let kind = if event_stream {
        BodyKind::EventStream
    } else {
        BodyKind::Json
    };
    let split = usize::from(split) % (body.len() + 1);
    let mut whole = UsageScanner::new(kind, 4096);
    whole.feed(body);
    let mut halves = UsageScanner::new(kind, 4096);
    halves.feed(&body[..split]);
    halves.feed(b"");
    halves.feed(&body[split..]);
    let mut bytewise = UsageScanner::new(kind, 4096);
    for byte in body {
        bytewise.feed(std::slice::from_ref(byte));
    }
    let expected = whole.finish();
    assert_eq!(halves.finish(), expected);
    assert_eq!(bytewise.finish(), expected);
    if !event_stream && body.len() <= 4096 {
        assert_eq!(expected, usage_through_value(body));
    }
    // The same document as one streamed chunk reads the same usage, when
    // nothing but a plain `"usage"` can name it (no `\u` escape) and it is
    // one line: the chunks read without parsing lose nothing.
    let one_line = !body.iter().any(|&byte| byte == b'\n' || byte == b'\r');
    let escaped = body.windows(2).any(|pair| pair == b"\\u");
    if one_line && !escaped && body.len() <= 4000 {
        let mut chunk = UsageScanner::new(BodyKind::EventStream, 4096);
        chunk.feed(b"data: ");
        chunk.feed(body);
        chunk.feed(b"\n\n");
        assert_eq!(chunk.finish(), usage_through_value(body));
    }
});
