//! An inner service's failure as the canonical error: its `Err`, by what
//! the error's source chain says, or its panic.

use std::io;

use crate::error::{ErrorKind, GatewayError};
use crate::response_body::{BoxError, causes};

/// 500 for an inner service that panicked; the log says so.
pub(super) fn panicked() -> GatewayError {
    tracing::error!("an inner service panicked; answered 500");
    GatewayError::new(
        ErrorKind::Internal,
        "the gateway failed while handling this request; retry later, and report it if it persists",
    )
}

/// The response for an inner service's `Err`, by what its source chain
/// says; `inner` names that service in the message ("the upstream").
pub(super) fn inner_error(error: BoxError, inner: &str) -> GatewayError {
    if let Some(error) = error.downcast_ref::<GatewayError>() {
        return error.clone();
    }
    for current in causes(&*error) {
        if current.is::<tower::timeout::error::Elapsed>()
            || current.is::<tokio::time::error::Elapsed>()
        {
            return GatewayError::new(
                ErrorKind::UpstreamTimeout,
                format!("{inner} did not answer in time; retry with backoff"),
            );
        }
        if current.is::<tower::load_shed::error::Overloaded>() {
            return GatewayError::new(
                ErrorKind::ServiceUnavailable,
                "the gateway is overloaded; retry with backoff",
            );
        }
        if let Some(io_error) = current.downcast_ref::<io::Error>() {
            match io_error.kind() {
                io::ErrorKind::TimedOut => {
                    return GatewayError::new(
                        ErrorKind::UpstreamTimeout,
                        format!("{inner} did not answer in time; retry with backoff"),
                    );
                }
                io::ErrorKind::ConnectionRefused => {
                    return GatewayError::new(
                        ErrorKind::Upstream,
                        format!("{inner} refused the connection; retry with backoff"),
                    );
                }
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => {
                    return GatewayError::new(
                        ErrorKind::Upstream,
                        format!("the connection to {inner} broke; retry with backoff"),
                    );
                }
                _ => {}
            }
        }
    }
    // The details (which may name hosts or URLs) go to the log only.
    tracing::warn!(%error, "inner service failed; answered 502");
    GatewayError::new(
        ErrorKind::Upstream,
        format!("the request to {inner} failed; retry with backoff"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_errors_map_by_cause() {
        let refused: BoxError = Box::new(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(inner_error(refused, "the upstream").status(), 502);
        let timed_out: BoxError = Box::new(io::Error::from(io::ErrorKind::TimedOut));
        assert_eq!(inner_error(timed_out, "the upstream").status(), 504);
        let elapsed: BoxError = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(inner_error(elapsed, "the upstream").status(), 504);
        let overloaded: BoxError = Box::new(tower::load_shed::error::Overloaded::new());
        assert_eq!(inner_error(overloaded, "the upstream").status(), 503);
        let wrapped: BoxError = Box::new(io::Error::other(io::Error::from(
            io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(inner_error(wrapped, "the upstream").status(), 502);
        let gateway: BoxError = Box::new(GatewayError::new(ErrorKind::ServiceUnavailable, "x"));
        assert_eq!(inner_error(gateway, "the upstream").status(), 503);
        let other: BoxError = "something".into();
        assert_eq!(inner_error(other, "the upstream").status(), 502);
    }
}
