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

/// [`super::chat_response_to_messages`].
pub fn chat_response_to_messages(body: &[u8]) -> Result<Vec<u8>, GatewayError> {
    super::chat_response_to_messages(body).map(|bytes| bytes.to_vec())
}

/// [`super::messages_response_to_chat`].
pub fn messages_response_to_chat(body: &[u8]) -> Result<Vec<u8>, GatewayError> {
    super::messages_response_to_chat(body).map(|bytes| bytes.to_vec())
}

/// A chat stream fed to [`super::ChatToMessagesEvents`] in `chunks`.
pub fn chat_stream_to_messages(chunks: &[&[u8]]) -> Vec<u8> {
    let mut events = super::ChatToMessagesEvents::new();
    let mut out = Vec::new();
    for chunk in chunks {
        out.extend_from_slice(&events.push(chunk));
    }
    out.extend_from_slice(&events.finish());
    out
}

/// A Messages stream fed to [`super::MessagesToChatEvents`] in `chunks`.
pub fn messages_stream_to_chat(chunks: &[&[u8]]) -> Vec<u8> {
    let mut events = super::MessagesToChatEvents::new();
    let mut out = Vec::new();
    for chunk in chunks {
        out.extend_from_slice(&events.push(chunk));
    }
    out.extend_from_slice(&events.finish());
    out
}
