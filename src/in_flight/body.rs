use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::OwnedSemaphorePermit;

pin_project! {
    /// A response body that holds its request's place in the
    /// [`InFlightLimit`](super::InFlightLimit) until it ends or is dropped.
    #[derive(Debug)]
    pub struct InFlightBody<B> {
        #[pin]
        inner: B,
        permit: Option<OwnedSemaphorePermit>,
    }
}

impl<B> InFlightBody<B> {
    pub(super) fn new(inner: B, permit: Option<OwnedSemaphorePermit>) -> Self {
        InFlightBody { inner, permit }
    }
}

impl<B: Body> Body for InFlightBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        if matches!(frame, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            // The work is over: the next request may have the place now,
            // not when the connection gets round to dropping the body.
            this.permit.take();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
