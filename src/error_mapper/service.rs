use std::convert::Infallible;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::anthropic::ErrorShape;
use super::future::ResponseFuture;
use super::inner::{inner_error, panicked};
use super::layer::ErrorMapperConfig;
use crate::error::GatewayError;
use crate::response_body::{BoxError, ResponseBody};

/// Turns every failure of the inner service into the canonical error body:
/// an `Err` becomes 502, 503 or 504; a panic becomes 500; an error response
/// not in the canonical shape is rewritten, keeping its status, its
/// `Retry-After` and (truncated) its own message. Canonical error bodies and
/// every success pass through untouched. Its error type is [`Infallible`].
///
/// See the [module docs](super) for an example.
#[derive(Debug)]
pub struct ErrorMapper<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<ErrorMapperConfig>,
    /// What the inner service's readiness failed with (an error or a
    /// panic), answered on the next call.
    pub(crate) not_ready: Option<GatewayError>,
}

impl<S: Clone> Clone for ErrorMapper<S> {
    fn clone(&self) -> Self {
        ErrorMapper {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
            not_ready: None,
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ErrorMapper<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes>,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = Infallible;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.not_ready.is_none() {
            // Answered as a response by the next call, never as an error.
            match catch_unwind(AssertUnwindSafe(|| self.inner.poll_ready(cx))) {
                Ok(Poll::Pending) => return Poll::Pending,
                Ok(Poll::Ready(Ok(()))) => {}
                Ok(Poll::Ready(Err(error))) => {
                    self.not_ready = Some(inner_error(error.into(), self.config.inner_name))
                }
                Err(_) => self.not_ready = Some(panicked()),
            }
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let config = Arc::clone(&self.config);
        let shape = ErrorShape::of(request.uri().path());
        if let Some(error) = self.not_ready.take() {
            return ResponseFuture::ready(shape.render(&error));
        }
        match catch_unwind(AssertUnwindSafe(|| self.inner.call(request))) {
            Ok(future) => {
                ResponseFuture::calling(AssertUnwindSafe(future).catch_unwind(), config, shape)
            }
            Err(_) => ResponseFuture::ready(shape.render(&panicked())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http::Request;
    use http_body_util::{BodyExt, Full};
    use tower::{ServiceBuilder, ServiceExt};

    use http::{Response, StatusCode};

    use crate::error_mapper::ErrorMapperLayer;

    /// A service whose readiness fails or panics, or whose `call` panics outright.
    #[derive(Clone)]
    struct Broken {
        ready_fails: bool,
        ready_panics: bool,
    }

    impl tower::Service<Request<Full<Bytes>>> for Broken {
        type Response = Response<Full<Bytes>>;
        type Error = io::Error;
        type Future = std::future::Ready<Result<Self::Response, io::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
            if self.ready_panics {
                panic!("poll_ready panicked");
            }
            if self.ready_fails {
                Poll::Ready(Err(io::Error::from(io::ErrorKind::ConnectionRefused)))
            } else {
                Poll::Ready(Ok(()))
            }
        }

        fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
            panic!("call panicked before returning a future")
        }
    }

    async fn answer(service: Broken) -> (StatusCode, serde_json::Value) {
        let service = ServiceBuilder::new()
            .layer(ErrorMapperLayer::new())
            .service(service);
        let response = service
            .oneshot(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn a_panic_inside_call_is_500() {
        let (status, body) = answer(Broken {
            ready_fails: false,
            ready_panics: false,
        })
        .await;
        assert_eq!(status, 500);
        assert_eq!(body["error"]["type"], "api_error");
    }

    #[tokio::test]
    async fn a_readiness_error_is_answered_not_returned() {
        let (status, body) = answer(Broken {
            ready_fails: true,
            ready_panics: false,
        })
        .await;
        assert_eq!(status, 502);
        assert_eq!(body["error"]["code"], 502);
        let (status, _) = answer(Broken {
            ready_fails: false,
            ready_panics: true,
        })
        .await;
        assert_eq!(status, 500);
    }
}
