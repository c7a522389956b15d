//! Reading a whole body within a size, a time and a least rate, for the
//! layers that answer a route themselves before authentication (webhooks,
//! leak alerts, the OAuth code exchange).

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::Request;
use http::header::CONTENT_LENGTH;
use http_body::Body;
use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::response_body::BoxError;

/// Why a body was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// Over the byte limit, declared or sent.
    TooLarge,
    /// Not all there within the time, or arriving slower than the pace.
    TimedOut,
    /// The connection failed mid-body.
    Broken,
}

/// The least rate a body must arrive at: after `grace`, at least
/// `min_bytes_per_second` on average. A body of declared length `n` must
/// be whole within `grace + n / min_bytes_per_second`; one without a
/// length must keep that average as it comes. A client that opens a
/// request and trickles its body so holds a place for seconds, not for a
/// whole timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BodyPace {
    pub(crate) min_bytes_per_second: u64,
    pub(crate) grace: Duration,
}

impl BodyPace {
    /// When the first `bytes` of a body begun at `start` must be in;
    /// `None` past what an `Instant` holds (never, in practice).
    fn due(&self, start: Instant, bytes: u64) -> Option<Instant> {
        let rate = self.min_bytes_per_second.max(1);
        // Whole seconds and the rest apart, the rest in u128: no overflow
        // for any u64.
        let rest_nanos = u128::from(bytes % rate) * 1_000_000_000 / u128::from(rate);
        let transfer = Duration::from_secs(bytes / rate)
            .checked_add(Duration::from_nanos(rest_nanos as u64))?;
        start.checked_add(self.grace)?.checked_add(transfer)
    }

    /// The pace in words, for a 408's message.
    pub(crate) fn describe(&self) -> String {
        format!(
            "at least {} bytes a second after the first {} s",
            self.min_bytes_per_second,
            self.grace.as_secs_f64()
        )
    }
}

