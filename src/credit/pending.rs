//! [`PendingSettlements`]: every settlement not yet recorded, so that a
//! gateway stopping can end the streams still open, wait for their
//! settlements and name the ones it could not record.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use crate::store::Settlement;

/// The settlements of one [`CreditGuardLayer`](super::CreditGuardLayer)
/// that have not reached the store yet: those retried in the background
/// after a failure, and those of clients that went away. Clones share them.
///
/// A gateway that stops waits for the requests in flight, calls
/// [`end_streams`](Self::end_streams) for those still open after its
/// grace period, then [`flush`](Self::flush) once the last has ended.
#[derive(Clone, Debug, Default)]
pub struct PendingSettlements {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: AtomicU64,
    pending: Mutex<HashMap<u64, Arc<Settlement>>>,
    emptied: Notify,
    /// Set by [`PendingSettlements::end_streams`]; `streams_end` wakes the
    /// bodies waiting at that moment, those made later see the flag.
    streams_ended: AtomicBool,
    streams_end: Arc<Notify>,
}

/// Completes once [`PendingSettlements::end_streams`] has been called:
/// what a metered body waits on beside its upstream.
pub(crate) struct StreamsEnd {
    inner: Arc<Inner>,
    /// Made at the first wait, so that a body that never waits allocates
    /// nothing for it.
    notified: Option<Pin<Box<OwnedNotified>>>,
    /// The waker `notified` was last polled with: polling it again takes
    /// the `Notify`'s lock, shared by every body, so it is polled again
    /// only for another waker.
    registered: Option<Waker>,
}

impl std::fmt::Debug for StreamsEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamsEnd")
            .field("ended", &self.has_ended())
            .finish_non_exhaustive()
    }
}

impl StreamsEnd {
    /// Whether the streams have been ended: one atomic load.
    pub(crate) fn has_ended(&self) -> bool {
        self.inner.streams_ended.load(Ordering::Acquire)
    }
}

impl Future for StreamsEnd {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let notified = this
            .notified
            .get_or_insert_with(|| Box::pin(Arc::clone(&this.inner.streams_end).notified_owned()));
        // Checked after the wait is registered: `notify_waiters` wakes every
        // wait registered before it, and the flag is set before it.
        if this.inner.streams_ended.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        if this
            .registered
            .as_ref()
            .is_some_and(|waker| waker.will_wake(cx.waker()))
        {
            return Poll::Pending;
        }
        let polled = notified.as_mut().poll(cx);
        this.registered = Some(cx.waker().clone());
        polled
    }
}

/// A settlement that could not be recorded before a flush's deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unrecorded {
    /// The account that owes it.
    pub account: String,
    /// The first 8 hex digits of the key's hash: enough to find the key,
    /// never the key.
    pub key_hash_prefix: String,
    /// The cost, in nano-credits.
    pub cost_nanos: i64,
    /// Whether the store holds the request's hold: then either an earlier
    /// attempt landed (only its reply was lost) or the hold lapses and is
    /// charged in full, and a settlement that lands later replaces that
    /// charge; nothing is to be booked by hand. `false` (admitted while
    /// the store failed open, no hold): the cost is booked nowhere unless
    /// by hand.
    pub held: bool,
}

/// Logs and counts a settlement not recorded in time, in
/// `modelgate_settlements_unrecorded_total` by `hold`: `lapses` (a granted
/// hold, which lapses and is charged unless the settlement landed; a
/// warning, nothing to book) or `none` (no hold: at error level with every
/// figure needed to book it by hand, since nothing else will).
pub(crate) fn report_unrecorded(
    account: &str,
    key: &str,
    reservation: Option<&str>,
    cost_nanos: i64,
    held: bool,
    why: &str,
) {
    let key = key.get(..8).unwrap_or(key);
    let reservation = reservation.unwrap_or("");
    match held {
        true => {
            metrics::counter!(crate::telemetry::SETTLEMENTS_UNRECORDED_TOTAL, "hold" => "lapses")
                .increment(1);
            tracing::warn!(
                account,
                key,
                reservation,
                cost_nanos,
                "{why}: either an earlier attempt landed and only its reply was lost, or the request's hold lapses and is charged what it held, with a generation record (a settlement that lands later replaces that charge); do not book it by hand, which would charge it twice"
            );
        }
        false => {
            metrics::counter!(crate::telemetry::SETTLEMENTS_UNRECORDED_TOTAL, "hold" => "none")
                .increment(1);
            tracing::error!(
                account,
                key,
                reservation,
                cost_nanos,
                "{why}: the request was admitted without a hold (the store was failing and CreditGuard fails open), so no lapse will charge it: book this cost by hand"
            );
        }
    }
}

