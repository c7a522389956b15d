//! `BodyLimit`: the request body buffered once, bounded in size and time,
//! and chat-completions requests parsed into a [`ChatRequest`].
//!
//! The layer reads the whole body into one [`Bytes`](bytes::Bytes) (a declared
//! `Content-Length` over the limit gets 413 before anything is read; a body
//! that runs over while streaming gets 413 too; a body not complete within
//! the read timeout gets 408), then calls the inner service with those same
//! bytes as a [`Full`](http_body_util::Full) body: inner layers and the
//! upstream see exactly what the client sent.
//!
//! For `POST …/chat/completions` the body must be JSON and is parsed once
//! into a [`ChatRequest`] placed in the request's
//! [`crate::context::RequestContext`], with 400 and 422
//! answers for bad input (see [`ChatRequest::parse`]). Every request also
//! gets its bytes there (`RequestContext::body`).
//!
//! Model ids are `provider/model` unless the layer is given
//! [`ModelNames`] ([`BodyLimitLayer::model_names`]): then a bare id or an
//! alias is resolved, and the parsed request's `model_id` is the model
//! chosen (what every later layer prices, limits and records), while its
//! `model` and the body the handler receives keep the client's spelling.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::body::BodyLimitLayer;
//! use modelgate::context::RequestContext;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let service = ServiceBuilder::new()
//!     .layer(BodyLimitLayer::new().max_body_bytes(64 * 1024))
//!     .service(service_fn(|request: Request<Full<Bytes>>| async move {
//!         let chat = RequestContext::of(&request).and_then(|context| context.chat.as_ref());
//!         let model = chat.unwrap().model.clone();
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

mod drain;
mod future;
mod layer;
mod prepare;
// Bodies read before authentication: the endpoints that carry their own
// credential (leak alerts, the OAuth exchange, webhook routes).
#[cfg(any(feature = "flows", feature = "leaks", feature = "oauth"))]
mod read;
mod service;

// The parsed request lives with the context that carries it.
pub use crate::context::{
    ChatMessage, ChatRequest, MessageContent, ModelId, ModelNames, ModelNamesError, Role,
};
// The Messages request, parsed on its own until a route reads it.
pub use crate::context::{
    BlockKind, CacheControl, CacheTtl, ContentBlock, InputMessage, MediaSource, MessagesContent,
    MessagesEndpoint, MessagesRequest, MessagesRole, MessagesTool, PromptSize, SystemPrompt,
    ThinkingConfig, ToolChoice, ToolChoiceKind, ToolKind,
};
// The Responses and embeddings requests, parsed on their own until a
// route reads them.
pub use crate::context::{
    ContentPart, DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS, FileSource, ImageSource, InputItem, ItemKind,
    PartKind, ReasoningConfig, ResponsesContent, ResponsesInput, ResponsesRequest, ResponsesRole,
    ResponsesTool, ResponsesToolChoice, ResponsesToolKind, TextConfig, TextFormat,
};
pub use crate::context::{
    EMBEDDING_INPUT_OVERHEAD_TOKENS, EmbeddingsInput, EmbeddingsRequest, MAX_EMBEDDING_INPUTS,
};
pub use drain::{DrainUnread, DrainUnreadLayer, UnreadDrained};
pub use future::ResponseFuture;
pub use layer::BodyLimitLayer;
#[cfg(any(feature = "flows", feature = "leaks", feature = "oauth"))]
pub(crate) use read::{BodyPace, ReadError, read_bounded};
pub use service::BodyLimit;
