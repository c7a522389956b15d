//! [`HoldRenewals`]: the holds of the requests in flight, renewed so that
//! a hold lasts as long as its request, however long it streams.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::clock::Clock;
use crate::store::{FastMap, HoldRenewal, LedgerStore};

/// Shards spread accounts over independent locks: each request takes one
/// twice (at admission and at its settlement).
const SHARD_COUNT: usize = 16;

/// The least time between renewals, whatever the hold's lifetime.
const MIN_RENEWAL_INTERVAL: Duration = Duration::from_millis(100);

/// How often holds are renewed: a third of their lifetime, so that two
/// renewals in a row may fail (a store briefly away) before one lapses.
pub(crate) fn renewal_interval(hold_ttl: Duration) -> Duration {
    (hold_ttl / 3).max(MIN_RENEWAL_INTERVAL)
}

/// The holds granted to this instance's requests and not yet settled, by
/// account. A task renews them every [`renewal_interval`]: one store call
/// per account with holds, extending each to the hold's lifetime from then.
/// Clones share them.
#[derive(Clone)]
pub(crate) struct HoldRenewals {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn LedgerStore>,
    clock: Arc<dyn Clock>,
    hold_ttl: Duration,
    shards: Vec<Mutex<Holds>>,
    hasher: foldhash::fast::RandomState,
    /// Whether the renewing task runs: started with the first hold.
    renewing: AtomicBool,
}

/// Account -> reservation id -> key (hash). The names are shared with the
/// tickets, which take them out again.
type Holds = FastMap<Arc<str>, FastMap<Arc<str>, String>>;

impl std::fmt::Debug for HoldRenewals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldRenewals")
            .field("hold_ttl", &self.inner.hold_ttl)
            .finish_non_exhaustive()
    }
}

impl HoldRenewals {
    pub(crate) fn new(
        store: Arc<dyn LedgerStore>,
        clock: Arc<dyn Clock>,
        hold_ttl: Duration,
    ) -> Self {
        HoldRenewals {
            inner: Arc::new(Inner {
                store,
                clock,
                hold_ttl,
                shards: (0..SHARD_COUNT).map(|_| Mutex::default()).collect(),
                hasher: Default::default(),
                renewing: AtomicBool::new(false),
            }),
        }
    }

    /// The holds' lifetime, which each renewal extends them to.
    pub(crate) fn hold_ttl(&self) -> Duration {
        self.inner.hold_ttl
    }

    /// Renews the hold `reservation_id` of `key` until the ticket is
    /// dropped (its settlement recorded, or given up).
    pub(crate) fn track(&self, account: &str, key: &str, reservation_id: &str) -> RenewalTicket {
        let reservation_id: Arc<str> = Arc::from(reservation_id);
        let account = {
            let mut shard = self.inner.shard(account);
            // The account's name is made once while it has holds.
            let account = match shard.get_key_value(account) {
                Some((name, _)) => Arc::clone(name),
                None => Arc::from(account),
            };
            shard
                .entry(Arc::clone(&account))
                .or_default()
                .insert(Arc::clone(&reservation_id), key.to_owned());
            account
        };
        self.start_renewing();
        RenewalTicket {
            inner: Arc::downgrade(&self.inner),
            account,
            reservation_id,
        }
    }

    /// The number of holds renewed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| lock(shard).values().map(FastMap::len).sum::<usize>())
            .sum()
    }

    fn start_renewing(&self) {
        if self.inner.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime (a test calling the layer by hand): the holds
            // last their lifetime, as unrenewed holds do.
            self.inner.renewing.store(false, Ordering::Release);
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let interval = renewal_interval(self.inner.hold_ttl);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                // The layer is gone: nothing is left to renew.
                let Some(inner) = weak.upgrade() else { return };
                inner.renew_all().await;
            }
        });
    }
}

impl Inner {
    fn shard(&self, account: &str) -> MutexGuard<'_, Holds> {
        let index = (self.hasher.hash_one(account) % SHARD_COUNT as u64) as usize;
        lock(&self.shards[index])
    }

    /// One call per account with holds; the accounts' calls go together.
    async fn renew_all(&self) {
        let mut batches: Vec<(String, Vec<HoldRenewal>)> = Vec::new();
        for shard in &self.shards {
            for (account, holds) in lock(shard).iter() {
                batches.push((
                    account.to_string(),
                    holds
                        .iter()
                        .map(|(reservation_id, key)| HoldRenewal {
                            key: key.clone(),
                            reservation_id: reservation_id.to_string(),
                        })
                        .collect(),
                ));
            }
        }
        let now = self.clock.now();
        let calls = batches.iter().map(|(account, holds)| async move {
            if let Err(error) = self
                .store
                .renew_holds(account, holds, self.hold_ttl, now)
                .await
            {
                // The next renewal tries again; two may fail before a hold
                // lapses, and a lapse is charged, never free.
                tracing::warn!(%error, %account, holds = holds.len(), "renewing holds failed");
            }
        });
        futures_util::future::join_all(calls).await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding the lock; were something to, the map
    // would still be whole.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps one hold renewed while it lives.
pub(crate) struct RenewalTicket {
    inner: Weak<Inner>,
    account: Arc<str>,
    reservation_id: Arc<str>,
}

impl std::fmt::Debug for RenewalTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenewalTicket")
            .field("reservation_id", &self.reservation_id)
            .finish_non_exhaustive()
    }
}

impl Drop for RenewalTicket {
    fn drop(&mut self) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let mut shard = inner.shard(&self.account);
        if let Some(holds) = shard.get_mut(&self.account) {
            holds.remove(&self.reservation_id);
            if holds.is_empty() {
                shard.remove(&self.account);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::store::MemoryStore;
    use proptest::prelude::*;

    #[tokio::test]
    async fn a_hold_is_renewed_until_its_ticket_drops() {
        let store = Arc::new(MemoryStore::new());
        let renewals = HoldRenewals::new(store, Arc::new(SystemClock), Duration::from_secs(60));
        let first = renewals.track("acme", "k1", "r1");
        let second = renewals.track("acme", "k2", "r2");
        assert_eq!(renewals.len(), 2);
        drop(first);
        assert_eq!(renewals.len(), 1);
        drop(second);
        assert_eq!(renewals.len(), 0);
        assert!(lock(&renewals.inner.shards[0]).is_empty() || renewals.len() == 0);
    }

    proptest! {
        #[test]
        fn two_renewals_fit_in_a_hold_s_lifetime(ttl_millis in 1u64..10_000_000) {
            let ttl = Duration::from_millis(ttl_millis);
            let interval = renewal_interval(ttl);
            prop_assert!(interval >= MIN_RENEWAL_INTERVAL);
            // Above the floor, two renewals may be missed before a lapse.
            if ttl >= 3 * MIN_RENEWAL_INTERVAL {
                prop_assert!(interval * 3 <= ttl);
                prop_assert!(interval * 3 + Duration::from_millis(3) > ttl);
            }
        }
    }
}
