//! The stream translations on arbitrary bytes cut into arbitrary chunks:
//! never panic, give the same events however the bytes are chunked, and
//! every event they give is whole (ends with a blank line) with JSON data
//! (or chat's `[DONE]`); a chat stream as Responses events ends once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::proxy::translate_fuzzing as translate;

fn check_events(out: &[u8]) {
    let text = std::str::from_utf8(out).expect("UTF-8");
    assert!(text.is_empty() || text.ends_with("\n\n"), "{text:?}");
    for event in text.split("\n\n").filter(|event| !event.is_empty()) {
        for line in event.lines() {
            if let Some(data) = line.strip_prefix("data: ") {
                if data != "[DONE]" {
                    serde_json::from_str::<serde_json::Value>(data).expect("JSON data");
                }
            } else {
                assert!(line.starts_with("event: "), "{line:?}");
            }
        }
    }
}

fuzz_target!(|input: (Vec<u16>, &[u8])| {
    let (cuts, stream) = input;
    let mut cuts: Vec<usize> = cuts
        .into_iter()
        .map(|at| usize::from(at) % (stream.len() + 1))
        .collect();
    cuts.sort_unstable();
    let mut pieces = Vec::new();
    let mut from = 0;
    for at in cuts {
        pieces.push(&stream[from..at]);
        from = at;
    }
    pieces.push(&stream[from..]);
    let whole = [stream];
    let messages = translate::chat_stream_to_messages(&pieces);
    assert_eq!(messages, translate::chat_stream_to_messages(&whole));
    check_events(&messages);
    let chat = translate::messages_stream_to_chat(&pieces);
    assert_eq!(chat, translate::messages_stream_to_chat(&whole));
    check_events(&chat);
    let responses = translate::chat_stream_to_responses(&pieces);
    assert_eq!(responses, translate::chat_stream_to_responses(&whole));
    check_events(&responses);
    // It ends once: completed, incomplete or failed, last.
    let text = String::from_utf8_lossy(&responses);
    let ends = text
        .matches("event: response.completed\n")
        .chain(text.matches("event: response.incomplete\n"))
        .chain(text.matches("event: response.failed\n"))
        .count();
    assert_eq!(ends, 1, "{text}");
});
