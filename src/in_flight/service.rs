use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::sync::Semaphore;
use tower::util::Oneshot;
use tower_service::Service;

use super::{InFlightBody, ResponseFuture};
use crate::response_body::ResponseBody;

/// Answers 503 at once to a request that arrives while the bound's worth
/// of requests are in flight; passes every other one on and holds its
/// place until its response body ends. See the [module docs](super).
#[derive(Clone, Debug)]
pub struct InFlightLimit<S> {
    pub(crate) inner: S,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) max_in_flight: usize,
}

impl<S, B, ResBody> Service<Request<B>> for InFlightLimit<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<InFlightBody<ResponseBody<ResBody>>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is asked of the inner service only for a request
        // within the bound; a shed one never waits.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => {
                ResponseFuture::admitted(Oneshot::new(self.inner.clone(), request), permit)
            }
            Err(_) => {
                crate::telemetry::request_shed();
                ResponseFuture::shed(self.max_in_flight)
            }
        }
    }
}
