//! [`FallbackLayer`]: a chat request tries its model, then its fallbacks,
//! each through the limits below as a request for that model.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::header::HeaderValue;
use http::{HeaderName, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use super::model_field::{BodyKind, MAX_REWRITTEN_JSON_BYTES, ReportedModel, rewrite_model_json};
use super::models::ModelCatalog;
use super::retry::SkipRetries;
use crate::body::{ChatRequest, MessagesRequest, ModelId};
use crate::context::{Principal, RequestContext};
use crate::edit::{JsonObject, ModelNamed, NameModel};
use crate::error::{ErrorKind, GatewayError, LimitSource, Refusal};
use crate::header_number::header_number;
use crate::response_body::ResponseBody;

/// The response header naming the model that answered, as the gateway
/// knows it.
pub const MODEL_HEADER: HeaderName = HeaderName::from_static("x-modelgate-model");

/// Applies [`Fallback`]: see there.
#[derive(Clone, Debug)]
pub struct FallbackLayer {
    catalog: Arc<ModelCatalog>,
}

impl FallbackLayer {
    /// Falls back as `catalog` says; refuses models it does not serve.
    pub fn new(catalog: Arc<ModelCatalog>) -> Self {
        FallbackLayer { catalog }
    }
}

impl<S> Layer<S> for FallbackLayer {
    type Service = Fallback<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Fallback {
            inner,
            catalog: Arc::clone(&self.catalog),
        }
    }
}

/// For a chat request (a [`ChatRequest`] and the body's bytes in its
/// [`RequestContext`]): 400 when its model is not served, 403
/// `model_not_allowed` when the caller's key may not call it; otherwise it
/// tries its model, then its `models` list, then the configured fallbacks
/// (those the key may call), each as a request for that model (body,
/// `ChatRequest`) through the inner service, so each passes its own
/// model's limits.
///
/// It moves on only when that model is what failed: after the upstream's
/// own 429 or 5xx, an upstream timeout (the gateway's 504), an upstream it
/// could not reach or that refused the gateway's credentials (the
/// gateway's 502), and a per-model rate rule's 429 (`limit_source`
/// `model_rate`). The gateway's own refusals of the account or key, which
/// the next model would meet as well, are answered at once: an
/// account-wide or free-model 429, any 402, a failed store's 503. It tells
/// the two apart by the [`Refusal`] that [`GatewayError::to_response`]
/// puts into the extensions of every response the gateway builds, never by
/// the body, which an upstream could write the same. A response it moves
/// past was never sent on, so no byte of it reached the client. The answer
/// names its model in `x-modelgate-model` and in its `model` field. Other
/// requests pass untouched.
#[derive(Clone, Debug)]
pub struct Fallback<S> {
    inner: S,
    catalog: Arc<ModelCatalog>,
}

/// Whether the next model is tried after `response`: see [`Fallback`].
fn falls_back<B>(response: &Response<B>) -> bool {
    let status = response.status();
    match response.extensions().get::<Refusal>() {
        // Nothing in process marked it: the upstream's own answer.
        None => status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error(),
        Some(refusal) => match refusal.kind {
            // The gateway's words for an upstream that failed.
            ErrorKind::Upstream | ErrorKind::UpstreamTimeout => true,
            // A rule of this model only; every other 429 is the account's.
            ErrorKind::RateLimited => {
                refusal.limit_source.as_deref() == Some(LimitSource::ModelRate.as_str())
            }
            _ => false,
        },
    }
}

