//! The ledger in memory: each account's money, holds, lapses, settled ids,
//! keys and generation records in the shard of the account, decided by
//! the rules (`store::rules::ledger`).
//!
//! An account's live holds are kept with their sums (the account's, each
//! key's) and their order by expiry (`Holds`), so an admission never walks
//! the holds in flight. Settled and lapsed ids, and records past their time
//! or the account's cap, are hidden at once and removed a minute later, at
//! most ten times a second per account, exactly as `RedisStore` does, so
//! the two answer alike.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::store::{MemoryStore, get_or_default};
use crate::clock::unix_micros;
use crate::store::counter::duration_micros;
use crate::store::ledger::{
    idempotency_key_ttl, validate_admit, validate_amount, validate_key_terms, validate_renewals,
    validate_settlements, validate_top_up_once,
};
use crate::store::rules::counter::Fit;
use crate::store::rules::ledger::{
    self as rules, Charged, Hold, HoldDecision, HoldView, Lapse, RenewDecision, RenewedView,
    SettleDecision, SettledView, UsageSums, decide_hold, decide_renewal, decide_settlement,
    key_refusal, period_starts_micros, tiered_checks,
};
use crate::store::{
    AccountBalance, AdmitOutcome, AdmitRequest, FastMap, GenerationsPage, HoldRenewal, KeyTerms,
    KeyUsage, LedgerStore, ReserveOutcome, ReserveRequest, Settlement, SettlementRecord,
    StoreError, TopUpOutcome,
};

/// How often an account's records past their time or cap are removed (as
/// on Redis, where each removal costs a few commands).
const TIDY_INTERVAL_MICROS: i64 = 100_000;

/// How long what is forgotten (settled and lapsed ids, records past their
/// time) is kept, unseen, before it is removed: a clock that steps back
/// less than that finds what it would have found before. The same on
/// Redis, so both stores answer alike.
const FORGOTTEN_KEPT_MICROS: i64 = 60_000_000;

/// One account's ledger.
#[derive(Debug, Default)]
pub(super) struct AccountLedger {
    purchased_nanos: i64,
    balance_nanos: i64,
    /// Every live hold of the account, on every key.
    holds: Holds,
    keys: FastMap<Box<str>, KeyLedger>,
    /// Holds that lapsed before their settlement came, by id, each known
    /// for [`LAPSED_HOLD_MEMORY`](crate::store::LAPSED_HOLD_MEMORY).
    lapses: Lapses,
    /// Ids settled lately, by fingerprint.
    settled: SettledIds,
    /// Idempotency keys of recent top-ups, and when each is forgotten
    /// (µs), oldest first: every key lives equally long, so forgetting
    /// pops from the front.
    top_ups: HashMap<Box<str>, RememberedTopUp>,
    top_up_order: VecDeque<(i64, Box<str>)>,
    pub(super) generations: Generations,
}

/// A key's side of its account's ledger.
#[derive(Debug, Default)]
struct KeyLedger {
    /// Its usage, all time and per period.
    sums: UsageSums,
    /// What its live holds hold (exact: no i64 count of i64 amounts
    /// overflows i128).
    held_nanos: i128,
    /// Revoked for good (`revoke_key`): every hold is refused.
    revoked: bool,
    /// Its terms (`set_key_terms`), once set.
    terms: Option<KeyTerms>,
}

impl KeyLedger {
    fn usage(&self, starts: [i64; 3]) -> KeyUsage {
        self.sums.usage(starts, saturate(self.held_nanos))
    }
}

/// An account's live holds by reservation id, with what the balance covers
/// of them and their order by expiry (then id, as Redis orders a sorted
/// set's equal scores): the holds that lapse are taken from the front.
#[derive(Debug, Default)]
struct Holds {
    by_id: FastMap<Box<str>, Hold>,
    by_expiry: BTreeSet<(i64, Box<str>)>,
    /// Exact, as a key's `held_nanos`.
    covered_nanos: i128,
}

