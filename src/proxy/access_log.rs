//! [`AccessLogLayer`]: each request's span, id, trace context, metrics and
//! one structured log line.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::future::BoxFuture;
use http::{HeaderName, Request, Response};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

use super::fallback::MODEL_HEADER;
use super::headers::{X_REQUEST_ID, request_id};
use super::models::ModelCatalog;
use crate::auth::Principal;
use crate::context::RequestContext;
use crate::error::Refusal;
use crate::routing::{loggable_path, normalized_segments};
use crate::telemetry::{
    HandleCache, REQUEST_DURATION_SECONDS, REQUESTS_IN_FLIGHT, REQUESTS_TOTAL, TraceContext,
};

/// The W3C trace context header, sent upstream.
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// What the inner layers learn about a request, for its log line.
#[derive(Clone, Debug, Default)]
struct Fields {
    key_hash_prefix: Option<KeyHashPrefix>,
    model: Option<String>,
}

/// The first 4 bytes of a key's hash in hex: what logs show of a key.
#[derive(Clone, Copy, Debug)]
struct KeyHashPrefix([u8; 8]);

impl KeyHashPrefix {
    fn of(principal: &Principal) -> Self {
        let mut hex = [0u8; 8];
        // Cannot fail: 4 bytes always fill 8 hex digits.
        let _ = hex::encode_to_slice(&principal.key_hash.as_bytes()[..4], &mut hex);
        KeyHashPrefix(hex)
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("-")
    }
}

#[derive(Clone, Debug, Default)]
struct Slot(Arc<Mutex<Fields>>);

/// Gives each request a `request` span (request id, trace id, method,
/// route; key hash prefix, account and model once known), an
/// `x-request-id` (the client's when well-formed) on the request and its
/// response, and a W3C `traceparent` for the upstream (the client's trace
/// continued, or a new one); counts it in the request metrics
/// ([`telemetry`](crate::telemetry)); and logs one line when its response
/// starts: method, path, key hash prefix (8 hex digits, never the key),
/// model, status, decision (`admitted`, or the refusal's type and limit
/// source) and latency.
///
/// Put it outermost and [`AccessLogLayer::annotate`] right after
/// BodyLimit: the inner part fills in the key and model the outer part
/// logs.
///
/// The `model` label of the request metrics is the catalog's id of the
/// model served, or `other` ([`ModelCatalog::metric_label`]); without a
/// catalog (the default) it is always `other`, since names clients send
/// are unbounded.
#[derive(Clone, Debug, Default)]
pub struct AccessLogLayer {
    catalog: Option<Arc<ModelCatalog>>,
}

impl AccessLogLayer {
    /// Labels metrics with the models `catalog` lists.
    pub fn new(catalog: Arc<ModelCatalog>) -> Self {
        AccessLogLayer {
            catalog: Some(catalog),
        }
    }

    /// The inner half, placed after BearerAuth (and BodyLimit).
    pub fn annotate() -> AnnotateLayer {
        AnnotateLayer
    }
}

impl<S> Layer<S> for AccessLogLayer {
    type Service = AccessLog<S>;

    fn layer(&self, inner: S) -> AccessLog<S> {
        AccessLog {
            inner,
            catalog: self.catalog.clone(),
        }
    }
}

