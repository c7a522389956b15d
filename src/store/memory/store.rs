//! `MemoryStore` itself: its shards, their locks and their sweeps.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use super::apps::AppPeriod;
use super::ledger::AccountLedger;
use super::records::Records;
use crate::clock::unix_micros;
use crate::store::FastMap;
#[cfg(doc)]
use crate::store::SETTLEMENT_MEMORY;
use crate::store::rules::counter::{Counter, EXPIRY_SLACK_MICROS};

/// Shards spread accounts over independent locks, so requests of different
/// accounts rarely wait for each other.
const SHARD_COUNT: usize = 64;
/// How often (in store time) a shard drops counters whose windows have ended
/// and slot leases that have ended.
pub(super) const SWEEP_INTERVAL_MICROS: i64 = 1_000_000;

/// Every store trait in process memory: the embedded default.
///
/// Counters, slots and ledgers are sharded by account behind plain mutexes
/// (a call holds one shard's lock for well under a microsecond, so the lock
/// never waits on I/O); counters whose windows have ended and slot sets
/// whose leases have all ended are swept away at most once a second per
/// shard, so memory stays bounded under many accounts. Expired records
/// read as absent at once; they are removed when their collection is next
/// written or listed, and every collection is swept of them at most once a
/// second (by the instants of the writes that give records a lifetime), so
/// a collection nobody calls again does not keep them. State is lost when
/// the process ends.
#[derive(Debug)]
pub struct MemoryStore {
    pub(super) shards: Box<[Mutex<Shard>]>,
    pub(super) records: Mutex<Records>,
    pub(super) app_usage: Mutex<HashMap<Box<str>, [AppPeriod; 3]>>,
    shard_hasher: foldhash::fast::RandomState,
    /// A settled reservation is remembered by a keyed 64-bit fingerprint
    /// of its id, not the id itself.
    settlement_hasher: foldhash::fast::RandomState,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore {
            shards: (0..SHARD_COUNT)
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
            records: Mutex::new(Records::default()),
            app_usage: Mutex::new(HashMap::new()),
            shard_hasher: foldhash::fast::RandomState::default(),
            settlement_hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// What a settled id is remembered by, for [`SETTLEMENT_MEMORY`]: at
    /// full load an account remembers hundreds of thousands of them, 16
    /// bytes each with its deadline, with no allocation, instead of a copy
    /// of the id. The hasher's key is random per store, so ids cannot be
    /// chosen to collide; by chance, a new id matches one of the n ids an
    /// account remembers with a probability of n/2⁶⁴ (below 10⁻¹³ for a
    /// million), which would leave that one request unrecorded.
    pub(super) fn settlement_fingerprint(&self, reservation_id: &str) -> u64 {
        self.settlement_hasher.hash_one(reservation_id)
    }

    /// How many counters are held, expired ones not yet swept included.
    pub fn counter_count(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                lock(shard)
                    .counters
                    .values()
                    .map(FastMap::len)
                    .sum::<usize>()
            })
            .sum()
    }

    /// Drops every counter whose window has ended by `now`, every slot
    /// lease that has, and every record whose lifetime has, at once.
    pub fn evict_expired(&self, now: DateTime<Utc>) {
        let now_micros = unix_micros(now);
        for shard in self.shards.iter() {
            lock(shard).sweep(now_micros);
        }
        lock(&self.records).sweep(now_micros);
    }

    /// How many records are held, expired ones not yet removed included.
    pub fn record_count(&self) -> usize {
        lock(&self.records)
            .collections
            .values()
            .map(|collection| collection.records.len())
            .sum()
    }

    pub(super) fn shard(&self, scope: &str) -> MutexGuard<'_, Shard> {
        let index = (self.shard_hasher.hash_one(scope) % SHARD_COUNT as u64) as usize;
        lock(&self.shards[index])
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent before anything that
    // could panic, so a poisoned lock's data is still good.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) counters: FastMap<Box<str>, FastMap<Box<str>, Counter>>,
    /// Slot sets by scope, then by name.
    pub(super) slots: FastMap<Box<str>, FastMap<Box<str>, Leases>>,
    pub(super) ledgers: FastMap<Box<str>, AccountLedger>,
    next_sweep_micros: i64,
}

/// One slot set: holder -> when its lease ends (µs). A plain map, scanned
/// whole: a set is about as small as its limit, the requests in flight.
pub(super) type Leases = FastMap<Box<str>, i64>;

/// Whether a sweep planned for `next_sweep_micros` is due at `now_micros`:
/// also when the clock has stepped far back, or sweeping would stop.
pub(super) fn sweep_due(next_sweep_micros: i64, now_micros: i64) -> bool {
    now_micros >= next_sweep_micros
        || next_sweep_micros.saturating_sub(now_micros) > 2 * SWEEP_INTERVAL_MICROS
}

impl Shard {
    pub(super) fn maybe_sweep(&mut self, now_micros: i64) {
        if sweep_due(self.next_sweep_micros, now_micros) {
            self.sweep(now_micros);
        }
    }

    pub(super) fn sweep(&mut self, now_micros: i64) {
        let horizon_micros = now_micros.saturating_sub(EXPIRY_SLACK_MICROS);
        self.counters.retain(|_, counters| {
            counters.retain(|_, counter| counter.expires_at_micros > horizon_micros);
            !counters.is_empty()
        });
        // Holders that never gave their slots back, and the sets they leave empty.
        self.slots.retain(|_, sets| {
            sets.retain(|_, leases| {
                leases.retain(|_, ends_at_micros| *ends_at_micros > horizon_micros);
                !leases.is_empty()
            });
            !sets.is_empty()
        });
        // Accounts nobody settles for again still let their records go.
        for ledger in self.ledgers.values_mut() {
            ledger.generations.purge(now_micros);
        }
        self.next_sweep_micros = now_micros.saturating_add(SWEEP_INTERVAL_MICROS);
    }
}

/// The value at `key`, inserted empty if absent (without allocating a key
/// when present, as `entry` would).
pub(super) fn get_or_default<'a, V: Default, S: BuildHasher>(
    map: &'a mut HashMap<Box<str>, V, S>,
    key: &str,
) -> &'a mut V {
    if !map.contains_key(key) {
        map.insert(key.into(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}
