//! The embedded store: every trait in process, for a single gateway instance.
//!
//! State is sharded by scope (an account) over 64 mutexes; a call takes
//! one. Ended windows and leases are swept from a shard about once a
//! second. Expired records read as absent at once and are removed on
//! their collection's next write or listing, and from every collection at
//! most once a second by writes that give records a lifetime. Each
//! account's holds and each key's reservations are kept with their sum and
//! their order by expiry (`Holds`), so an admission never walks the holds
//! in flight. Settled and lapsed ids, and records past their time or the
//! account's cap, are hidden at once and removed a minute later, at most
//! ten times a second per account, exactly as `RedisStore` does, so the
//! two answer alike.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::apps::{validate_app_usage, AppUsage, AppUsageStore, MAX_APP_USAGE_ROWS};
use super::counter::{
    duration_micros, micros_duration, validate_checks, validate_slot, window_bounds_micros,
};
use super::ledger::{
    idempotency_key_ttl, key_limit_outcome, lapse_record, period_starts_micros, top_up_overflow,
    validate_admit, validate_amount, validate_key_terms, validate_renewals, validate_settlements,
    validate_top_up_once, RecordKeeping, UsageSums, LAPSED_HOLD_MEMORY, SETTLEMENT_MEMORY,
};
use super::records::validate_put;
use super::{
    AccountBalance, AdmitOutcome, AdmitRequest, Check, CheckOutcome, CounterStore, Decision,
    Expect, HoldRenewal, KeyTerms, KeyUsage, LedgerStore, Limit, PutOptions, PutOutcome,
    RecordStore, ReserveOutcome, ReserveRequest, Settlement, SettlementRecord, SlotOutcome,
    StoreError, TopUpOutcome, Versioned, WriteOutcome,
};
use crate::clock::{unix_micros, Period};

/// The maps every request reads and writes a few times, by scope, key hash,
/// reservation or holder id: ids the gateway made or checked, hashed with
/// foldhash at a fraction of SipHash's cost. Maps whose keys a client names
/// (app usage rows, webhook records) keep SipHash: foldhash's random seeds
/// are no defence against someone who can time lookups.
pub(super) type FastMap<K, V> = foldhash::HashMap<K, V>;

/// Shards spread accounts over independent locks, so requests of different
/// accounts rarely wait for each other.
const SHARD_COUNT: usize = 64;
/// How often (in store time) a shard drops counters whose windows have ended
/// and slot leases that have ended.
const SWEEP_INTERVAL_MICROS: i64 = 1_000_000;

/// How often an account's records past their time or cap are removed (as
/// on Redis, where each removal costs a few commands).
const TIDY_INTERVAL_MICROS: i64 = 100_000;