/// See [`AccessLogLayer`].
#[derive(Clone, Debug)]
pub struct AccessLog<S> {
    inner: S,
    catalog: Option<Arc<ModelCatalog>>,
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
        let id = request_id(request.headers());
        let trace = TraceContext::continue_or_start(request.headers().get(&TRACEPARENT));
        request
            .headers_mut()
            .insert(X_REQUEST_ID.clone(), id.clone());
        request
            .headers_mut()
            .insert(TRACEPARENT.clone(), trace.traceparent());
        let method = request.method().clone();
        // The path as sent, kept without a copy (the URI shares its bytes).
        let uri = request.uri().clone();
        let route = route_class(uri.path());
        let span = tracing::info_span!(
            "request",
            // Strings, recorded as they are: no formatter runs for them.
            request_id = id.to_str().unwrap_or("-"),
            trace_id = trace.trace_id(),
            method = method.as_str(),
            route,
            key = tracing::field::Empty,
            account = tracing::field::Empty,
            model = tracing::field::Empty,
        );
        let in_flight = InFlight::start();
        // Boxed before the block takes it: the block's first poll would
        // otherwise move the whole chain's future once more.
        let future = Box::pin(span.in_scope(|| self.inner.call(request)));
        let catalog = self.catalog.clone();
        Box::pin(
            async move {
                let mut outcome = future.await;
                drop(in_flight);
                let fields = slot
                    .0
                    .lock()
                    .map(|mut fields| std::mem::take(&mut *fields))
                    .unwrap_or_default();
                let (status, decision, served_model) = match &mut outcome {
                    Ok(response) => {
                        response.headers_mut().insert(X_REQUEST_ID.clone(), id);
                        let decision = match response.extensions().get::<Refusal>() {
                            Some(refusal) => match refusal.limit_source.as_deref() {
                                Some(source) => {
                                    Cow::Owned(format!("{}:{source}", refusal.kind.type_str()))
                                }
                                None => Cow::Borrowed(refusal.kind.type_str()),
                            },
                            None => Cow::Borrowed("admitted"),
                        };
                        // Only a model the catalog lists labels a metric:
                        // what clients send is unbounded.
                        let served = response
                            .headers()
                            .get(&MODEL_HEADER)
                            .and_then(|value| value.to_str().ok())
                            .map(|model| {
                                catalog
                                    .as_deref()
                                    .map_or("other", |catalog| catalog.metric_label(model))
                                    .to_owned()
                            });
                        (response.status().as_u16(), decision, served)
                    }
                    Err(_) => (0, Cow::Borrowed("inner_error"), None),
                };
                let latency = started.elapsed();
                let counted = (
                    route,
                    status,
                    served_model.unwrap_or_else(|| "-".to_owned()),
                );
                REQUESTS
                    .get(&counted, || {
                        let counter = metrics::counter!(
                            REQUESTS_TOTAL,
                            "route" => route,
                            "model" => counted.2.clone(),
                            "status" => status.to_string()
                        );
                        (counted.clone(), counter)
                    })
                    .increment(1);
                DURATIONS
                    .get(&route, || {
                        let histogram =
                            metrics::histogram!(REQUEST_DURATION_SECONDS, "route" => route);
                        (route, histogram)
                    })
                    .record(latency.as_secs_f64());
                let key = fields
                    .key_hash_prefix
                    .as_ref()
                    .map(|prefix| prefix.as_str());
                tracing::info!(
                    target: "modelgate::access",
                    method = method.as_str(),
                    // The route, never a whole key hash (8 hex digits).
                    path = loggable_path(uri.path()),
                    key = key.unwrap_or("-"),
                    model = fields.model.as_deref().unwrap_or("-"),
                    status,
                    decision = &*decision,
                    // Whole microseconds: finer is noise, and a short
                    // decimal formats faster than a long one.
                    latency_ms = latency.as_micros() as f64 / 1000.0,
                    "request"
                );
                outcome
            }
            .instrument(span),
        )
    }
}

