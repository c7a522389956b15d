use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::combinators::Collect;
use http_body_util::{Full, LengthLimitError, Limited};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::util::Oneshot;
use tower_service::Service;

use super::prepare::{prepare_request, too_large};
use crate::context::ModelNames;
use crate::error::{ErrorKind, GatewayError};
use crate::response_body::{BoxError, ResponseBody, causes};

pin_project! {
    /// Response future of [`BodyLimit`](super::BodyLimit).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<Full<Bytes>>>,
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<S, B>
    where
        S: Service<Request<Full<Bytes>>>,
        B: Body,
        B::Error: Into<BoxError>,
    {
        Rejected {
            error: Option<GatewayError>,
        },
        Buffering {
            #[pin]
            collect: Collect<Limited<B>>,
            #[pin]
            deadline: Sleep,
            read_timeout: Duration,
            max_body_bytes: usize,
            names: Arc<ModelNames>,
            parts: Option<Parts>,
            inner: Option<S>,
        },
        Calling {
            #[pin]
            future: Oneshot<S, Request<Full<Bytes>>>,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<Full<Bytes>>>,
    B: Body,
    B::Error: Into<BoxError>,
{
    pub(crate) fn rejected(error: GatewayError) -> Self {
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
        }
    }

    pub(crate) fn buffering(
        parts: Parts,
        collect: Collect<Limited<B>>,
        read_timeout: Duration,
        max_body_bytes: usize,
        names: Arc<ModelNames>,
        inner: S,
    ) -> Self {
        ResponseFuture {
            state: State::Buffering {
                collect,
                deadline: tokio::time::sleep(read_timeout),
                read_timeout,
                max_body_bytes,
                names,
                parts: Some(parts),
                inner: Some(inner),
            },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>>,
    B: Body,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProjection::Rejected { error } => {
                    let error = error
                        .take()
                        .expect("ResponseFuture polled after completion");
                    crate::telemetry::layer_decision("BodyLimit", Some(&error));
                    return Poll::Ready(Ok(error.to_response()));
                }
                StateProjection::Calling { future } => {
                    let response = ready!(future.poll(cx))?;
                    return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                }
                StateProjection::Buffering {
                    collect,
                    deadline,
                    read_timeout,
                    max_body_bytes,
                    names,
                    parts,
                    inner,
                } => {
                    let collected = match collect.poll(cx) {
                        Poll::Ready(collected) => collected,
                        Poll::Pending => {
                            ready!(deadline.poll(cx));
                            let error = GatewayError::new(
                                ErrorKind::RequestTimeout,
                                format!(
                                    "the request body was not received within {} s; send it faster or in one piece",
                                    read_timeout.as_secs_f64()
                                ),
                            );
                            state.set(State::Rejected { error: Some(error) });
                            continue;
                        }
                    };
                    let mut parts = parts.take().expect("buffered once");
                    let prepared = collected
                        .map_err(|error| body_error(error, *max_body_bytes))
                        .and_then(|collected| {
                            let bytes = collected.to_bytes();
                            prepare_request(&mut parts, &bytes, names).map(|()| bytes)
                        });
                    match prepared {
                        Err(error) => State::Rejected { error: Some(error) },
                        Ok(bytes) => {
                            crate::telemetry::layer_decision("BodyLimit", None);
                            let request = Request::from_parts(parts, Full::new(bytes));
                            let inner = inner.take().expect("called once");
                            State::Calling {
                                future: Oneshot::new(inner, request),
                            }
                        }
                    }
                }
            };
            state.set(next);
        }
    }
}

fn body_error(error: BoxError, max_body_bytes: usize) -> GatewayError {
    // The limit error may come wrapped by whatever produced the body.
    if causes(&*error).any(|cause| cause.is::<LengthLimitError>()) {
        too_large(max_body_bytes)
    } else {
        GatewayError::new(
            ErrorKind::InvalidRequest,
            format!("the request body could not be read: {error}"),
        )
    }
}