impl Holds {
    fn get(&self, id: &str) -> Option<&Hold> {
        self.by_id.get(id)
    }

    /// When the first hold expires.
    fn next_expiry(&self) -> Option<i64> {
        self.by_expiry
            .first()
            .map(|(expires_at_micros, _)| *expires_at_micros)
    }

    /// The first hold whose time is up at `now_micros`, taken out.
    fn pop_expired(&mut self, now_micros: i64) -> Option<(Box<str>, Hold)> {
        if self.next_expiry()? > now_micros {
            return None;
        }
        let (_, id) = self.by_expiry.pop_first()?;
        let hold = self.by_id.remove(&id)?;
        if hold.covered {
            self.covered_nanos -= i128::from(hold.amount_nanos);
        }
        Some((id, hold))
    }

    /// Takes `hold` for `id`, which holds nothing.
    fn insert(&mut self, id: &str, hold: Hold) {
        if hold.covered {
            self.covered_nanos += i128::from(hold.amount_nanos);
        }
        self.by_expiry.insert((hold.expires_at_micros, id.into()));
        self.by_id.insert(id.into(), hold);
    }

    /// Takes out `id`'s hold, if it has one.
    fn remove(&mut self, id: &str) -> Option<Hold> {
        let (id, hold) = self.by_id.remove_entry(id)?;
        if hold.covered {
            self.covered_nanos -= i128::from(hold.amount_nanos);
        }
        self.by_expiry.remove(&(hold.expires_at_micros, id));
        Some(hold)
    }

    /// Moves `id`'s hold to expire at `expires_at_micros`.
    fn extend(&mut self, id: &str, expires_at_micros: i64) {
        let Some(hold) = self.by_id.get_mut(id) else {
            return;
        };
        let id: Box<str> = id.into();
        self.by_expiry.remove(&(hold.expires_at_micros, id.clone()));
        self.by_expiry.insert((expires_at_micros, id));
        hold.expires_at_micros = expires_at_micros;
    }
}

/// Lapses known, by id, and the order they are forgotten in.
#[derive(Debug, Default)]
struct Lapses {
    by_id: FastMap<Box<str>, Lapse>,
    order: VecDeque<(i64, Box<str>)>,
}

impl Lapses {
    fn get(&self, id: &str) -> Option<&Lapse> {
        self.by_id.get(id)
    }

    /// Keeps `lapse` for `id`, in place of any it had.
    fn insert(&mut self, id: Box<str>, lapse: Lapse) {
        self.order.push_back((lapse.forget_at_micros, id.clone()));
        self.by_id.insert(id, lapse);
    }

    /// Keeps `id`'s lapse until `forget_at_micros`.
    fn refresh(&mut self, id: &str, forget_at_micros: i64) {
        if let Some(mut lapse) = self.by_id.remove(id) {
            lapse.forget_at_micros = forget_at_micros;
            self.insert(id.into(), lapse);
        }
    }

    fn remove(&mut self, id: &str) {
        // Its place in `order` goes when forgotten, as a no-op.
        self.by_id.remove(id);
    }

    /// Removes the lapses forgotten by `before_micros`.
    fn forget(&mut self, before_micros: i64) {
        while let Some((forget_at_micros, _)) = self.order.front() {
            if *forget_at_micros > before_micros {
                break;
            }
            if let Some((forget_at_micros, id)) = self.order.pop_front()
                && self
                    .by_id
                    .get(&id)
                    .is_some_and(|lapse| lapse.forget_at_micros == forget_at_micros)
            {
                self.by_id.remove(&id);
            }
        }
    }
}

fn saturate(nanos: i128) -> i64 {
    i64::try_from(nanos).unwrap_or(if nanos < 0 { i64::MIN } else { i64::MAX })
}

/// A top-up remembered by its idempotency key.
#[derive(Debug)]
struct RememberedTopUp {
    amount_nanos: i64,
    after: AccountBalance,
    forget_at_micros: i64,
}

