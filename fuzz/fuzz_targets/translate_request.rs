//! The request translations on arbitrary bodies: never panic; a body the
//! gateway's parser accepts translates to a body the other API's parser
//! accepts with the same model, stream flag and bound on output tokens (a
//! Responses body to a chat one asking for its stream's usage), or is
//! refused with a 400 naming the field; the whole-answer translations
//! never panic on the same bytes, and what they give is JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::{ChatRequest, MessagesRequest, ResponsesRequest};
use modelgate::proxy::translate_fuzzing as translate;

fn refused_by_name(error: &modelgate::error::GatewayError) {
    assert!(matches!(error.status().as_u16(), 400 | 422), "{error}");
    assert!(error.metadata()["param"].is_string(), "{error}");
}

fuzz_target!(|input: (u16, &[u8])| {
    let (default_max_tokens, body) = input;
    let default_max_tokens = u64::from(default_max_tokens).max(1);
    if let Ok(request) = MessagesRequest::parse(body) {
        match translate::messages_request_to_chat(body) {
            Ok(chat) => {
                let chat = ChatRequest::parse(&chat).expect("the gateway's chat parser accepts it");
                assert_eq!(chat.model, request.model);
                assert_eq!(chat.stream, request.stream);
                assert_eq!(chat.stream_usage_requested, request.stream);
                assert_eq!(chat.max_tokens, request.max_tokens);
            }
            Err(error) => refused_by_name(&error),
        }
    }
    if let Ok(request) = ChatRequest::parse(body) {
        match translate::chat_request_to_messages(body, default_max_tokens) {
            Ok(messages) => {
                let messages = MessagesRequest::parse(&messages)
                    .expect("the gateway's Messages parser accepts it");
                assert_eq!(messages.model, request.model);
                assert_eq!(messages.stream, request.stream);
                assert_eq!(
                    messages.max_tokens,
                    Some(request.max_tokens.unwrap_or(default_max_tokens))
                );
            }
            Err(error) => refused_by_name(&error),
        }
    }
    if let Ok(request) = ResponsesRequest::parse(body) {
        match translate::responses_request_to_chat(body) {
            Ok(chat) => {
                let chat = ChatRequest::parse(&chat).expect("the gateway's chat parser accepts it");
                assert_eq!(chat.model, request.model);
                assert_eq!(chat.stream, request.stream);
                assert_eq!(chat.stream_usage_requested, request.stream);
                assert_eq!(chat.max_tokens, request.max_output_tokens);
            }
            Err(error) => refused_by_name(&error),
        }
    }
    for translated in [
        translate::chat_response_to_messages(body),
        translate::messages_response_to_chat(body),
        translate::chat_response_to_responses(body),
    ] {
        match translated {
            Ok(answer) => {
                serde_json::from_slice::<serde_json::Value>(&answer).expect("JSON");
            }
            Err(error) => assert_eq!(error.status().as_u16(), 502),
        }
    }
});
