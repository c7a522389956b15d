use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::CatchUnwind;
use http::Response;
use http::response::Parts;
use http_body::Body;
use http_body_util::combinators::Collect;
use http_body_util::{BodyExt, Limited};
use tokio::time::Sleep;

use pin_project_lite::pin_project;

use super::anthropic::ErrorShape;
use super::inner::{inner_error, panicked};
use super::layer::ErrorMapperConfig;
use super::upstream::rewrite_error_response;
use crate::error::Refusal;
use crate::response_body::{BoxError, ResponseBody};

pin_project! {
    /// Response future of [`ErrorMapper`](super::ErrorMapper).
    pub struct ResponseFuture<F, B>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<F, B>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        Ready {
            response: Option<Response<ResponseBody<B>>>,
        },
        Calling {
            #[pin]
            future: CatchUnwind<AssertUnwindSafe<F>>,
            config: Arc<ErrorMapperConfig>,
            shape: ErrorShape,
        },
        ReadingError {
            #[pin]
            collect: CatchUnwind<AssertUnwindSafe<Collect<Limited<B>>>>,
            #[pin]
            deadline: Sleep,
            parts: Option<Parts>,
            config: Arc<ErrorMapperConfig>,
            shape: ErrorShape,
        },
    }
}

impl<F, B> ResponseFuture<F, B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    pub(crate) fn ready(response: Response<ResponseBody<B>>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) fn calling(
        future: CatchUnwind<AssertUnwindSafe<F>>,
        config: Arc<ErrorMapperConfig>,
        shape: ErrorShape,
    ) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                config,
                shape,
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<ResponseBody<B>>, std::convert::Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProjection::Ready { response } => {
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(response));
                }
                StateProjection::Calling {
                    future,
                    config,
                    shape,
                } => match ready!(future.poll(cx)) {
                    Err(_panic) => State::Ready {
                        response: Some(shape.render(&panicked())),
                    },
                    Ok(Err(error)) => State::Ready {
                        response: Some(shape.render(&inner_error(error.into(), config.inner_name))),
                    },
                    // The handler's own 4xx, when it speaks for itself.
                    Ok(Ok(response))
                        if config.own_client_errors_pass
                            && response.status().is_client_error()
                            && response.extensions().get::<Refusal>().is_none() =>
                    {
                        return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                    }
                    Ok(Ok(response))
                        if response.status().is_client_error()
                            || response.status().is_server_error() =>
                    {
                        let (parts, body) = response.into_parts();
                        let collect = Limited::new(body, config.max_error_body_bytes).collect();
                        State::ReadingError {
                            collect: AssertUnwindSafe(collect).catch_unwind(),
                            deadline: tokio::time::sleep(config.error_body_timeout),
                            parts: Some(parts),
                            config: Arc::clone(config),
                            shape: *shape,
                        }
                    }
                    Ok(Ok(response)) => {
                        return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                    }
                },
                StateProjection::ReadingError {
                    collect,
                    deadline,
                    parts,
                    config,
                    shape,
                } => {
                    let body = match collect.poll(cx) {
                        Poll::Ready(Ok(collected)) => {
                            collected.map(|collected| collected.to_bytes())
                        }
                        Poll::Ready(Err(_panic)) => Err("the error body panicked".into()),
                        Poll::Pending => {
                            ready!(deadline.poll(cx));
                            Err("the error body did not arrive in time".into())
                        }
                    };
                    let parts = parts.take().expect("read once");
                    State::Ready {
                        response: Some(rewrite_error_response(parts, body, config, *shape)),
                    }
                }
            };
            state.set(next);
        }
    }
}
