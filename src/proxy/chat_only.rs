//! [`ChatOnly`]: the gateway's last policy step before the provider side.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use serde_json::Value;
use tower_service::Service;

use super::models;
use super::providers::Providers;
use super::retry::SkipRetries;
use super::translate::{self, TranslatedBody, Translation};
use super::upstream::WireApi;
use crate::context::{ModelApi, RequestContext};
use crate::error::{ErrorKind, GatewayError};
use crate::response_body::ResponseBody;

/// Forwards the model calls only (`POST /api/v1/chat/completions`,
/// `/api/v1/messages`, `/api/v1/messages/count_tokens`), each in the API
/// its provider serves ([`ServedApis`](super::ServedApis): translated when
/// the provider does not serve the client's); every other path is a
/// canonical 404. Upstream failures and credential refusals become
/// complete canonical responses here, below CreditGuard, so they are
/// settled as errors: at no cost, unless the upstream had the request
/// (a timeout, a connection failed once sent), whose late answer the
/// [`Upstream`](super::Upstream) leaves for CreditGuard to charge.
#[derive(Clone, Debug)]
pub(super) struct ChatOnly<S> {
    inner: S,
    /// `GET /api/v1/models`, built once.
    models_list: Arc<Value>,
    /// Which APIs each model's upstream serves.
    providers: Providers,
}

impl<S> ChatOnly<S> {
    /// Serves `models_list` as `GET /api/v1/models` and forwards model
    /// calls to `inner`, each in an API `providers` says its upstream serves.
    pub(super) fn new(inner: S, models_list: Arc<Value>, providers: Providers) -> Self {
        ChatOnly {
            inner,
            models_list,
            providers,
        }
    }
}

impl<S> Service<Request<Full<Bytes>>> for ChatOnly<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody<WireBody>>;
    type Error = GatewayError;
    type Future = BoxFuture<'static, Result<Self::Response, GatewayError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        if is_models_path(request.method(), request.uri().path()) {
            let principal =
                RequestContext::of(&request).and_then(|context| context.principal.as_ref());
            let callable = match principal {
                Some(key) if key.allowed_models.is_some() => {
                    std::borrow::Cow::Owned(models::callable_by(&self.models_list, key))
                }
                _ => std::borrow::Cow::Borrowed(&*self.models_list),
            };
            // Anthropic's clients list models in Anthropic's shape.
            let list = if request.headers().contains_key("anthropic-version") {
                models::anthropic_list(&callable).to_string()
            } else {
                callable.to_string()
            };
            let mut response = Response::new(ResponseBody::full(Bytes::from(list)));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            return Box::pin(async move { Ok(response) });
        }
        let Some(route) = model_route(request.method(), request.uri().path()) else {
            let error = GatewayError::new(
                ErrorKind::NotFound,
                format!(
                    "no such endpoint: {} {}; this gateway serves POST /api/v1/chat/completions, /api/v1/messages (and its count_tokens), /api/v1/responses and /api/v1/embeddings, and the key routes",
                    request.method(),
                    request.uri().path()
                ),
            );
            return Box::pin(async move { Ok(error.to_response()) });
        };
        let (request, translation) = match self.to_wire(request, route) {
            Ok((request, translation)) => (provider_side(request), translation),
            Err(error) => return Box::pin(async move { Ok(error.to_response()) }),
        };
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let outcome = match tower::ServiceExt::ready(&mut inner).await {
                Ok(ready) => ready.call(request).await,
                Err(error) => Err(error),
            };
            Ok(match outcome {
                // An upstream that could not be reached or did not answer
                // becomes a complete error response: CreditGuard charges
                // nothing for it, or what the late answer the upstream
                // client left reports.
                Err(error) => error.to_response(),
                Ok(response) if matches!(response.status().as_u16(), 401..=403) => {
                    // The upstream refused the gateway's own credentials or
                    // account, not the client's: a 502, and its words (which
                    // may name the operator's key) only in the log.
                    let status = response.status().as_u16();
                    tracing::warn!(
                        upstream_status = status,
                        "the upstream refused the gateway's credentials"
                    );
                    GatewayError::new(
                        ErrorKind::Upstream,
                        "the upstream refused this gateway's credentials; the operator must check the upstream key and account",
                    )
                    .with_metadata("upstream_status", status)
                    .to_response()
                }
                Ok(response) => translated(response, translation).map(ResponseBody::inner),
            })
        })
    }
}

/// The request with only the extensions the provider side reads (the
/// retry policy, [`Providers`], [`Upstream`]): the retry keeps a copy of
/// every request it sends, and the layers above have their own.
/// The model calls ChatOnly forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ModelRoute {
    Chat,
    Messages,
    CountTokens,
    Responses,
    Embeddings,
}

