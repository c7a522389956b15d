//! The response `model` rewriter on arbitrary upstream bytes: never
//! panics, a JSON object's `model` always comes out as the gateway's, and
//! an SSE line that is not a `data:` JSON object passes unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::proxy::{rewrite_model_json, rewrite_model_sse_line};

/// Only `model` is read: other values stay as the upstream wrote them,
/// numbers beyond f64's range included (valid JSON all the same).
#[derive(serde::Deserialize)]
struct ModelOnly {
    model: String,
}

fuzz_target!(|bytes: &[u8]| {
    if let Some(rewritten) = rewrite_model_json(bytes, "p/m") {
        serde_json::from_slice::<&serde_json::value::RawValue>(&rewritten).expect("valid JSON out");
        let out: ModelOnly = serde_json::from_slice(&rewritten).expect("a model out");
        assert_eq!(out.model, "p/m");
    }
    let line = rewrite_model_sse_line(bytes, "p/m");
    if !bytes.starts_with(b"data:") {
        assert_eq!(line, bytes);
    }
});
