//! Reading a whole body within a size, a time and a least rate, for the
//! layers that answer a route themselves before authentication (webhooks,
//! leak alerts, the OAuth code exchange).

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::Request;
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
    /// When the first `bytes` of a body begun at `start` must be in.
    fn due(&self, start: Instant, bytes: u64) -> Instant {
        let rate = self.min_bytes_per_second.max(1);
        // Whole seconds and the rest apart: no overflow for any u64.
        let transfer = Duration::from_secs(bytes / rate)
            + Duration::from_nanos((bytes % rate) * 1_000_000_000 / rate);
        start + self.grace + transfer
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
/// given up after `max_time` or as soon as it falls behind `pace`.
pub(crate) async fn read_bounded<B>(
    request: Request<B>,
    max_bytes: usize,
    max_time: Duration,
    pace: BodyPace,
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
        let deadline = pace.due(start, owed).min(last_moment);
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
