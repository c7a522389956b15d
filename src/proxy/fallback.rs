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

use super::model_field::{
    rewrite_model_json, BodyKind, JsonObject, ReportedModel, MAX_REWRITTEN_JSON_BYTES,
};
use super::models::ModelCatalog;
use super::retry::SkipRetries;
use crate::body::{BufferedBody, ChatRequest, ModelId};
use crate::error::{ErrorKind, GatewayError};
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

/// For a chat request (a [`ChatRequest`] and [`BufferedBody`] in its
/// extensions): 400 when its model is not served; otherwise it tries its
/// model, then its `models` list, then the configured fallbacks, each as a
/// request for that model (body, `ChatRequest`) through the inner service,
/// so each passes its own model's limits. It moves on after a 429 or a
/// 5xx (a timeout is a 504, a refused connection a 502): a response it
/// moves past was never sent on, so no byte of it reached the client. The
/// answer names its model in `x-modelgate-model` and in its `model` field.
/// Other requests pass untouched.
#[derive(Clone, Debug)]
pub struct Fallback<S> {
    inner: S,
    catalog: Arc<ModelCatalog>,
}

/// Statuses after which the next model is tried.
fn falls_back(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 500 | 502 | 503 | 504)
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
        let extensions = request.extensions();
        let (Some(chat), Some(buffered)) = (
            extensions.get::<ChatRequest>(),
            extensions.get::<BufferedBody>(),
        ) else {
            return Box::pin(async move {
                let response = inner.oneshot(request).await?;
                Ok(response
                    .map(|body| ReportedModel::new(ResponseBody::inner(body), "", BodyKind::Other)))
            });
        };
        let mut candidates = match self.catalog.candidates(chat) {
            Ok(candidates) => candidates,
            Err(error) => {
                return Box::pin(async move {
                    Ok(error
                        .to_response::<ResponseBody<ResBody>>()
                        .map(|body| ReportedModel::new(body, "", BodyKind::Other)))
                })
            }
        };
        if candidates.len() == 1 && !chat.extra.contains_key("models") {
            // Nothing to fall back to: the request goes on as it is, its
            // parsed body not copied.
            let model = candidates.swap_remove(0);
            return Box::pin(async move {
                let response = inner.oneshot(request).await?;
                Ok(reported(response, &model).await)
            });
        }
        let (chat, buffered) = (chat.clone(), buffered.clone());
        Box::pin(async move {
            let (parts, _) = request.into_parts();
            let last = candidates.len() - 1;
            for (index, model) in candidates.iter().enumerate() {
                let mut attempt = Request::from_parts(parts.clone(), Full::new(Bytes::new()));
                let body = for_model(&buffered.0, &chat, model);
                let mut attempt_chat = chat.clone();
                attempt_chat.model = model.as_str().to_owned();
                attempt_chat.model_id = model.clone();
                attempt.extensions_mut().insert(attempt_chat);
                attempt.extensions_mut().insert(BufferedBody(body.clone()));
                if index < last {
                    // The next model is the better retry.
                    attempt.extensions_mut().insert(SkipRetries);
                }
                *attempt.body_mut() = Full::new(body);
                let response = inner.clone().oneshot(attempt).await?;
                if index < last && falls_back(response.status()) {
                    tracing::info!(
                        from = %model,
                        to = %candidates[index + 1],
                        status = response.status().as_u16(),
                        "falling back to the next model"
                    );
                    // Served models only: the catalog checked every candidate.
                    metrics::counter!(
                        crate::telemetry::FALLBACKS_TOTAL,
                        "from" => model.as_str().to_owned(),
                        "to" => candidates[index + 1].as_str().to_owned()
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
    if kind == BodyKind::EventStream {
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
    let bytes = rewrite_model_json(&held, model.as_str())
        .map(Bytes::from)
        .unwrap_or_else(|| held.freeze());
    parts
        .headers
        .insert(http::header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    Response::from_parts(
        parts,
        ReportedModel::new(ResponseBody::full(bytes), "", BodyKind::Other),
    )
}

/// The request body for `model`: its `model` field set, and `models`
/// removed (the upstream gets one model; the gateway did the falling back).
fn for_model(original: &Bytes, chat: &ChatRequest, model: &ModelId) -> Bytes {
    let unchanged = chat.model_id.as_str() == model.as_str() && !chat.extra.contains_key("models");
    if unchanged {
        return original.clone();
    }
    body_with_model(original, model.as_str())
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
