//! [`DrainUnreadLayer`]: a request body that a layer refused without
//! reading is read to its end and thrown away after the answer has gone,
//! as a web server's lingering close does.
//!
//! Without it, an HTTP/1 server that answers early (a 401 before the body,
//! a 503 when overloaded) closes the connection with the client's bytes
//! still arriving: the kernel then resets the connection, and the client
//! often sees a broken pipe instead of the answer. Reading to the end keeps
//! the answer readable and the connection reusable. Nothing is kept: each
//! chunk is dropped as it arrives, so the work is a copy per chunk, never
//! a buffer the size of the body, and it stops at a byte and a time limit,
//! after which the connection closes.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tower_layer::Layer;
use tower_service::Service;

/// Wraps each request body in an [`UnreadDrained`]: dropped before its
/// end, the rest is read and discarded in a task, up to `max_bytes` and
/// `max_time`.
#[derive(Clone, Copy, Debug)]
pub struct DrainUnreadLayer {
    limits: DrainLimits,
}

#[derive(Clone, Copy, Debug)]
struct DrainLimits {
    max_bytes: u64,
    max_time: Duration,
}

impl DrainUnreadLayer {
    /// Reads at most `max_bytes` more of an unread body, for at most
    /// `max_time`.
    pub fn new(max_bytes: u64, max_time: Duration) -> Self {
        DrainUnreadLayer {
            limits: DrainLimits {
                max_bytes,
                max_time,
            },
        }
    }
}

impl<S> Layer<S> for DrainUnreadLayer {
    type Service = DrainUnread<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DrainUnread {
            inner,
            limits: self.limits,
        }
    }
}

/// See [`DrainUnreadLayer`].
#[derive(Clone, Debug)]
pub struct DrainUnread<S> {
    inner: S,
    limits: DrainLimits,
}

impl<S, B> Service<Request<B>> for DrainUnread<S>
where
    S: Service<Request<UnreadDrained<B>>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let limits = self.limits;
        self.inner.call(request.map(|body| UnreadDrained {
            inner: Some(Box::pin(body)),
            finished: false,
            limits,
        }))
    }
}

/// A request body that, dropped before its end, has the rest read and
/// discarded in a task (see [`DrainUnreadLayer`]).
pub struct UnreadDrained<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Send,
{
    inner: Option<Pin<Box<B>>>,
    finished: bool,
    limits: DrainLimits,
}

impl<B> std::fmt::Debug for UnreadDrained<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Send,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnreadDrained")
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl<B> Body for UnreadDrained<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Send,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = inner.as_mut().poll_frame(cx);
        if matches!(frame, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.finished = true;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(|inner| inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |inner| inner.size_hint())
    }
}

impl<B> Drop for UnreadDrained<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Send,
{
    fn drop(&mut self) {
        let Some(body) = self.inner.take() else {
            return;
        };
        if self.finished || body.is_end_stream() {
            return;
        }
        // Outside a runtime (a body dropped by a synchronous test) there is
        // no connection to keep readable.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(discard(body, self.limits));
        }
    }
}

/// Reads `body` to its end, or to the limits, keeping nothing.
async fn discard<B>(mut body: Pin<Box<B>>, limits: DrainLimits)
where
    B: Body + Send + 'static,
{
    let _ = tokio::time::timeout(limits.max_time, async {
        let mut read: u64 = 0;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                read = read.saturating_add(data.remaining() as u64);
                if read > limits.max_bytes {
                    break;
                }
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::StreamBody;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A body of `chunks` chunks that counts the ones read.
    fn counted(
        chunks: usize,
        read: Arc<AtomicUsize>,
    ) -> impl Body<Data = Bytes, Error = std::io::Error> {
        StreamBody::new(futures_util::stream::iter((0..chunks).map(move |_| {
            read.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(&[0; 1024])))
        })))
    }

    fn drained<B>(body: B, max_bytes: u64) -> UnreadDrained<B>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Send,
    {
        UnreadDrained {
            inner: Some(Box::pin(body)),
            finished: false,
            limits: DrainLimits {
                max_bytes,
                max_time: Duration::from_secs(5),
            },
        }
    }

    #[tokio::test]
    async fn an_unread_body_is_read_to_its_end_after_the_drop() {
        let read = Arc::new(AtomicUsize::new(0));
        drop(drained(counted(10, read.clone()), 1 << 20));
        for _ in 0..100 {
            if read.load(Ordering::SeqCst) == 10 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("read {} of 10 chunks", read.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn draining_stops_at_the_byte_limit() {
        let read = Arc::new(AtomicUsize::new(0));
        drop(drained(counted(100, read.clone()), 4 * 1024));
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        // The chunk that crossed the limit is the last read.
        assert_eq!(read.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn a_body_read_to_its_end_is_not_drained_again() {
        let read = Arc::new(AtomicUsize::new(0));
        let mut body = drained(counted(3, read.clone()), 1 << 20);
        while body.frame().await.is_some() {}
        drop(body);
        tokio::task::yield_now().await;
        assert_eq!(read.load(Ordering::SeqCst), 3);
    }
}