impl<S, ResBody> Service<Request<Full<Bytes>>> for Fallback<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: std::fmt::Display,
{
    type Response = Response<ReportedModel<ResponseBody<ResBody>>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each attempt waits for the inner service itself (`oneshot`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let inner = self.inner.clone();
        let context = RequestContext::of(&request);
        let parsed = context.and_then(|context| {
            let call = context.model_call()?;
            context.body.as_ref()?;
            let models = match (&context.chat, &context.messages) {
                (Some(chat), _) => chat.extra.get("models"),
                (None, Some(messages)) => messages.extra.get("models"),
                (None, None) => None,
            };
            Some((call, models))
        });
        let Some((call, models)) = parsed else {
            return Box::pin(async move {
                let response = inner.oneshot(request).await?;
                Ok(response
                    .map(|body| ReportedModel::new(ResponseBody::inner(body), "", BodyKind::Other)))
            });
        };
        // A bare id or alias the body names: the layers below read the
        // body (translations, the provider's request), so it names the
        // model chosen, as if the client had sent that.
        let aliased = call.model != call.model_id.as_str();
        let principal = RequestContext::of(&request).and_then(|context| context.principal.as_ref());
        let candidates = self
            .catalog
            .candidates(call.model_id, models)
            .and_then(|candidates| callable(principal, call.model_id, candidates));
        let mut candidates = match candidates {
            Ok(candidates) => candidates,
            Err(error) => {
                return Box::pin(async move {
                    Ok(error
                        .to_response::<ResponseBody<ResBody>>()
                        .map(|body| ReportedModel::new(body, "", BodyKind::Other)))
                });
            }
        };
        if candidates.len() == 1 && models.is_none() {
            // Nothing to fall back to: the request goes on as it is, its
            // parsed body not copied.
            let model = candidates.swap_remove(0);
            let mut request = request;
            if aliased {
                name_in_body(&mut request, &model);
            }
            request
                .extensions_mut()
                .insert(NameModel(model.as_str().into()));
            return Box::pin(async move {
                let response = inner.oneshot(request).await?;
                Ok(reported(response, &model).await)
            });
        }
        let catalog = Arc::clone(&self.catalog);
        Box::pin(async move {
            let (mut parts, _) = request.into_parts();
            // Each attempt gets its own context: this one's, for its model.
            let mut context = parts
                .extensions
                .remove::<RequestContext>()
                .unwrap_or_default();
            let (chat, messages) = (context.chat.take(), context.messages.take());
            let buffered = context.body.take().unwrap_or_default();
            // Each attempt's record names the model the client asked for.
            let asked = chat
                .as_ref()
                .map(|chat| &chat.model_id)
                .or(messages.as_ref().map(|messages| &messages.model_id))
                .cloned();
            context.requested_model = asked.as_ref().map(|asked| asked.as_str().to_owned());
            let last = candidates.len() - 1;
            for (index, model) in candidates.iter().enumerate() {
                let mut attempt = Request::from_parts(parts.clone(), Full::new(Bytes::new()));
                // The client's bytes when they already name the model.
                let body = match asked.as_ref() == Some(model)
                    && models_was_none(&chat, &messages)
                    && !aliased
                {
                    true => buffered.clone(),
                    false => body_with_model(&buffered, model.as_str()),
                };
                // Shared with the context while it names this model as
                // sent and resolved (the first attempt, mostly); copied for
                // another, or for a name the client sent as an alias.
                let attempt_chat = chat.clone().map(|mut chat| {
                    if chat.model != model.as_str() || chat.model_id != *model {
                        let chat = Arc::make_mut(&mut chat);
                        chat.model = model.as_str().to_owned();
                        chat.model_id = model.clone();
                    }
                    chat
                });
                let attempt_messages = messages.clone().map(|mut messages| {
                    if messages.model != model.as_str() || messages.model_id != *model {
                        let messages = Arc::make_mut(&mut messages);
                        messages.model = model.as_str().to_owned();
                        messages.model_id = model.clone();
                    }
                    messages
                });
                attempt.extensions_mut().insert(RequestContext {
                    chat: attempt_chat,
                    messages: attempt_messages,
                    body: Some(body.clone()),
                    ..context.clone()
                });
                attempt
                    .extensions_mut()
                    .insert(NameModel(model.as_str().into()));
                if index < last {
                    // The next model is the better retry.
                    attempt.extensions_mut().insert(SkipRetries);
                }
                *attempt.body_mut() = Full::new(body);
                let response = inner.clone().oneshot(attempt).await?;
                if index < last && falls_back(&response) {
                    tracing::info!(
                        from = %model,
                        to = %candidates[index + 1],
                        status = response.status().as_u16(),
                        "falling back to the next model"
                    );
                    // Listed models or `other`: a request's `models` may
                    // name any model a default price serves.
                    metrics::counter!(
                        crate::telemetry::FALLBACKS_TOTAL,
                        "from" => catalog.metric_label(model.as_str()).to_owned(),
                        "to" => catalog.metric_label(candidates[index + 1].as_str()).to_owned()
                    )
                    .increment(1);
                    continue;
                }
                return Ok(reported(response, model).await);
            }
            unreachable!("the last candidate always answers")
        })
    }
}

