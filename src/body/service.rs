use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::BodyLimitConfig;
use super::too_large;
use crate::error::{ErrorKind, GatewayError};
use crate::response_body::{BoxError, ResponseBody};

/// Buffers the request body once into `Bytes` (413 when too large, 408 when
/// too slow), parses chat-completions requests into a
/// [`ChatRequest`](super::ChatRequest), and calls the inner service with
/// the same bytes as a [`Full`] body.
///
/// See the [module docs](super) for an example.
#[derive(Clone, Debug)]
pub struct BodyLimit<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<BodyLimitConfig>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BodyLimit<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone,
    ReqBody: Body,
    ReqBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is asked for readiness only once the body is in,
        // so a slow client never holds a concurrency permit while it uploads.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let inner = self.inner.clone();
        let max_body_bytes = self.config.max_body_bytes;
        if let Some(rejection) = check_content_length(&request, max_body_bytes) {
            return ResponseFuture::rejected(rejection);
        }
        let (parts, body) = request.into_parts();
        let collect = Limited::new(body, max_body_bytes).collect();
        ResponseFuture::buffering(
            parts,
            collect,
            self.config.read_timeout,
            max_body_bytes,
            inner,
        )
    }
}

/// A declared length over the limit is refused before a byte is read.
fn check_content_length<B>(request: &Request<B>, max_body_bytes: usize) -> Option<GatewayError> {
    let declared = request.headers().get(CONTENT_LENGTH)?;
    match declared
        .to_str()
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
    {
        None => Some(GatewayError::new(
            ErrorKind::InvalidRequest,
            "the Content-Length header is not a number",
        )),
        Some(length) if length > max_body_bytes as u64 => Some(too_large(max_body_bytes)),
        Some(_) => None,
    }
}
