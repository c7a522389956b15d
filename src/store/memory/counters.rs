//! Counters and in-flight slots in memory: the states in the shard of their
//! scope, decided by the rules.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::store::{MemoryStore, get_or_default};
use crate::clock::unix_micros;
use crate::store::counter::{duration_micros, validate_checks, validate_slot};
use crate::store::rules::counter::check_all;
use crate::store::rules::slots::{self, SlotsView};
use crate::store::{Check, CounterStore, Decision, FastMap, SlotOutcome, StoreError};

#[async_trait]
impl CounterStore for MemoryStore {
    async fn check_and_add(
        &self,
        scope: &str,
        checks: &[Check],
        now: DateTime<Utc>,
    ) -> Result<Decision, StoreError> {
        validate_checks("check_and_add", checks)?;
        let now_micros = unix_micros(now);
        let mut shard = self.shard(scope);
        shard.maybe_sweep(now_micros);
        if !shard.counters.contains_key(scope) {
            shard.counters.insert(scope.into(), FastMap::default());
        }
        let counters = shard.counters.get_mut(scope).expect("inserted above");
        let (admitted, outcomes) = check_all(counters, checks, now, true);
        Ok(Decision { admitted, outcomes })
    }

    async fn acquire_slot(
        &self,
        scope: &str,
        name: &str,
        holder: &str,
        limit: u64,
        lease: Duration,
        now: DateTime<Utc>,
    ) -> Result<SlotOutcome, StoreError> {
        validate_slot(limit, lease, holder)?;
        let now_micros = unix_micros(now);
        let mut shard = self.shard(scope);
        shard.maybe_sweep(now_micros);
        let leases = get_or_default(get_or_default(&mut shard.slots, scope), name);
        // A lease ending at `t` is held while `now < t`.
        leases.retain(|_, ends_at_micros| *ends_at_micros > now_micros);
        let view = SlotsView {
            held: leases.len() as u64,
            earliest_end_micros: leases.values().copied().min(),
            renewing: leases.contains_key(holder),
        };
        let (outcome, lease_end) = slots::acquire(view, limit, duration_micros(lease), now_micros);
        if let Some(ends_at_micros) = lease_end {
            match leases.get_mut(holder) {
                Some(lease_end) => *lease_end = ends_at_micros,
                None => {
                    leases.insert(holder.into(), ends_at_micros);
                }
            }
        }
        Ok(outcome)
    }

