//! `RequestContext`: what the gateway has learnt about one request, in one
//! value that travels in the request's extensions.
//!
//! The first layer that learns something inserts the context (BearerAuth,
//! with the [`Principal`]); every later layer writes its part into the same
//! value and reads the others' by reference: BodyLimit the parsed
//! [`ChatRequest`] and the body's bytes, the deciding layers their checks,
//! CreditGuard the BYOK credential and the [`SentUpstream`] mark, the
//! proxy's `Fallback` the model the client asked for. Each layer still works
//! alone: one that finds no context starts one.
//!
//! [`MessagesRequest`] is the same reading of an Anthropic Messages body
//! (`POST /v1/messages`, `count_tokens`), with what a hold needs;
//! [`RequestContext::model_call`] gives what either says of its model.
//!
//! A service behind the layers reads it with [`RequestContext::of`]:
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
//!     .layer(BodyLimitLayer::new())
//!     .service(service_fn(|request: Request<Full<Bytes>>| async move {
//!         let context = RequestContext::of(&request).expect("BodyLimit starts one");
//!         let model = context.chat.as_ref().map(|chat| chat.model.clone()).unwrap_or_default();
//!         let bytes = context.body.as_ref().map_or(0, Bytes::len);
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(format!("{model} in {bytes} bytes")))))
//!     }));
//!
//! let chat = Request::post("/api/v1/chat/completions")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from_static(br#"{"model":"openai/gpt-4o","messages":[{"role":"user","content":"Hi"}]}"#)))
//!     .unwrap();
//! let answer = service.oneshot(chat).await.unwrap().into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(answer, "openai/gpt-4o in 69 bytes");
//! # }
//! ```

mod chat;
mod embeddings;
mod messages;
mod principal;
mod request;
mod responses;
mod sent;
mod stack;

pub use crate::model_id::{ModelId, ModelNames, ModelNamesError};
pub use chat::{ChatMessage, ChatRequest, MessageContent, Role};
pub use embeddings::{
    EMBEDDING_INPUT_OVERHEAD_TOKENS, EmbeddingsInput, EmbeddingsRequest, MAX_EMBEDDING_INPUTS,
};
pub use messages::{
    BlockKind, CacheControl, CacheTtl, ContentBlock, InputMessage, MediaSource, MessagesContent,
    MessagesEndpoint, MessagesRequest, MessagesRole, MessagesTool, PromptSize, SystemPrompt,
    ThinkingConfig, ToolChoice, ToolChoiceKind, ToolKind,
};
pub use principal::Principal;
pub use request::{ModelApi, ModelCall, RequestContext};
pub use responses::{
    ContentPart, DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS, FileSource, ImageSource, InputItem, ItemKind,
    PartKind, ReasoningConfig, ResponsesContent, ResponsesInput, ResponsesRequest, ResponsesRole,
    ResponsesTool, ResponsesToolChoice, ResponsesToolKind, TextConfig, TextFormat,
};
pub use sent::{LateAnswer, LateBody, SentUpstream, UpstreamAttempt};
pub use stack::{CheckedStack, ContextLayer, ContextPart, MissingLayer};