/// Makes the body of `request` (and the context's copy) name `model`.
fn name_in_body(request: &mut Request<Full<Bytes>>, model: &ModelId) {
    let context = RequestContext::of_mut(request);
    let Some(original) = context.body.as_ref() else {
        return;
    };
    let body = body_with_model(original, model.as_str());
    context.body = Some(body.clone());
    request.headers_mut().insert(
        http::header::CONTENT_LENGTH,
        header_number(body.len() as u64),
    );
    *request.body_mut() = Full::new(body);
}

/// The answer of `model`: it names the model in [`MODEL_HEADER`] and, when
/// successful, in its body's `model` field. A JSON answer is read whole
/// (up to [`MAX_REWRITTEN_JSON_BYTES`]) and sent rewritten with its
/// length, in one piece as the upstream sent it; a stream is rewritten as
/// it passes.
async fn reported<B>(
    response: Response<B>,
    model: &ModelId,
) -> Response<ReportedModel<ResponseBody<B>>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let kind = if response.status().is_success() {
        BodyKind::of(response.headers())
    } else {
        BodyKind::Other
    };
    let (mut parts, mut body) = response.into_parts();
    if let Ok(value) = HeaderValue::from_str(model.as_str()) {
        parts.headers.insert(MODEL_HEADER, value);
    }
    if kind == BodyKind::Other {
        return Response::from_parts(
            parts,
            ReportedModel::new(ResponseBody::inner(body), model.as_str(), kind),
        );
    }
    // The length changes when `model` is rewritten.
    parts.headers.remove(http::header::CONTENT_LENGTH);
    let named = parts.extensions.get::<ModelNamed>().is_some();
    if kind == BodyKind::EventStream {
        // The layer below that reads each chunk may have named it already.
        let kind = if named { BodyKind::Other } else { kind };
        return Response::from_parts(
            parts,
            ReportedModel::new(ResponseBody::inner(body), model.as_str(), kind),
        );
    }
    let mut held = BytesMut::new();
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                // Trailers do not follow a JSON answer; data is all there is.
                if let Ok(data) = frame.into_data() {
                    held.extend_from_slice(&data);
                }
                if held.len() > MAX_REWRITTEN_JSON_BYTES {
                    // Too large to hold: what was read goes first, the rest streams.
                    return Response::from_parts(
                        parts,
                        ReportedModel::resume(ResponseBody::inner(body), held),
                    );
                }
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "the upstream's answer broke off");
                let error = GatewayError::new(
                    ErrorKind::Upstream,
                    "the upstream's answer broke off before its end; retry",
                );
                return error
                    .to_response::<ResponseBody<B>>()
                    .map(|body| ReportedModel::new(body, "", BodyKind::Other));
            }
        }
    }
    // The layer below that read the answer may have named it already.
    let bytes = match named {
        true => held.freeze(),
        false => rewrite_model_json(&held, model.as_str())
            .map(Bytes::from)
            .unwrap_or_else(|| held.freeze()),
    };
    parts.headers.insert(
        http::header::CONTENT_LENGTH,
        header_number(bytes.len() as u64),
    );
    Response::from_parts(
        parts,
        ReportedModel::new(ResponseBody::full(bytes), "", BodyKind::Other),
    )
}

/// The request body for `model`: its `model` field set, and `models`
/// removed (the upstream gets one model; the gateway did the falling back).
fn models_was_none(
    chat: &Option<Arc<ChatRequest>>,
    messages: &Option<Arc<MessagesRequest>>,
) -> bool {
    let listed = |extra: &serde_json::Map<String, serde_json::Value>| extra.contains_key("models");
    !chat.as_ref().is_some_and(|chat| listed(&chat.extra))
        && !messages
            .as_ref()
            .is_some_and(|messages| listed(&messages.extra))
}

