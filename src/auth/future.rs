use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_util::future::BoxFuture;
use http::header::AUTHORIZATION;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::util::Oneshot;
use tower_service::Service;

use super::Principal;
use crate::error::GatewayError;
use crate::response_body::ResponseBody;

pin_project! {
    /// Response future of [`BearerAuth`](super::BearerAuth).
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
        Authenticating {
            authenticating: BoxFuture<'static, Result<Principal, GatewayError>>,
            request: Option<Request<B>>,
            inner: Option<S>,
        },
        Calling {
            #[pin]
            future: Oneshot<S, Request<B>>,
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

    pub(crate) fn authenticating(
        authenticating: BoxFuture<'static, Result<Principal, GatewayError>>,
        request: Request<B>,
        inner: S,
    ) -> Self {
        ResponseFuture {
            state: State::Authenticating {
                authenticating,
                request: Some(request),
                inner: Some(inner),
            },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProjection::Rejected { error } => {
                    let error = error.take().expect("polled after completion");
                    return Poll::Ready(Ok(error.to_response()));
                }
                StateProjection::Authenticating {
                    authenticating,
                    request,
                    inner,
                } => {
                    let outcome = ready!(authenticating.as_mut().poll(cx));
                    let (Some(mut request), Some(inner)) = (request.take(), inner.take()) else {
                        panic!("polled after completion");
                    };
                    match outcome {
                        Ok(principal) => {
                            request.headers_mut().remove(AUTHORIZATION);
                            request.extensions_mut().insert(principal);
                            state.set(State::Calling {
                                future: Oneshot::new(inner, request),
                            });
                        }
                        Err(error) => state.set(State::Rejected { error: Some(error) }),
                    }
                }
                StateProjection::Calling { future } => {
                    let response = ready!(future.poll(cx))?;
                    return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                }
            }
        }
    }
}
