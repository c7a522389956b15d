//! Admission: how the deciding layers decide, alone or together.
//!
//! Used alone, each of [`GlobalRateLimit`], [`FreeModelQuota`] and
//! [`CreditGuard`] decides by itself, each in
//! its own store step. Stacked by [`AdmissionLayers`] (as the proxy does),
//! the first two do not decide: each hands its checks to CreditGuard in an
//! admission plan in the request's extensions, and CreditGuard decides
//! every check and its credit hold in one atomic store step
//! ([`LedgerStore::admit`](crate::store::LedgerStore::admit); on Redis one
//! script). A request refused by any of them counts in none: no rate, no
//! free quota, no hold. Each layer still words its own refusals and adds
//! its own headers.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::admission::AdmissionLayers;
//! use modelgate::auth::BearerAuthLayer;
//! use modelgate::body::BodyLimitLayer;
//! use modelgate::credit::{CreditGuardLayer, PriceTable};
//! use modelgate::free_quota::FreeModelQuotaLayer;
//! use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
//! use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
//! use modelgate::store::MemoryStore;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let directory = KeyDirectory::new(store.clone());
//! let (key, _) = directory.create_key(NewKey::named("app")).await.unwrap();
//! let rules = RateLimitRules::from_json(r#"{"account": {"rolling": {"requests": 100, "window_seconds": 60}}}"#).unwrap();
//! let prices = PriceTable::from_json(r#"{"models": {"openai/gpt-4o": {"prompt_per_million": 1, "completion_per_million": 1}}}"#).unwrap();
//! let admission = AdmissionLayers::new(
//!     GlobalRateLimitLayer::new(store.clone(), rules).unwrap(),
//!     FreeModelQuotaLayer::new(store.clone()),
//!     CreditGuardLayer::new(store.clone(), Arc::new(prices)),
//! );
//! let upstream = service_fn(|_: Request<Full<Bytes>>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
//! });
//! let gateway = ServiceBuilder::new()
//!     .layer(BearerAuthLayer::new(directory))
//!     .layer(BodyLimitLayer::new())
//!     .layer(admission)
//!     .service(upstream);
//! // The account has bought nothing: a paid model is refused with 402, and
//! // the refusal spent none of its rate.
//! let body = r#"{"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}"#;
//! let chat = Request::post("/api/v1/chat/completions")
//!     .header("authorization", format!("Bearer {}", key.expose()))
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from(body)))
//!     .unwrap();
//! let response = gateway.oneshot(chat).await.unwrap();
//! assert_eq!(response.status(), 402);
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures_util::future::BoxFuture;
use http::{Extensions, HeaderMap, Request, Response};
use pin_project_lite::pin_project;
use tower::util::Oneshot;
use tower_service::Service;

use crate::credit::{CreditGuard, CreditGuardLayer};
use crate::error::GatewayError;
use crate::free_quota::{FreeModelQuota, FreeModelQuotaLayer};
use crate::limiter::headers::merge_response_headers;
use crate::limiter::{Limiter, Verdict};
use crate::rate_limit::{GlobalRateLimit, GlobalRateLimitLayer};
use crate::response_body::ResponseBody;
use crate::store::{Check, PurchaseTier};

/// [`GlobalRateLimit`], [`FreeModelQuota`] and [`CreditGuard`], in that
/// order, deciding every request in one atomic store step (see the
/// [module docs](self)). Put it where the three would go: after
/// [`BearerAuth`](crate::auth::BearerAuth) and
/// [`BodyLimit`](crate::body::BodyLimit).
#[derive(Clone, Debug)]
pub struct AdmissionLayers {
    rate_limit: GlobalRateLimitLayer,
    free_quota: FreeModelQuotaLayer,
    credit: CreditGuardLayer,
}

impl AdmissionLayers {
    /// The three layers, configured as each alone would be; the first two
    /// hand their checks to the third.
    pub fn new(
        rate_limit: GlobalRateLimitLayer,
        free_quota: FreeModelQuotaLayer,
        credit: CreditGuardLayer,
    ) -> Self {
        AdmissionLayers {
            rate_limit: rate_limit.deferred(),
            free_quota: free_quota.deferred(),
            credit,
        }
    }
}

impl<S> tower_layer::Layer<S> for AdmissionLayers {
    type Service = GlobalRateLimit<FreeModelQuota<CreditGuard<S>>>;

