//! `ChatRequest::parse` on arbitrary bytes: never panics, and whatever it
//! accepts satisfies the documented bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::ChatRequest;
use serde_json::Value;

fuzz_target!(|body: &[u8]| {
    match ChatRequest::parse(body) {
        Ok(request) => {
            assert_eq!(request.model_id.as_str(), request.model);
            assert!(!request.messages.is_empty());
            assert!(request.temperature.is_none_or(|t| (0.0..=2.0).contains(&t)));
            assert!(request.top_p.is_none_or(|p| (0.0..=1.0).contains(&p)));
            // Read the plain way: the completion bound is the larger of the
            // two fields (the hold must cover whichever the upstream obeys),
            // and usage is requested only by `include_usage: true`.
            let value: Value = serde_json::from_slice(body).expect("accepted means JSON");
            let bound = |name: &str| value.get(name).and_then(Value::as_u64);
            let expected = bound("max_tokens").max(bound("max_completion_tokens"));
            assert_eq!(request.max_tokens, expected);
            assert!(request.max_tokens.is_none_or(|m| m >= 1));
            let include_usage = value
                .get("stream_options")
                .and_then(|options| options.get("include_usage"));
            assert_eq!(
                request.stream_usage_requested,
                include_usage == Some(&Value::Bool(true))
            );
        }
        Err(error) => {
            assert!(matches!(error.status().as_u16(), 400 | 422));
            // `model` is read first: of the wrong type, it is a 422 (unless
            // the body names a field twice, which is refused before).
            if let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) {
                if fields
                    .get("model")
                    .is_some_and(|model| !model.is_string() && !model.is_null())
                {
                    assert!(
                        error.status().as_u16() == 422 || error.message().contains("duplicate"),
                        "{}",
                        error.message()
                    );
                }
            }
        }
    }
});
