//! `EmbeddingsRequest::parse` on arbitrary bytes: never panics; whatever it
//! accepts has between 1 and `MAX_EMBEDDING_INPUTS` non-empty inputs and a
//! prompt bound of at least their bytes or tokens, and each input's
//! overhead; whatever it refuses is a 400 or 422, naming a field unless the
//! body as a whole is wrong.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::{
    EmbeddingsInput, EmbeddingsRequest, EMBEDDING_INPUT_OVERHEAD_TOKENS, MAX_EMBEDDING_INPUTS,
};

fuzz_target!(|body: &[u8]| {
    match EmbeddingsRequest::parse(body) {
        Ok(request) => {
            assert_eq!(request.model_id.as_str(), request.model);
            let count = request.input.count();
            assert!((1..=MAX_EMBEDDING_INPUTS).contains(&count));
            let own: u64 = match &request.input {
                EmbeddingsInput::Text(text) => text.len() as u64,
                EmbeddingsInput::Texts(texts) => {
                    assert!(texts.iter().all(|text| !text.is_empty()));
                    texts.iter().map(|text| text.len() as u64).sum()
                }
                EmbeddingsInput::Tokens(tokens) => tokens.len() as u64,
                EmbeddingsInput::TokenLists(lists) => {
                    assert!(lists.iter().all(|list| !list.is_empty()));
                    lists.iter().map(|list| list.len() as u64).sum()
                }
            };
            assert!(own >= 1);
            assert_eq!(
                request.prompt_bound_tokens(),
                own + count as u64 * EMBEDDING_INPUT_OVERHEAD_TOKENS
            );
            assert!(request.dimensions.is_none_or(|dimensions| dimensions >= 1));
        }
        Err(error) => {
            assert!(matches!(error.status().as_u16(), 400 | 422));
            if !error.message().starts_with("the request body") {
                assert!(error.metadata()["param"].is_string(), "{}", error.message());
            }
        }
    }
});