impl AccountLedger {
    fn balance(&self) -> AccountBalance {
        AccountBalance {
            purchased_nanos: self.purchased_nanos,
            balance_nanos: self.balance_nanos,
        }
    }

    /// The key's ledger, created empty if new.
    fn key(&mut self, key: &str) -> &mut KeyLedger {
        get_or_default(&mut self.keys, key)
    }

    /// The key's usage and the account's balance, for the rules to charge.
    fn charged(&mut self, key: &str) -> Charged<'_> {
        let key = get_or_default(&mut self.keys, key);
        Charged {
            key_sums: &mut key.sums,
            balance_nanos: &mut self.balance_nanos,
        }
    }

    /// What every ledger call does first, as every call on Redis does:
    /// forgets what is past its time, and lapses every hold whose time is up.
    fn begin(&mut self, account: &str, now_micros: i64) {
        self.lapses
            .forget(now_micros.saturating_sub(FORGOTTEN_KEPT_MICROS));
        self.settled.sweep(now_micros);
        self.lapse_expired(account, now_micros);
    }

    /// Charges each hold that has reached its expiry unsettled, in the
    /// order of their expiries (then ids), and keeps it as lapsed, with a
    /// generation record when the hold asked for one.
    fn lapse_expired(&mut self, account: &str, now_micros: i64) {
        while let Some((id, hold)) = self.holds.pop_expired(now_micros) {
            self.key(&hold.key).held_nanos -= i128::from(hold.amount_nanos);
            let (lapse, record) =
                rules::lapse(account, &id, &hold, self.charged(&hold.key), now_micros);
            if let Some(record) = record {
                self.generations.put(&id, &hold.key, &record, now_micros);
            }
            self.lapses.insert(id, lapse);
        }
    }

    /// Releases `id`'s hold, if it has one, whichever key holds it.
    fn release(&mut self, id: &str) -> Option<Hold> {
        let hold = self.holds.remove(id)?;
        self.key(&hold.key).held_nanos -= i128::from(hold.amount_nanos);
        Some(hold)
    }

    /// Decides the hold `request` by the rules; a request whose id
    /// (`fingerprint`) is settled already holds nothing.
    fn hold(
        &mut self,
        request: &ReserveRequest,
        fingerprint: u64,
        now: DateTime<Utc>,
    ) -> ReserveOutcome {
        let now_micros = unix_micros(now);
        let id = request.reservation_id.as_str();
        let (own_nanos, own_covered, own_on_key) =
            self.holds.get(id).map_or((0, false, false), |own| {
                (own.amount_nanos, own.covered, *own.key == *request.key)
            });
        let account_held_nanos = if request.covered_by_balance {
            let own_covered_nanos = if own_covered { own_nanos } else { 0 };
            saturate(self.holds.covered_nanos - i128::from(own_covered_nanos))
        } else {
            0
        };
        let settled = self.settled.contains(fingerprint, now_micros);
        let balance_nanos = self.balance_nanos;
        let key = get_or_default(&mut self.keys, &request.key);
        let own_held_on_key_nanos = if own_on_key { own_nanos } else { 0 };
        let view = HoldView {
            balance_nanos,
            account_held_nanos,
            key_sums: &key.sums,
            key_held_nanos: saturate(key.held_nanos - i128::from(own_held_on_key_nanos)),
            own_held_on_key_nanos,
            key_terms: key.terms,
            settled,
        };
        match decide_hold(request, view, now) {
            HoldDecision::Unchanged(outcome) => outcome,
            HoldDecision::Granted { outcome, hold } => {
                self.release(id);
                self.key(&hold.key).held_nanos += i128::from(hold.amount_nanos);
                self.holds.insert(id, hold);
                outcome
            }
        }
    }

    /// Records `settlement` once per reservation id and releases its hold.
    fn settle(&mut self, settlement: &Settlement, fingerprint: u64, now_micros: i64) {
        let id = settlement.reservation_id.as_str();
        let released = self.release(id);
        let view = SettledView {
            settled: self.settled.contains(fingerprint, now_micros),
            hold_admitted_at_micros: released.and_then(|hold| hold.admitted_at_micros),
            lapse: self.lapses.get(id),
        };
        let SettleDecision::Record {
            undo,
            charge_starts,
            marker_until_micros,
        } = decide_settlement(view, now_micros)
        else {
            return;
        };
        self.settled
            .insert(fingerprint, marker_until_micros, now_micros);
        if let Some(lapse) = undo {
            self.lapses.remove(id);
            rules::undo_lapse(&lapse, self.charged(&lapse.key));
            // Its record too, to the settlement's or (never sent) to none.
            self.generations.remove(id);
        }
        rules::charge(
            settlement.cost_nanos,
            settlement.byok,
            self.charged(&settlement.key),
            charge_starts,
        );
        if let Some(record) = &settlement.record {
            self.generations
                .put(id, &settlement.key, record, now_micros);
        }
    }

    /// Extends the live holds of `renewals` to `expires_at_micros`; how
    /// many were live.
    fn renew(&mut self, renewals: &[HoldRenewal], expires_at_micros: i64, now_micros: i64) -> u64 {
        let mut renewed = 0;
        for renewal in renewals {
            let id = renewal.reservation_id.as_str();
            let view = match (self.holds.get(id), self.lapses.get(id)) {
                (Some(hold), _) => RenewedView::Holding {
                    on_its_key: *hold.key == *renewal.key,
                    expires_at_micros: hold.expires_at_micros,
                },
                (None, Some(lapse)) => RenewedView::Lapsed {
                    on_its_key: *lapse.key == *renewal.key,
                    lapse,
                },
                (None, None) => RenewedView::Other,
            };
            let decision = decide_renewal(view, expires_at_micros, now_micros);
            renewed += u64::from(decision.renewed());
            match decision {
                RenewDecision::Extend { expires_at_micros } => {
                    self.holds.extend(id, expires_at_micros);
                }
                RenewDecision::KeepLapse { forget_at_micros } => {
                    self.lapses.refresh(id, forget_at_micros);
                }
                RenewDecision::Nothing => {}
            }
        }
        renewed
    }

    /// Forgets the idempotency keys whose time has passed. A key used
    /// again after it was forgotten has a newer entry, which stays.
    fn forget_top_ups(&mut self, now_micros: i64) {
        while let Some((forget_at_micros, _)) = self.top_up_order.front() {
            if *forget_at_micros > now_micros {
                break;
            }
            if let Some((forget_at_micros, key)) = self.top_up_order.pop_front()
                && self
                    .top_ups
                    .get(&key)
                    .is_some_and(|remembered| remembered.forget_at_micros == forget_at_micros)
            {
                self.top_ups.remove(&key);
            }
        }
    }

    fn credit(&mut self, amount_nanos: i64) -> Result<AccountBalance, StoreError> {
        let after = rules::credit(self.balance(), amount_nanos)?;
        self.purchased_nanos = after.purchased_nanos;
        self.balance_nanos = after.balance_nanos;
        Ok(after)
    }
}

