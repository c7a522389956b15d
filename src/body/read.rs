//! Reading a whole body within a size and a time, for the layers that
//! answer a route themselves (webhooks, leak alerts).

use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::Request;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::response_body::{causes, BoxError};

/// Why a body was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// Over the byte limit, declared or sent.
    TooLarge,
    /// Not all there within the time.
    TimedOut,
    /// The connection failed mid-body.
    Broken,
}

/// The whole body of `request`: refused unread when `Content-Length`
/// declares more than `max_bytes`, cut off as soon as more arrives, and
/// given up after `max_time`.
pub(crate) async fn read_bounded<B>(
    request: Request<B>,
    max_bytes: usize,
    max_time: Duration,
) -> Result<Bytes, ReadError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max_bytes as u64) {
        return Err(ReadError::TooLarge);
    }
    let limited = Limited::new(request.into_body(), max_bytes);
    match tokio::time::timeout(max_time, limited.collect()).await {
        Err(_) => Err(ReadError::TimedOut),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if causes(error.as_ref()).any(|cause| cause.is::<LengthLimitError>()) => {
            Err(ReadError::TooLarge)
        }
        Ok(Err(_)) => Err(ReadError::Broken),
    }
}
