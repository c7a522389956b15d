//! The circuit breaker of a [`RedisStore`](super::RedisStore): a sick
//! store fails fast instead of making every call wait its full timeout.
//!
//! Closed, it lets every call through and counts consecutive failures;
//! after `failures_to_open` in a row it opens: calls are refused at once
//! for `cool_down`. Then exactly one call goes through (half-open): its
//! success closes the breaker, its failure opens it for another cool-down.
//!
//! Closed (the normal case) costs one atomic load per call, and one more
//! when the call succeeds; the mutex is taken only while it is open.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// Shared by every clone of a store (behind its `Arc`).
pub(super) struct Breaker {
    /// Consecutive failures that open it; 0 turns the breaker off.
    failures_to_open: u32,
    cool_down: Duration,
    /// Consecutive failures seen while closed.
    failures: AtomicU32,
    /// Open or half-open: the one flag a closed breaker's calls read.
    tripped: AtomicBool,
    open: Mutex<Open>,
}

/// What only an open breaker needs.
struct Open {
    /// When the next call may go through as the probe.
    probe_at: Instant,
    /// A probe is in flight: every other call is still refused.
    probing: bool,
}

/// A call let through. Say how it went with [`Permit::succeeded`] or
/// [`Permit::failed`]; a probe dropped unsettled (its caller gave up)
/// lets the next call be the probe.
#[must_use]
pub(super) struct Permit<'a> {
    breaker: &'a Breaker,
    probe: bool,
    settled: bool,
}

impl Breaker {
    pub(super) fn new(failures_to_open: u32, cool_down: Duration) -> Self {
        Breaker {
            failures_to_open,
            cool_down,
            failures: AtomicU32::new(0),
            tripped: AtomicBool::new(false),
            open: Mutex::new(Open {
                probe_at: Instant::now(),
                probing: false,
            }),
        }
    }

    /// Whether calls are being refused (open, or half-open with a probe
    /// in flight or due).
    pub(super) fn is_open(&self) -> bool {
        self.tripped.load(Ordering::Acquire)
    }

    /// A permit for one call, or `None`: refuse it at once.
    pub(super) fn admit(&self) -> Option<Permit<'_>> {
        if !self.tripped.load(Ordering::Acquire) {
            return Some(self.permit(false));
        }
        let mut open = self.lock();
        if !self.tripped.load(Ordering::Acquire) {
            // A probe closed it meanwhile.
            return Some(self.permit(false));
        }
        if open.probing || Instant::now() < open.probe_at {
            return None;
        }
        open.probing = true;
        Some(self.permit(true))
    }

    fn permit(&self, probe: bool) -> Permit<'_> {
        Permit {
            breaker: self,
            probe,
            settled: false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        // The state is two plain fields, consistent after any panic.
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn failed_while_closed(&self) {
        if self.failures_to_open == 0 {
            return;
        }
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if failures < self.failures_to_open {
            return;
        }
        let mut open = self.lock();
        if self.tripped.load(Ordering::Acquire) {
            // Another failing call opened it first.
            return;
        }
        open.probe_at = Instant::now() + self.cool_down;
        open.probing = false;
        self.failures.store(0, Ordering::Release);
        self.tripped.store(true, Ordering::Release);
        drop(open);
        crate::telemetry::store_circuit_opened();
        tracing::warn!(
            failures,
            cool_down_ms = self.cool_down.as_millis() as u64,
            "store circuit opened: the store failed {failures} calls in a row; \
             calls are refused at once until a probe after the cool-down succeeds"
        );
    }

    fn probe_failed(&self) {
        let mut open = self.lock();
        open.probe_at = Instant::now() + self.cool_down;
        open.probing = false;
        drop(open);
        crate::telemetry::store_circuit_opened();
        tracing::debug!(
            cool_down_ms = self.cool_down.as_millis() as u64,
            "store circuit stays open: the probe failed"
        );
    }

    fn probe_succeeded(&self) {
        let mut open = self.lock();
        open.probing = false;
        self.failures.store(0, Ordering::Release);
        self.tripped.store(false, Ordering::Release);
        drop(open);
        tracing::info!("store circuit closed: the store answers again");
    }

    fn probe_abandoned(&self) {
        self.lock().probing = false;
    }
}