impl MemoryStore {
    /// Runs `f` on the account's ledger, created empty if new, under its shard's lock.
    fn with_account<T>(&self, account: &str, f: impl FnOnce(&mut AccountLedger) -> T) -> T {
        let mut shard = self.shard(account);
        f(get_or_default(&mut shard.ledgers, account))
    }

    /// Records `settlements` (validated, of one account), each once per
    /// reservation id, then tidies the account once, as a Redis call does.
    fn record_settlements(&self, settlements: &[Settlement], now: DateTime<Utc>) {
        let Some(first) = settlements.first() else {
            return;
        };
        let now_micros = unix_micros(now);
        let fingerprints: Vec<u64> = settlements
            .iter()
            .map(|settlement| self.settlement_fingerprint(&settlement.reservation_id))
            .collect();
        self.with_account(&first.account, |ledger| {
            ledger.begin(&first.account, now_micros);
            for (settlement, fingerprint) in settlements.iter().zip(fingerprints) {
                ledger.settle(settlement, fingerprint, now_micros);
            }
            ledger.generations.tidy(now_micros);
        });
    }
}

/// An account's generation records by reservation id, their order by
/// expiry (then by write) for removing the oldest and listing the newest,
/// and each key's own order, so that a key's page is read without walking
/// the other keys' records. As on Redis, the cap (the `max_per_account` of
/// the last record kept) hides the records past it at once and removes
/// them when the account is next tidied (at most ten times a second, at
/// the end of a ledger call).
#[derive(Debug, Default)]
pub(super) struct Generations {
    /// Record, expiry (µs) and key by id.
    records: FastMap<Box<str>, Kept>,
    /// By expiry, then id (as Redis orders a sorted set's equal scores).
    order: BTreeSet<(i64, Box<str>)>,
    /// Each key's records, ordered as `order`.
    by_key: FastMap<Box<str>, BTreeSet<(i64, Box<str>)>>,
    most: Option<u64>,
    tidy_at_micros: i64,
}