    fn layer(&self, inner: S) -> Self::Service {
        self.rate_limit
            .layer(self.free_quota.layer(self.credit.layer(inner)))
    }
}

/// How a deferring layer reads the verdict on its checks: its refusal, or
/// what it adds to the request and response.
pub(crate) type Finish = Arc<dyn Fn(Verdict) -> Result<Admission, GatewayError> + Send + Sync>;

/// One deferring layer's part of a request's admission.
#[derive(Clone)]
pub(crate) struct PlannedChecks {
    /// Its counters' memo and failure policy.
    pub(crate) limiter: Limiter,
    pub(crate) checks: Vec<Check>,
    /// A purchase tier, its index among `checks`.
    pub(crate) tier: Option<PurchaseTier>,
    pub(crate) finish: Finish,
}

/// The checks the layers before CreditGuard hand it, in layer order.
#[derive(Clone, Default)]
pub(crate) struct AdmissionPlan {
    pub(crate) parts: Vec<PlannedChecks>,
}

impl AdmissionPlan {
    /// Adds `part` to the request's plan.
    pub(crate) fn add<B>(request: &mut Request<B>, part: PlannedChecks) {
        match request.extensions_mut().get_mut::<AdmissionPlan>() {
            Some(plan) => plan.parts.push(part),
            None => {
                request
                    .extensions_mut()
                    .insert(AdmissionPlan { parts: vec![part] });
            }
        }
    }
}

/// What a layer's decision adds when it admits a request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Admission {
    /// Added to the request's extensions.
    pub(crate) extensions: Extensions,
    /// Added to the response (rate-limit headers keep the tightest limit).
    pub(crate) response_headers: HeaderMap,
}

/// A layer's decision: admit with additions, or the response refusing.
pub(crate) type Decision = BoxFuture<'static, Result<Admission, GatewayError>>;

pin_project! {
    /// Response future of the admission layers: the decision, then the
    /// inner service.
    pub struct AdmissionFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        Rejected {
            layer: &'static str,
            error: Option<GatewayError>,
        },
        Deciding {
            layer: &'static str,
            decision: Decision,
            request: Option<Request<B>>,
            inner: Option<S>,
        },
        Calling {
            #[pin]
            future: Oneshot<S, Request<B>>,
            response_headers: HeaderMap,
        },
    }
}

impl<S, B> AdmissionFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn rejected(layer: &'static str, error: GatewayError) -> Self {
        AdmissionFuture {
            state: State::Rejected {
                layer,
                error: Some(error),
            },
        }
    }

    pub(crate) fn deciding(
        layer: &'static str,
        decision: Decision,
        request: Request<B>,
        inner: S,
    ) -> Self {
        AdmissionFuture {
            state: State::Deciding {
                layer,
                decision,
                request: Some(request),
                inner: Some(inner),
            },
        }
    }
}

impl<S, B, ResBody> Future for AdmissionFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProjection::Rejected { layer, error } => {
                    let error = error.take().expect("polled after completion");
                    crate::telemetry::layer_decision(layer, Some(&error));
                    return Poll::Ready(Ok(error.to_response()));
                }
                StateProjection::Deciding {
                    layer,
                    decision,
                    request,
                    inner,
                } => {
                    let layer = *layer;
                    let outcome = ready!(decision.as_mut().poll(cx));
                    let (Some(mut request), Some(inner)) = (request.take(), inner.take()) else {
                        panic!("polled after completion");
                    };
                    match outcome {
                        Ok(admission) => {
                            crate::telemetry::layer_decision(layer, None);
                            request.extensions_mut().extend(admission.extensions);
                            state.set(State::Calling {
                                future: Oneshot::new(inner, request),
                                response_headers: admission.response_headers,
                            });
                        }
                        Err(error) => state.set(State::Rejected {
                            layer,
                            error: Some(error),
                        }),
                    }
                }
                StateProjection::Calling {
                    future,
                    response_headers,
                } => {
                    let response = ready!(future.poll(cx))?;
                    let (mut parts, body) = response.into_parts();
                    merge_response_headers(&mut parts, std::mem::take(response_headers));
                    return Poll::Ready(Ok(Response::from_parts(parts, ResponseBody::inner(body))));
                }
            }
        }
    }
}
