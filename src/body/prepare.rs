//! What BodyLimit does to a request once its body is read whole: a chat
//! completion parsed, the context given the bytes, the framing headers
//! made to say exactly those bytes.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use http::request::Parts;

use super::{
    ChatRequest, EmbeddingsRequest, MessagesEndpoint, MessagesRequest, ModelNames, ResponsesRequest,
};
use crate::context::RequestContext;
use crate::error::{ErrorKind, GatewayError};
use crate::header_number::header_number;
use crate::routing::{
    MessagesCall, is_chat_completions, is_embeddings_call, is_responses_call, messages_call,
};

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

/// Fills the request's context from its buffered body, the model named by
/// `names`; rejects a model call (chat completions, Messages, Responses,
/// embeddings) that is not JSON or does not parse.
pub(super) fn prepare_request(
    parts: &mut Parts,
    bytes: &Bytes,
    names: &ModelNames,
) -> Result<(), GatewayError> {
    let messages_call = messages_call(&parts.method, parts.uri.path());
    let chat_call = messages_call.is_none() && is_chat_completions(parts);
    let responses_call = is_responses_call(&parts.method, parts.uri.path());
    let embeddings_call = is_embeddings_call(&parts.method, parts.uri.path());
    let api = if chat_call {
        Some("chat completions take")
    } else if messages_call.is_some() {
        Some("the Messages API takes")
    } else if responses_call {
        Some("the Responses API takes")
    } else if embeddings_call {
        Some("embeddings take")
    } else {
        None
    };
    if let Some(api) = api.filter(|_| !is_json(parts)) {
        return Err(GatewayError::new(
            ErrorKind::InvalidRequest,
            format!("{api} a JSON body: send `Content-Type: application/json`"),
        ));
    }
    let chat = match chat_call {
        true => Some(ChatRequest::parse_named(bytes, names)?),
        false => None,
    };
    let messages = match messages_call {
        Some(MessagesCall::Create) => Some(MessagesRequest::parse_named(
            bytes,
            MessagesEndpoint::Create,
            names,
        )?),
        Some(MessagesCall::CountTokens) => Some(MessagesRequest::parse_named(
            bytes,
            MessagesEndpoint::CountTokens,
            names,
        )?),
        None => None,
    };
    let responses = match responses_call {
        true => Some(ResponsesRequest::parse_named(bytes, names)?),
        false => None,
    };
    let embeddings = match embeddings_call {
        true => Some(EmbeddingsRequest::parse_named(bytes, names)?),
        false => None,
    };
    // The body is now exactly these bytes, whatever framing it came in.
    parts.headers.remove(TRANSFER_ENCODING);
    parts
        .headers
        .insert(CONTENT_LENGTH, header_number(bytes.len() as u64));
    let context = RequestContext::in_extensions(&mut parts.extensions);
    context.chat = chat.map(Arc::new);
    context.messages = messages.map(Arc::new);
    context.responses = responses.map(Arc::new);
    context.embeddings = embeddings.map(Arc::new);
    context.body = Some(bytes.clone());
    Ok(())
}
