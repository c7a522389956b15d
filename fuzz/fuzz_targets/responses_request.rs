//! `ResponsesRequest::parse` on arbitrary bytes: never panics; whatever it
//! accepts keeps nothing stored (no `store: true`, no
//! `previous_response_id`, no `background: true`), has its documented
//! bounds (`max_output_tokens` at least 1, the sampling ranges, every web
//! search bounded by `max_tool_calls` or the default the gateway adds) and
//! a prompt size of at least its text's bytes; whatever it refuses is a
//! 400 or 422, naming a field unless the body as a whole is wrong.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::{
    ItemKind, PartKind, ResponsesContent, ResponsesInput, ResponsesRequest,
    DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS,
};
use serde_json::Value;

/// Bytes of plain text the prompt size must count at least.
fn text_bytes(content: &ResponsesContent) -> u64 {
    match content {
        ResponsesContent::Text(text) => text.len() as u64,
        ResponsesContent::Parts(parts) => parts
            .iter()
            .map(|part| match &part.kind {
                PartKind::InputText { text } | PartKind::OutputText { text } => text.len() as u64,
                PartKind::Refusal { refusal } => refusal.len() as u64,
                _ => 0,
            })
            .sum(),
    }
}

fuzz_target!(|body: &[u8]| {
    match ResponsesRequest::parse(body) {
        Ok(request) => {
            let value: Value = serde_json::from_slice(body).expect("accepted means JSON");
            assert_eq!(request.model_id.as_str(), request.model);
            assert_ne!(value["store"], Value::Bool(true));
            assert_ne!(value["background"], Value::Bool(true));
            assert!(value["previous_response_id"].is_null());
            assert!(value["conversation"].is_null());
            assert_eq!(
                request.max_output_tokens,
                value["max_output_tokens"].as_u64()
            );
            assert!(request.max_output_tokens.is_none_or(|max| max >= 1));
            assert!(request.temperature.is_none_or(|t| (0.0..=2.0).contains(&t)));
            assert!(request.top_p.is_none_or(|p| (0.0..=1.0).contains(&p)));
            let searches = value["tools"].as_array().into_iter().flatten().any(|tool| {
                tool["type"]
                    .as_str()
                    .is_some_and(|kind| kind.starts_with("web_search"))
            });
            let bound = value["max_tool_calls"]
                .as_u64()
                .unwrap_or(DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS);
            assert_eq!(request.web_search_max_uses(), searches.then_some(bound));
            assert_eq!(
                request.max_tool_calls_to_add().is_some(),
                searches && value["max_tool_calls"].is_null()
            );
            let mut text = request
                .instructions
                .as_ref()
                .map_or(0, |text| text.len() as u64);
            let items = match &request.input {
                ResponsesInput::Text(input) => {
                    text += input.len() as u64;
                    1
                }
                ResponsesInput::Items(items) => {
                    assert!(!items.is_empty());
                    for item in items {
                        text += match &item.kind {
                            ItemKind::Message { content, .. } => text_bytes(content),
                            ItemKind::FunctionCall { arguments, .. } => arguments.len() as u64,
                            ItemKind::FunctionCallOutput { output, .. }
                            | ItemKind::CustomToolCallOutput { output, .. } => text_bytes(output),
                            _ => 0,
                        };
                    }
                    items.len() as u64
                }
            };
            let size = request.prompt_size();
            assert!(size.measured_bytes >= text);
            assert_eq!(
                size.message_count,
                items + u64::from(request.instructions.is_some())
            );
        }
        Err(error) => {
            assert!(matches!(error.status().as_u16(), 400 | 422));
            // Only a body wrong as a whole names no field.
            if !error.message().starts_with("the request body") {
                assert!(error.metadata()["param"].is_string(), "{}", error.message());
            }
        }
    }
});
