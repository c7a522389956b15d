//! [`AccessLogLayer`]: one structured log line per request.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::future::BoxFuture;
use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::auth::Principal;
use crate::body::ChatRequest;
use crate::error::Refusal;

/// What the inner layers learn about a request, for its log line.
#[derive(Clone, Debug, Default)]
struct Fields {
    key_hash_prefix: Option<String>,
    model: Option<String>,
}

#[derive(Clone, Debug, Default)]
struct Slot(Arc<Mutex<Fields>>);

/// Logs one line per request when its response starts: method, path, key
/// hash prefix (8 hex digits, never the key), model, status, decision
/// (`admitted`, or the refusal's type and limit source) and latency.
///
/// Put it outermost and [`AccessLogLayer::annotate`] right after
/// BearerAuth: the inner part fills in the key and model the outer part
/// logs.
#[derive(Clone, Copy, Debug, Default)]
pub struct AccessLogLayer;

impl AccessLogLayer {
    /// The inner half, placed after BearerAuth (and BodyLimit).
    pub fn annotate() -> AnnotateLayer {
        AnnotateLayer
    }
}

impl<S> Layer<S> for AccessLogLayer {
    type Service = AccessLog<S>;

    fn layer(&self, inner: S) -> AccessLog<S> {
        AccessLog { inner }
    }
}

/// See [`AccessLogLayer`].
#[derive(Clone, Debug)]
pub struct AccessLog<S> {
    inner: S,
}

impl<S, B, ResBody> Service<Request<B>> for AccessLog<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let started = Instant::now();
        let slot = Slot::default();
        request.extensions_mut().insert(slot.clone());
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let future = self.inner.call(request);
        Box::pin(async move {
            let outcome = future.await;
            let fields = slot
                .0
                .lock()
                .map(|fields| fields.clone())
                .unwrap_or_default();
            let (status, decision) = match &outcome {
                Ok(response) => (
                    response.status().as_u16(),
                    match response.extensions().get::<Refusal>() {
                        Some(refusal) => format!(
                            "{}{}",
                            refusal.kind.type_str(),
                            refusal
                                .limit_source
                                .as_deref()
                                .map(|source| format!(":{source}"))
                                .unwrap_or_default()
                        ),
                        None => "admitted".to_owned(),
                    },
                ),
                Err(_) => (0, "inner_error".to_owned()),
            };
            tracing::info!(
                target: "modelgate::access",
                %method,
                path,
                key = fields.key_hash_prefix.as_deref().unwrap_or("-"),
                model = fields.model.as_deref().unwrap_or("-"),
                status,
                decision,
                latency_ms = started.elapsed().as_secs_f64() * 1000.0,
                "request"
            );
            outcome
        })
    }
}

/// The inner half of [`AccessLogLayer`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AnnotateLayer;

impl<S> Layer<S> for AnnotateLayer {
    type Service = Annotate<S>;

    fn layer(&self, inner: S) -> Annotate<S> {
        Annotate { inner }
    }
}

/// See [`AccessLogLayer::annotate`].
#[derive(Clone, Debug)]
pub struct Annotate<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for Annotate<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if let Some(slot) = request.extensions().get::<Slot>() {
            if let Ok(mut fields) = slot.0.lock() {
                fields.key_hash_prefix = request
                    .extensions()
                    .get::<Principal>()
                    .map(|principal| principal.key_hash.to_hex()[..8].to_owned());
                fields.model = request
                    .extensions()
                    .get::<ChatRequest>()
                    .map(|chat| chat.model.clone());
            }
        }
        self.inner.call(request)
    }
}
