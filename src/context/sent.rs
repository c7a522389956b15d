//! The mark that says whether a request reached the upstream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::combinators::UnsyncBoxBody;

/// Put into each metered request's [`RequestContext`](super::RequestContext)
/// (`sent`) when
/// [`CreditGuardLayer::upstream_reports_sending`](crate::credit::CreditGuardLayer::upstream_reports_sending)
/// is on: whether the upstream has received the request, which decides
/// what a request that ends without usage costs. Clones share the mark.
///
/// The service that sends the request marks it once the request is on a
/// live connection to the upstream, and a retry clears it for the wait
/// before its next attempt. A request that ends unmarked (a client that
/// left while a concurrency limit or a buffer held it, while the upstream
/// could not be reached, or while a retry waited; every attempt failing
/// to connect) never reached the upstream: its hold is released at no cost
/// and it has no generation record.
///
/// Each clearing starts a new attempt: a mark made through an
/// [`UpstreamAttempt`] of an earlier one (a connection still writing a
/// request the upstream already answered) is ignored.
///
/// A sent attempt that the service below answers with an error before the
/// upstream answered (a response-header timeout, a connection reset) may
/// leave a [`LateAnswer`] here ([`UpstreamAttempt::answer_late`]): CreditGuard
/// takes it ([`SentUpstream::take_late_answer`]) and settles the request
/// on what the upstream still answers, so that a request the upstream
/// worked on is never free.
#[derive(Clone, Debug, Default)]
pub struct SentUpstream(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    /// The attempt count and the sent bit.
    state: AtomicU64,
    /// The answer a sent attempt may still get, with that attempt's number.
    late: Mutex<Option<(u64, LateAnswer)>>,
}

/// The body of an answer that comes late.
pub type LateBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// What a request that reached the upstream may still be answered, once
/// its client got an error at once: see [`SentUpstream`].
pub enum LateAnswer {
    /// None can come: the connection failed after the upstream had the
    /// request, or no place was free to wait for one. What the upstream
    /// did is unknown, so the request's hold is charged.
    Lost,
    /// The upstream's answer, still to come until `deadline`: `response`
    /// yields it (`None` when its connection fails). `permit` bounds the
    /// answers waited for at once, and is held until this one is read.
    Coming {
        /// When waiting (for the response and its body) stops.
        deadline: tokio::time::Instant,
        /// The response, as it comes.
        response: BoxFuture<'static, Option<http::Response<LateBody>>>,
        /// A place among the answers waited for at once.
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    },
}

impl std::fmt::Debug for LateAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LateAnswer::Lost => f.write_str("Lost"),
            LateAnswer::Coming { deadline, .. } => f
                .debug_struct("Coming")
                .field("deadline", deadline)
                .finish_non_exhaustive(),
        }
    }
}

/// The bit of [`SentUpstream`]'s state that says the current attempt was
/// sent; the bits above count the attempts.
const SENT_BIT: u64 = 1;

impl SentUpstream {
    /// Records that the request, in its current attempt, reached the upstream.
    pub fn mark(&self) {
        self.0.state.fetch_or(SENT_BIT, Ordering::AcqRel);
    }

