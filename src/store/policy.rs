//! What a layer does when its store fails.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::error::{ErrorKind, GatewayError};

static FAIL_OPEN_DECISIONS: AtomicU64 = AtomicU64::new(0);
static FAIL_CLOSED_DECISIONS: AtomicU64 = AtomicU64::new(0);

/// A layer's answer to a store that failed or timed out: explicit, logged,
/// and never a silent fallback to per-instance counters.
///
/// Rate limits and quotas fail open by default (a brief outage should not
/// take the gateway down); credits and auth fail closed (nobody is
/// overcharged or let in unchecked).
///
/// ```
/// use modelgate::store::FailurePolicy;
/// let policy: FailurePolicy = serde_json::from_str("\"fail_closed\"").unwrap();
/// assert_eq!(policy, FailurePolicy::FailClosed);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Let the request through, with a warning.
    FailOpen,
    /// Answer 503, with a warning.
    FailClosed,
}

impl FailurePolicy {
    /// Applies the policy for `layer` to `error`: `Ok(())` lets the request
    /// through, `Err` is the 503 to answer. Either way the failure is logged.
    pub fn on_store_error(
        self,
        layer: &'static str,
        error: &StoreError,
    ) -> Result<(), GatewayError> {
        match self {
            FailurePolicy::FailOpen => {
                FAIL_OPEN_DECISIONS.fetch_add(1, Ordering::Relaxed);
                crate::telemetry::store_failure_decision(layer, "fail_open");
                tracing::warn!(layer, %error, decision = "fail_open", "store failed; request admitted unchecked");
                Ok(())
            }
            FailurePolicy::FailClosed => Err(Self::refusal(layer, error)),
        }
    }

    /// The 503 of a layer that fails closed, logged and counted: for the
    /// layers (like BearerAuth) that can never admit a request unchecked.
    pub fn refusal(layer: &'static str, error: &StoreError) -> GatewayError {
        FAIL_CLOSED_DECISIONS.fetch_add(1, Ordering::Relaxed);
        crate::telemetry::store_failure_decision(layer, "fail_closed");
        tracing::warn!(layer, %error, decision = "fail_closed", "store failed; request refused");
        GatewayError::new(
            ErrorKind::ServiceUnavailable,
            format!("{layer} cannot reach its store right now; retry with backoff"),
        )
        .with_metadata("layer", layer)
    }

    /// Requests admitted unchecked because a store failed, since start.
    pub fn fail_open_decisions() -> u64 {
        FAIL_OPEN_DECISIONS.load(Ordering::Relaxed)
    }

    /// Requests refused because a store failed, since start.
    pub fn fail_closed_decisions() -> u64 {
        FAIL_CLOSED_DECISIONS.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreErrorKind;

    #[test]
    fn fail_open_admits_and_counts() {
        let error = StoreError::new(
            "check_and_add",
            StoreErrorKind::Timeout(std::time::Duration::from_millis(50)),
        );
        let before = FailurePolicy::fail_open_decisions();
        assert!(
            FailurePolicy::FailOpen
                .on_store_error("GlobalRateLimit", &error)
                .is_ok()
        );
        assert!(FailurePolicy::fail_open_decisions() > before);
    }

    #[test]
    fn fail_closed_answers_503_naming_the_layer() {
        let error = StoreError::new(
            "reserve",
            StoreErrorKind::Backend("connection refused".into()),
        );
        let before = FailurePolicy::fail_closed_decisions();
        let rejection = FailurePolicy::FailClosed
            .on_store_error("CreditGuard", &error)
            .unwrap_err();
        assert_eq!(rejection.status(), 503);
        assert!(rejection.message().contains("CreditGuard"));
        assert!(FailurePolicy::fail_closed_decisions() > before);
    }
}
