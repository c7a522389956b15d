//! [`RequestContext`]: the one value in a request's extensions that
//! carries what the layers learn about it.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Extensions, Request};

use super::{
    ChatRequest, EmbeddingsRequest, MessagesRequest, ModelId, Principal, ResponsesRequest,
    SentUpstream,
};
use crate::keys::ByokCredential;
use crate::limiter::AdmissionPlan;

/// What the layers know about one request; see the [module docs](super).
///
/// `Debug` shows no secret: the key hash and the BYOK key print redacted.
#[derive(Clone, Default)]
pub struct RequestContext {
    /// Who is calling: the key BearerAuth accepted.
    pub principal: Option<Principal>,
    /// The chat-completions request BodyLimit parsed, for a chat call.
    pub chat: Option<Arc<ChatRequest>>,
    /// The Messages API request BodyLimit parsed, for a Messages call
    /// (`…/messages` or `…/messages/count_tokens`).
    pub messages: Option<Arc<MessagesRequest>>,
    /// The Responses API request BodyLimit parsed, for a Responses call.
    pub responses: Option<Arc<ResponsesRequest>>,
    /// The embeddings request BodyLimit parsed, for an embeddings call.
    pub embeddings: Option<Arc<EmbeddingsRequest>>,
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

    /// The model call this request makes, whichever API it speaks: what
    /// the layers that decide by the model read.
    pub fn model_call(&self) -> Option<ModelCall<'_>> {
        if let Some(chat) = &self.chat {
            return Some(ModelCall {
                api: ModelApi::Chat,
                model: &chat.model,
                model_id: &chat.model_id,
                stream: chat.stream,
            });
        }
        if let Some(messages) = &self.messages {
            return Some(ModelCall {
                api: ModelApi::Messages,
                model: &messages.model,
                model_id: &messages.model_id,
                stream: messages.stream,
            });
        }
        if let Some(responses) = &self.responses {
            return Some(ModelCall {
                api: ModelApi::Responses,
                model: &responses.model,
                model_id: &responses.model_id,
                stream: responses.stream,
            });
        }
        self.embeddings.as_ref().map(|embeddings| ModelCall {
            api: ModelApi::Embeddings,
            model: &embeddings.model,
            model_id: &embeddings.model_id,
            stream: false,
        })
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
            chat: Some(Arc::new(
                ChatRequest::parse(body).expect("a valid chat request"),
            )),
            body: Some(Bytes::copy_from_slice(body)),
            ..RequestContext::default()
        }
    }
}

/// The API a model call speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelApi {
    /// OpenAI's chat completions (`POST /api/v1/chat/completions`).
    Chat,
    /// Anthropic's Messages API (`POST /api/v1/messages`).
    Messages,
    /// OpenAI's Responses API, stateless (`POST /api/v1/responses`).
    Responses,
    /// Embeddings (`POST /api/v1/embeddings`).
    Embeddings,
}

impl ModelApi {
    /// The name records and configuration give it: `chat`, `messages`,
    /// `responses`, `embeddings`.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelApi::Chat => "chat",
            ModelApi::Messages => "messages",
            ModelApi::Responses => "responses",
            ModelApi::Embeddings => "embeddings",
        }
    }
}

/// What every model call says, whichever API it speaks
/// ([`RequestContext::model_call`]).
#[derive(Clone, Copy, Debug)]
pub struct ModelCall<'a> {
    /// The API the request speaks.
    pub api: ModelApi,
    /// The model id, as the body names it (maybe a bare id or alias).
    pub model: &'a str,
    /// The model chosen: `model` parsed, or resolved by the `ModelNames`
    /// of `BodyLimit`; what the limits, prices and records use.
    pub model_id: &'a ModelId,
    /// Whether the answer is streamed.
    pub stream: bool,
}

impl fmt::Debug for RequestContext {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("RequestContext")
            .field("principal", &self.principal)
            .field("chat", &self.chat)
            .field("messages", &self.messages)
            .field("responses", &self.responses)
            .field("embeddings", &self.embeddings)
            .field("body_bytes", &self.body.as_ref().map(Bytes::len))
            .field("credential", &self.credential)
            .field("requested_model", &self.requested_model)
            .field("sent", &self.sent)
            .field("planned_checks", &self.plan.parts.len())
            .finish()
    }
}
