//! The admission plan: how a deciding layer hands its checks to the one
//! that decides (see [`AdmissionLayers`](crate::admission::AdmissionLayers)),
//! and the response future of a layer that decides before it calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_util::future::BoxFuture;
use http::{Extensions, Request, Response};
use pin_project_lite::pin_project;
use tower::util::Oneshot;
use tower_service::Service;

use super::headers::{RateHeaders, merge_response_headers};
use super::{Limiter, Verdict};
use crate::error::GatewayError;
use crate::response_body::ResponseBody;
use crate::store::{Check, PurchaseTier};

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

/// What a layer's decision adds when it admits a request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Admission<A = Extensions> {
    /// Added to the request before the inner service is called.
    pub(crate) additions: A,
    /// Added to the response (rate-limit headers keep the tightest limit).
    pub(crate) response_headers: RateHeaders,
}

/// What an admitted request gains before the inner service sees it.
pub(crate) trait Additions<B>: Send + 'static {
    /// Adds `self` to `request`.
    fn add_to(self, request: &mut Request<B>);
}

impl<B> Additions<B> for Extensions {
    /// Extensions of their own only: the request's context is written
    /// through its fields, never replaced by `extend`.
    fn add_to(self, request: &mut Request<B>) {
        request.extensions_mut().extend(self);
    }
}

/// A layer's decision: admit with additions, or the response refusing.
pub(crate) type Decision<A = Extensions> = BoxFuture<'static, Result<Admission<A>, GatewayError>>;

pin_project! {
    /// Response future of the admission layers (and of BearerAuth): the
    /// decision, then the inner service.
    pub struct AdmissionFuture<S, B, A = Extensions>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B, A>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<S, B, A>
    where
        S: Service<Request<B>>,
    {
        Rejected {
            layer: &'static str,
            error: Option<GatewayError>,
        },
        Deciding {
            layer: &'static str,
            decision: Decision<A>,
            request: Option<Request<B>>,
            inner: Option<S>,
        },
        Calling {
            #[pin]
            future: Oneshot<S, Request<B>>,
            response_headers: RateHeaders,
        },
    }
}

impl<S, B, A> AdmissionFuture<S, B, A>
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

    /// Admitted with nothing to add: the inner service is called at once.
    pub(crate) fn admitted(layer: &'static str, request: Request<B>, inner: S) -> Self {
        crate::telemetry::layer_decision(layer, None);
        AdmissionFuture {
            state: State::Calling {
                future: Oneshot::new(inner, request),
                response_headers: RateHeaders::default(),
            },
        }
    }

    pub(crate) fn deciding(
        layer: &'static str,
        decision: Decision<A>,
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

impl<S, B, A, ResBody> Future for AdmissionFuture<S, B, A>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    A: Additions<B>,
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
                            admission.additions.add_to(&mut request);
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
