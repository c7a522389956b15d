//! [`MeteredBody`]: the response body, passed through frame by frame and
//! byte for byte, read for usage on the way, and settled at its end.
//!
//! The end reaches the client at once: the settlement goes on its own
//! (tracked in [`PendingSettlements`](super::PendingSettlements)), and the
//! request's hold keeps every limit exact until it lands.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::meter::{Ending, Meter};
use super::usage::UsageScanner;
use crate::response_body::BoxError;

pin_project! {
    /// A response body that settles its request's cost when it ends, fails
    /// or is dropped. Frames pass through as they come; nothing is held
    /// back or changed.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        metering: Option<Metering>,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // A client that went away: settle with what was seen.
            if let Some(metering) = this.metering.take() {
                let (meter, usage) = metering.finish();
                meter.settle_in_background(usage, Ending::Abandoned);
            }
        }
    }
}

struct Metering {
    meter: Meter,
    scanner: UsageScanner,
}

impl Metering {
    /// The meter, knowing what an event stream carried, and the usage read.
    fn finish(self) -> (Meter, Option<super::usage::Usage>) {
        let Metering { mut meter, scanner } = self;
        if scanner.is_event_stream() {
            meter.streamed_tokens = Some(scanner.streamed_tokens());
        }
        (meter, scanner.finish())
    }
}

impl<B> MeteredBody<B> {
    /// A body that settles `meter` with what `scanner` reads.
    pub(crate) fn metered(inner: B, meter: Meter, scanner: UsageScanner) -> Self {
        MeteredBody {
            inner,
            metering: Some(Metering { meter, scanner }),
        }
    }

    /// A body that is not metered (a request CreditGuard does not charge).
    pub(crate) fn unmetered(inner: B) -> Self {
        MeteredBody {
            inner,
            metering: None,
        }
    }
}

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let next = ready!(this.inner.as_mut().poll_frame(cx));
        let Some(metering) = this.metering.as_mut() else {
            return Poll::Ready(next.map(|frame| frame.map_err(Into::into)));
        };
        let ending = match &next {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    metering.scanner.feed(data);
                }
                return Poll::Ready(next.map(|frame| frame.map_err(Into::into)));
            }
            Some(Err(_)) => Ending::Interrupted,
            None => Ending::Complete,
        };
        if let Some(metering) = this.metering.take() {
            let (meter, usage) = metering.finish();
            meter.settle_in_background(usage, ending);
        }
        Poll::Ready(next.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
