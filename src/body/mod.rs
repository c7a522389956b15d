//! `BodyLimit`: the request body buffered once, bounded in size and time,
//! and chat-completions requests parsed into a [`ChatRequest`].
//!
//! The layer reads the whole body into one [`Bytes`] (a declared
//! `Content-Length` over the limit gets 413 before anything is read; a body
//! that runs over while streaming gets 413 too; a body not complete within
//! the read timeout gets 408), then calls the inner service with those same
//! bytes as a [`Full`](http_body_util::Full) body: inner layers and the
//! upstream see exactly what the client sent.
//!
//! For `POST …/chat/completions` the body must be JSON and is parsed once
//! into a [`ChatRequest`] placed in the request's extensions, with 400 and
//! 422 answers for bad input (see [`ChatRequest::parse`]). Every request also
//! gets a [`BufferedBody`] extension.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::body::{BodyLimitLayer, ChatRequest};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let service = ServiceBuilder::new()
//!     .layer(BodyLimitLayer::new().max_body_bytes(64 * 1024))
//!     .service(service_fn(|request: Request<Full<Bytes>>| async move {
//!         let model = request.extensions().get::<ChatRequest>().unwrap().model.clone();
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(model))))
//!     }));
//!
//! let chat = Request::post("/api/v1/chat/completions")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from_static(br#"{"model":"openai/gpt-4o","messages":[{"role":"user","content":"Hi"}]}"#)))
//!     .unwrap();
//! let response = service.clone().oneshot(chat).await.unwrap();
//! assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "openai/gpt-4o");
//!
//! let too_big = Request::post("/api/v1/chat/completions")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from(vec![b' '; 100_000])))
//!     .unwrap();
//! assert_eq!(service.oneshot(too_big).await.unwrap().status(), 413);
//! # }
//! ```

mod chat;
mod future;
mod layer;
mod service;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::Method;

pub use chat::{ChatMessage, ChatRequest, MessageContent, Role};
pub use future::ResponseFuture;
pub use layer::BodyLimitLayer;
pub use service::BodyLimit;

use crate::error::{ErrorKind, GatewayError};

/// The request body as received, in the request's extensions, for layers
/// that need the bytes after the body itself has been handed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferedBody(pub Bytes);

fn too_large(max_body_bytes: usize) -> GatewayError {
    GatewayError::new(
        ErrorKind::PayloadTooLarge,
        format!("the request body is larger than the limit of {max_body_bytes} bytes; send a shorter request"),
    )
    .with_metadata("max_body_bytes", max_body_bytes)
}

/// Whether `parts` is a chat-completions call.
pub(crate) fn is_chat_completions(parts: &Parts) -> bool {
    parts.method == Method::POST
        && parts
            .uri
            .path()
            .trim_end_matches('/')
            .ends_with("/chat/completions")
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

/// Adds the extensions of a buffered request; rejects a chat request that
/// is not JSON or does not parse.
fn prepare_request(parts: &mut Parts, bytes: &Bytes) -> Result<(), GatewayError> {
    if is_chat_completions(parts) {
        if !is_json(parts) {
            return Err(GatewayError::new(
                ErrorKind::InvalidRequest,
                "chat completions take a JSON body: send `Content-Type: application/json`",
            ));
        }
        let chat = ChatRequest::parse(bytes)?;
        parts.extensions.insert(chat);
    }
    parts.extensions.insert(BufferedBody(bytes.clone()));
    Ok(())
}