/// The whole body of `request`: refused unread when `Content-Length`
/// declares more than `max_bytes`, cut off as soon as more arrives, and
/// given up after `max_time` or as soon as it falls behind `pace` (when
/// given).
pub(crate) async fn read_bounded<B>(
    request: Request<B>,
    max_bytes: usize,
    max_time: Duration,
    pace: Option<BodyPace>,
) -> Result<Bytes, ReadError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let start = Instant::now();
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max_bytes as u64) {
        return Err(ReadError::TooLarge);
    }
    let last_moment = start + max_time;
    let body = request.into_body();
    tokio::pin!(body);
    let mut received = BytesMut::new();
    loop {
        // A declared length is due whole; an open one byte by byte as it
        // comes, so a body that stalls is given up once it falls behind.
        let owed = declared.unwrap_or(0).max(received.len() as u64);
        let deadline = pace
            .and_then(|pace| pace.due(start, owed))
            .map_or(last_moment, |due| due.min(last_moment));
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(ReadError::TimedOut),
            Ok(None) => return Ok(received.freeze()),
            Ok(Some(Err(_))) => return Err(ReadError::Broken),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if received.len() + data.remaining() > max_bytes {
                return Err(ReadError::TooLarge);
            }
            received.put(data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use std::convert::Infallible;

    const PACE: BodyPace = BodyPace {
        min_bytes_per_second: 1000,
        grace: Duration::from_secs(1),
    };

    /// A body sending `chunks`, each `(bytes, delay before it)`, then
    /// ending; `stall`: never ending after the last chunk.
    fn paced(
        chunks: Vec<(usize, Duration)>,
        stall: bool,
        length: Option<usize>,
    ) -> Request<StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>>>>
    {
        let frames = stream::unfold(
            (chunks.into_iter(), stall),
            |(mut chunks, stall)| async move {
                match chunks.next() {
                    Some((bytes, delay)) => {
                        tokio::time::sleep(delay).await;
                        Some((
                            Ok(Frame::data(Bytes::from(vec![b'x'; bytes]))),
                            (chunks, stall),
                        ))
                    }
                    None if stall => std::future::pending().await,
                    None => None,
                }
            },
        );
        let mut request = Request::new(StreamBody::new(frames));
        if let Some(length) = length {
            request
                .headers_mut()
                .insert(CONTENT_LENGTH, length.to_string().parse().unwrap());
        }
        request
    }

    const ALL_DAY: Duration = Duration::from_secs(86_400);

    proptest::proptest! {
        #[test]
        fn the_due_time_grows_with_the_bytes_and_never_overflows(
            rate in 1u64..,
            grace_ms in 0u64..=60_000,
            bytes in 0u64..,
            more in 0u64..,
        ) {
            let pace = BodyPace {
                min_bytes_per_second: rate,
                grace: Duration::from_millis(grace_ms),
            };
            let start = Instant::now();
            if let (Some(first), Some(then)) =
                (pace.due(start, bytes), pace.due(start, bytes.saturating_add(more)))
            {
                proptest::prop_assert!(first <= then);
                proptest::prop_assert!(first >= start + pace.grace);
                // Exact to the nanosecond: bytes / rate after the grace.
                let expected_nanos = u128::from(bytes) * 1_000_000_000 / u128::from(rate);
                proptest::prop_assert_eq!(
                    (first - start - pace.grace).as_nanos(),
                    expected_nanos
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_declared_body_is_due_whole_after_the_grace_and_its_length_at_the_rate() {
        // 4000 bytes at 1000 B/s after 1 s: due at 5 s.
        let start = Instant::now();
        let stalled = paced(vec![(1, Duration::ZERO)], true, Some(4000));
        assert_eq!(
            read_bounded(stalled, 8192, ALL_DAY, Some(PACE)).await,
            Err(ReadError::TimedOut)
        );
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        // All of it at 4.9 s is in time.
        let late = paced(vec![(4000, Duration::from_millis(4900))], false, Some(4000));
        assert_eq!(
            read_bounded(late, 8192, ALL_DAY, Some(PACE))
                .await
                .unwrap()
                .len(),
            4000
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_body_must_keep_the_rate_as_it_comes() {
        // 500 bytes every 1.2 s falls behind 1000 B/s: 1000 bytes are due
        // at 2 s, the third chunk comes at 2.4 s.
        let start = Instant::now();
        let mut chunks = vec![(500, Duration::ZERO)];
        chunks.extend([(500, Duration::from_millis(1200)); 20]);
        let trickle = paced(chunks, false, None);
        assert_eq!(
            read_bounded(trickle, 1 << 20, ALL_DAY, Some(PACE)).await,
            Err(ReadError::TimedOut)
        );
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        let mut chunks = vec![(1000, Duration::ZERO)];
        chunks.extend([(1000, Duration::from_secs(1)); 9]);
        let steady = paced(chunks, false, None);
        assert_eq!(
            read_bounded(steady, 1 << 20, ALL_DAY, Some(PACE))
                .await
                .unwrap()
                .len(),
            10_000
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_time_and_size_bounds_still_hold() {
        let start = Instant::now();
        let stalled = paced(vec![(10, Duration::ZERO)], true, Some(1 << 20));
        assert_eq!(
            read_bounded(stalled, 1 << 21, Duration::from_secs(3), Some(PACE)).await,
            Err(ReadError::TimedOut)
        );
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        let declared = paced(vec![], false, Some(101));
        assert_eq!(
            read_bounded(declared, 100, ALL_DAY, Some(PACE)).await,
            Err(ReadError::TooLarge)
        );
        let sent = paced(
            vec![(60, Duration::ZERO), (60, Duration::ZERO)],
            false,
            None,
        );
        assert_eq!(
            read_bounded(sent, 100, ALL_DAY, Some(PACE)).await,
            Err(ReadError::TooLarge)
        );
    }
}
