//! [`MeteredBody`]: the response body, passed through frame by frame and
//! byte for byte, read for usage on the way, and settled at its end.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
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
        settling: Option<BoxFuture<'static, ()>>,
        // What to answer once settled: the end, or the inner body's error.
        after_settling: Option<Option<Result<Frame<Bytes>, BoxError>>>,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // A client that went away: settle with what was seen.
            if let Some(metering) = this.metering.take() {
                let (meter, usage) = metering.finish();
                meter.settle_in_background(usage, Ending::Abandoned);
            }
            // Dropped while settling (a client that closed at the last
            // frame): the settlement finishes on its own.
            if let Some(settling) = this.settling.take() {
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => {
                        runtime.spawn(settling);
                    }
                    Err(_) => tracing::error!("a settlement in progress was dropped without a runtime to finish it"),
                }
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
            settling: None,
            after_settling: None,
        }
    }

    /// A body that is not metered (a request CreditGuard does not charge).
    pub(crate) fn unmetered(inner: B) -> Self {
        MeteredBody {
            inner,
            metering: None,
            settling: None,
            after_settling: None,
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
        loop {
            if let Some(settling) = this.settling.as_mut() {
                ready!(settling.poll_unpin(cx));
                *this.settling = None;
                return Poll::Ready(this.after_settling.take().flatten());
            }
            let next = ready!(this.inner.as_mut().poll_frame(cx));
            let Some(metering) = this.metering.take() else {
                return Poll::Ready(next.map(|frame| frame.map_err(Into::into)));
            };
            let (ending, answer) = match next {
                Some(Ok(frame)) => {
                    let mut metering = metering;
                    if let Some(data) = frame.data_ref() {
                        metering.scanner.feed(data);
                    }
                    *this.metering = Some(metering);
                    return Poll::Ready(Some(Ok(frame)));
                }
                Some(Err(error)) => (Ending::Interrupted, Some(Err(error.into()))),
                None => (Ending::Complete, None),
            };
            // The end is answered only once the cost is recorded, so a
            // client that asks for its usage next sees this request in it.
            let (meter, usage) = metering.finish();
            *this.settling = Some(meter.settle(usage, ending).boxed());
            *this.after_settling = Some(answer);
        }
    }

    fn is_end_stream(&self) -> bool {
        // Until settled, the end must still be polled for.
        self.metering.is_none() && self.settling.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        if self.metering.is_none() && self.settling.is_none() {
            return inner;
        }
        // No exact length while metered: the body ends only after its
        // settlement, and a known length would let the client end first.
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower());
        hint
    }
}
