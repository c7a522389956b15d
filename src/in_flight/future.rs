use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::sync::OwnedSemaphorePermit;
use tower::util::Oneshot;
use tower_service::Service;

use super::InFlightBody;
use crate::error::{ErrorKind, GatewayError};
use crate::response_body::ResponseBody;

pin_project! {
    /// Response future of [`InFlightLimit`](super::InFlightLimit).
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
        Admitted {
            #[pin]
            future: Oneshot<S, Request<B>>,
            permit: Option<OwnedSemaphorePermit>,
        },
        Shed {
            max_in_flight: usize,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(super) fn admitted(future: Oneshot<S, Request<B>>, permit: OwnedSemaphorePermit) -> Self {
        ResponseFuture {
            state: State::Admitted {
                future,
                permit: Some(permit),
            },
        }
    }

    pub(super) fn shed(max_in_flight: usize) -> Self {
        ResponseFuture {
            state: State::Shed { max_in_flight },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<InFlightBody<ResponseBody<ResBody>>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProjection::Admitted { future, permit } => {
                // An error drops the permit with the future.
                let response = ready!(future.poll(cx))?;
                let permit = permit.take();
                Poll::Ready(Ok(
                    response.map(|body| InFlightBody::new(ResponseBody::inner(body), permit))
                ))
            }
            StateProjection::Shed { max_in_flight } => {
                let response = GatewayError::new(
                    ErrorKind::ServiceUnavailable,
                    format!(
                        "the gateway is overloaded: {max_in_flight} requests are already in flight; retry in a moment"
                    ),
                )
                .with_metadata("reason", "overloaded")
                .with_retry_after(Duration::from_secs(1))
                .to_response::<Bytes>();
                Poll::Ready(Ok(
                    response.map(|bytes| InFlightBody::new(ResponseBody::full(bytes), None))
                ))
            }
        }
    }
}
