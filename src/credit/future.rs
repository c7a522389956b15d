use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_util::future::BoxFuture;
use http::header::CONTENT_LENGTH;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::util::Oneshot;
use tower_service::Service;

use super::body::MeteredBody;
use super::meter::{Ending, Unsettled};
use super::service::Admitted;
use super::usage::{BodyKind, UsageScanner};
use crate::error::GatewayError;
use crate::response_body::ResponseBody;

pin_project! {
    /// Response future of [`CreditGuard`](super::CreditGuard): the
    /// reservation, then the inner service, then a metered body.
    pub struct ResponseFuture<S, B>
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
            error: Option<GatewayError>,
        },
        Admitting {
            admitting: BoxFuture<'static, Result<Admitted, GatewayError>>,
            request: Option<Request<B>>,
            inner: Option<S>,
            max_scanned_body_bytes: usize,
        },
        Calling {
            #[pin]
            future: Oneshot<S, Request<B>>,
            meter: Unsettled,
            max_scanned_body_bytes: usize,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn rejected(error: GatewayError) -> Self {
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
        }
    }

    pub(crate) fn unmetered(request: Request<B>, inner: S) -> Self {
        ResponseFuture {
            state: State::Calling {
                future: Oneshot::new(inner, request),
                meter: Unsettled::new(None, Ending::Abandoned),
                max_scanned_body_bytes: 0,
            },
        }
    }

    pub(crate) fn admitting(
        admitting: BoxFuture<'static, Result<Admitted, GatewayError>>,
        request: Request<B>,
        inner: S,
        max_scanned_body_bytes: usize,
    ) -> Self {
        ResponseFuture {
            state: State::Admitting {
                admitting,
                request: Some(request),
                inner: Some(inner),
                max_scanned_body_bytes,
            },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<MeteredBody<ResBody>>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProjection::Rejected { error } => {
                    let error = error.take().expect("polled after completion");
                    crate::telemetry::layer_decision("CreditGuard", Some(&error));
                    return Poll::Ready(Ok(error.to_response()));
                }
                StateProjection::Admitting {
                    admitting,
                    request,
                    inner,
                    max_scanned_body_bytes,
                } => {
                    let outcome = ready!(admitting.as_mut().poll(cx));
                    let (Some(mut request), Some(inner)) = (request.take(), inner.take()) else {
                        panic!("polled after completion");
                    };
                    let next = match outcome {
                        Ok(Admitted { meter, credential }) => {
                            crate::telemetry::layer_decision("CreditGuard", None);
                            if let Some(credential) = credential {
                                // For the upstream client, which sends it
                                // instead of the gateway's own key.
                                request.extensions_mut().insert(credential);
                            }
                            State::Calling {
                                future: Oneshot::new(inner, request),
                                // Dropped before the response: the upstream
                                // may be working, so the hold is charged.
                                meter: Unsettled::new(Some(meter), Ending::Abandoned),
                                max_scanned_body_bytes: *max_scanned_body_bytes,
                            }
                        }
                        Err(error) => State::Rejected { error: Some(error) },
                    };
                    state.set(next);
                }
                StateProjection::Calling {
                    future,
                    meter,
                    max_scanned_body_bytes,
                } => {
                    let response = match ready!(future.poll(cx)) {
                        Ok(response) => response,
                        Err(error) => {
                            if let Some(meter) = meter.take() {
                                meter.settle_in_background(None, Ending::InnerFailed);
                            }
                            return Poll::Ready(Err(error));
                        }
                    };
                    let success = response.status().is_success();
                    let mut response = response;
                    if meter.is_some() {
                        // The end of a metered body waits for its settlement;
                        // a declared length would let the client finish
                        // first, before the cost is recorded.
                        response.headers_mut().remove(CONTENT_LENGTH);
                    }
                    // The body is read as what it is, whatever was asked for.
                    let kind = if is_event_stream(response.headers()) {
                        BodyKind::EventStream
                    } else {
                        BodyKind::Json
                    };
                    let response = response.map(|body| match meter.take() {
                        Some(mut meter) => {
                            meter.response_success = Some(success);
                            MeteredBody::metered(
                                body,
                                meter,
                                UsageScanner::new(kind, *max_scanned_body_bytes),
                            )
                        }
                        None => MeteredBody::unmetered(body),
                    });
                    return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                }
            }
        }
    }
}

fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"))
}