impl ModelRoute {
    fn api(self) -> ModelApi {
        match self {
            ModelRoute::Chat => ModelApi::Chat,
            ModelRoute::Messages | ModelRoute::CountTokens => ModelApi::Messages,
            ModelRoute::Responses => ModelApi::Responses,
            ModelRoute::Embeddings => ModelApi::Embeddings,
        }
    }
}

impl<S> ChatOnly<S> {
    /// The request as its provider takes it: marked with the API it goes
    /// in ([`WireApi`]), translated when the provider does not serve the
    /// client's (and then the translation its answer needs).
    fn to_wire(
        &self,
        mut request: Request<Full<Bytes>>,
        route: ModelRoute,
    ) -> Result<(Request<Full<Bytes>>, Option<TranslateAnswer>), GatewayError> {
        let Some(wire) = on_the_wire(&self.providers, &request, route)? else {
            request.extensions_mut().insert(WireApi(route.api()));
            return Ok((request, None));
        };
        let (mut parts, _) = request.into_parts();
        parts.extensions.insert(WireApi(wire.api));
        parts.uri = http::Uri::from_static(wire.path);
        parts
            .headers
            .insert(http::header::CONTENT_LENGTH, wire.body.len().into());
        RequestContext::in_extensions(&mut parts.extensions).body = Some(wire.body.clone());
        Ok((
            Request::from_parts(parts, Full::new(wire.body)),
            Some(wire.answer),
        ))
    }
}

/// A model call translated for its provider.
struct Translated {
    api: ModelApi,
    path: &'static str,
    body: Bytes,
    answer: TranslateAnswer,
}

/// How `request` (a call on `route`) goes to its model's provider: `None`
/// in its own API (or with no provider, which Providers answers), else
/// translated; the 400 of a call no provider API can take.
fn on_the_wire<B>(
    providers: &Providers,
    request: &Request<B>,
    route: ModelRoute,
) -> Result<Option<Translated>, GatewayError> {
    let context = RequestContext::of(request);
    let Some(served) = context
        .and_then(RequestContext::model_call)
        .and_then(|call| providers.apis_for(call.model_id))
    else {
        return Ok(None);
    };
    let wire = served.wire_api(route.api()).ok_or_else(|| {
        GatewayError::new(
            ErrorKind::InvalidRequest,
            format!(
                "this model's provider does not serve the {} API, and the gateway cannot translate it to one the provider serves; use a model whose provider serves it",
                route.api().as_str()
            ),
        )
        .with_metadata("param", "model")
    })?;
    if wire == route.api() {
        return Ok(None);
    }
    if route == ModelRoute::CountTokens {
        return Err(GatewayError::new(
            ErrorKind::InvalidRequest,
            "this model's provider does not serve the Messages API, so it cannot count a Messages request's tokens; send the request to /api/v1/messages itself, or use a model whose provider serves Messages",
        )
        .with_metadata("param", "model"));
    }
    // The body as the layers above left it (CreditGuard's bound written).
    let Some(body) = context.and_then(|context| context.body.as_ref()) else {
        return Err(GatewayError::missing_layer("ChatOnly", "BodyLimit"));
    };
    let (body, path, answer) = match (route.api(), wire) {
        (ModelApi::Messages, ModelApi::Chat) => (
            translate::messages_request_to_chat(body)?,
            "/api/v1/chat/completions",
            TranslateAnswer::ChatToMessages,
        ),
        (ModelApi::Chat, ModelApi::Messages) => (
            translate::chat_request_to_messages(body, DEFAULT_TRANSLATED_MAX_TOKENS)?,
            "/api/v1/messages",
            TranslateAnswer::MessagesToChat,
        ),
        (ModelApi::Responses, ModelApi::Chat) => (
            translate::responses_request_to_chat(body)?,
            "/api/v1/chat/completions",
            TranslateAnswer::ChatToResponses,
        ),
        (client, wire) => {
            return Err(GatewayError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "the gateway cannot translate a {} request to the {} API this model's provider serves",
                    client.as_str(),
                    wire.as_str()
                ),
            ));
        }
    };
    Ok(Some(Translated {
        api: wire,
        path,
        body,
        answer,
    }))
}

/// Refuses, before the admission counts anything, a model call its
/// provider cannot take in any API (a translation that cannot say it, a
/// `count_tokens` for a chat-only provider): such a request spends no
/// rate and no quota. It sits between Fallback and the admission, so each
/// attempt is checked for its own model; ChatOnly translates the body the
/// admission edited.
#[derive(Clone, Debug)]
pub(super) struct WireCheck<S> {
    inner: S,
    providers: Providers,
}