/// `original` (a JSON object) with `model` set and no `models` list;
/// every other field goes on byte for byte as the client sent it.
pub(crate) fn body_with_model(original: &Bytes, model: &str) -> Bytes {
    let edited = JsonObject::parse(original).and_then(|mut object| {
        object
            .set("model", serde_json::to_string(model).ok()?)
            .ok()?;
        object.remove("models").ok()?;
        Some(object.to_bytes())
    });
    // BodyLimit parsed it already (an object, each field once): the
    // original is only a fallback that cannot happen.
    edited.map_or_else(|| original.clone(), Bytes::from)
}

impl crate::context::ContextLayer for FallbackLayer {
    const NAME: &'static str = "Fallback";

    fn reads(&self) -> &'static [crate::context::ContextPart] {
        use crate::context::ContextPart;
        &[ContextPart::Principal, ContextPart::ParsedBody]
    }
}

/// The candidates of a key with a model list: the model asked must be on
/// it (403 otherwise, never served by a fallback instead); fallbacks that
/// are not are skipped.
fn callable(
    principal: Option<&Principal>,
    asked: &ModelId,
    mut candidates: Vec<ModelId>,
) -> Result<Vec<ModelId>, GatewayError> {
    if let Some(key) = principal.filter(|key| key.allowed_models.is_some()) {
        key.check_model(asked)?;
        candidates.retain(|model| key.may_call(model));
    }
    Ok(candidates)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::credit::PriceTable;
    use crate::free_quota::FreeQuotaRules;
    use crate::model_id::ModelNames;
    use crate::rate_limit::RateLimitRules;

    /// A response as the upstream client returns it: nothing marks it.
    fn upstream(status: u16) -> Response<Full<Bytes>> {
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    fn rate_limited(source: LimitSource) -> GatewayError {
        GatewayError::rate_limited(source, "slow down", Duration::from_secs(1))
    }

    /// Every refusal the gateway makes below Fallback, by whether the next
    /// model is tried after it.
    fn gateway_refusals() -> Vec<(GatewayError, bool)> {
        vec![
            (
                GatewayError::new(ErrorKind::Upstream, "cannot connect")
                    .with_metadata("upstream_failure", "connect"),
                true,
            ),
            (
                GatewayError::new(ErrorKind::UpstreamTimeout, "no answer in time"),
                true,
            ),
            (rate_limited(LimitSource::ModelRate), true),
            (rate_limited(LimitSource::AccountRate), false),
            (rate_limited(LimitSource::FreePerMinute), false),
            (rate_limited(LimitSource::FreePerDay), false),
            (
                GatewayError::insufficient_credits(LimitSource::KeyLimit, "limit"),
                false,
            ),
            (
                GatewayError::insufficient_credits(LimitSource::Credits, "balance"),
                false,
            ),
            (
                GatewayError::new(ErrorKind::ServiceUnavailable, "the store failed")
                    .with_metadata("layer", "CreditGuard"),
                false,
            ),
            (
                GatewayError::missing_layer("CreditGuard", "BearerAuth"),
                false,
            ),
            (
                GatewayError::new(ErrorKind::InvalidRequest, "no provider"),
                false,
            ),
        ]
    }

    #[test]
    fn the_upstreams_own_429_and_5xx_move_on_and_nothing_else_of_its() {
        for status in [429, 500, 502, 503, 504, 529] {
            assert!(falls_back(&upstream(status)), "{status}");
        }
        for status in [200, 400, 402, 404, 413, 422] {
            assert!(!falls_back(&upstream(status)), "{status}");
        }
    }

    #[test]
    fn of_the_gateways_own_answers_only_upstream_failures_and_model_rules_move_on() {
        for (error, expected) in gateway_refusals() {
            let response: Response<Full<Bytes>> = error.to_response();
            assert_eq!(falls_back(&response), expected, "{error}");
        }
    }

    #[test]
    fn a_body_that_looks_like_the_gateways_does_not_fool_it() {
        // An upstream may send the canonical body too: its own 429 still
        // moves on, and its 402 still does not.
        for (error, expected) in [
            (rate_limited(LimitSource::AccountRate), true),
            (
                GatewayError::insufficient_credits(LimitSource::Credits, "balance"),
                false,
            ),
        ] {
            let mut response = upstream(error.status().as_u16());
            *response.body_mut() = Full::new(Bytes::from(error.to_json().to_string()));
            assert_eq!(falls_back(&response), expected, "{error}");
        }
    }

    /// FallbackLayer over a stand-in that answers `first` for `alpha/m1`
    /// and 200 for anything else, recording the models it was asked for.
    async fn tried_after(first: Response<Full<Bytes>>) -> (u16, Vec<String>) {
        tried_sending(first, "alpha/m1", &ModelNames::new()).await
    }

    /// As [`tried_after`], the body naming `sent`, read through `names`;
    /// each model recorded as the attempt's parsed request names it.
    async fn tried_sending(
        first: Response<Full<Bytes>>,
        sent: &str,
        names: &ModelNames,
    ) -> (u16, Vec<String>) {
        let price = r#"{"prompt_per_million": 1, "completion_per_million": 1}"#;
        let prices = PriceTable::from_json(&format!(
            r#"{{"models": {{"alpha/m1": {price}, "beta/m2": {price}}}}}"#
        ))
        .unwrap();
        let fallbacks = HashMap::from([("alpha/m1".to_owned(), vec!["beta/m2".to_owned()])]);
        let catalog = ModelCatalog::new(
            Arc::new(prices),
            None,
            &fallbacks,
            &RateLimitRules::default(),
            &FreeQuotaRules::default(),
        )
        .unwrap();
        let tried = Arc::new(Mutex::new(Vec::new()));
        let first = Arc::new(Mutex::new(Some(first)));
        let inner = tower::service_fn({
            let tried = Arc::clone(&tried);
            move |request: Request<Full<Bytes>>| {
                let model = RequestContext::of(&request)
                    .and_then(|context| context.chat.as_ref())
                    .unwrap()
                    .model
                    .clone();
                tried.lock().unwrap().push(model.clone());
                let answer = match first.lock().unwrap().take() {
                    Some(response) if model == "alpha/m1" => response,
                    _ => upstream(200),
                };
                async move { Ok::<_, std::convert::Infallible>(answer) }
            }
        });
        let service = FallbackLayer::new(Arc::new(catalog)).layer(inner);
        let body = Bytes::from(format!(
            r#"{{"model": "{sent}", "messages": [{{"role": "user", "content": "hi"}}]}}"#
        ));
        let mut request = Request::post("/api/v1/chat/completions")
            .body(Full::new(body.clone()))
            .unwrap();
        let context = RequestContext::of_mut(&mut request);
        context.chat = Some(Arc::new(ChatRequest::parse_named(&body, names).unwrap()));
        context.body = Some(body);
        let response = service.oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let tried = tried.lock().unwrap().clone();
        (status, tried)
    }

    #[tokio::test]
    async fn a_refusal_of_the_account_is_answered_without_trying_the_fallback() {
        for (error, expected) in gateway_refusals() {
            let (answered, tried) = tried_after(error.to_response()).await;
            let (status, models) = if expected {
                (200, vec!["alpha/m1", "beta/m2"])
            } else {
                (error.status().as_u16(), vec!["alpha/m1"])
            };
            assert_eq!(
                (answered, tried),
                (
                    status,
                    models.iter().map(|model| model.to_string()).collect()
                ),
                "{error}"
            );
        }
        let (answered, tried) = tried_after(upstream(503)).await;
        assert_eq!((answered, tried.len()), (200, 2), "the upstream's 503");
    }

    #[tokio::test]
    async fn each_attempt_names_its_model_though_the_client_sent_an_alias() {
        let names = ModelNames::new().alias("m1", "alpha/m1").unwrap();
        let (answered, tried) = tried_sending(upstream(503), "m1", &names).await;
        assert_eq!(
            (answered, tried),
            (200, vec!["alpha/m1".to_owned(), "beta/m2".to_owned()])
        );
    }
}