/// `modelgate_requests_total` by route class, status and served model.
static REQUESTS: HandleCache<(&'static str, u16, String), metrics::Counter> = HandleCache::new();
/// `modelgate_request_duration_seconds` by route class.
static DURATIONS: HandleCache<&'static str, metrics::Histogram> = HandleCache::new();
static IN_FLIGHT: HandleCache<(), metrics::Gauge> = HandleCache::new();

/// Counts a request in flight until dropped (answered, or abandoned).
struct InFlight(metrics::Gauge);

impl InFlight {
    fn start() -> Self {
        let gauge = IN_FLIGHT.get(&(), || ((), metrics::gauge!(REQUESTS_IN_FLIGHT)));
        gauge.increment(1.0);
        InFlight(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// A small fixed set of route names for metric labels; paths as sent are
/// unbounded.
fn route_class(path: &str) -> &'static str {
    let segments = normalized_segments(path);
    // `expected` then nothing more, or then anything (`open`), in any case.
    let is = |expected: &[&str], open: bool| {
        (segments.len() == expected.len() || open && segments.len() > expected.len())
            && segments
                .iter()
                .zip(expected)
                .all(|(segment, expected)| segment.eq_ignore_ascii_case(expected))
    };
    if is(&["api", "v1", "chat", "completions"], false) {
        "chat_completions"
    } else if is(&["api", "v1", "messages"], true) {
        "messages"
    } else if is(&["api", "v1", "responses"], false) {
        "responses"
    } else if is(&["api", "v1", "embeddings"], false) {
        "embeddings"
    } else if is(&["api", "v1", "models"], false) {
        "models"
    } else if is(&["api", "v1", "key"], false) {
        "key"
    } else if is(&["api", "v1", "credits"], false) {
        "credits"
    } else if is(&["user", "balance"], false) {
        "balance"
    } else if is(&["api", "v1", "keys"], true) {
        "keys"
    } else if is(&["api", "v1", "accounts"], true) {
        "accounts"
    } else if is(&["plugins", "webhooks"], true) {
        "webhooks"
    } else {
        "other"
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
        let context = RequestContext::of(&request);
        let principal = context.and_then(|context| context.principal.as_ref());
        let key_hash_prefix = principal.map(KeyHashPrefix::of);
        let model = context
            .and_then(RequestContext::model_call)
            // The model chosen, an alias resolved: what was priced.
            .map(|call| call.model_id.as_str().to_owned());
        // One record for all three: each record is a lookup and a format
        // in every subscriber layer.
        tracing::record_all!(
            tracing::Span::current(),
            key = key_hash_prefix.as_ref().map(KeyHashPrefix::as_str),
            account = principal.map(|principal| principal.account_id.as_str()),
            model = model.as_deref()
        );
        if let Some(slot) = request.extensions().get::<Slot>()
            && let Ok(mut fields) = slot.0.lock()
        {
            fields.key_hash_prefix = key_hash_prefix;
            fields.model = model;
        }
        self.inner.call(request)
    }
}

impl crate::context::ContextLayer for AnnotateLayer {
    const NAME: &'static str = "Annotate";

    fn reads(&self) -> &'static [crate::context::ContextPart] {
        use crate::context::ContextPart;
        &[ContextPart::Principal, ContextPart::ParsedBody]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_route_has_its_class_in_any_case_and_spelling() {
        for (path, class) in [
            ("/api/v1/chat/completions", "chat_completions"),
            ("/api/v1/messages", "messages"),
            ("/api/v1/messages/count_tokens", "messages"),
            ("/api/v1/responses", "responses"),
            ("/api/v1/embeddings", "embeddings"),
            ("/API/V1/Chat/Completions", "chat_completions"),
            ("//api/./v1/chat/%63ompletions", "chat_completions"),
            ("/api/v1/chat/completions/more", "other"),
            ("/api/v1/models", "models"),
            ("/api/v1/key", "key"),
            ("/api/v1/credits", "credits"),
            ("/user/balance", "balance"),
            ("/api/v1/keys", "keys"),
            ("/api/v1/keys/abc/rotate", "keys"),
            ("/api/v1/accounts/acme/credits", "accounts"),
            ("/plugins/webhooks/acme/run", "webhooks"),
            ("/plugins/webhooks", "webhooks"),
            ("/plugins", "other"),
            ("/api/v1", "other"),
            ("/", "other"),
            ("", "other"),
        ] {
            assert_eq!(route_class(path), class, "{path}");
        }
    }

    proptest! {
        /// A label is one of a fixed few whatever the path: metrics stay bounded.
        #[test]
        fn any_path_gets_one_of_the_fixed_classes(path in "(/[a-zA-Z0-9%.]{0,12}){0,6}") {
            prop_assert!([
                "chat_completions", "messages", "responses", "embeddings", "models", "key",
                "credits", "balance", "keys", "accounts", "webhooks", "other",
            ]
            .contains(&route_class(&path)));
        }
    }
}