/// How long what is forgotten (settled and lapsed ids, records past their
/// time) is kept, unseen, before it is removed: a clock that steps back
/// less than that finds what it would have found before. The same on
/// Redis, so both stores answer alike.
const FORGOTTEN_KEPT_MICROS: i64 = 60_000_000;
/// How long a counter outlives its window, as `RedisStoreConfig::expiry_slack`
/// does: a caller whose clock reads a little earlier still finds it.
pub(super) const EXPIRY_SLACK_MICROS: i64 = 10_000_000;

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
    shards: Box<[Mutex<Shard>]>,
    records: Mutex<Records>,
    app_usage: Mutex<HashMap<Box<str>, [AppPeriod; 3]>>,
    shard_hasher: foldhash::fast::RandomState,
    /// A reservation settled without a granted hold is remembered by a
    /// keyed 64-bit fingerprint of its id, not the id itself.
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

    /// What the id of a settlement without a granted hold is remembered
    /// by. A store outage as long as a hold's lifetime lets hundreds of
    /// thousands of such settlements per key through at full load: 16
    /// bytes each with its deadline, with no allocation, instead of a copy
    /// of the id. The hasher's key is random per store, so ids cannot be
    /// chosen to collide; by chance, a new id matches one of the n ids a
    /// key remembers with a probability of n/2⁶⁴ (below 10⁻¹³ for a
    /// million), which would leave that one request unrecorded.
    fn settlement_fingerprint(&self, reservation_id: &str) -> u64 {
        self.settlement_hasher.hash_one(reservation_id)
    }

    /// Records `settlements` (validated), each once per reservation id,
    /// then tidies their accounts once, as a Redis call does.
    fn record_settlements(&self, settlements: &[Settlement], now: DateTime<Utc>) {
        let now_micros = unix_micros(now);
        let starts = period_starts_micros(now);
        for settlement in settlements {
            let fingerprint = self.settlement_fingerprint(&settlement.reservation_id);
            self.with_account(&settlement.account, |account| {
                account.settle(settlement, fingerprint, now_micros, starts);
            });
        }
        // Tidied once the call's records are all kept, as on Redis.
        let mut tidied: Vec<&str> = Vec::new();
        for settlement in settlements {
            if !tidied.contains(&settlement.account.as_str()) {
                tidied.push(&settlement.account);
                self.with_account(&settlement.account, |account| {
                    account.generations.tidy(now_micros);
                });
            }
        }
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

    fn shard(&self, scope: &str) -> MutexGuard<'_, Shard> {
        let index = (self.shard_hasher.hash_one(scope) % SHARD_COUNT as u64) as usize;
        lock(&self.shards[index])
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent before anything that
    // could panic, so a poisoned lock's data is still good.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Debug, Default)]
struct Shard {
    counters: FastMap<Box<str>, FastMap<Box<str>, Counter>>,
    /// Slot sets by scope, then by name.
    slots: FastMap<Box<str>, FastMap<Box<str>, Leases>>,
    ledgers: FastMap<Box<str>, AccountLedger>,
    next_sweep_micros: i64,
}

/// One slot set: holder -> when its lease ends (µs). A plain map, scanned
/// whole: a set is about as small as its limit, the requests in flight.
type Leases = FastMap<Box<str>, i64>;

/// Whether a sweep planned for `next_sweep_micros` is due at `now_micros`:
/// also when the clock has stepped far back, or sweeping would stop.
fn sweep_due(next_sweep_micros: i64, now_micros: i64) -> bool {
    now_micros >= next_sweep_micros
        || next_sweep_micros.saturating_sub(now_micros) > 2 * SWEEP_INTERVAL_MICROS
}

impl Shard {
    fn maybe_sweep(&mut self, now_micros: i64) {
        if sweep_due(self.next_sweep_micros, now_micros) {
            self.sweep(now_micros);
        }
    }

    fn sweep(&mut self, now_micros: i64) {
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

/// One counter's state; `SqliteStore` keeps it as a row and decides with
/// the functions below, so both stores answer alike.
#[derive(Debug)]
pub(super) struct Counter {
    pub(super) state: CounterState,
    /// After this instant the counter holds nothing and may be dropped.
    pub(super) expires_at_micros: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WindowCount {
    pub(super) start_micros: i64,
    pub(super) end_micros: i64,
    pub(super) used: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CounterState {
    Empty,
    /// Fixed and calendar windows, by start, until they end (plus slack).
    Windows(Vec<WindowCount>),
    Rolling {
        entries: VecDeque<(i64, u64)>,
        used: u64,
    },
    Gcra {
        theoretical_arrival_micros: i64,
    },
}

fn counter_mut<'a>(counters: &'a mut FastMap<Box<str>, Counter>, name: &str) -> &'a mut Counter {
    if !counters.contains_key(name) {
        counters.insert(
            name.into(),
            Counter {
                state: CounterState::Empty,
                expires_at_micros: i64::MIN,
            },
        );
    }
    counters.get_mut(name).expect("inserted above")
}

/// Evaluates one check against its counter; when `commit`, adds the amount.
/// Returns whether the amount fits and the outcome as it stands afterwards.
fn check_one(
    counter: &mut Counter,
    check: &Check,
    now_micros: i64,
    (start_micros, end_micros): (i64, i64),
    commit: bool,
) -> CheckOutcome {
    let amount = check.amount;
    match check.limit {
        Limit::FixedWindow { limit, .. } | Limit::Calendar { limit, .. } => {
            if !matches!(counter.state, CounterState::Windows(_)) {
                counter.state = CounterState::Windows(Vec::new());
            }
            let CounterState::Windows(windows) = &mut counter.state else {
                unreachable!("set to windows above")
            };
            // Windows are kept by their start, as Redis keys them, so a
            // caller whose clock reads a moment earlier (or who lost the race
            // for the lock at an edge) counts in its own window and never
            // resets a newer one.
            windows.retain(|window| {
                window.end_micros.saturating_add(EXPIRY_SLACK_MICROS) > now_micros
            });
            let index = windows
                .iter()
                .position(|window| window.start_micros == start_micros);
            let used = index.map_or(0, |index| windows[index].used);
            let fits = used.checked_add(amount).is_some_and(|total| total <= limit);
            let used = if fits && commit && amount > 0 {
                match index {
                    Some(index) => windows[index].used += amount,
                    None => windows.push(WindowCount {
                        start_micros,
                        end_micros,
                        used: amount,
                    }),
                }
                counter.expires_at_micros = counter.expires_at_micros.max(end_micros);
                used + amount
            } else {
                used
            };
            let window_left = micros_duration(end_micros - now_micros);
            CheckOutcome {
                admitted: fits,
                limit,
                used,
                remaining: limit.saturating_sub(used),
                retry_after: if fits {
                    Default::default()
                } else {
                    window_left
                },
                reset_after: if used > 0 {
                    window_left
                } else {
                    Default::default()
                },
            }
        }
        Limit::Rolling { limit, window } => {
            let window_micros = duration_micros(window);
            if !matches!(counter.state, CounterState::Rolling { .. }) {
                counter.state = CounterState::Rolling {
                    entries: VecDeque::new(),
                    used: 0,
                };
            }
            let CounterState::Rolling { entries, used } = &mut counter.state else {
                unreachable!("set to rolling above")
            };
            // An entry made at `t` counts while `now < t + window`.
            let cutoff = now_micros.saturating_sub(window_micros);
            while let Some(&(at, entry_amount)) = entries.front() {
                if at > cutoff {
                    break;
                }
                *used -= entry_amount;
                entries.pop_front();
            }
            let fits = used.checked_add(amount).is_some_and(|total| total <= limit);
            if fits && commit && amount > 0 {
                // Sorted by time even when this caller's clock reads earlier
                // than the last one's, so pruning from the front stays exact.
                let index = entries.partition_point(|&(at, _)| at <= now_micros);
                entries.insert(index, (now_micros, amount));
                *used += amount;
                counter.expires_at_micros = counter
                    .expires_at_micros
                    .max(now_micros.saturating_add(window_micros));
            }
            let retry_after = if fits {
                0
            } else {
                // The earliest instant when enough old entries have left the window.
                let needed = used.saturating_add(amount).saturating_sub(limit);
                let mut freed = 0u64;
                entries
                    .iter()
                    .find_map(|&(at, entry_amount)| {
                        freed += entry_amount;
                        (freed >= needed && amount <= limit)
                            .then(|| at + window_micros - now_micros)
                    })
                    .unwrap_or(window_micros)
            };
            let reset_after = entries
                .back()
                .map_or(0, |&(at, _)| at + window_micros - now_micros);
            CheckOutcome {
                admitted: fits,
                limit,
                used: *used,
                remaining: limit.saturating_sub(*used),
                retry_after: micros_duration(retry_after),
                reset_after: micros_duration(reset_after),
            }
        }
        Limit::Gcra {
            rate,
            period,
            burst,
        } => {
            let emission_micros = i128::from(duration_micros(period) / rate as i64);
            let tolerance_micros = emission_micros * i128::from(burst);
            let now_wide = i128::from(now_micros);
            let stored = match counter.state {
                CounterState::Gcra {
                    theoretical_arrival_micros,
                } => i128::from(theoretical_arrival_micros),
                _ => now_wide,
            };
            let arrival = stored.max(now_wide);
            let new_arrival = arrival + emission_micros * i128::from(amount);
            let fits = new_arrival - now_wide <= tolerance_micros;
            let arrival = if fits && commit && amount > 0 {
                let new_arrival = i64::try_from(new_arrival).unwrap_or(i64::MAX);
                counter.state = CounterState::Gcra {
                    theoretical_arrival_micros: new_arrival,
                };
                counter.expires_at_micros = new_arrival;
                i128::from(new_arrival)
            } else {
                arrival
            };
            let backlog = arrival - now_wide;
            let used = u64::try_from((backlog + emission_micros - 1) / emission_micros)
                .unwrap_or(u64::MAX);
            let retry_after = if fits {
                0
            } else {
                new_arrival - now_wide - tolerance_micros
            };
            CheckOutcome {
                admitted: fits,
                limit: burst,
                used,
                remaining: burst.saturating_sub(used),
                retry_after: micros_duration(i64::try_from(retry_after).unwrap_or(i64::MAX)),
                reset_after: micros_duration(i64::try_from(backlog).unwrap_or(i64::MAX)),
            }
        }
    }
}

/// Checks every counter of `checks` under one lock: whether all fit, and
/// when they do and `commit`, adds to all; never to some.
pub(super) fn check_all(
    counters: &mut FastMap<Box<str>, Counter>,
    checks: &[Check],
    now: DateTime<Utc>,
    commit: bool,
) -> (bool, Vec<CheckOutcome>) {
    let now_micros = unix_micros(now);
    let bounds: Vec<(i64, i64)> = checks
        .iter()
        .map(|check| window_bounds_micros(&check.limit, now))
        .collect();
    // Two passes: learn whether everything fits, then add to all or none.
    let admitted = checks.iter().zip(&bounds).all(|(check, &bounds)| {
        let counter = counter_mut(counters, &check.name);
        check_one(counter, check, now_micros, bounds, false).admitted
    });
    let outcomes = checks
        .iter()
        .zip(&bounds)
        .map(|(check, &bounds)| {
            let counter = counter_mut(counters, &check.name);
            check_one(counter, check, now_micros, bounds, admitted && commit)
        })
        .collect();
    (admitted, outcomes)
}

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
        let renewing = leases.contains_key(holder);
        let held = leases.len() as u64;
        if !renewing && held >= limit {
            let earliest_micros = leases.values().copied().min().unwrap_or(now_micros);
            return Ok(SlotOutcome {
                acquired: false,
                held,
                limit,
                retry_after: micros_duration(earliest_micros.saturating_sub(now_micros)),
            });
        }
        let ends_at_micros = now_micros.saturating_add(duration_micros(lease));
        match leases.get_mut(holder) {
            Some(lease_end) => *lease_end = ends_at_micros,
            None => {
                leases.insert(holder.into(), ends_at_micros);
            }
        }
        Ok(SlotOutcome {
            acquired: true,
            held: leases.len() as u64,
            limit,
            retry_after: Duration::ZERO,
        })
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

/// The value at `key`, inserted empty if absent (without allocating a key
/// when present, as `entry` would).
fn get_or_default<'a, V: Default, S: BuildHasher>(
    map: &'a mut HashMap<Box<str>, V, S>,
    key: &str,
) -> &'a mut V {
    if !map.contains_key(key) {
        map.insert(key.into(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

#[derive(Debug, Default)]
struct AccountLedger {
    purchased_nanos: i64,
    balance_nanos: i64,
    /// Holds taken from the balance, on every key, by reservation id.
    holds: Holds,
    keys: FastMap<Box<str>, KeyLedger>,
    /// Idempotency keys of recent top-ups, and when each is forgotten
    /// (µs), oldest first: every key lives equally long, so forgetting
    /// pops from the front.
    top_ups: HashMap<Box<str>, RememberedTopUp>,
    top_up_order: VecDeque<(i64, Box<str>)>,
    generations: Generations,
    /// No hold of any key expires before this (µs; `None` when no key
    /// holds): a call looks through its keys only once it has passed.
    key_holds_lapse_from_micros: Option<i64>,
}

/// An account's generation records by reservation id, and their order by
/// expiry (then by write) for removing the oldest and listing the newest.
/// As on Redis, the cap (the `max_per_account` of the last record kept)
/// hides the records past it at once and removes them when the account is
/// next tidied (at most ten times a second, at the end of a ledger call).
#[derive(Debug, Default)]
struct Generations {
    /// Record and expiry (µs) by id.
    records: FastMap<Box<str>, (bytes::Bytes, i64)>,
    /// By expiry, then id (as Redis orders a sorted set's equal scores).
    order: BTreeSet<(i64, Box<str>)>,
    most: Option<u64>,
    tidy_at_micros: i64,
}

impl Generations {
    fn purge(&mut self, now_micros: i64) {
        let before_micros = now_micros.saturating_sub(FORGOTTEN_KEPT_MICROS);
        while self
            .order
            .first()
            .is_some_and(|(expires_at_micros, _)| *expires_at_micros <= before_micros)
        {
            if let Some((_, id)) = self.order.pop_first() {
                self.records.remove(&id);
            }
        }
    }

    /// Keeps `record` for `id`; past the account's cap the oldest are
    /// hidden at once and removed when tidied.
    fn put(&mut self, id: &str, record: &SettlementRecord, now_micros: i64) {
        self.purge(now_micros);
        let expires_at_micros = now_micros.saturating_add(duration_micros(record.retention));
        if let Some((_, previous)) = self
            .records
            .insert(id.into(), (record.bytes.clone(), expires_at_micros))
        {
            self.order.remove(&(previous, Box::from(id)));
        }
        self.order.insert((expires_at_micros, id.into()));
        self.most = Some(record.max_per_account);
    }

    /// At most ten times a second: removes the records past their time or the
    /// cap (which no reader sees meanwhile).
    fn tidy(&mut self, now_micros: i64) {
        if self.tidy_at_micros > now_micros {
            return;
        }
        self.tidy_at_micros = now_micros.saturating_add(TIDY_INTERVAL_MICROS);
        self.purge(now_micros);
        let most = self.most.unwrap_or(u64::MAX);
        while self.records.len() as u64 > most {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.records.remove(&oldest);
        }
    }

    /// Whether the record of `id`, expiring at `expires_at_micros`, is
    /// among the newest `most`.
    fn within_cap(&self, id: &str, expires_at_micros: i64) -> bool {
        self.most.is_none_or(|most| {
            let after = (expires_at_micros, Box::<str>::from(id));
            (self
                .order
                .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
                .count() as u64)
                < most
        })
    }

    fn remove(&mut self, id: &str) {
        if let Some((_, expires_at_micros)) = self.records.remove(id) {
            self.order.remove(&(expires_at_micros, Box::from(id)));
        }
    }

    fn get(&self, id: &str, now_micros: i64) -> Option<bytes::Bytes> {
        self.records
            .get(id)
            .filter(|(_, expires_at_micros)| {
                *expires_at_micros > now_micros && self.within_cap(id, *expires_at_micros)
            })
            .map(|(bytes, _)| bytes.clone())
    }

    fn newest(&self, limit: usize, now_micros: i64) -> Vec<bytes::Bytes> {
        let most = usize::try_from(self.most.unwrap_or(u64::MAX)).unwrap_or(usize::MAX);
        self.order
            .iter()
            .rev()
            .take_while(|(expires_at_micros, _)| *expires_at_micros > now_micros)
            .take(limit.min(most))
            .filter_map(|(_, id)| self.records.get(id).map(|(bytes, _)| bytes.clone()))
            .collect()
    }
}

/// A top-up remembered by its idempotency key.
#[derive(Debug)]
struct RememberedTopUp {
    amount_nanos: i64,
    after: AccountBalance,
    forget_at_micros: i64,
}

impl AccountLedger {
    /// Forgets the idempotency keys whose time has passed. A key used
    /// again after it was forgotten has a newer entry, which stays.
    fn forget_top_ups(&mut self, now_micros: i64) {
        while let Some((forget_at_micros, _)) = self.top_up_order.front() {
            if *forget_at_micros > now_micros {
                break;
            }
            if let Some((forget_at_micros, key)) = self.top_up_order.pop_front() {
                if self
                    .top_ups
                    .get(&key)
                    .is_some_and(|remembered| remembered.forget_at_micros == forget_at_micros)
                {
                    self.top_ups.remove(&key);
                }
            }
        }
    }

    fn credit(&mut self, amount_nanos: i64) -> Result<AccountBalance, StoreError> {
        let (Some(purchased_nanos), Some(balance_nanos)) = (
            self.purchased_nanos.checked_add(amount_nanos),
            self.balance_nanos.checked_add(amount_nanos),
        ) else {
            return Err(top_up_overflow());
        };
        self.purchased_nanos = purchased_nanos;
        self.balance_nanos = balance_nanos;
        Ok(AccountBalance {
            purchased_nanos,
            balance_nanos,
        })
    }

    /// What the account's live holds other than `id`'s take from the balance.
    fn held_besides(&mut self, id: &str, now_micros: i64) -> i64 {
        self.lapse_account_holds(now_micros);
        self.holds.total_besides(id)
    }

    /// Charges the balance each hold of the account that has reached its
    /// expiry unsettled, and keeps it as lapsed.
    fn lapse_account_holds(&mut self, now_micros: i64) {
        let AccountLedger {
            holds,
            balance_nanos,
            ..
        } = self;
        holds.expire(now_micros, |_, hold| {
            *balance_nanos = balance_nanos.saturating_sub(hold.amount_nanos);
        });
    }

    /// The key's ledger, created empty if new, once every hold of the
    /// account that has reached its expiry unsettled has lapsed (see
    /// [`lapse_key_holds`](Self::lapse_key_holds)).
    fn key_ledger(&mut self, account: &str, key: &str, now_micros: i64) -> &mut KeyLedger {
        self.lapse_account_holds(now_micros);
        self.lapse_key_holds(account, now_micros);
        if !self.keys.contains_key(key) {
            self.keys.insert(key.into(), KeyLedger::default());
        }
        let ledger = self.keys.get_mut(key).expect("inserted above");
        ledger
            .lapsed
            .forget(now_micros.saturating_sub(FORGOTTEN_KEPT_MICROS));
        ledger.settled.sweep(now_micros);
        ledger
    }

    /// Lapses every hold of the account's keys that has reached its expiry
    /// unsettled, whichever key the call is about, in the order of their
    /// expiries (then ids), as Redis does: each is charged in full (to the
    /// balance when the account held it, else to the key's BYOK usage) and
    /// kept as lapsed, with a generation record when the hold asked for one.
    fn lapse_key_holds(&mut self, account: &str, now_micros: i64) {
        if self
            .key_holds_lapse_from_micros
            .is_none_or(|from| from > now_micros)
        {
            return;
        }
        let mut expired: Vec<(i64, Box<str>, Box<str>, Reservation)> = Vec::new();
        for (key, ledger) in self.keys.iter_mut() {
            if ledger
                .reservations
                .next_expiry()
                .is_some_and(|at| at <= now_micros)
            {
                ledger.reservations.expire(now_micros, |id, hold| {
                    expired.push((hold.expires_at_micros, id, key.clone(), hold));
                });
            }
        }
        self.key_holds_lapse_from_micros = self
            .keys
            .values()
            .filter_map(|key| key.reservations.next_expiry())
            .min();
        if expired.is_empty() {
            return;
        }
        expired.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let now = micros_instant(now_micros);
        let starts = period_starts_micros(now);
        for (_, id, key, hold) in expired {
            // Held on the balance too: its account's lapse charged it there.
            let byok = !hold.covered;
            if let Some(keeping) = hold.lapse_record {
                let record = lapse_record(account, &key, &id, hold.amount_nanos, byok, now);
                self.generations.put(
                    &id,
                    &SettlementRecord {
                        bytes: record,
                        retention: keeping.retention,
                        max_per_account: keeping.max_per_account,
                    },
                    now_micros,
                );
            }
            let ledger = self.keys.get_mut(&key).expect("a key whose hold lapsed");
            let mut charge = lapsed_charge(&hold, starts);
            charge.byok = byok;
            ledger.lapsed.insert(id, charge, now_micros);
            ledger.record(hold.amount_nanos, byok, starts);
        }
    }

    /// Extends the live holds of `renewals` to `expires_at_micros`; how
    /// many were live.
    fn renew(
        &mut self,
        account: &str,
        renewals: &[HoldRenewal],
        expires_at_micros: i64,
        now_micros: i64,
    ) -> u64 {
        let mut renewed = 0;
        for renewal in renewals {
            let id = renewal.reservation_id.as_str();
            let key = self.key_ledger(account, &renewal.key, now_micros);
            if key.reservations.renew(id, expires_at_micros) {
                self.holds.renew(id, expires_at_micros);
                renewed += 1;
            } else {
                // Lapsed while its request goes on: its charge is kept for
                // its settlement.
                key.lapsed.refresh(id, now_micros);
            }
        }
        renewed
    }

    /// Records `settlement` once per reservation id and releases its holds.
    fn settle(
        &mut self,
        settlement: &Settlement,
        fingerprint: u64,
        now_micros: i64,
        starts: [i64; 3],
    ) {
        let id = settlement.reservation_id.as_str();
        let key = self.key_ledger(&settlement.account, &settlement.key, now_micros);
        // Released even when settled already: a late admission of a
        // request given up on must not leave a hold behind.
        key.reservations.remove(id);
        // Its marker, kept longer than any retry can come: a retry records
        // nothing more. Without a marker it is recorded, hold or not (a
        // hold the store lost costs a late charge, never a free request).
        let marked = key.settled.insert(
            fingerprint,
            now_micros.saturating_add(duration_micros(SETTLEMENT_MEMORY)),
            now_micros,
        );
        self.holds.remove(id);
        if !marked {
            return;
        }
        let key = self
            .keys
            .get_mut(settlement.key.as_str())
            .expect("made above");
        // A lapsed hold's charge gives way to the real cost.
        if let Some(charge) = key.lapsed.take(id, now_micros) {
            key.unrecord(&charge);
            if !charge.byok {
                self.balance_nanos = self.balance_nanos.saturating_add(charge.amount_nanos);
            }
            // Its record too, to the settlement's or (never sent) to none.
            self.generations.remove(id);
        }
        let key = self
            .keys
            .get_mut(settlement.key.as_str())
            .expect("made above");
        key.record(settlement.cost_nanos, settlement.byok, starts);
        if let Some(record) = &settlement.record {
            self.generations
                .put(&settlement.reservation_id, record, now_micros);
        }
        if !settlement.byok {
            self.balance_nanos = self.balance_nanos.saturating_sub(settlement.cost_nanos);
        }
    }

    /// Decides the hold `request` as [`LedgerStore::admit`] does; a
    /// request whose id (`fingerprint`) is settled already holds nothing.
    fn hold(
        &mut self,
        request: &ReserveRequest,
        fingerprint: u64,
        now: DateTime<Utc>,
    ) -> ReserveOutcome {
        let now_micros = unix_micros(now);
        let starts = period_starts_micros(now);
        let id = request.reservation_id.as_str();
        // Lapsed holds are charged first: the balance is read after them.
        let account_held_nanos = if request.covered_by_balance {
            self.held_besides(id, now_micros)
        } else {
            self.lapse_account_holds(now_micros);
            0
        };
        let balance_nanos = self.balance_nanos;
        let key = self.key_ledger(&request.account, &request.key, now_micros);
        // The store's copy of the key's terms, once set, over the request's.
        let key_limit = key
            .terms
            .map_or(request.key_limit, |terms| terms.limit)
            .filter(|_| request.counts_against_key_limit);
        let mut usage = key.usage(starts);
        if key.settled.contains(fingerprint, now_micros) {
            // Its settlement came first (the caller gave up on it): the
            // request was never sent, and nothing must stay held.
            return ReserveOutcome::Reserved {
                used_nanos: key_limit.map_or(usage.total_nanos, |limit| {
                    usage.in_period(limit.reset, limit.include_byok)
                }),
                reserved_nanos: usage.reserved_nanos,
                held_nanos: 0,
            };
        }
        // A re-reservation replaces its earlier hold.
        usage.reserved_nanos = key.reservations.total_besides(id);
        let least_nanos = request.min_amount_nanos.unwrap_or(request.amount_nanos);
        let mut granted_nanos = request.amount_nanos;
        if let Some(limit) = &key_limit {
            if let Some(rejection) = key_limit_outcome(&usage, limit, least_nanos, now) {
                return rejection;
            }
            let committed = usage
                .in_period(limit.reset, limit.include_byok)
                .saturating_add(usage.reserved_nanos);
            granted_nanos = granted_nanos.min(limit.limit_nanos.saturating_sub(committed));
        }
        if (request.check_balance || request.covered_by_balance) && balance_nanos < 0 {
            return ReserveOutcome::BalanceNegative { balance_nanos };
        }
        if request.covered_by_balance {
            let available_nanos = balance_nanos.saturating_sub(account_held_nanos);
            if available_nanos < least_nanos {
                return ReserveOutcome::BalanceInsufficient {
                    balance_nanos,
                    held_nanos: account_held_nanos,
                };
            }
            granted_nanos = granted_nanos.min(available_nanos);
        }
        let expires_at_micros = now_micros.saturating_add(duration_micros(request.ttl));
        key.reservations.insert(
            id,
            Reservation {
                amount_nanos: granted_nanos,
                expires_at_micros,
                lapse_record: request.lapse_record,
                covered: request.covered_by_balance,
            },
        );
        self.key_holds_lapse_from_micros = Some(
            self.key_holds_lapse_from_micros
                .map_or(expires_at_micros, |from| from.min(expires_at_micros)),
        );
        let outcome = ReserveOutcome::Reserved {
            used_nanos: key_limit.map_or(usage.total_nanos, |limit| {
                usage.in_period(limit.reset, limit.include_byok)
            }),
            reserved_nanos: usage.reserved_nanos.saturating_add(granted_nanos),
            held_nanos: granted_nanos,
        };
        if request.covered_by_balance {
            self.holds.insert(
                id,
                Reservation {
                    amount_nanos: granted_nanos,
                    expires_at_micros,
                    lapse_record: None,
                    covered: true,
                },
            );
        } else {
            // A hold of the same id the balance covered is replaced whole.
            self.holds.remove(&request.reservation_id);
        }
        outcome
    }
}

#[derive(Debug, Default)]
struct KeyLedger {
    /// Its usage, all time and per period.
    sums: UsageSums,
    reservations: Holds,
    /// Holds that expired unsettled, until their settlement or
    /// [`LAPSED_HOLD_MEMORY`].
    lapsed: LapsedHolds,
    /// Reservations settled recently without a granted hold, by the
    /// fingerprint of their id.
    settled: SettledIds,
    /// Revoked for good (`revoke_key`): every hold is refused.
    revoked: bool,
    /// Its terms (`set_key_terms`), once set.
    terms: Option<KeyTerms>,
}

#[derive(Debug)]
struct Reservation {
    amount_nanos: i64,
    expires_at_micros: i64,
    /// How the generation record of its lapse is kept, when it has one.
    lapse_record: Option<RecordKeeping>,
    /// Whether the account's balance holds it too (a key's hold): its
    /// lapse is then the key's own usage, else BYOK.
    covered: bool,
}

/// Holds by reservation id, with their sum and their order by expiry: an
/// admission reads the sum and drops the expired ones from the front, so
/// thousands of requests in flight on one account cost it O(log n), not
/// a walk over all of them.
#[derive(Debug, Default)]
struct Holds {
    by_id: FastMap<Box<str>, Reservation>,
    by_expiry: BTreeSet<(i64, Box<str>)>,
    /// Exact: amounts are i64, and no i64 count of them overflows i128.
    total_nanos: i128,
}

impl Holds {
    /// Drops the holds whose time is up at `now_micros`, handing each to
    /// `lapse`.
    fn expire(&mut self, now_micros: i64, mut lapse: impl FnMut(Box<str>, Reservation)) {
        while let Some((expires_at_micros, _)) = self.by_expiry.first() {
            if *expires_at_micros > now_micros {
                break;
            }
            if let Some((_, id)) = self.by_expiry.pop_first() {
                if let Some(hold) = self.by_id.remove(&id) {
                    self.total_nanos -= i128::from(hold.amount_nanos);
                    lapse(id, hold);
                }
            }
        }
    }

    /// When the first hold expires.
    fn next_expiry(&self) -> Option<i64> {
        self.by_expiry
            .first()
            .map(|(expires_at_micros, _)| *expires_at_micros)
    }

    /// Extends `id`'s hold, if it has one, to `expires_at_micros` (never
    /// shortens it); whether it had one.
    fn renew(&mut self, id: &str, expires_at_micros: i64) -> bool {
        let Some(hold) = self.by_id.get_mut(id) else {
            return false;
        };
        if hold.expires_at_micros < expires_at_micros {
            let id: Box<str> = id.into();
            self.by_expiry.remove(&(hold.expires_at_micros, id.clone()));
            self.by_expiry.insert((expires_at_micros, id));
            hold.expires_at_micros = expires_at_micros;
        }
        true
    }

    /// Takes `hold` for `id`, in place of any hold `id` had.
    fn insert(&mut self, id: &str, hold: Reservation) {
        self.remove(id);
        self.total_nanos += i128::from(hold.amount_nanos);
        self.by_expiry.insert((hold.expires_at_micros, id.into()));
        self.by_id.insert(id.into(), hold);
    }

    /// Releases `id`'s hold, if it has one, and says when it would have
    /// expired.
    fn remove(&mut self, id: &str) -> Option<i64> {
        let (id, hold) = self.by_id.remove_entry(id)?;
        self.total_nanos -= i128::from(hold.amount_nanos);
        self.by_expiry.remove(&(hold.expires_at_micros, id));
        Some(hold.expires_at_micros)
    }

    fn total(&self) -> i64 {
        saturate(self.total_nanos)
    }

    /// The sum of every hold but `id`'s.
    fn total_besides(&self, id: &str) -> i64 {
        let own = self.by_id.get(id).map_or(0, |hold| hold.amount_nanos);
        saturate(self.total_nanos - i128::from(own))
    }
}

/// What a hold's lapse charged: given back when its settlement comes.
#[derive(Debug, Clone, Copy)]
struct LapsedCharge {
    amount_nanos: i64,
    byok: bool,
    /// The starts of the day, week and month it was charged in.
    starts: [i64; 3],
    /// Until when (µs) the charge is known.
    forget_at_micros: i64,
}

fn lapsed_charge(hold: &Reservation, starts: [i64; 3]) -> LapsedCharge {
    LapsedCharge {
        amount_nanos: hold.amount_nanos,
        byok: false,
        starts,
        forget_at_micros: 0,
    }
}

fn micros_instant(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).unwrap_or_default()
}

/// Holds that lapsed before their settlement came, each known for
/// [`LAPSED_HOLD_MEMORY`] after its lapse, in that order.
#[derive(Debug, Default)]
struct LapsedHolds {
    by_id: FastMap<Box<str>, LapsedCharge>,
    order: VecDeque<(i64, Box<str>)>,
}

impl LapsedHolds {
    fn insert(&mut self, id: Box<str>, mut charge: LapsedCharge, now_micros: i64) {
        charge.forget_at_micros = now_micros.saturating_add(duration_micros(LAPSED_HOLD_MEMORY));
        self.by_id.insert(id.clone(), charge);
        self.order.push_back((charge.forget_at_micros, id));
    }

    /// Keeps `id`'s charge, if still known, for [`LAPSED_HOLD_MEMORY`]
    /// from now.
    fn refresh(&mut self, id: &str, now_micros: i64) {
        if let Some((id, charge)) = self.by_id.get_key_value(id) {
            if charge.forget_at_micros > now_micros {
                let (id, charge) = (id.clone(), *charge);
                self.insert(id, charge, now_micros);
            }
        }
    }

    /// `id`'s lapse charge if still known, no longer kept. Its place in
    /// `order` goes when forgotten, as a no-op.
    fn take(&mut self, id: &str, now_micros: i64) -> Option<LapsedCharge> {
        if self.by_id.is_empty() {
            return None;
        }
        match self.by_id.get(id) {
            Some(charge) if charge.forget_at_micros > now_micros => self.by_id.remove(id),
            _ => None,
        }
    }

    fn forget(&mut self, now_micros: i64) {
        while let Some((forget_at_micros, _)) = self.order.front() {
            if *forget_at_micros > now_micros {
                break;
            }
            if let Some((forget_at_micros, id)) = self.order.pop_front() {
                if self
                    .by_id
                    .get(&id)
                    .is_some_and(|charge| charge.forget_at_micros == forget_at_micros)
                {
                    self.by_id.remove(&id);
                }
            }
        }
    }
}

/// Settled reservation ids of one key, by fingerprint, each with until when
/// (µs) it is remembered. One map entry of 16 bytes per id; forgotten ids
/// are swept out at most once a minute, so the sweep's walk costs well
/// under a microsecond per settlement.
#[derive(Debug, Default)]
struct SettledIds {
    until_micros: HashMap<u64, i64, BuildHasherDefault<FingerprintHasher>>,
    next_sweep_micros: i64,
}

const SETTLED_SWEEP_INTERVAL_MICROS: i64 = 60_000_000;

impl SettledIds {
    fn contains(&self, fingerprint: u64, now_micros: i64) -> bool {
        self.until_micros
            .get(&fingerprint)
            .is_some_and(|until| *until > now_micros)
    }

    /// Removes the forgotten ids, at most once a minute. Run on every
    /// access of the key, not only when an id is added: ids are added only
    /// by settlements without a granted hold, and a burst of those must not
    /// stay until the next one.
    fn sweep(&mut self, now_micros: i64) {
        if now_micros < self.next_sweep_micros {
            return;
        }
        let before_micros = now_micros.saturating_sub(FORGOTTEN_KEPT_MICROS);
        self.until_micros.retain(|_, until| *until > before_micros);
        // Give back what a burst left behind.
        if self.until_micros.capacity() > 4 * self.until_micros.len().max(64) {
            self.until_micros.shrink_to_fit();
        }
        self.next_sweep_micros = now_micros.saturating_add(SETTLED_SWEEP_INTERVAL_MICROS);
    }

    /// Remembers `fingerprint` until `until_micros`; false when it is
    /// remembered already.
    fn insert(&mut self, fingerprint: u64, until_micros: i64, now_micros: i64) -> bool {
        self.sweep(now_micros);
        match self.until_micros.entry(fingerprint) {
            std::collections::hash_map::Entry::Occupied(mut remembered) => {
                if *remembered.get() > now_micros {
                    return false;
                }
                // Forgotten, not yet swept: a new settlement.
                remembered.insert(until_micros);
                true
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(until_micros);
                true
            }
        }
    }
}

/// Fingerprints are keyed hashes already: used as they are, not hashed
/// again.
#[derive(Debug, Default)]
struct FingerprintHasher(u64);

impl std::hash::Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64s are hashed with it; any other input still hashes.
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

fn saturate(nanos: i128) -> i64 {
    i64::try_from(nanos).unwrap_or(if nanos < 0 { i64::MIN } else { i64::MAX })
}

impl KeyLedger {
    /// Takes back a lapse's charge: from the all-time total, and from each
    /// period still the one it was charged in.
    fn unrecord(&mut self, charge: &LapsedCharge) {
        self.sums
            .unrecord(charge.amount_nanos, charge.byok, charge.starts);
    }

    fn usage(&self, starts: [i64; 3]) -> KeyUsage {
        self.sums.usage(starts, self.reservations.total())
    }

    fn record(&mut self, cost_nanos: i64, byok: bool, starts: [i64; 3]) {
        self.sums.record(cost_nanos, byok, starts);
    }
}

impl MemoryStore {
    /// Runs `f` on the account's ledger, created empty if new, under its shard's lock.
    fn with_account<T>(&self, account: &str, f: impl FnOnce(&mut AccountLedger) -> T) -> T {
        let mut shard = self.shard(account);
        if !shard.ledgers.contains_key(account) {
            shard
                .ledgers
                .insert(account.into(), AccountLedger::default());
        }
        f(shard.ledgers.get_mut(account).expect("inserted above"))
    }
}

/// When the key's terms say it expired, if they do by `now`.
fn expired_terms(ledger: &AccountLedger, key: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    ledger
        .keys
        .get(key)
        .and_then(|key| key.terms?.expires_at)
        .filter(|expires_at| *expires_at <= now)
}

/// The request's checks, its purchase tier's capacity in force when the
/// account has bought `purchased_nanos` (read under the checks' lock).
pub(super) fn tiered_checks(
    request: &AdmitRequest,
    purchased_nanos: i64,
) -> std::borrow::Cow<'_, [Check]> {
    match request.purchase_tier {
        Some(tier) if purchased_nanos >= tier.threshold_nanos => {
            let mut checks = request.checks.clone();
            let check = &mut checks[tier.check_index];
            check.limit = check.limit.with_capacity(tier.raised_capacity);
            std::borrow::Cow::Owned(checks)
        }
        _ => std::borrow::Cow::Borrowed(&request.checks),
    }
}

#[async_trait]
impl LedgerStore for MemoryStore {
    async fn admit_after_settling(
        &self,
        settlements: &[Settlement],
        request: &AdmitRequest,
        now: DateTime<Utc>,
    ) -> Result<AdmitOutcome, StoreError> {
        validate_admit(settlements, request)?;
        let now_micros = unix_micros(now);
        let starts = period_starts_micros(now);
        let fingerprints: Vec<u64> = settlements
            .iter()
            .map(|settlement| self.settlement_fingerprint(&settlement.reservation_id))
            .collect();
        let account = request.account.as_str();
        let mut shard = self.shard(account);
        shard.maybe_sweep(now_micros);
        let Shard {
            counters, ledgers, ..
        } = &mut *shard;
        let ledger = get_or_default(ledgers, account);
        // What lapses, lapses first, whatever is decided after: every hold
        // of the account (as on Redis).
        ledger.lapse_account_holds(now_micros);
        ledger.lapse_key_holds(account, now_micros);
        for (settlement, fingerprint) in settlements.iter().zip(fingerprints) {
            ledger.settle(settlement, fingerprint, now_micros, starts);
        }
        if let Some(hold) = &request.hold {
            ledger.key_ledger(account, &hold.key, now_micros);
        }
        let checks = tiered_checks(request, ledger.purchased_nanos);
        let counters = get_or_default(counters, account);
        let (fit, outcomes) = check_all(counters, &checks, now, false);
        let hold = match (&request.hold, fit) {
            // A revoked key is refused first, whatever its counters say.
            (Some(hold), _)
                if ledger
                    .keys
                    .get(hold.key.as_str())
                    .is_some_and(|key| key.revoked) =>
            {
                Some(ReserveOutcome::KeyRevoked)
            }
            // Past its expiry by the store's clock, whatever the request
            // (an instance's copy of the key) says.
            (Some(hold), _) if expired_terms(ledger, &hold.key, now).is_some() => {
                expired_terms(ledger, &hold.key, now)
                    .map(|expired_at| ReserveOutcome::KeyExpired { expired_at })
            }
            (Some(hold), true) => {
                let fingerprint = self.settlement_fingerprint(&hold.reservation_id);
                Some(ledger.hold(hold, fingerprint, now))
            }
            _ => None,
        };
        ledger.generations.tidy(now_micros);
        let admitted = fit && hold.as_ref().is_none_or(ReserveOutcome::is_reserved);
        let outcomes = if admitted && !checks.is_empty() {
            check_all(counters, &checks, now, true).1
        } else {
            outcomes
        };
        Ok(AdmitOutcome {
            admitted,
            checks: outcomes,
            hold,
            decided_at: now,
        })
    }

    async fn settle(&self, settlement: &Settlement, now: DateTime<Utc>) -> Result<(), StoreError> {
        validate_settlements("settle", std::slice::from_ref(settlement), None)?;
        self.record_settlements(std::slice::from_ref(settlement), now);
        Ok(())
    }

    async fn settle_many(
        &self,
        settlements: &[Settlement],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        validate_settlements("settle_many", settlements, None)?;
        self.record_settlements(settlements, now);
        Ok(())
    }

    async fn key_usage(
        &self,
        account: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<KeyUsage, StoreError> {
        let now_micros = unix_micros(now);
        let starts = period_starts_micros(now);
        let mut shard = self.shard(account);
        let usage = shard.ledgers.get_mut(account).and_then(|ledger| {
            // As every ledger call on Redis does, whatever key it names.
            ledger.lapse_account_holds(now_micros);
            ledger.lapse_key_holds(account, now_micros);
            let usage = ledger
                .keys
                .contains_key(key)
                .then(|| ledger.key_ledger(account, key, now_micros).usage(starts));
            ledger.generations.tidy(now_micros);
            usage
        });
        Ok(usage.unwrap_or_default())
    }

    async fn renew_holds(
        &self,
        account: &str,
        holds: &[HoldRenewal],
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        validate_renewals(ttl)?;
        let now_micros = unix_micros(now);
        let expires_at_micros = now_micros.saturating_add(duration_micros(ttl));
        let mut shard = self.shard(account);
        Ok(shard.ledgers.get_mut(account).map_or(0, |ledger| {
            let renewed = ledger.renew(account, holds, expires_at_micros, now_micros);
            if !holds.is_empty() {
                ledger.generations.tidy(now_micros);
            }
            renewed
        }))
    }

    async fn top_up(&self, account: &str, amount_nanos: i64) -> Result<AccountBalance, StoreError> {
        validate_amount("top_up", amount_nanos)?;
        self.with_account(account, |ledger| ledger.credit(amount_nanos))
    }

    async fn top_up_once(
        &self,
        account: &str,
        amount_nanos: i64,
        idempotency_key: &str,
        now: DateTime<Utc>,
    ) -> Result<TopUpOutcome, StoreError> {
        validate_top_up_once(amount_nanos, idempotency_key)?;
        let now_micros = unix_micros(now);
        let forget_at_micros = now_micros.saturating_add(duration_micros(idempotency_key_ttl()));
        self.with_account(account, |ledger| {
            ledger.forget_top_ups(now_micros);
            // Also a key kept past its time by a clock that stepped back.
            if let Some(remembered) = ledger
                .top_ups
                .get(idempotency_key)
                .filter(|remembered| remembered.forget_at_micros > now_micros)
            {
                return Ok(if remembered.amount_nanos == amount_nanos {
                    TopUpOutcome::Repeated(remembered.after)
                } else {
                    TopUpOutcome::KeyReused {
                        first_amount_nanos: remembered.amount_nanos,
                    }
                });
            }
            let after = ledger.credit(amount_nanos)?;
            ledger.top_ups.insert(
                idempotency_key.into(),
                RememberedTopUp {
                    amount_nanos,
                    after,
                    forget_at_micros,
                },
            );
            ledger
                .top_up_order
                .push_back((forget_at_micros, idempotency_key.into()));
            Ok(TopUpOutcome::Credited(after))
        })
    }

    async fn set_key_terms(
        &self,
        account: &str,
        key: &str,
        terms: &KeyTerms,
    ) -> Result<(), StoreError> {
        validate_key_terms(terms)?;
        self.with_account(account, |ledger| {
            get_or_default(&mut ledger.keys, key).terms = Some(*terms);
        });
        Ok(())
    }

    async fn revoke_key(
        &self,
        account: &str,
        key: &str,
        _now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.with_account(account, |ledger| {
            // A mark beside the key's usage, as on Redis: nothing lapses.
            get_or_default(&mut ledger.keys, key).revoked = true;
        });
        Ok(())
    }

    async fn generation(
        &self,
        account: &str,
        reservation_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<bytes::Bytes>, StoreError> {
        let shard = self.shard(account);
        Ok(shard
            .ledgers
            .get(account)
            .and_then(|ledger| ledger.generations.get(reservation_id, unix_micros(now))))
    }

    async fn recent_generations(
        &self,
        account: &str,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<bytes::Bytes>, StoreError> {
        let shard = self.shard(account);
        Ok(shard
            .ledgers
            .get(account)
            .map(|ledger| ledger.generations.newest(limit, unix_micros(now)))
            .unwrap_or_default())
    }

    async fn account_balance(&self, account: &str) -> Result<AccountBalance, StoreError> {
        let shard = self.shard(account);
        Ok(shard
            .ledgers
            .get(account)
            .map(|ledger| AccountBalance {
                purchased_nanos: ledger.purchased_nanos,
                balance_nanos: ledger.balance_nanos,
            })
            .unwrap_or_default())
    }
}

/// One scope's app usage in one period (day, week or month).
#[derive(Debug, Default)]
struct AppPeriod {
    start_micros: i64,
    /// (app, model) -> (requests, tokens).
    rows: HashMap<(Box<str>, Box<str>), (u64, u64)>,
    details: HashMap<Box<str>, Box<str>>,
}

#[async_trait]
impl AppUsageStore for MemoryStore {
    async fn add_app_usage(
        &self,
        scope: &str,
        rows: &[AppUsage],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        validate_app_usage(rows)?;
        let starts = period_starts_micros(now);
        let mut scopes = lock(&self.app_usage);
        let periods = get_or_default(&mut scopes, scope);
        for (period, start_micros) in periods.iter_mut().zip(starts) {
            // Periods only roll forward; a write stamped in one that has
            // already rolled over counts nowhere.
            if start_micros > period.start_micros {
                *period = AppPeriod {
                    start_micros,
                    ..AppPeriod::default()
                };
            } else if start_micros < period.start_micros {
                continue;
            }
            for row in rows {
                let key = (Box::from(row.app.as_str()), Box::from(row.model.as_str()));
                if period.rows.len() >= MAX_APP_USAGE_ROWS && !period.rows.contains_key(&key) {
                    continue;
                }
                let counts = period.rows.entry(key).or_default();
                counts.0 = counts.0.saturating_add(row.requests);
                counts.1 = counts.1.saturating_add(row.tokens);
                period
                    .details
                    .insert(row.app.as_str().into(), row.details.as_str().into());
            }
        }
        Ok(())
    }

    async fn app_usage(
        &self,
        scope: &str,
        period: Period,
        now: DateTime<Utc>,
    ) -> Result<Vec<AppUsage>, StoreError> {
        let index = match period {
            Period::Day => 0,
            Period::Week => 1,
            Period::Month => 2,
        };
        let start_micros = period_starts_micros(now)[index];
        let scopes = lock(&self.app_usage);
        let Some(counted) = scopes
            .get(scope)
            .map(|periods| &periods[index])
            .filter(|counted| counted.start_micros == start_micros)
        else {
            return Ok(Vec::new());
        };
        Ok(counted
            .rows
            .iter()
            .map(|((app, model), (requests, tokens))| AppUsage {
                app: app.to_string(),
                details: counted
                    .details
                    .get(app)
                    .map(|details| details.to_string())
                    .unwrap_or_default(),
                model: model.to_string(),
                requests: *requests,
                tokens: *tokens,
            })
            .collect())
    }
}

/// Every record collection, and when they are next swept of expired
/// records.
#[derive(Debug, Default)]
struct Records {
    collections: HashMap<String, Collection>,
    next_sweep_micros: i64,
}

impl Records {
    /// Removes every expired record of every collection, and collections
    /// left empty, at most once a second of store time: a session nobody
    /// calls again still has its expired flows removed.
    fn maybe_sweep(&mut self, now_micros: i64) {
        if sweep_due(self.next_sweep_micros, now_micros) {
            self.sweep(now_micros);
        }
    }

    fn sweep(&mut self, now_micros: i64) {
        self.collections.retain(|_, collection| {
            collection.purge(now_micros);
            !collection.records.is_empty()
        });
        self.next_sweep_micros = now_micros.saturating_add(SWEEP_INTERVAL_MICROS);
    }
}

#[derive(Debug, Default)]
struct Collection {
    records: HashMap<String, StoredRecord>,
    /// Creation sequence number -> id, for newest-first listing.
    order: BTreeMap<u64, String>,
    next_sequence: u64,
    /// (expiry µs, id) of every record with a lifetime, soonest first, so
    /// removing the expired ones never scans the live ones.
    expiring: BTreeSet<(i64, String)>,
}

impl Collection {
    /// Removes every record expired by `now`.
    fn purge(&mut self, now_micros: i64) {
        while self
            .expiring
            .first()
            .is_some_and(|(expires_at_micros, _)| *expires_at_micros <= now_micros)
        {
            if let Some((_, id)) = self.expiring.pop_first() {
                if let Some(record) = self.records.remove(&id) {
                    self.order.remove(&record.sequence);
                }
            }
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(record) = self.records.remove(id) {
            self.order.remove(&record.sequence);
            if let Some(expires_at_micros) = record.expires_at_micros {
                self.expiring.remove(&(expires_at_micros, id.to_owned()));
            }
        }
    }
}

#[derive(Debug)]
struct StoredRecord {
    value: Vec<u8>,
    revision: u64,
    sequence: u64,
    /// A record that expires at `t` is live while `now < t`.
    expires_at_micros: Option<i64>,
}

impl StoredRecord {
    fn versioned(&self) -> Versioned<Vec<u8>> {
        Versioned {
            value: self.value.clone(),
            revision: self.revision,
        }
    }

    fn is_live(&self, now_micros: i64) -> bool {
        self.expires_at_micros
            .is_none_or(|expires_at_micros| expires_at_micros > now_micros)
    }
}

/// Whether `expect` holds for a record at `current_revision` (`None`: no
/// live record). Shared with `SqliteStore`.
pub(super) fn expectation_holds(current_revision: Option<u64>, expect: Expect) -> bool {
    match (expect, current_revision) {
        (Expect::Any, _) => true,
        (Expect::Absent, current) => current.is_none(),
        (Expect::Revision(revision), Some(current)) => current == revision,
        (Expect::Revision(_), None) => false,
    }
}

#[async_trait]
impl RecordStore for MemoryStore {
    async fn get_record_at(
        &self,
        collection: &str,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Versioned<Vec<u8>>>, StoreError> {
        let now_micros = unix_micros(now);
        let records = lock(&self.records);
        Ok(records
            .collections
            .get(collection)
            .and_then(|collection| collection.records.get(id))
            .filter(|record| record.is_live(now_micros))
            .map(StoredRecord::versioned))
    }

    async fn put_record_at(
        &self,
        collection: &str,
        id: &str,
        value: &[u8],
        expect: Expect,
        options: PutOptions,
        now: DateTime<Utc>,
    ) -> Result<PutOutcome, StoreError> {
        validate_put(&options)?;
        let now_micros = unix_micros(now);
        let mut records = lock(&self.records);
        // Only writers of expiring records sweep every collection: they keep
        // the time those records are judged by (a caller with no clock of
        // its own, at the system's, never removes a test's records early).
        if options.ttl.is_some() {
            records.maybe_sweep(now_micros);
        }
        let collection = records
            .collections
            .entry(collection.to_owned())
            .or_default();
        collection.purge(now_micros);
        let current = collection.records.get(id);
        if !expectation_holds(current.map(|record| record.revision), expect) {
            return Ok(PutOutcome::Write(WriteOutcome::Conflict {
                current: current.map(StoredRecord::versioned),
            }));
        }
        let live = collection.records.len() as u64;
        if current.is_none() && options.max_records.is_some_and(|max| live >= max) {
            return Ok(PutOutcome::Full { records: live });
        }
        let expires_at_micros = options
            .ttl
            .map(|ttl| now_micros.saturating_add(duration_micros(ttl)));
        let (revision, sequence) = match current {
            Some(record) => {
                if let Some(old) = record.expires_at_micros {
                    collection.expiring.remove(&(old, id.to_owned()));
                }
                (record.revision + 1, record.sequence)
            }
            None => {
                collection.next_sequence += 1;
                collection
                    .order
                    .insert(collection.next_sequence, id.to_owned());
                (1, collection.next_sequence)
            }
        };
        if let Some(expires_at_micros) = expires_at_micros {
            collection
                .expiring
                .insert((expires_at_micros, id.to_owned()));
        }
        collection.records.insert(
            id.to_owned(),
            StoredRecord {
                value: value.to_vec(),
                revision,
                sequence,
                expires_at_micros,
            },
        );
        Ok(PutOutcome::Write(WriteOutcome::Written { revision }))
    }

    async fn delete_record_at(
        &self,
        collection: &str,
        id: &str,
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<WriteOutcome, StoreError> {
        let mut records = lock(&self.records);
        let Some(collection) = records.collections.get_mut(collection) else {
            return Ok(match expect {
                Expect::Revision(_) => WriteOutcome::Conflict { current: None },
                Expect::Any | Expect::Absent => WriteOutcome::Written { revision: 0 },
            });
        };
        collection.purge(unix_micros(now));
        let current = collection.records.get(id);
        if !expectation_holds(current.map(|record| record.revision), expect) {
            return Ok(WriteOutcome::Conflict {
                current: current.map(StoredRecord::versioned),
            });
        }
        collection.remove(id);
        Ok(WriteOutcome::Written { revision: 0 })
    }

    async fn list_records_at(
        &self,
        collection: &str,
        offset: usize,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, Versioned<Vec<u8>>)>, StoreError> {
        let mut records = lock(&self.records);
        let Some(collection) = records.collections.get_mut(collection) else {
            return Ok(Vec::new());
        };
        collection.purge(unix_micros(now));
        Ok(collection
            .order
            .values()
            .rev()
            .skip(offset)
            .take(limit)
            .map(|id| (id.clone(), collection.records[id].versioned()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use proptest::prelude::*;

    use super::*;

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

    /// Per key of `account`: settled ids remembered, lapsed holds known,
    /// live holds; and the account's live holds.
    fn settlement_memory(store: &MemoryStore, account: &str) -> ((usize, usize, usize), usize) {
        let shard = store.shard(account);
        let ledger = &shard.ledgers[account];
        let keys = ledger
            .keys
            .values()
            .fold((0, 0, 0), |(settled, lapsed, live), key| {
                (
                    settled + key.settled.until_micros.len(),
                    lapsed + key.lapsed.by_id.len() + key.lapsed.order.len(),
                    live + key.reservations.by_id.len() + key.reservations.by_expiry.len(),
                )
            });
        (keys, ledger.holds.by_id.len())
    }

    fn granted(reservation_id: String, cost_nanos: i64) -> Settlement {
        Settlement {
            account: "acct".into(),
            key: "key".into(),
            reservation_id,
            hold_granted: true,
            cost_nanos,
            byok: false,
            record: None,
        }
    }

    fn paid_hold(reservation_id: String, ttl: Duration) -> ReserveRequest {
        ReserveRequest {
            account: "acct".into(),
            key: "key".into(),
            reservation_id,
            amount_nanos: 10,
            min_amount_nanos: None,
            key_limit: None,
            check_balance: true,
            covered_by_balance: true,
            lapse_record: None,
            counts_against_key_limit: true,
            ttl,
        }
    }

    #[tokio::test]
    async fn settled_holds_leave_nothing_behind() {
        // What a steady flow of requests leaves in memory: nothing once
        // each is settled, however many there were.
        let store = MemoryStore::new();
        store.top_up("acct", 1_000_000).await.unwrap();
        let ttl = Duration::from_secs(900);
        for request in 0..10_000 {
            let now = at(request * 1_000);
            let id = format!("r{request}");
            let outcome = store
                .reserve(&paid_hold(id.clone(), ttl), now)
                .await
                .unwrap();
            assert!(outcome.is_reserved());
            // Retried, as after a lost reply: still recorded once.
            for _ in 0..2 {
                store.settle(&granted(id.clone(), 7), now).await.unwrap();
            }
        }
        // Each leaves its marker (16 bytes) until SETTLEMENT_MEMORY has
        // passed (and FORGOTTEN_KEPT_MICROS more), and then nothing.
        assert_eq!(settlement_memory(&store, "acct"), ((10_000, 0, 0), 0));
        let balance = store.account_balance("acct").await.unwrap().balance_nanos;
        assert_eq!(balance, 1_000_000 - 7 * 10_000);
        let kept = chrono::Duration::microseconds(FORGOTTEN_KEPT_MICROS);
        let start = at(10 * SECOND) + chrono::Duration::from_std(SETTLEMENT_MEMORY).unwrap() + kept;
        store.key_usage("acct", "key", start).await.unwrap();
        assert_eq!(settlement_memory(&store, "acct"), ((0, 0, 0), 0));
        // A hold left unsettled (an instance that died) lapses, charged,
        // and its charge is known for LAPSED_HOLD_MEMORY, then forgotten.
        let outcome = store
            .reserve(&paid_hold("orphan".into(), ttl), start)
            .await
            .unwrap();
        assert!(outcome.is_reserved());
        assert_eq!(settlement_memory(&store, "acct"), ((0, 0, 2), 1));
        let expiry = start + chrono::Duration::from_std(ttl).unwrap();
        store.key_usage("acct", "key", expiry).await.unwrap();
        // Lapsed: charged its hold, once, on the balance and the key.
        let lapsed_balance = store.account_balance("acct").await.unwrap().balance_nanos;
        assert_eq!(lapsed_balance, balance - 10);
        let usage = store.key_usage("acct", "key", expiry).await.unwrap();
        assert_eq!(usage.total_nanos, 7 * 10_000 + 10);
        let lapsed = chrono::Duration::from_std(LAPSED_HOLD_MEMORY).unwrap();
        store
            .key_usage(
                "acct",
                "key",
                expiry + lapsed + kept - chrono::Duration::microseconds(1),
            )
            .await
            .unwrap();
        assert_eq!(settlement_memory(&store, "acct").0, (0, 2, 0));
        store
            .key_usage("acct", "key", expiry + lapsed + kept)
            .await
            .unwrap();
        assert_eq!(settlement_memory(&store, "acct").0, (0, 0, 0));
    }

    #[tokio::test]
    async fn ids_remembered_without_a_hold_are_swept_by_any_later_access() {
        // A burst of settlements without a granted hold (a store outage
        // at admission) remembers their ids; once forgotten they go at the
        // key's next access of any kind, not only at the next such
        // settlement.
        let store = MemoryStore::new();
        store.top_up("acct", 1_000_000).await.unwrap();
        for request in 0..1_000 {
            let mut settlement = granted(format!("u{request}"), 1);
            settlement.hold_granted = false;
            store.settle(&settlement, at(request)).await.unwrap();
        }
        assert_eq!(settlement_memory(&store, "acct").0, (1_000, 0, 0));
        let forgotten = at(0)
            + chrono::Duration::from_std(SETTLEMENT_MEMORY).unwrap()
            + chrono::Duration::microseconds(SETTLED_SWEEP_INTERVAL_MICROS + 1_000);
        // Still remembered before then: a retry records nothing.
        let mut retry = granted("u0".into(), 1);
        retry.hold_granted = false;
        store.settle(&retry, at(10 * SECOND)).await.unwrap();
        let balance = store.account_balance("acct").await.unwrap().balance_nanos;
        assert_eq!(balance, 1_000_000 - 1_000);
        assert_eq!(settlement_memory(&store, "acct").0, (1_000, 0, 0));
        store.key_usage("acct", "key", forgotten).await.unwrap();
        assert_eq!(settlement_memory(&store, "acct").0, (0, 0, 0));
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
        assert!(store
            .shards
            .iter()
            .all(|shard| lock(shard).slots.is_empty()));
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

    #[tokio::test]
    async fn expired_records_are_removed_even_from_collections_nobody_calls_again() {
        let store = MemoryStore::new();
        let week = PutOptions::expiring(Duration::from_secs(7 * 86_400));
        for session in 0..100 {
            let outcome = store
                .put_record_at(
                    &crate::store::flows(&format!("s{session}")),
                    "f",
                    b"v",
                    Expect::Absent,
                    week,
                    at(0),
                )
                .await
                .unwrap();
            assert_eq!(
                outcome,
                PutOutcome::Write(WriteOutcome::Written { revision: 1 })
            );
        }
        // A write without a lifetime, at the system clock (years after
        // `at(0)`), removes nothing: only the clock of the writers that
        // gave records their lifetime decides.
        store
            .put_record(crate::store::KEYS, "k", b"v", Expect::Any)
            .await
            .unwrap();
        assert_eq!(store.record_count(), 101);
        // An expiring write a week later sweeps every collection.
        store
            .put_record_at(
                &crate::store::flows("s-new"),
                "f",
                b"v",
                Expect::Absent,
                week,
                at(7 * 86_400 * SECOND),
            )
            .await
            .unwrap();
        assert_eq!(store.record_count(), 2);
        assert_eq!(
            lock(&store.records).collections.len(),
            2,
            "empty ones dropped"
        );
        // And so does `evict_expired`.
        store.evict_expired(at(14 * 86_400 * SECOND));
        assert_eq!(store.record_count(), 1);
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
