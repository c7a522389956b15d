//! [`AnswerFuture`]: the response future of a layer that answers some
//! requests itself (complete JSON responses it builds) and passes every
//! other request to the inner service untouched.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::response_body::ResponseBody;

/// A JSON answer a layer writes itself: status, extra headers, body.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: serde_json::Value,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    /// A body other than JSON (a CSV export): its content type and bytes,
    /// sent instead of `body`.
    pub(crate) raw: Option<(&'static str, Bytes)>,
}

impl Answer {
    pub(crate) fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    pub(crate) fn into_response(self) -> Response<Bytes> {
        let (content_type, body) = match self.raw {
            Some((content_type, bytes)) => (content_type, bytes),
            None => ("application/json", Bytes::from(self.body.to_string())),
        };
        let mut response = Response::new(body);
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        // Answers can hold a new key or a flow's state: no cache keeps them.
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        response
    }
}

pin_project! {
    /// Response future of the JSON API's `KeyRoutes` and
    /// [`WebhookSecret`](crate::webhook::WebhookSecret).
    pub struct AnswerFuture<S, B>
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
            answer: BoxFuture<'static, Response<Bytes>>,
        },
        Passing {
            #[pin]
            future: S::Future,
        },
    }
}

impl<S, B> AnswerFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn answering(answer: BoxFuture<'static, Response<Bytes>>) -> Self {
        AnswerFuture {
            state: State::Answering { answer },
        }
    }

    /// The inner service's own future: the layer's `poll_ready` is the
    /// inner service's, so a request passed on is called at once, with no
    /// clone of the services below.
    pub(crate) fn passing(future: S::Future) -> Self {
        AnswerFuture {
            state: State::Passing { future },
        }
    }
}

impl<S, B, ResBody> Future for AnswerFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProjection::Answering { answer } => {
                let response = ready!(answer.as_mut().poll(cx));
                Poll::Ready(Ok(response.map(ResponseBody::full)))
            }
            StateProjection::Passing { future } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(response.map(ResponseBody::inner)))
            }
        }
    }
}