/// A settlement registered as pending until this is dropped.
#[derive(Debug)]
pub(crate) struct Tracked {
    inner: Arc<Inner>,
    id: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut pending = lock(&self.inner.pending);
        pending.remove(&self.id);
        if pending.is_empty() {
            self.inner.emptied.notify_waiters();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding it; the map stays whole.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl PendingSettlements {
    /// Registers `settlement` as pending until the returned guard drops
    /// (shared with whoever records it: no copy per request).
    pub(crate) fn track(&self, settlement: Arc<Settlement>) -> Tracked {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.pending).insert(id, settlement);
        Tracked {
            inner: Arc::clone(&self.inner),
            id,
        }
    }

    /// Ends every metered response body still open, at once and for good:
    /// each stops at its next frame boundary (an event stream with a last
    /// `data: {"error": …}` event whose `metadata.reason` is
    /// `shutting_down`, any other body with an error that cuts its
    /// connection), and settles as a response cut short: a stream is
    /// charged its prompt and what it streamed, with its generation record.
    /// Their settlements are then pending: [`flush`](Self::flush) them.
    pub fn end_streams(&self) {
        self.inner.streams_ended.store(true, Ordering::Release);
        self.inner.streams_end.notify_waiters();
    }

    /// A future that completes once [`end_streams`](Self::end_streams) is
    /// called, even if it was called before.
    pub(crate) fn streams_end(&self) -> StreamsEnd {
        StreamsEnd {
            inner: Arc::clone(&self.inner),
            notified: None,
            registered: None,
        }
    }

    /// How many settlements are pending now.
    pub fn len(&self) -> usize {
        lock(&self.inner.pending).len()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until none is pending, for at most `deadline`; whether none is.
    /// A late answer still read then is one: a gateway that stops can end
    /// it ([`end_streams`](Self::end_streams): it is charged its hold) and
    /// [`flush`](Self::flush) what is left.
    pub async fn settled_within(&self, deadline: Duration) -> bool {
        tokio::time::timeout(deadline, async {
            loop {
                let emptied = self.inner.emptied.notified();
                if self.is_empty() {
                    return;
                }
                emptied.await;
            }
        })
        .await
        .is_ok()
    }

    /// Waits until every pending settlement is recorded or given up (each
    /// is retried for [`SETTLEMENT_RETRY_WINDOW`](crate::store::SETTLEMENT_RETRY_WINDOW)),
    /// or `deadline` has passed. Those still pending then are returned,
    /// logged and counted in `modelgate_settlements_unrecorded_total` (see
    /// [`Unrecorded::held`]): a granted hold lapses and is charged in full,
    /// so only a cost admitted without a hold is to be booked by hand.
    /// Their retries go on while the process does.
    pub async fn flush(&self, deadline: Duration) -> Vec<Unrecorded> {
        if self.settled_within(deadline).await {
            return Vec::new();
        }
        let pending: Vec<Arc<Settlement>> = lock(&self.inner.pending).values().cloned().collect();
        pending
            .into_iter()
            .map(|settlement| {
                report_unrecorded(
                    &settlement.account,
                    &settlement.key,
                    Some(&settlement.reservation_id),
                    settlement.cost_nanos,
                    settlement.hold_granted,
                    "a settlement was not recorded before the gateway stopped",
                );
                Unrecorded {
                    account: settlement.account.clone(),
                    key_hash_prefix: settlement.key.chars().take(8).collect(),
                    cost_nanos: settlement.cost_nanos,
                    held: settlement.hold_granted,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settlement(cost_nanos: i64) -> Settlement {
        Settlement {
            account: "acme".into(),
            key: "0123456789abcdef".into(),
            reservation_id: "r".into(),
            hold_granted: false,
            cost_nanos,
            byok: false,
            record: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_waits_for_every_pending_settlement_or_names_them() {
        let pending = PendingSettlements::default();
        assert!(pending.flush(Duration::from_secs(1)).await.is_empty());
        let first = pending.track(Arc::new(settlement(5)));
        let second = pending.track(Arc::new(settlement(7)));
        assert_eq!(pending.len(), 2);
        let flushing = tokio::spawn({
            let pending = pending.clone();
            async move { pending.flush(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(first);
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(second);
        assert!(flushing.await.unwrap().is_empty(), "both landed in time");

        let stuck = pending.track(Arc::new(settlement(9)));
        let unrecorded = pending.flush(Duration::from_secs(3)).await;
        assert_eq!(
            unrecorded,
            vec![Unrecorded {
                account: "acme".into(),
                key_hash_prefix: "01234567".into(),
                cost_nanos: 9,
                held: false,
            }]
        );
        drop(stuck);
        assert!(pending.is_empty());

        // A granted hold lapses and is charged: reported as such.
        let held = pending.track(Arc::new(Settlement {
            hold_granted: true,
            ..settlement(11)
        }));
        let unrecorded = pending.flush(Duration::from_secs(3)).await;
        assert_eq!(unrecorded.len(), 1);
        assert!(unrecorded[0].held);
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn ending_the_streams_wakes_every_wait_made_before_and_after() {
        let pending = PendingSettlements::default();
        let polled = pending.streams_end();
        let unpolled = pending.streams_end();
        let waiting = tokio::spawn(polled);
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), pending.streams_end())
                .await
                .is_err(),
            "nothing ends while the gateway runs"
        );
        assert!(!unpolled.has_ended());
        pending.end_streams();
        let at_once = Duration::from_secs(1);
        tokio::time::timeout(at_once, waiting)
            .await
            .expect("a wait polled before is woken")
            .unwrap();
        assert!(unpolled.has_ended());
        tokio::time::timeout(at_once, unpolled)
            .await
            .expect("a wait made before, polled after, completes");
        // Made after: complete at once, by a clone too.
        tokio::time::timeout(at_once, pending.clone().streams_end())
            .await
            .expect("a wait made after completes");
    }
}