#[derive(Debug)]
struct Kept {
    bytes: bytes::Bytes,
    expires_at_micros: i64,
    key: Box<str>,
}

impl Generations {
    pub(super) fn purge(&mut self, now_micros: i64) {
        let before_micros = now_micros.saturating_sub(FORGOTTEN_KEPT_MICROS);
        while self
            .order
            .first()
            .is_some_and(|(expires_at_micros, _)| *expires_at_micros <= before_micros)
        {
            if let Some((_, id)) = self.order.pop_first() {
                self.forget(&id);
            }
        }
    }

    /// Keeps `record` for `id` of `key`; past the account's cap the oldest
    /// are hidden at once and removed when tidied.
    fn put(&mut self, id: &str, key: &str, record: &SettlementRecord, now_micros: i64) {
        self.purge(now_micros);
        self.remove(id);
        let expires_at_micros = now_micros.saturating_add(duration_micros(record.retention));
        self.records.insert(
            id.into(),
            Kept {
                bytes: record.bytes.clone(),
                expires_at_micros,
                key: key.into(),
            },
        );
        self.order.insert((expires_at_micros, id.into()));
        self.by_key
            .entry(key.into())
            .or_default()
            .insert((expires_at_micros, id.into()));
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
            self.forget(&oldest);
        }
    }

    /// The oldest (expiry, id) still within the cap, when records past it
    /// wait for the next tidying; `None` when none do.
    fn cap_edge(&self) -> Option<&(i64, Box<str>)> {
        let most = usize::try_from(self.most?).unwrap_or(usize::MAX);
        // From the oldest end: past only the records over the cap (those
        // written since the last tidying, a tenth of a second at most).
        let over = self
            .records
            .len()
            .checked_sub(most)
            .filter(|over| *over > 0)?;
        self.order.iter().nth(over)
    }

    /// Whether `entry` is among the newest `most` (which `edge` is the
    /// oldest of; everything is when there is no edge).
    fn within_cap(entry: &(i64, Box<str>), edge: Option<&(i64, Box<str>)>) -> bool {
        edge.is_none_or(|edge| entry >= edge)
    }

    /// Removes `id` from the per-key order and the records (the caller has
    /// taken it out of `order`).
    fn forget(&mut self, id: &str) {
        if let Some(kept) = self.records.remove(id)
            && let Some(keyed) = self.by_key.get_mut(&kept.key)
        {
            keyed.remove(&(kept.expires_at_micros, Box::from(id)));
            if keyed.is_empty() {
                self.by_key.remove(&kept.key);
            }
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(kept) = self.records.get(id) {
            self.order.remove(&(kept.expires_at_micros, Box::from(id)));
            self.forget(id);
        }
    }

    fn get(&self, id: &str, now_micros: i64) -> Option<bytes::Bytes> {
        let kept = self.records.get(id)?;
        let entry = (kept.expires_at_micros, Box::from(id));
        (kept.expires_at_micros > now_micros && Self::within_cap(&entry, self.cap_edge()))
            .then(|| kept.bytes.clone())
    }

    fn page(&self, page: GenerationsPage<'_>, now_micros: i64) -> Vec<bytes::Bytes> {
        let order = match page.key {
            None => &self.order,
            Some(key) => match self.by_key.get(key) {
                Some(keyed) => keyed,
                None => return Vec::new(),
            },
        };
        let edge = self.cap_edge();
        order
            .iter()
            .rev()
            .take_while(|entry| entry.0 > now_micros && Self::within_cap(entry, edge))
            .skip(page.skip)
            .take(page.limit)
            .filter_map(|(_, id)| self.records.get(id).map(|kept| kept.bytes.clone()))
            .collect()
    }
}

