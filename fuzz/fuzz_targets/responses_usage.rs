//! The Responses usage reader on arbitrary bodies: each `data:` line of the
//! input read as a stream event, and the whole input as an answer. Never
//! panics; whatever usage it gives keeps its details within their totals;
//! and reading the same final event again changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::credit::ResponsesUsage;
use serde_json::Value;

fuzz_target!(|body: &[u8]| {
    let events: Vec<Value> = body
        .split(|&byte| byte == b'\n')
        .filter_map(|line| line.strip_prefix(b"data:"))
        .filter_map(|data| serde_json::from_slice(data).ok())
        .collect();
    let mut usage = ResponsesUsage::default();
    for event in &events {
        usage.merge_event(event);
    }
    if let Ok(answer) = serde_json::from_slice::<Value>(body) {
        usage.merge_response(&answer);
    }
    let read = usage.usage();
    if let Some(read) = read {
        assert!(read.cache_read_tokens <= read.prompt_tokens);
        assert!(read.reasoning_tokens <= read.completion_tokens);
        assert_eq!(read.cache_write_tokens + read.cache_write_1h_tokens, 0);
    }
    if let Some(last) = events.last() {
        let mut again = usage.clone();
        again.merge_event(last);
        if read.is_some() {
            assert_eq!(again.usage(), read);
        }
    }
});
