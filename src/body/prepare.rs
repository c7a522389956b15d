//! What BodyLimit does to a request once its body is read whole: a chat
//! completion parsed, the context given the bytes, the framing headers
//! made to say exactly those bytes.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, TRANSFER_ENCODING};
use http::request::Parts;

use super::{ChatRequest, MessagesRequest};
use crate::context::RequestContext;
use crate::error::{ErrorKind, GatewayError};
use crate::routing::{MessagesCall, is_chat_completions, messages_call};

/// 413: the body is over `max_body_bytes`.
pub(super) fn too_large(max_body_bytes: usize) -> GatewayError {
    GatewayError::new(
        ErrorKind::PayloadTooLarge,
        format!("the request body is larger than the limit of {max_body_bytes} bytes; send a shorter request"),
    )
    .with_metadata("max_body_bytes", max_body_bytes)
}

/// `application/json`, with parameters, or any `…+json` type.
fn is_json(parts: &Parts) -> bool {
    let Some(content_type) = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence
            .rsplit_once('+')
            .is_some_and(|(_, suffix)| suffix.eq_ignore_ascii_case("json"))
}

/// Fills the request's context from its buffered body; rejects a model
/// call (chat completions, Messages) that is not JSON or does not parse.
pub(super) fn prepare_request(parts: &mut Parts, bytes: &Bytes) -> Result<(), GatewayError> {
    let messages_call = messages_call(&parts.method, parts.uri.path());
    let chat_call = messages_call.is_none() && is_chat_completions(parts);
    if (chat_call || messages_call.is_some()) && !is_json(parts) {
        let api = match chat_call {
            true => "chat completions take",
            false => "the Messages API takes",
        };
        return Err(GatewayError::new(
            ErrorKind::InvalidRequest,
            format!("{api} a JSON body: send `Content-Type: application/json`"),
        ));
    }
    let chat = match chat_call {
        true => Some(ChatRequest::parse(bytes)?),
        false => None,
    };
    let messages = match messages_call {
        Some(MessagesCall::Create) => Some(MessagesRequest::parse(bytes)?),
        Some(MessagesCall::CountTokens) => Some(MessagesRequest::parse_count_tokens(bytes)?),
        None => None,
    };
    // The body is now exactly these bytes, whatever framing it came in.
    parts.headers.remove(TRANSFER_ENCODING);
    parts
        .headers
        .insert(CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    let context = RequestContext::in_extensions(&mut parts.extensions);
    context.chat = chat;
    context.messages = messages;
    context.body = Some(bytes.clone());
    Ok(())
}
