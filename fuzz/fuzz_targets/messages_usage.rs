//! The Messages usage merge on arbitrary bodies: each `data:` line of the
//! input read as a stream event, and the whole input as an answer. Never
//! panics; whatever usage it gives keeps the cache reads and writes within
//! the prompt; and merging the same events again changes nothing (each
//! field is its last value, never a sum).
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::credit::MessagesUsage;
use serde_json::Value;

fuzz_target!(|body: &[u8]| {
    let events: Vec<Value> = body
        .split(|&byte| byte == b'\n')
        .filter_map(|line| line.strip_prefix(b"data:"))
        .filter_map(|data| serde_json::from_slice(data).ok())
        .collect();
    let mut usage = MessagesUsage::default();
    for event in &events {
        usage.merge_event(event);
    }
    if let Ok(answer) = serde_json::from_slice::<Value>(body) {
        usage.merge_message(&answer);
    }
    let read = usage.usage();
    if let Some(read) = read {
        let cached = read.cache_read_tokens as u128
            + read.cache_write_tokens as u128
            + read.cache_write_1h_tokens as u128;
        assert!(cached <= read.prompt_tokens as u128 || read.prompt_tokens == u64::MAX);
        assert_eq!(read.reasoning_tokens, 0);
    }
    // The last event again: every field already holds its last value.
    if let Some(last) = events.last() {
        let mut again = usage.clone();
        again.merge_event(last);
        if read.is_some() {
            assert_eq!(again.usage(), usage.usage());
        }
    }
});