/// Settled reservation ids of one account, by fingerprint, each with until
/// when (µs) it is remembered. One map entry of 16 bytes per id; forgotten ids
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
    /// ledger call of the account, not only when an id is added: a burst
    /// of settlements must not stay until the next one.
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
        let fingerprints: Vec<u64> = settlements
            .iter()
            .map(|settlement| self.settlement_fingerprint(&settlement.reservation_id))
            .collect();
        let hold_fingerprint = request
            .hold
            .as_ref()
            .map(|hold| self.settlement_fingerprint(&hold.reservation_id));
        let account = request.account.as_str();
        let mut shard = self.shard(account);
        shard.maybe_sweep(now_micros);
        let shard = &mut *shard;
        let ledger = get_or_default(&mut shard.ledgers, account);
        // What lapses, lapses first, whatever is decided after.
        ledger.begin(account, now_micros);
        for (settlement, fingerprint) in settlements.iter().zip(fingerprints) {
            ledger.settle(settlement, fingerprint, now_micros);
        }
        let checks = tiered_checks(request, ledger.purchased_nanos);
        let counters = get_or_default(&mut shard.counters, account);
        let fit = Fit::of(counters, &checks, now);
        let hold = request.hold.as_ref().and_then(|hold| {
            let key = ledger.key(&hold.key);
            // A revoked or expired key is refused first, whatever its
            // counters say.
            key_refusal(key.revoked, key.terms.as_ref(), now).or_else(|| {
                fit.admitted
                    .then(|| ledger.hold(hold, hold_fingerprint.unwrap_or_default(), now))
            })
        });
        ledger.generations.tidy(now_micros);
        let admitted = fit.admitted && hold.as_ref().is_none_or(ReserveOutcome::is_reserved);
        // Added only when the hold was taken too.
        let outcomes = fit.outcomes(counters, &checks, admitted);
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
        let mut shard = self.shard(account);
        let usage = shard.ledgers.get_mut(account).and_then(|ledger| {
            // As every ledger call on Redis does, whatever key it names.
            ledger.begin(account, now_micros);
            let usage = ledger
                .keys
                .get(key)
                .map(|key| key.usage(period_starts_micros(now)));
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
            ledger.begin(account, now_micros);
            let renewed = ledger.renew(holds, expires_at_micros, now_micros);
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
                return Ok(rules::repeated_top_up(
                    remembered.amount_nanos,
                    remembered.after,
                    amount_nanos,
                ));
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
            ledger.key(key).terms = Some(*terms);
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
            ledger.key(key).revoked = true;
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

    async fn generations_page(
        &self,
        account: &str,
        page: GenerationsPage<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<bytes::Bytes>, StoreError> {
        let shard = self.shard(account);
        Ok(shard
            .ledgers
            .get(account)
            .map(|ledger| ledger.generations.page(page, unix_micros(now)))
            .unwrap_or_default())
    }

    async fn account_balance(&self, account: &str) -> Result<AccountBalance, StoreError> {
        let shard = self.shard(account);
        Ok(shard
            .ledgers
            .get(account)
            .map(AccountLedger::balance)
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::store::{LAPSED_HOLD_MEMORY, SETTLEMENT_MEMORY};

    const SECOND: i64 = 1_000_000;

    /// `micros` after 2024-01-01 00:00:00 UTC.
    fn at(micros: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::microseconds(micros)
    }

    /// Of `account`: settled ids remembered, lapses known (with their
    /// places in the order of forgetting), live holds (with their places
    /// in the order of expiry).
    fn settlement_memory(store: &MemoryStore, account: &str) -> (usize, usize, usize) {
        let shard = store.shard(account);
        let ledger = &shard.ledgers[account];
        (
            ledger.settled.until_micros.len(),
            ledger.lapses.by_id.len() + ledger.lapses.order.len(),
            ledger.holds.by_id.len() + ledger.holds.by_expiry.len(),
        )
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
        assert_eq!(settlement_memory(&store, "acct"), (10_000, 0, 0));
        let balance = store.account_balance("acct").await.unwrap().balance_nanos;
        assert_eq!(balance, 1_000_000 - 7 * 10_000);
        let kept = chrono::Duration::microseconds(FORGOTTEN_KEPT_MICROS);
        let start = at(10 * SECOND) + chrono::Duration::from_std(SETTLEMENT_MEMORY).unwrap() + kept;
        store.key_usage("acct", "key", start).await.unwrap();
        assert_eq!(settlement_memory(&store, "acct"), (0, 0, 0));
        // A hold left unsettled (an instance that died) lapses, charged,
        // and its charge is known for LAPSED_HOLD_MEMORY, then forgotten.
        let outcome = store
            .reserve(&paid_hold("orphan".into(), ttl), start)
            .await
            .unwrap();
        assert!(outcome.is_reserved());
        assert_eq!(settlement_memory(&store, "acct"), (0, 0, 2));
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
        assert_eq!(settlement_memory(&store, "acct"), (0, 2, 0));
        store
            .key_usage("acct", "key", expiry + lapsed + kept)
            .await
            .unwrap();
        assert_eq!(settlement_memory(&store, "acct"), (0, 0, 0));
    }

    #[tokio::test]
    async fn ids_remembered_without_a_hold_are_swept_by_any_later_access() {
        // A burst of settlements without a granted hold (a store outage
        // at admission) remembers their ids; once forgotten they go at the
        // account's next ledger call of any kind, not only at the next
        // settlement.
        let store = MemoryStore::new();
        store.top_up("acct", 1_000_000).await.unwrap();
        for request in 0..1_000 {
            let mut settlement = granted(format!("u{request}"), 1);
            settlement.hold_granted = false;
            store.settle(&settlement, at(request)).await.unwrap();
        }
        assert_eq!(settlement_memory(&store, "acct"), (1_000, 0, 0));
        let forgotten = at(0)
            + chrono::Duration::from_std(SETTLEMENT_MEMORY).unwrap()
            + chrono::Duration::microseconds(SETTLED_SWEEP_INTERVAL_MICROS + 1_000);
        // Still remembered before then: a retry records nothing.
        let mut retry = granted("u0".into(), 1);
        retry.hold_granted = false;
        store.settle(&retry, at(10 * SECOND)).await.unwrap();
        let balance = store.account_balance("acct").await.unwrap().balance_nanos;
        assert_eq!(balance, 1_000_000 - 1_000);
        assert_eq!(settlement_memory(&store, "acct"), (1_000, 0, 0));
        store.key_usage("acct", "key", forgotten).await.unwrap();
        assert_eq!(settlement_memory(&store, "acct"), (0, 0, 0));
    }
}
