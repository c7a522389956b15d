//! The response `model` rewriter on arbitrary upstream bytes: never
//! panics, a JSON object's `model` always comes out as the gateway's, and
//! an SSE line that is not a `data:` JSON object passes unchanged. Its
//! JSON reader agrees with serde_json: it rewrites exactly the objects
//! serde_json reads with another `model` string, named once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::proxy::{rewrite_model_json, rewrite_model_sse_line};

/// Only `model` is read: other values stay as the upstream wrote them,
/// numbers beyond f64's range included (valid JSON all the same).
#[derive(serde::Deserialize)]
struct ModelOnly {
    model: String,
}

/// A top-level `model` named once: serde refuses a repeated field.
#[derive(serde::Deserialize)]
struct AnyModel<'a> {
    #[serde(borrow)]
    model: std::borrow::Cow<'a, str>,
}

fuzz_target!(|bytes: &[u8]| {
    let another_model =
        serde_json::from_slice::<AnyModel>(bytes)
        .is_ok_and(|object| object.model != "p/m")
        // Any object: its values unbuilt, so numbers beyond f64 are valid.
        && serde_json::from_slice::<std::collections::BTreeMap<String, &serde_json::value::RawValue>>(bytes).is_ok();
    let rewritten = rewrite_model_json(bytes, "p/m");
    assert_eq!(
        rewritten.is_some(),
        another_model,
        "{}",
        String::from_utf8_lossy(bytes)
    );
    if let Some(rewritten) = rewritten {
        serde_json::from_slice::<&serde_json::value::RawValue>(&rewritten).expect("valid JSON out");
        let out: ModelOnly = serde_json::from_slice(&rewritten).expect("a model out");
        assert_eq!(out.model, "p/m");
    }
    let line = rewrite_model_sse_line(bytes, "p/m");
    if !bytes.starts_with(b"data:") {
        assert_eq!(line, bytes);
    }
});