impl<S> WireCheck<S> {
    pub(super) fn new(inner: S, providers: Providers) -> Self {
        WireCheck { inner, providers }
    }
}

impl<S, ResBody> Service<Request<Full<Bytes>>> for WireCheck<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResponseBody<ResBody>>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        futures_util::future::Either<std::future::Ready<Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let refusal = model_route(request.method(), request.uri().path())
            .and_then(|route| on_the_wire(&self.providers, &request, route).err());
        match refusal {
            Some(error) => {
                futures_util::future::Either::Left(std::future::ready(Ok(error.to_response())))
            }
            None => futures_util::future::Either::Right(self.inner.call(request)),
        }
    }
}

/// The bound a chat request translated for a Messages provider goes with
/// when it has none (Messages requires one); CreditGuard writes one in
/// every request it meters, so only a stack without it sends this.
const DEFAULT_TRANSLATED_MAX_TOKENS: u64 = 4096;

/// How a translated request's answer goes back to its client.
#[derive(Clone, Copy, Debug)]
enum TranslateAnswer {
    ChatToMessages,
    MessagesToChat,
    ChatToResponses,
}

/// The body ChatOnly answers with: the upstream's own, or translated back
/// into the client's API.
pub(super) type WireBody = Either<Incoming, TranslatedBody<Incoming>>;

/// `response` in the client's API: a successful answer of a translated
/// request translated back (a stream event by event), anything else as
/// the upstream sent it (the ErrorMapper renders an error in the client's
/// shape).
fn translated(response: Response<Incoming>, answer: Option<TranslateAnswer>) -> Response<WireBody> {
    let Some(answer) = answer.filter(|_| response.status().is_success()) else {
        return response.map(Either::Left);
    };
    let stream = super::model_field::BodyKind::of(response.headers())
        == super::model_field::BodyKind::EventStream;
    let translation = match answer {
        TranslateAnswer::ChatToMessages => Translation::ChatToMessages { stream },
        TranslateAnswer::MessagesToChat => Translation::MessagesToChat { stream },
        TranslateAnswer::ChatToResponses => Translation::ChatToResponses { stream },
    };
    let (mut parts, body) = response.into_parts();
    // The bytes change: the upstream's length no longer holds.
    parts.headers.remove(http::header::CONTENT_LENGTH);
    if !stream {
        parts.headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
    }
    Response::from_parts(parts, Either::Right(TranslatedBody::new(body, translation)))
}

/// The model call `method` and `path` make, spelled exactly under
/// `/api/v1` (in any case and spelling of the same segments).
fn model_route(method: &http::Method, path: &str) -> Option<ModelRoute> {
    if method != http::Method::POST {
        return None;
    }
    use crate::routing::path_is;
    if path_is(path, &["api", "v1", "chat", "completions"]) {
        Some(ModelRoute::Chat)
    } else if path_is(path, &["api", "v1", "messages"]) {
        Some(ModelRoute::Messages)
    } else if path_is(path, &["api", "v1", "messages", "count_tokens"]) {
        Some(ModelRoute::CountTokens)
    } else if path_is(path, &["api", "v1", "responses"]) {
        Some(ModelRoute::Responses)
    } else if path_is(path, &["api", "v1", "embeddings"]) {
        Some(ModelRoute::Embeddings)
    } else {
        None
    }
}

fn provider_side(request: Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let (mut parts, body) = request.into_parts();
    let mut kept = http::Extensions::new();
    move_extension::<RequestContext>(&mut parts.extensions, &mut kept);
    move_extension::<SkipRetries>(&mut parts.extensions, &mut kept);
    move_extension::<WireApi>(&mut parts.extensions, &mut kept);
    parts.extensions = kept;
    Request::from_parts(parts, body)
}

fn move_extension<T: Clone + Send + Sync + 'static>(
    from: &mut http::Extensions,
    to: &mut http::Extensions,
) {
    if let Some(value) = from.remove::<T>() {
        to.insert(value);
    }
}

/// `GET /api/v1/models`, spelled the same way.
fn is_models_path(method: &http::Method, path: &str) -> bool {
    method == http::Method::GET && crate::routing::path_is(path, &["api", "v1", "models"])
}

/// Whether ChatOnly serves the request (every other is its 404): the
/// routes the admission counts.
pub(super) fn serves(method: &http::Method, path: &str) -> bool {
    model_route(method, path).is_some() || is_models_path(method, path)
}
