//! [`PendingSettlements`]: every settlement not yet recorded, so that a
//! gateway stopping can wait for them and name the ones it could not
//! record.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::store::Settlement;

/// The settlements of one [`CreditGuardLayer`](super::CreditGuardLayer)
/// that have not reached the store yet: those retried in the background
/// after a failure, and those of clients that went away. Clones share them.
///
/// A gateway that stops calls [`flush`](Self::flush) once it has stopped
/// taking requests and those in flight have ended.
#[derive(Clone, Debug, Default)]
pub struct PendingSettlements {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: AtomicU64,
    pending: Mutex<HashMap<u64, Settlement>>,
    emptied: Notify,
}

/// Put into each metered request's extensions when
/// [`CreditGuardLayer::upstream_reports_sending`](super::CreditGuardLayer::upstream_reports_sending)
/// is on: the service that sends the request upstream [`mark`](Self::mark)s
/// it as it sends. A request dropped before it was marked (a client that
/// left while a concurrency limit or a buffer below CreditGuard held it)
/// never reached the upstream: its hold is released at no cost.
#[derive(Clone, Debug, Default)]
pub struct SentUpstream(Arc<std::sync::atomic::AtomicBool>);

impl SentUpstream {
    /// Records that the request is on its way to the upstream.
    pub fn mark(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether the request was sent.
    pub fn is_marked(&self) -> bool {
        self.0.load(Ordering::Acquire)
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
    /// Registers `settlement` as pending until the returned guard drops.
    pub(crate) fn track(&self, settlement: &Settlement) -> Tracked {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.pending).insert(id, settlement.clone());
        Tracked {
            inner: Arc::clone(&self.inner),
            id,
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

    /// Waits until every pending settlement is recorded, or `deadline`
    /// has passed. Those still pending then are logged at error level with
    /// their account, key hash prefix and amount, counted in
    /// `modelgate_settlements_unrecorded_total`, and returned: their holds
    /// expire, and their costs must be booked by hand. Their retries go on
    /// while the process does.
    pub async fn flush(&self, deadline: Duration) -> Vec<Unrecorded> {
        let waited = tokio::time::timeout(deadline, async {
            loop {
                let emptied = self.inner.emptied.notified();
                if self.is_empty() {
                    return;
                }
                emptied.await;
            }
        })
        .await;
        if waited.is_ok() {
            return Vec::new();
        }
        let unrecorded: Vec<Unrecorded> = lock(&self.inner.pending)
            .values()
            .map(|settlement| Unrecorded {
                account: settlement.account.clone(),
                key_hash_prefix: settlement.key.chars().take(8).collect(),
                cost_nanos: settlement.cost_nanos,
            })
            .collect();
        for settlement in &unrecorded {
            tracing::error!(
                account = %settlement.account,
                key = %settlement.key_hash_prefix,
                cost_nanos = settlement.cost_nanos,
                "a settlement was not recorded before the deadline; its cost must be booked by hand"
            );
        }
        metrics::counter!(crate::telemetry::SETTLEMENTS_UNRECORDED_TOTAL)
            .increment(unrecorded.len() as u64);
        unrecorded
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
        let first = pending.track(&settlement(5));
        let second = pending.track(&settlement(7));
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

        let stuck = pending.track(&settlement(9));
        let unrecorded = pending.flush(Duration::from_secs(3)).await;
        assert_eq!(
            unrecorded,
            vec![Unrecorded {
                account: "acme".into(),
                key_hash_prefix: "01234567".into(),
                cost_nanos: 9
            }]
        );
        drop(stuck);
        assert!(pending.is_empty());
    }
}
