//! `ChatRequest::parse` on arbitrary bytes: never panics, and whatever it
//! accepts satisfies the documented bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::ChatRequest;

fuzz_target!(|body: &[u8]| {
    match ChatRequest::parse(body) {
        Ok(request) => {
            assert_eq!(request.model_id.as_str(), request.model);
            assert!(!request.messages.is_empty());
            assert!(request.temperature.is_none_or(|t| (0.0..=2.0).contains(&t)));
            assert!(request.top_p.is_none_or(|p| (0.0..=1.0).contains(&p)));
            assert!(request.max_tokens.is_none_or(|m| m >= 1));
        }
        Err(error) => assert!(matches!(error.status().as_u16(), 400 | 422)),
    }
});