    async fn release_slot(&self, scope: &str, name: &str, holder: &str) -> Result<(), StoreError> {
        let mut shard = self.shard(scope);
        let Some(sets) = shard.slots.get_mut(scope) else {
            return Ok(());
        };
        if let Some(leases) = sets.get_mut(name) {
            leases.remove(holder);
            if leases.is_empty() {
                sets.remove(name);
            }
        }
        if sets.is_empty() {
            shard.slots.remove(scope);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use chrono::TimeZone;

    use super::*;
    use crate::store::counter::micros_duration;
    use crate::store::memory::store::lock;
    use crate::store::rules::counter::EXPIRY_SLACK_MICROS;

    const SECOND: i64 = 1_000_000;

    /// `micros` after 2024-01-01 00:00:00 UTC.
    fn at(micros: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::microseconds(micros)
    }

    /// Slot sets held, and leases in them, ended ones not yet dropped included.
    fn slots_held(store: &MemoryStore) -> (usize, usize) {
        store.shards.iter().fold((0, 0), |(sets, leases), shard| {
            let shard = lock(shard);
            let scopes = shard.slots.values();
            (
                sets + scopes.clone().map(FastMap::len).sum::<usize>(),
                leases
                    + scopes
                        .flat_map(FastMap::values)
                        .map(FastMap::len)
                        .sum::<usize>(),
            )
        })
    }

    #[tokio::test]
    async fn slots_given_back_or_abandoned_do_not_stay_in_memory() {
        let store = MemoryStore::new();
        let lease = Duration::from_secs(5);
        for scope in 0..1_000 {
            let outcome = store
                .acquire_slot(&format!("acct{scope}"), "webhook", "h", 1, lease, at(0))
                .await
                .unwrap();
            assert!(outcome.acquired);
        }
        assert_eq!(slots_held(&store), (1_000, 1_000));
        // Given back: gone at once, scope and all.
        for scope in 0..500 {
            store
                .release_slot(&format!("acct{scope}"), "webhook", "h")
                .await
                .unwrap();
        }
        assert_eq!(slots_held(&store), (500, 500));
        // Abandoned: swept once the leases (and the slack for clocks
        // reading a little earlier) have ended.
        store.evict_expired(at(5 * SECOND + EXPIRY_SLACK_MICROS - 1));
        assert_eq!(slots_held(&store), (500, 500));
        store.evict_expired(at(5 * SECOND + EXPIRY_SLACK_MICROS));
        assert_eq!(slots_held(&store), (0, 0));
        assert!(
            store
                .shards
                .iter()
                .all(|shard| lock(shard).slots.is_empty())
        );
    }

    #[tokio::test]
    async fn a_slot_set_keeps_only_live_leases_when_holders_keep_crashing() {
        let store = MemoryStore::new();
        // A new holder every 2 s, each abandoning a 1 s lease: taking a slot
        // drops the ended ones first, so the set never grows.
        for holder in 0..1_000 {
            let outcome = store
                .acquire_slot(
                    "acct",
                    "webhook",
                    &format!("h{holder}"),
                    1,
                    Duration::from_secs(1),
                    at(holder * 2 * SECOND),
                )
                .await
                .unwrap();
            assert_eq!((outcome.acquired, outcome.held), (true, 1));
        }
        assert_eq!(slots_held(&store), (1, 1));
    }

    #[derive(Clone, Debug)]
    enum SlotOp {
        Acquire { holder: u8, lease_micros: u64 },
        Release { holder: u8 },
        Advance { micros: i64 },
    }

    /// Times on a 100 ms grid, so leases often end exactly at a call's `now`.
    fn slot_op() -> impl Strategy<Value = SlotOp> {
        prop_oneof![
            3 => (0u8..6, 1u64..30).prop_map(|(holder, tenths)| SlotOp::Acquire {
                holder,
                lease_micros: tenths * 100_000,
            }),
            1 => (0u8..6).prop_map(|holder| SlotOp::Release { holder }),
            2 => (0i64..20).prop_map(|tenths| SlotOp::Advance { micros: tenths * 100_000 }),
        ]
    }

    proptest! {
        /// Random acquires, releases and waits agree with a plain map of
        /// holder -> lease end, and never hold more than the limit.
        #[test]
        fn slots_match_a_model_and_never_exceed_their_limit(
            limit in 1u64..5,
            ops in proptest::collection::vec(slot_op(), 1..80),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let store = MemoryStore::new();
            let mut model: HashMap<u8, i64> = HashMap::new();
            let mut now_micros = 0i64;
            for op in &ops {
                match *op {
                    SlotOp::Advance { micros } => now_micros += micros,
                    SlotOp::Release { holder } => {
                        runtime
                            .block_on(store.release_slot("acct", "s", &format!("h{holder}")))
                            .unwrap();
                        model.remove(&holder);
                    }
                    SlotOp::Acquire { holder, lease_micros } => {
                        model.retain(|_, ends_at_micros| *ends_at_micros > now_micros);
                        let free = model.contains_key(&holder) || (model.len() as u64) < limit;
                        let retry_after = if free {
                            model.insert(holder, now_micros + lease_micros as i64);
                            Duration::ZERO
                        } else {
                            let earliest_micros = model.values().copied().min().unwrap();
                            micros_duration(earliest_micros - now_micros)
                        };
                        let expected = SlotOutcome {
                            acquired: free,
                            held: model.len() as u64,
                            limit,
                            retry_after,
                        };
                        let actual = runtime
                            .block_on(store.acquire_slot(
                                "acct",
                                "s",
                                &format!("h{holder}"),
                                limit,
                                Duration::from_micros(lease_micros),
                                at(now_micros),
                            ))
                            .unwrap();
                        prop_assert!(actual.held <= limit, "{:?}", actual);
                        prop_assert_eq!(actual, expected, "after {:?} at {}", op, now_micros);
                    }
                }
            }
        }
    }
}
