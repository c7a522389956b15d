use std::convert::Infallible;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::ErrorMapperConfig;
use super::{inner_error, panicked};
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
                Ok(Poll::Ready(Err(error))) => self.not_ready = Some(inner_error(error.into())),
                Err(_) => self.not_ready = Some(panicked()),
            }
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let config = Arc::clone(&self.config);
        if let Some(error) = self.not_ready.take() {
            return ResponseFuture::ready(error.to_response());
        }
        match catch_unwind(AssertUnwindSafe(|| self.inner.call(request))) {
            Ok(future) => ResponseFuture::calling(AssertUnwindSafe(future).catch_unwind(), config),
            Err(_) => ResponseFuture::ready(panicked().to_response()),
        }
    }
}
