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
mod principal;
mod sent;
mod stack;

use std::fmt;

use bytes::Bytes;
use http::{Extensions, Request};

pub use crate::model_id::ModelId;
pub use chat::{ChatMessage, ChatRequest, MessageContent, Role};
pub use principal::Principal;
pub use sent::{SentUpstream, UpstreamAttempt};
pub use stack::{CheckedStack, ContextLayer, ContextPart, MissingLayer};

use crate::keys::ByokCredential;
use crate::limiter::AdmissionPlan;

/// What the layers know about one request; see the [module docs](self).
///
/// `Debug` shows no secret: the key hash and the BYOK key print redacted.
#[derive(Clone, Default)]
pub struct RequestContext {
    /// Who is calling: the key BearerAuth accepted.
    pub principal: Option<Principal>,
    /// The chat-completions request BodyLimit parsed, for a chat call.
    pub chat: Option<ChatRequest>,
    /// The body as received (or as CreditGuard edited it for the
    /// upstream), for layers that need the bytes after the body itself has
    /// been handed on. BodyLimit sets it for every request it buffers.
    pub body: Option<Bytes>,
    /// The account's own provider key, when CreditGuard admitted the
    /// request as BYOK: the upstream client sends it instead of the
    /// gateway's key.
    pub credential: Option<ByokCredential>,
    /// The model the client asked for, when a layer sends the request on
    /// for another (the proxy's `Fallback`), so the record names both.
    pub requested_model: Option<String>,
    /// Whether the upstream has received the request: set by CreditGuard
    /// when it meters a request whose upstream reports sending.
    pub sent: Option<SentUpstream>,
    /// The checks the deciding layers hand CreditGuard, in layer order.
    pub(crate) plan: AdmissionPlan,
}

impl RequestContext {
    /// The context of `request`, if a layer has started one.
    pub fn of<B>(request: &Request<B>) -> Option<&RequestContext> {
        request.extensions().get()
    }

    /// The context of `request`, started empty if no layer has.
    pub fn of_mut<B>(request: &mut Request<B>) -> &mut RequestContext {
        Self::in_extensions(request.extensions_mut())
    }

    /// The context in `extensions`, started empty if there is none.
    pub fn in_extensions(extensions: &mut Extensions) -> &mut RequestContext {
        extensions.get_or_insert_default()
    }
}

#[cfg(test)]
impl RequestContext {
    /// A chat request's context for layer tests: a normal key of
    /// `account`, `body` parsed and kept.
    pub(crate) fn chat_for_tests(account: &str, body: &[u8]) -> Self {
        RequestContext {
            principal: Some(Principal::for_tests(account)),
            chat: Some(ChatRequest::parse(body).expect("a valid chat request")),
            body: Some(Bytes::copy_from_slice(body)),
            ..RequestContext::default()
        }
    }
}

impl fmt::Debug for RequestContext {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("RequestContext")
            .field("principal", &self.principal)
            .field("chat", &self.chat)
            .field("body_bytes", &self.body.as_ref().map(Bytes::len))
            .field("credential", &self.credential)
            .field("requested_model", &self.requested_model)
            .field("sent", &self.sent)
            .field("planned_checks", &self.plan.parts.len())
            .finish()
    }
}
