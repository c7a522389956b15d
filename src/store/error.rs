//! [`StoreError`]: a store call that failed, and why.

use std::fmt;

/// A store call that failed, naming the operation.
#[derive(Clone, Debug, thiserror::Error)]
#[error("store operation `{operation}` failed: {kind}")]
pub struct StoreError {
    operation: &'static str,
    kind: StoreErrorKind,
}

/// Why a store call failed.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// No answer within the configured timeout.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The backend failed (connection refused, reset, server error).
    #[error("backend error: {0}")]
    Backend(String),
    /// Not sent: the store failed its last calls in a row, and its circuit
    /// breaker refuses calls at once for a cool-down
    /// ([`RedisStoreConfig::breaker_failures`](super::RedisStoreConfig::breaker_failures)).
    #[error("circuit open: the store failed repeatedly, calls are refused until it answers again")]
    CircuitOpen,
    /// The backend answered something this crate did not write.
    #[error("unexpected data: {0}")]
    Corrupt(String),
    /// The call's arguments are unusable (a zero window, a duplicate name).
    #[error("invalid arguments: {0}")]
    Invalid(String),
    /// The store holds data in a layout this version does not use: written
    /// by an older version (migrate it once) or a newer one.
    #[error("{0}")]
    Layout(String),
}

impl StoreError {
    /// The operation that failed (`check_and_add`, `reserve`, …).
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// Why it failed.
    pub fn kind(&self) -> &StoreErrorKind {
        &self.kind
    }

    /// Whether the store could not be reached in time (as opposed to bad
    /// arguments): a timeout, a backend error, or an open circuit breaker.
    /// Each layer applies its [`FailurePolicy`](super::FailurePolicy) to these.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Timeout(_) | StoreErrorKind::Backend(_) | StoreErrorKind::CircuitOpen
        )
    }

    pub(crate) fn new(operation: &'static str, kind: StoreErrorKind) -> Self {
        StoreError { operation, kind }
    }

    pub(crate) fn invalid(operation: &'static str, reason: impl fmt::Display) -> Self {
        StoreError::new(operation, StoreErrorKind::Invalid(reason.to_string()))
    }

    pub(crate) fn corrupt(operation: &'static str, reason: impl fmt::Display) -> Self {
        StoreError::new(operation, StoreErrorKind::Corrupt(reason.to_string()))
    }
}
