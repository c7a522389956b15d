//! [`MeteredBody`]: the response body, passed through frame by frame and
//! byte for byte, read for usage on the way, and settled at its end.
//!
//! The end reaches the client at once: the settlement goes on its own
//! (tracked in [`PendingSettlements`](super::PendingSettlements)), and the
//! request's hold keeps every limit exact until it lands. A gateway that
//! stops ends the bodies still open
//! ([`PendingSettlements::end_streams`](super::PendingSettlements::end_streams)),
//! so that each settles before the process exits.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::meter::{Ending, Meter};
use super::pending::StreamsEnd;
use super::usage::{Usage, UsageScanner};
use crate::error::{ErrorKind, GatewayError};
use crate::response_body::BoxError;

pin_project! {
    /// A response body that settles its request's cost when it ends, fails
    /// or is dropped. Frames pass through as they come, unless the body is
    /// edited (the usage the gateway asked for hidden, or the model named
    /// that the layer above asked for): then each event of a stream goes
    /// on whole, as edited, once its blank line has come, and a JSON answer
    /// at its end.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        // Boxed: each layer above moves the response whole, body and all.
        metering: Option<Box<Metering>>,
        // Completes when the gateway stopping ends the bodies still open.
        streams_end: Option<StreamsEnd>,
        // Ended by the gateway: nothing more is sent.
        cut_short: bool,
        // An edited stream's trailers, held until the data before them
        // has gone.
        trailers: Option<HeaderMap>,
        // The inner body has ended (an edited stream's last bytes go first).
        inner_ended: bool,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // A client that went away: settle with what was seen.
            if let Some(metering) = this.metering.take() {
                let (meter, usage) = metering.finish(&mut BytesMut::new());
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
    /// The meter, knowing what an event stream carried, and the usage
    /// read; an edited stream's last bytes are added to `out`.
    fn finish(self: Box<Self>, out: &mut BytesMut) -> (Meter, Option<Usage>) {
        let Metering { mut meter, scanner } = *self;
        if scanner.is_event_stream() {
            // What the events whole so far carried: an unfinished last
            // one is read for usage, not counted as a chunk.
            meter.streamed_tokens = Some(scanner.streamed_tokens());
        }
        (meter, scanner.finish_edited(out))
    }
}

impl<B> MeteredBody<B> {
    /// A body that settles `meter` with what `scanner` reads (and edits).
    pub(crate) fn metered(inner: B, meter: Meter, scanner: UsageScanner) -> Self {
        MeteredBody {
            inner,
            streams_end: Some(meter.pending.streams_end()),
            metering: Some(Box::new(Metering { meter, scanner })),
            cut_short: false,
            trailers: None,
            inner_ended: false,
        }
    }

    /// A body that is not metered (a request CreditGuard does not charge).
    pub(crate) fn unmetered(inner: B) -> Self {
        MeteredBody {
            inner,
            metering: None,
            streams_end: None,
            cut_short: false,
            trailers: None,
            inner_ended: false,
        }
    }
}

/// What a stream the gateway ends while stopping says last, as OpenAI-style
/// clients expect a failure told in a stream: one `data:` event with the
/// error body. `between_events` false: the stream's last event is
/// unfinished, and is closed first so that this one stays whole.
fn shutting_down_event(between_events: bool) -> Bytes {
    let error = GatewayError::new(
        ErrorKind::ServiceUnavailable,
        "the gateway is shutting down: this stream was ended early and is charged for what it streamed",
    )
    .with_metadata("reason", "shutting_down");
    let opening = if between_events { "" } else { "\n\n" };
    Bytes::from(format!("{opening}data: {}\n\n", error.to_json()))
}

/// The last frame of a body the gateway ends: an event stream says why
/// (after what an edited one still held); any other body cannot say it
/// was cut, its connection is.
fn cut_short(metering: Box<Metering>) -> Result<Frame<Bytes>, BoxError> {
    let mut out = BytesMut::new();
    let scanner = &metering.scanner;
    let last = scanner.is_event_stream().then(|| {
        (
            scanner.between_events(),
            scanner.is_edited(),
            scanner.is_passing(),
        )
    });
    let (meter, usage) = metering.finish(&mut out);
    meter.settle_in_background(usage, Ending::ShutDown);
    let Some((between_events, editing, passing)) = last else {
        return Err(BoxError::from("the gateway is shutting down"));
    };
    // What an edited stream held ends without its blank line, if at all
    // (and an event too long to hold has partly gone already); a stream
    // read only has given the client every byte already.
    let closed = match editing {
        true => out.is_empty() && !passing,
        false => between_events,
    };
    out.extend_from_slice(&shutting_down_event(closed));
    Ok(Frame::data(out.freeze()))
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
            if *this.cut_short {
                return Poll::Ready(None);
            }
            if *this.inner_ended {
                *this.cut_short = true;
                return Poll::Ready(
                    this.trailers
                        .take()
                        .map(|trailers| Ok(Frame::trailers(trailers))),
                );
            }
            // The gateway stopping ends the body at a frame boundary: at once
            // if told before this frame, else when the upstream makes it wait.
            let ended = this.streams_end.as_ref().is_some_and(StreamsEnd::has_ended);
            let next = match ended {
                true => None,
                false => match this.inner.as_mut().poll_frame(cx) {
                    Poll::Ready(next) => Some(next),
                    Poll::Pending => {
                        match this.streams_end.as_mut().map(|end| Pin::new(end).poll(cx)) {
                            Some(Poll::Ready(())) => None,
                            _ => return Poll::Pending,
                        }
                    }
                },
            };
            let Some(next) = next else {
                *this.streams_end = None;
                *this.cut_short = true;
                return Poll::Ready(this.metering.take().map(cut_short));
            };
            let Some(metering) = this.metering.as_mut() else {
                return Poll::Ready(next.map(|frame| frame.map_err(Into::into)));
            };
            let mut out = BytesMut::new();
            let ending = match next {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if !metering.scanner.feed_edited(&data, &mut out) {
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                        if out.is_empty() {
                            // An edited stream's event is not whole yet.
                            continue;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                    }
                    Err(frame) => match frame.into_trailers() {
                        // Trailers end the body: they go after its data.
                        Ok(trailers) => {
                            *this.trailers = Some(trailers);
                            continue;
                        }
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    },
                },
                Some(Err(error)) => {
                    *this.streams_end = None;
                    if let Some(metering) = this.metering.take() {
                        let (meter, usage) = metering.finish(&mut out);
                        meter.settle_in_background(usage, Ending::Interrupted);
                    }
                    return Poll::Ready(Some(Err(error.into())));
                }
                None => Ending::Complete,
            };
            *this.streams_end = None;
            *this.inner_ended = true;
            if let Some(metering) = this.metering.take() {
                let (meter, usage) = metering.finish(&mut out);
                meter.settle_in_background(usage, ending);
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.cut_short || (self.inner_ended && self.trailers.is_none()) {
            return true;
        }
        // An edited stream may still hold its last event.
        let holding = self
            .metering
            .as_ref()
            .is_some_and(|metering| metering.scanner.is_edited());
        !holding && self.trailers.is_none() && !self.inner_ended && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.metering {
            // What is taken out of an edited stream is not known in advance.
            Some(metering) if metering.scanner.is_edited() => SizeHint::default(),
            _ => self.inner.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::StreamExt;
    use http_body_util::{BodyExt, Full, StreamBody};

    use super::*;
    use crate::clock::{Clock, SystemClock};
    use crate::credit::PendingSettlements;
    use crate::credit::group_commit::GroupCommit;
    use crate::credit::pricing::TokenPrice;
    use crate::credit::stream::StreamEdits;
    use crate::credit::usage::BodyKind;
    use crate::store::{LedgerStore, MemoryStore, NANOS_PER_CREDIT};

    const PROMPT_TOKENS: u64 = 5;

    /// A meter of a 5-token prompt held for 100 credits, at a credit a token.
    fn meter(store: &Arc<MemoryStore>, pending: &PendingSettlements) -> Meter {
        Meter {
            api: crate::context::ModelApi::Chat,
            ledger: GroupCommit::new(store.clone(), Arc::new(SystemClock)),
            account: "acme".into(),
            key: "0123456789abcdef".into(),
            reservation_id: "r1".into(),
            hold_granted: false,
            estimate_nanos: 100 * NANOS_PER_CREDIT,
            price: Arc::new(TokenPrice::per_million_tokens(
                NANOS_PER_CREDIT * 1_000_000,
                NANOS_PER_CREDIT * 1_000_000,
            )),
            free: false,
            byok: false,
            response_success: Some(true),
            late: false,
            prompt_tokens: PROMPT_TOKENS,
            streamed_tokens: None,
            pending: pending.clone(),
            renewal: None,
            generation: None,
            span: tracing::Span::none(),
            key_limit: None,
            on_settled: None,
        }
    }

    type UpstreamFrames = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send>,
    >;

    /// An upstream stream that sends `chunks` and then waits forever.
    fn stalling(chunks: &'static [&'static str]) -> StreamBody<UpstreamFrames> {
        let sent = futures_util::stream::iter(
            chunks
                .iter()
                .map(|chunk| Ok(Frame::data(Bytes::from_static(chunk.as_bytes())))),
        );
        StreamBody::new(Box::pin(sent.chain(futures_util::stream::pending())))
    }

    async fn charged_nanos(store: &MemoryStore) -> i64 {
        store
            .key_usage("acme", "0123456789abcdef", SystemClock.now())
            .await
            .unwrap()
            .total_nanos
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_the_gateway_ends_says_why_and_is_charged_what_it_streamed() {
        let store = Arc::new(MemoryStore::new());
        let pending = PendingSettlements::default();
        const CHUNK: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"ab\"}}]}\n\n";
        let mut body = MeteredBody::metered(
            stalling(&[CHUNK, CHUNK, "data: {\"choi"]),
            meter(&store, &pending),
            UsageScanner::new(BodyKind::EventStream, 64 * 1024),
        );
        for _ in 0..3 {
            body.frame().await.unwrap().unwrap();
        }
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), body.frame())
                .await
                .is_err(),
            "a stalled stream waits while the gateway runs"
        );
        assert_eq!(charged_nanos(&store).await, 0);

        pending.end_streams();
        let last = tokio::time::timeout(Duration::from_secs(1), body.frame())
            .await
            .expect("ended at once")
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap();
        let last = std::str::from_utf8(&last).unwrap();
        let event = last
            .strip_prefix("\n\ndata: ")
            .and_then(|event| event.strip_suffix("\n\n"))
            .unwrap_or_else(|| panic!("the unfinished event closed, then one event: {last:?}"));
        let event: serde_json::Value = serde_json::from_str(event).unwrap();
        assert_eq!(event["error"]["metadata"]["reason"], "shutting_down");
        assert_eq!(event["error"]["code"], 503);
        assert!(body.frame().await.is_none(), "then the stream ends");
        assert!(body.is_end_stream());
        // Two chunks of two bytes: two tokens streamed, and the prompt.
        assert_eq!(
            charged_nanos(&store).await,
            (PROMPT_TOKENS + 2) as i64 * NANOS_PER_CREDIT
        );
        assert!(pending.is_empty(), "recorded at once on MemoryStore");
    }

    #[tokio::test(start_paused = true)]
    async fn an_edited_stream_ended_in_a_long_event_closes_it_before_saying_why() {
        let store = Arc::new(MemoryStore::new());
        let pending = PendingSettlements::default();
        let long: &'static str = Box::leak(
            format!(
                "data: {}\n",
                "y".repeat(crate::edit::MAX_SSE_LINE_BYTES + 10)
            )
            .into_boxed_str(),
        );
        let chunks: &'static [&'static str] = Box::leak(vec![long].into_boxed_slice());
        let edits = StreamEdits {
            hide_usage: true,
            served_model: None,
        };
        let mut body = MeteredBody::metered(
            stalling(chunks),
            meter(&store, &pending),
            UsageScanner::event_stream(edits, 64 * 1024),
        );
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), long.len(), "too long to hold: passed on");
        pending.end_streams();
        let last = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(
            last.starts_with(b"\n\ndata: {\"error\""),
            "the long event closed first: {:?}",
            String::from_utf8_lossy(&last[..40.min(last.len())])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bodies_made_after_the_end_end_at_once_and_a_json_body_is_cut() {
        let store = Arc::new(MemoryStore::new());
        let pending = PendingSettlements::default();
        pending.end_streams();
        let mut stream = MeteredBody::metered(
            stalling(&["data: {\"choices\":[]}\n\n"]),
            meter(&store, &pending),
            UsageScanner::new(BodyKind::EventStream, 64 * 1024),
        );
        let last = tokio::time::timeout(Duration::from_secs(1), stream.frame())
            .await
            .expect("ended at once")
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap();
        assert!(
            last.starts_with(b"data: {\"error\""),
            "between events: nothing to close first"
        );
        assert!(stream.frame().await.is_none());

        let mut json = MeteredBody::metered(
            Full::new(Bytes::from_static(b"{\"choices\": []}")),
            meter(&store, &pending),
            UsageScanner::new(BodyKind::Json, 64 * 1024),
        );
        assert!(
            json.frame().await.unwrap().is_err(),
            "a JSON body cannot say it was cut: its connection is"
        );
        assert!(json.frame().await.is_none());

        let mut unmetered = MeteredBody::unmetered(Full::new(Bytes::from_static(b"{}")));
        assert!(
            unmetered.frame().await.unwrap().is_ok(),
            "a body not metered is not the gateway's to end"
        );
    }
}