    /// Records that the request is no longer at the upstream (it could not
    /// connect, or the upstream answered with an error and a retry waits):
    /// until the next attempt marks it, it is charged as never sent. Later
    /// marks through an earlier [`UpstreamAttempt`] are ignored.
    pub fn clear(&self) {
        // Infallible: the closure always returns `Some`.
        let _ = self
            .0
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                Some(((state >> 1).wrapping_add(1)) << 1)
            });
    }

    /// Whether the request is at the upstream.
    pub fn is_marked(&self) -> bool {
        self.0.state.load(Ordering::Acquire) & SENT_BIT != 0
    }

    /// The late answer the current attempt left, if it is still sent;
    /// taken once.
    pub fn take_late_answer(&self) -> Option<LateAnswer> {
        let state = self.0.state.load(Ordering::Acquire);
        let mut late = lock(&self.0.late);
        match late.take() {
            Some((attempt, answer)) if state == (attempt << 1) | SENT_BIT => Some(answer),
            _ => None,
        }
    }

    /// The current attempt, to be marked when its request is sent
    /// (possibly from another task, such as the connection's).
    pub fn attempt(&self) -> UpstreamAttempt {
        UpstreamAttempt {
            sent: self.clone(),
            attempt: self.0.state.load(Ordering::Acquire) >> 1,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing panics while holding it.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One attempt at sending a request: see [`SentUpstream::attempt`].
#[derive(Clone, Debug)]
pub struct UpstreamAttempt {
    sent: SentUpstream,
    attempt: u64,
}

impl UpstreamAttempt {
    /// Marks the request sent if this is still its current attempt;
    /// whether it is.
    pub fn mark(&self) -> bool {
        let unsent = self.attempt << 1;
        match self.sent.0.state.compare_exchange(
            unsent,
            unsent | SENT_BIT,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(state) => state == unsent | SENT_BIT,
        }
    }

    /// Records that this attempt did not reach the upstream (it could not
    /// connect), unless a later attempt has begun.
    pub fn clear(&self) {
        let _ = self
            .sent
            .0
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state >> 1 == self.attempt).then(|| self.attempt.wrapping_add(1) << 1)
            });
    }

    /// Leaves `late` for CreditGuard, when this attempt is the request's
    /// current one and reached the upstream; whether it was left (else it
    /// is dropped, and a coming answer with it).
    pub fn answer_late(&self, late: LateAnswer) -> bool {
        let sent = (self.attempt << 1) | SENT_BIT;
        if self.sent.0.state.load(Ordering::Acquire) != sent {
            return false;
        }
        *lock(&self.sent.0.late) = Some((self.attempt, late));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sent_mark_follows_each_attempt_and_ignores_stale_ones() {
        let sent = SentUpstream::default();
        assert!(!sent.is_marked(), "nothing is sent at admission");
        let first = sent.attempt();
        assert!(first.mark());
        assert!(first.mark(), "marking twice is harmless");
        assert!(sent.clone().is_marked(), "clones share the mark");
        // A retry waits: the request is at no upstream.
        sent.clear();
        assert!(!sent.is_marked());
        assert!(!first.mark(), "the first attempt's late write is ignored");
        assert!(!sent.is_marked());
        first.clear();
        let second = sent.attempt();
        // The second attempt cannot connect.
        second.clear();
        assert!(!sent.is_marked());
        assert!(!second.mark(), "a cleared attempt stays cleared");
        let third = sent.attempt();
        second.clear();
        assert!(third.mark(), "an earlier attempt cannot clear a later one");
        assert!(sent.is_marked());
        sent.clear();
        sent.mark();
        assert!(sent.is_marked(), "a plain mark marks the current attempt");
    }

    #[test]
    fn a_late_answer_is_left_only_by_the_current_sent_attempt_and_taken_once() {
        let sent = SentUpstream::default();
        let first = sent.attempt();
        assert!(
            !first.answer_late(LateAnswer::Lost),
            "not sent: nothing to charge"
        );
        assert!(first.mark());
        assert!(first.answer_late(LateAnswer::Lost));
        assert!(matches!(sent.take_late_answer(), Some(LateAnswer::Lost)));
        assert!(sent.take_late_answer().is_none(), "taken once");
        // Left, then a retry cleared the mark: the next attempt's request
        // is not charged for the first's.
        assert!(first.answer_late(LateAnswer::Lost));
        sent.clear();
        let second = sent.attempt();
        assert!(
            !first.answer_late(LateAnswer::Lost),
            "a stale attempt leaves nothing"
        );
        assert!(second.mark());
        assert!(
            sent.take_late_answer().is_none(),
            "the first attempt's is not the second's"
        );
    }

    proptest::proptest! {
        /// Whatever the order of marks and clears, the request is marked
        /// exactly when the last attempt begun was marked through itself or
        /// directly, and not cleared since.
        #[test]
        fn the_mark_is_the_current_attempts(steps in proptest::collection::vec(0u8..5, 0..40)) {
            let sent = SentUpstream::default();
            let mut attempts = vec![sent.attempt()];
            let mut marked = false;
            for step in steps {
                match step {
                    0 => { sent.clear(); marked = false; attempts.push(sent.attempt()); }
                    1 => { sent.mark(); marked = true; }
                    2 => { let current = attempts.last().unwrap(); marked |= current.mark(); }
                    // A stale attempt changes nothing.
                    3 if attempts.len() > 1 => { attempts[0].mark(); attempts[0].clear(); }
                    _ => { attempts.last().unwrap().clear(); marked = false; attempts.push(sent.attempt()); }
                }
                proptest::prop_assert_eq!(sent.is_marked(), marked);
            }
        }
    }
}
