//! `ChatRequest::parse` on arbitrary bytes: never panics, and whatever it
//! accepts satisfies the documented bounds; the hold's prompt estimate of
//! what it accepts never counts less than its text's bytes, and refuses
//! only a part its bounds cannot bound, naming the field to set.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::{ChatRequest, MessageContent};
use modelgate::credit::{estimate_prompt_tokens, PromptBounds};
use serde_json::Value;

/// Bytes of text the estimate must count at least: plain contents and
/// text parts.
fn text_bytes(request: &ChatRequest) -> u64 {
    let mut bytes = 0u64;
    for message in &request.messages {
        match &message.content {
            Some(MessageContent::Text(text)) => bytes += text.len() as u64,
            Some(MessageContent::Parts(parts)) => {
                for part in parts {
                    if part["type"] == "text" {
                        bytes += part["text"].as_str().map_or(0, |text| text.len() as u64);
                    }
                }
            }
            None => {}
        }
    }
    bytes
}

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
            let text = text_bytes(&request);
            let context = 1 << 20;
            let bounded = PromptBounds {
                context_length_tokens: Some(context),
                max_tokens_per_image: Some(765),
                max_tokens_per_file: Some(4096),
            };
            let tokens = estimate_prompt_tokens(&request, &bounded).expect("every part bounded");
            assert!(tokens >= text.min(context) && tokens <= context);
            match estimate_prompt_tokens(&request, &PromptBounds::default()) {
                Ok(tokens) => assert!(tokens >= text),
                Err(error) => {
                    assert_eq!(error.status().as_u16(), 400);
                    assert!(matches!(
                        error.metadata()["param"].as_str(),
                        Some("max_tokens_per_image" | "max_tokens_per_file" | "context_length")
                    ));
                }
            }
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
