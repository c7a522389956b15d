use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::util::Oneshot;
use tower_service::Service;

use super::handlers::Answer;
use crate::error::GatewayError;
use crate::response_body::ResponseBody;

pin_project! {
    /// Response future of [`KeyRoutes`](super::KeyRoutes).
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
        Answering {
            answer: BoxFuture<'static, Result<Answer, GatewayError>>,
        },
        Passing {
            #[pin]
            future: Oneshot<S, Request<B>>,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn answering(answer: BoxFuture<'static, Result<Answer, GatewayError>>) -> Self {
        ResponseFuture {
            state: State::Answering { answer },
        }
    }

    pub(crate) fn passing(future: Oneshot<S, Request<B>>) -> Self {
        ResponseFuture {
            state: State::Passing { future },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProjection::Answering { answer } => {
                let response = match ready!(answer.as_mut().poll(cx)) {
                    Ok(answer) => json_response(answer),
                    Err(error) => error.to_response(),
                };
                Poll::Ready(Ok(response))
            }
            StateProjection::Passing { future } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(response.map(ResponseBody::inner)))
            }
        }
    }
}

fn json_response<B>(answer: Answer) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::full(Bytes::from(answer.body.to_string())));
    *response.status_mut() = answer.status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in answer.headers {
        headers.insert(name, value);
    }
    response
}
