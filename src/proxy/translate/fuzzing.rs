//! The translations opened to the fuzz targets (`fuzz/fuzz_targets/translate_*.rs`),
//! built only with `--cfg fuzzing`, which `cargo fuzz` sets: the
//! translations are the crate's own, not its API.

use crate::error::GatewayError;

/// [`super::messages_request_to_chat`].
pub fn messages_request_to_chat(body: &[u8]) -> Result<Vec<u8>, GatewayError> {
    super::messages_request_to_chat(body).map(|bytes| bytes.to_vec())
}

/// [`super::chat_request_to_messages`].
pub fn chat_request_to_messages(
    body: &[u8],
    default_max_tokens: u64,
) -> Result<Vec<u8>, GatewayError> {
    super::chat_request_to_messages(body, default_max_tokens).map(|bytes| bytes.to_vec())
}

/// [`super::responses_request_to_chat`].
pub fn responses_request_to_chat(body: &[u8]) -> Result<Vec<u8>, GatewayError> {
    super::responses_request_to_chat(body).map(|bytes| bytes.to_vec())
}

/// [`super::response::chat_response_to_messages`].
pub fn chat_response_to_messages(body: &[u8]) -> Result<Vec<u8>, GatewayError> {
    super::response::chat_response_to_messages(body).map(|bytes| bytes.to_vec())
}

/// [`super::response::messages_response_to_chat`].
pub fn messages_response_to_chat(body: &[u8]) -> Result<Vec<u8>, GatewayError> {
    super::response::messages_response_to_chat(body).map(|bytes| bytes.to_vec())
}

/// [`super::responses_response::chat_response_to_responses`].
pub fn chat_response_to_responses(body: &[u8]) -> Result<Vec<u8>, GatewayError> {
    super::responses_response::chat_response_to_responses(body).map(|bytes| bytes.to_vec())
}

/// A stream fed to `events` in `chunks`, then finished.
fn fed<E>(
    mut events: E,
    chunks: &[&[u8]],
    push: fn(&mut E, &[u8]) -> bytes::Bytes,
    finish: fn(&mut E) -> bytes::Bytes,
) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in chunks {
        out.extend_from_slice(&push(&mut events, chunk));
    }
    out.extend_from_slice(&finish(&mut events));
    out
}

/// A chat stream fed to [`super::stream::ChatToMessagesEvents`] in `chunks`.
pub fn chat_stream_to_messages(chunks: &[&[u8]]) -> Vec<u8> {
    use super::stream::ChatToMessagesEvents as Events;
    fed(Events::new(), chunks, Events::push, Events::finish)
}

/// A Messages stream fed to [`super::stream::MessagesToChatEvents`] in `chunks`.
pub fn messages_stream_to_chat(chunks: &[&[u8]]) -> Vec<u8> {
    use super::stream::MessagesToChatEvents as Events;
    fed(Events::new(), chunks, Events::push, Events::finish)
}

/// A chat stream fed to [`super::responses_stream::ChatToResponsesEvents`] in `chunks`.
pub fn chat_stream_to_responses(chunks: &[&[u8]]) -> Vec<u8> {
    use super::responses_stream::ChatToResponsesEvents as Events;
    fed(Events::new(), chunks, Events::push, Events::finish)
}
