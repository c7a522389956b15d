//! The usage scanner on arbitrary bodies split at an arbitrary point:
//! never panics, stays within its memory bound, and reads the same usage
//! however the body is split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::credit::{BodyKind, UsageScanner};

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
});