impl Permit<'_> {
    /// The store answered.
    pub(super) fn succeeded(mut self) {
        self.settled = true;
        if self.probe {
            self.breaker.probe_succeeded();
        } else if self.breaker.failures.load(Ordering::Acquire) != 0 {
            self.breaker.failures.store(0, Ordering::Release);
        }
    }

    /// The store did not answer (timeout, connection) or cannot serve.
    pub(super) fn failed(mut self) {
        self.settled = true;
        if self.probe {
            self.breaker.probe_failed();
        } else {
            self.breaker.failed_while_closed();
        }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.probe && !self.settled {
            self.breaker.probe_abandoned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOL_DOWN: Duration = Duration::from_secs(1);

    fn fail(breaker: &Breaker) {
        breaker.admit().expect("let through").failed();
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_then_probes_once_and_closes() {
        let breaker = Breaker::new(3, COOL_DOWN);
        // Successes in between start the count again.
        fail(&breaker);
        fail(&breaker);
        breaker.admit().unwrap().succeeded();
        fail(&breaker);
        fail(&breaker);
        assert!(!breaker.is_open());
        fail(&breaker);
        assert!(breaker.is_open());
        for _ in 0..50 {
            assert!(breaker.admit().is_none(), "refused during the cool-down");
        }

        tokio::time::advance(COOL_DOWN - Duration::from_millis(1)).await;
        assert!(breaker.admit().is_none(), "still cooling down");
        tokio::time::advance(Duration::from_millis(1)).await;
        let probe = breaker.admit().expect("one probe after the cool-down");
        assert!(probe.probe);
        assert!(breaker.admit().is_none(), "only one probe at a time");
        assert!(breaker.is_open());
        probe.succeeded();
        assert!(!breaker.is_open());
        let call = breaker.admit().expect("closed again");
        assert!(!call.probe);
        call.succeeded();
        // Closing forgot the failures: it takes three new ones to open.
        fail(&breaker);
        fail(&breaker);
        assert!(!breaker.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_opens_it_for_another_cool_down() {
        let breaker = Breaker::new(2, COOL_DOWN);
        fail(&breaker);
        fail(&breaker);
        tokio::time::advance(COOL_DOWN).await;
        let probe = breaker.admit().unwrap();
        assert!(probe.probe);
        probe.failed();
        assert!(breaker.is_open());
        assert!(breaker.admit().is_none());
        tokio::time::advance(COOL_DOWN / 2).await;
        assert!(breaker.admit().is_none(), "a whole new cool-down");
        tokio::time::advance(COOL_DOWN / 2).await;
        breaker.admit().unwrap().succeeded();
        assert!(!breaker.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_probe_lets_the_next_call_probe() {
        let breaker = Breaker::new(1, COOL_DOWN);
        fail(&breaker);
        tokio::time::advance(COOL_DOWN).await;
        drop(breaker.admit().unwrap());
        let probe = breaker.admit().expect("the next call probes");
        assert!(probe.probe);
        probe.succeeded();
        assert!(!breaker.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_call_that_fails_late_does_not_reopen_an_open_breaker() {
        let breaker = Breaker::new(2, COOL_DOWN);
        let late = breaker.admit().unwrap();
        fail(&breaker);
        fail(&breaker);
        tokio::time::advance(COOL_DOWN / 2).await;
        // Started before it opened, failed after: no new cool-down.
        late.failed();
        tokio::time::advance(COOL_DOWN / 2).await;
        assert!(breaker.admit().unwrap().probe);
    }

    #[test]
    fn zero_failures_to_open_turns_it_off() {
        let breaker = Breaker::new(0, COOL_DOWN);
        for _ in 0..10 {
            fail(&breaker);
        }
        assert!(!breaker.is_open());
        assert!(breaker.admit().is_some());
    }
}
