//! The ledger's decisions, over what a store reads of one account: whether
//! a hold is granted and how much, what a settlement records, what a lapse
//! charges, what a renewal extends, what a top-up credits.
//!
//! Every function here is pure: it takes a view of the state it reads (an
//! account's balance and holds, a key's usage and terms, what the ledger
//! knows of one request id) and returns, or writes into the view it is
//! lent, what changes. `MemoryStore` keeps that state in maps and
//! `SqliteStore` in rows; the Redis Functions (`ledger_common.lua`,
//! `ledger_write.lua`) decide the same way, and a differential test runs
//! the same random operations through both and compares every answer and
//! the state left.

use chrono::{DateTime, Utc};

use crate::clock::{Period, unix_micros};
use crate::store::counter::duration_micros;
use crate::store::ledger::{lapse_record, top_up_overflow};
use crate::store::{
    AccountBalance, AdmitRequest, Check, KeyLimit, KeyTerms, KeyUsage, LAPSED_HOLD_MEMORY,
    RecordKeeping, ReserveOutcome, ReserveRequest, SETTLEMENT_MEMORY, SettlementRecord, StoreError,
    TopUpOutcome,
};

/// What a request in flight holds, as the ledger tracks it by its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hold {
    /// The key (its hash) whose limit the hold counts against.
    pub(crate) key: Box<str>,
    pub(crate) amount_nanos: i64,
    /// When it was admitted: its cost counts in the day, week and month
    /// containing this instant, whenever it settles or lapses. `None` for a
    /// hold an older version wrote, which counts in the periods it ends in.
    pub(crate) admitted_at_micros: Option<i64>,
    /// When it lapses unless renewed or settled first.
    pub(crate) expires_at_micros: i64,
    /// Whether the account's balance holds it too: its lapse is then the
    /// key's own usage and the balance's, else the key's BYOK usage.
    pub(crate) covered: bool,
    /// How the generation record of its lapse is kept, when it has one.
    pub(crate) lapse_record: Option<RecordKeeping>,
}

/// What a hold's lapse charged, known until `forget_at_micros`, so that the
/// request's late settlement replaces it with the real cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lapse {
    pub(crate) key: Box<str>,
    pub(crate) amount_nanos: i64,
    pub(crate) byok: bool,
    /// The starts (µs) of the day, week and month it was charged in.
    pub(crate) starts: [i64; 3],
    pub(crate) forget_at_micros: i64,
}

impl Lapse {
    /// Whether it is still known at `now_micros`.
    pub(crate) fn is_known(&self, now_micros: i64) -> bool {
        self.forget_at_micros > now_micros
    }
}

/// A key's usage sums as a store keeps them: all time, and per day, week
/// and month with each period's start, own and BYOK. Periods only roll
/// forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UsageSums {
    pub(crate) total_nanos: i64,
    pub(crate) byok_total_nanos: i64,
    /// Day, week, month.
    pub(crate) periods: [PeriodSums; 3],
}

/// One period's start (µs) and its own and BYOK usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeriodSums {
    pub(crate) start_micros: i64,
    pub(crate) nanos: i64,
    pub(crate) byok_nanos: i64,
}

impl Default for UsageSums {
    fn default() -> Self {
        UsageSums {
            total_nanos: 0,
            byok_total_nanos: 0,
            periods: [PeriodSums {
                start_micros: i64::MIN,
                nanos: 0,
                byok_nanos: 0,
            }; 3],
        }
    }
}

impl UsageSums {
    /// The usage in the periods starting at `starts` (a stored period that
    /// is not the current one counts nothing), with `reserved_nanos` held.
    pub(crate) fn usage(&self, starts: [i64; 3], reserved_nanos: i64) -> KeyUsage {
        let current = |index: usize| {
            let period = self.periods[index];
            if period.start_micros == starts[index] {
                (period.nanos, period.byok_nanos)
            } else {
                (0, 0)
            }
        };
        let (day_nanos, byok_day_nanos) = current(0);
        let (week_nanos, byok_week_nanos) = current(1);
        let (month_nanos, byok_month_nanos) = current(2);
        KeyUsage {
            total_nanos: self.total_nanos,
            day_nanos,
            week_nanos,
            month_nanos,
            byok_total_nanos: self.byok_total_nanos,
            byok_day_nanos,
            byok_week_nanos,
            byok_month_nanos,
            reserved_nanos,
        }
    }

    /// Adds a cost in the periods starting at `starts` and all time. A cost
    /// stamped in a period that has already rolled over (a clock a moment
    /// behind) counts in the all-time sums only, and never wipes the newer
    /// period.
    pub(crate) fn record(&mut self, cost_nanos: i64, byok: bool, starts: [i64; 3]) {
        for (period, start_micros) in self.periods.iter_mut().zip(starts) {
            if start_micros < period.start_micros {
                continue;
            }
            if start_micros > period.start_micros {
                *period = PeriodSums {
                    start_micros,
                    nanos: 0,
                    byok_nanos: 0,
                };
            }
            if byok {
                period.byok_nanos = period.byok_nanos.saturating_add(cost_nanos);
            } else {
                period.nanos = period.nanos.saturating_add(cost_nanos);
            }
        }
        if byok {
            self.byok_total_nanos = self.byok_total_nanos.saturating_add(cost_nanos);
        } else {
            self.total_nanos = self.total_nanos.saturating_add(cost_nanos);
        }
    }

    /// Takes back a cost charged in the periods starting at
    /// `charged_starts`: all time, and in each period still that one.
    pub(crate) fn unrecord(&mut self, amount_nanos: i64, byok: bool, charged_starts: [i64; 3]) {
        for (period, start_micros) in self.periods.iter_mut().zip(charged_starts) {
            if period.start_micros == start_micros {
                if byok {
                    period.byok_nanos = period.byok_nanos.saturating_sub(amount_nanos);
                } else {
                    period.nanos = period.nanos.saturating_sub(amount_nanos);
                }
            }
        }
        if byok {
            self.byok_total_nanos = self.byok_total_nanos.saturating_sub(amount_nanos);
        } else {
            self.total_nanos = self.total_nanos.saturating_sub(amount_nanos);
        }
    }
}

/// The starts of the day, week and month containing `now`, in µs: the
/// ledger compares them with the stored ones to roll its period totals.
pub(crate) fn period_starts_micros(now: DateTime<Utc>) -> [i64; 3] {
    let now_micros = unix_micros(now);
    [Period::Day, Period::Week, Period::Month].map(|period| period.bounds_micros(now_micros).0)
}

/// The instant of `micros` µs after the epoch.
pub(crate) fn instant(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).unwrap_or_default()
}

/// The key-limit refusal for a reservation of `amount_nanos`, if any: the
/// request could take usage past the limit (so overspend is bounded by how
/// far real costs exceed their estimates), or, for a free request, usage
/// has reached the limit.
pub(crate) fn key_limit_outcome(
    usage: &KeyUsage,
    limit: &KeyLimit,
    amount_nanos: i64,
    now: DateTime<Utc>,
) -> Option<ReserveOutcome> {
    let used_nanos = usage
        .in_period(limit.reset, limit.include_byok)
        .saturating_add(usage.reserved_nanos);
    let over = if amount_nanos == 0 {
        used_nanos >= limit.limit_nanos
    } else {
        used_nanos.saturating_add(amount_nanos) > limit.limit_nanos
    };
    over.then(|| ReserveOutcome::KeyLimitReached {
        used_nanos,
        limit_nanos: limit.limit_nanos,
        resets_at: limit.reset.map(|period| period.end_of(now)),
    })
}

/// The request's checks, its purchase tier's capacity in force when the
/// account has bought `purchased_nanos` (read in the same atomic step).
pub(crate) fn tiered_checks(
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

/// A key's refusal before any counter or credit is looked at: revoked for
/// good, or past the expiry its terms give, by the store's clock.
pub(crate) fn key_refusal(
    revoked: bool,
    terms: Option<&KeyTerms>,
    now: DateTime<Utc>,
) -> Option<ReserveOutcome> {
    if revoked {
        return Some(ReserveOutcome::KeyRevoked);
    }
    terms
        .and_then(|terms| terms.expires_at)
        .filter(|expires_at| *expires_at <= now)
        .map(|expired_at| ReserveOutcome::KeyExpired { expired_at })
}

/// What a hold decision reads of the account and the key, with the
/// request's own earlier hold (a re-reservation replaces it) left out of
/// both sums.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HoldView<'a> {
    pub(crate) balance_nanos: i64,
    /// What the balance covers of the account's other live holds.
    pub(crate) account_held_nanos: i64,
    pub(crate) key_sums: &'a UsageSums,
    /// The key's other live holds.
    pub(crate) key_held_nanos: i64,
    /// The request's own earlier hold on this key, if it has one: counted
    /// in the key's holds when the request was settled already.
    pub(crate) own_held_on_key_nanos: i64,
    /// The key's own terms, once set.
    pub(crate) key_terms: Option<KeyTerms>,
    /// Whether the request's id was settled already (its marker is live).
    pub(crate) settled: bool,
}

/// What a hold decision changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HoldDecision {
    /// Nothing changes; the outcome says why (a refusal, or a request
    /// settled already, answered as reserved with nothing held).
    Unchanged(ReserveOutcome),
    /// `hold` is taken in place of any hold of the id.
    Granted { outcome: ReserveOutcome, hold: Hold },
}

#[cfg(test)]
impl HoldDecision {
    /// What admission answers.
    pub(crate) fn outcome(&self) -> ReserveOutcome {
        match self {
            HoldDecision::Unchanged(outcome) | HoldDecision::Granted { outcome, .. } => *outcome,
        }
    }
}

/// Decides the hold `request` (see [`LedgerStore::admit`](crate::store::LedgerStore::admit)):
/// the key's limit (its stored terms over the request's), then the
/// balance; as much of the amount as both leave, refusing only below the
/// least worth holding. A request whose settlement came first (the caller
/// gave up on it, so it was never sent) holds nothing.
pub(crate) fn decide_hold(
    request: &ReserveRequest,
    view: HoldView<'_>,
    now: DateTime<Utc>,
) -> HoldDecision {
    let now_micros = unix_micros(now);
    let starts = period_starts_micros(now);
    let key_limit = view
        .key_terms
        .map_or(request.key_limit, |terms| terms.limit)
        .filter(|_| request.counts_against_key_limit);
    let mut usage = view.key_sums.usage(
        starts,
        view.key_held_nanos
            .saturating_add(view.own_held_on_key_nanos),
    );
    let used_nanos = |usage: &KeyUsage| {
        key_limit.map_or(usage.total_nanos, |limit| {
            usage.in_period(limit.reset, limit.include_byok)
        })
    };
    if view.settled {
        return HoldDecision::Unchanged(ReserveOutcome::Reserved {
            used_nanos: used_nanos(&usage),
            reserved_nanos: usage.reserved_nanos,
            held_nanos: 0,
        });
    }
    usage.reserved_nanos = view.key_held_nanos;
    let least_nanos = request.min_amount_nanos.unwrap_or(request.amount_nanos);
    let mut granted_nanos = request.amount_nanos;
    if let Some(limit) = &key_limit {
        if let Some(refusal) = key_limit_outcome(&usage, limit, least_nanos, now) {
            return HoldDecision::Unchanged(refusal);
        }
        let committed = usage
            .in_period(limit.reset, limit.include_byok)
            .saturating_add(usage.reserved_nanos);
        granted_nanos = granted_nanos.min(limit.limit_nanos.saturating_sub(committed));
    }
    let balance_nanos = view.balance_nanos;
    if (request.check_balance || request.covered_by_balance) && balance_nanos < 0 {
        return HoldDecision::Unchanged(ReserveOutcome::BalanceNegative { balance_nanos });
    }
    if request.covered_by_balance {
        let available_nanos = balance_nanos.saturating_sub(view.account_held_nanos);
        if available_nanos < least_nanos {
            return HoldDecision::Unchanged(ReserveOutcome::BalanceInsufficient {
                balance_nanos,
                held_nanos: view.account_held_nanos,
            });
        }
        granted_nanos = granted_nanos.min(available_nanos);
    }
    HoldDecision::Granted {
        outcome: ReserveOutcome::Reserved {
            used_nanos: used_nanos(&usage),
            reserved_nanos: usage.reserved_nanos.saturating_add(granted_nanos),
            held_nanos: granted_nanos,
        },
        hold: Hold {
            key: request.key.as_str().into(),
            amount_nanos: granted_nanos,
            admitted_at_micros: Some(now_micros),
            expires_at_micros: now_micros.saturating_add(duration_micros(request.ttl)),
            covered: request.covered_by_balance,
            lapse_record: request.lapse_record.clone(),
        },
    }
}

/// A key's usage and the account's balance, lent to the functions that
/// charge them.
pub(crate) struct Charged<'a> {
    pub(crate) key_sums: &'a mut UsageSums,
    pub(crate) balance_nanos: &'a mut i64,
}

/// Charges a hold that reached its expiry unsettled (its instance stopped
/// renewing it): in full, in the periods it was admitted in, to the key's
/// own usage and the balance when the balance covered it, else to the
/// key's BYOK usage. Returns the lapse to
/// remember, for [`LAPSED_HOLD_MEMORY`], and its generation record when the
/// hold asked for one. The caller has released the hold already.
pub(crate) fn lapse(
    account: &str,
    id: &str,
    hold: &Hold,
    charged: Charged<'_>,
    now_micros: i64,
) -> (Lapse, Option<SettlementRecord>) {
    let byok = !hold.covered;
    let starts = period_starts_micros(instant(hold.admitted_at_micros.unwrap_or(now_micros)));
    charged.key_sums.record(hold.amount_nanos, byok, starts);
    if hold.covered {
        *charged.balance_nanos = charged.balance_nanos.saturating_sub(hold.amount_nanos);
    }
    let record = hold.lapse_record.as_ref().map(|keeping| SettlementRecord {
        bytes: lapse_record(
            account,
            &hold.key,
            id,
            hold.amount_nanos,
            byok,
            instant(now_micros),
            keeping.model.as_deref(),
        ),
        retention: keeping.retention,
        max_per_account: keeping.max_per_account,
    });
    let lapse = Lapse {
        key: hold.key.clone(),
        amount_nanos: hold.amount_nanos,
        byok,
        starts,
        forget_at_micros: now_micros.saturating_add(duration_micros(LAPSED_HOLD_MEMORY)),
    };
    (lapse, record)
}

/// Gives back what `lapse` charged: to its key's usage (all time, and each
/// period still the one it was charged in) and, unless BYOK, the balance.
/// The caller also removes the lapse's generation record.
pub(crate) fn undo_lapse(lapse: &Lapse, charged: Charged<'_>) {
    charged
        .key_sums
        .unrecord(lapse.amount_nanos, lapse.byok, lapse.starts);
    if !lapse.byok {
        *charged.balance_nanos = charged.balance_nanos.saturating_add(lapse.amount_nanos);
    }
}

/// Records a settlement's cost: the key's usage (own or BYOK) in the
/// periods starting at `starts`, those its hold was admitted in (see
/// [`SettleDecision::Record`]), and, unless BYOK, the balance.
pub(crate) fn charge(cost_nanos: i64, byok: bool, charged: Charged<'_>, starts: [i64; 3]) {
    charged.key_sums.record(cost_nanos, byok, starts);
    if !byok {
        *charged.balance_nanos = charged.balance_nanos.saturating_sub(cost_nanos);
    }
}

/// What the ledger knows of a settlement's id when it comes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SettledView<'a> {
    /// Its marker is live: settled already.
    pub(crate) settled: bool,
    /// When its live hold was admitted, if it has one.
    pub(crate) hold_admitted_at_micros: Option<i64>,
    /// The lapse it replaces, if one is known: its own, or the one its hold
    /// was admitted again over.
    pub(crate) lapse: Option<&'a Lapse>,
}

/// What a settlement changes, besides releasing its id's hold (always,
/// even when settled already: a late admission of a request given up on
/// must not leave a hold behind).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SettleDecision {
    /// Its marker says it was recorded: nothing more.
    Repeated,
    /// New: undo the lapse it replaces (with its record), if any, then
    /// [`charge`] its cost in the periods starting at `charge_starts`, keep
    /// its record, and mark it settled until `marker_until_micros`. A
    /// settlement that finds neither hold nor marker (a hold the store
    /// lost) is recorded all the same.
    Record {
        undo: Option<Lapse>,
        /// The day, week and month its hold was admitted in (the live
        /// hold's, else the lapse's it replaces), so that a late
        /// settlement never counts against a period that did not hold it;
        /// the current ones when the store knows neither.
        charge_starts: [i64; 3],
        marker_until_micros: i64,
    },
}

/// Decides what a settlement changes: once per id within
/// [`SETTLEMENT_MEMORY`].
pub(crate) fn decide_settlement(view: SettledView<'_>, now_micros: i64) -> SettleDecision {
    if view.settled {
        return SettleDecision::Repeated;
    }
    let undo = view
        .lapse
        .filter(|lapse| lapse.is_known(now_micros))
        .cloned();
    let charge_starts = match (view.hold_admitted_at_micros, &undo) {
        (Some(admitted_at_micros), _) => period_starts_micros(instant(admitted_at_micros)),
        (None, Some(lapse)) => lapse.starts,
        (None, None) => period_starts_micros(instant(now_micros)),
    };
    SettleDecision::Record {
        undo,
        charge_starts,
        marker_until_micros: now_micros.saturating_add(duration_micros(SETTLEMENT_MEMORY)),
    }
}

/// What a renewal finds of its id.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RenewedView<'a> {
    /// A live hold, on the key (its hash) the renewal names or another.
    Holding {
        on_its_key: bool,
        expires_at_micros: i64,
    },
    /// A lapse still known, on the renewal's key or another.
    Lapsed { on_its_key: bool, lapse: &'a Lapse },
    /// Nothing to renew.
    Other,
}

/// What a renewal changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RenewDecision {
    /// The hold lives until then (never shorter than it was); it counts
    /// as renewed.
    Extend { expires_at_micros: i64 },
    /// Lapsed while its request goes on: its charge stays known for the
    /// settlement until then. Not counted as renewed.
    KeepLapse { forget_at_micros: i64 },
    /// Nothing.
    Nothing,
}

impl RenewDecision {
    /// Whether the renewal counts as renewed (its hold was live).
    pub(crate) fn renewed(&self) -> bool {
        matches!(self, RenewDecision::Extend { .. })
    }
}

/// Decides a renewal to `expires_at_micros`: only the key that holds a
/// hold renews it.
pub(crate) fn decide_renewal(
    view: RenewedView<'_>,
    expires_at_micros: i64,
    now_micros: i64,
) -> RenewDecision {
    match view {
        RenewedView::Holding {
            on_its_key: true,
            expires_at_micros: before,
        } => RenewDecision::Extend {
            expires_at_micros: before.max(expires_at_micros),
        },
        RenewedView::Lapsed {
            on_its_key: true,
            lapse,
        } if lapse.is_known(now_micros) => RenewDecision::KeepLapse {
            forget_at_micros: now_micros.saturating_add(duration_micros(LAPSED_HOLD_MEMORY)),
        },
        _ => RenewDecision::Nothing,
    }
}

/// A purchase credited: the purchased total and the balance rise, or the
/// whole purchase is refused past the largest amount a ledger holds.
pub(crate) fn credit(
    balance: AccountBalance,
    amount_nanos: i64,
) -> Result<AccountBalance, StoreError> {
    match (
        balance.purchased_nanos.checked_add(amount_nanos),
        balance.balance_nanos.checked_add(amount_nanos),
    ) {
        (Some(purchased_nanos), Some(balance_nanos)) => Ok(AccountBalance {
            purchased_nanos,
            balance_nanos,
        }),
        _ => Err(top_up_overflow()),
    }
}

/// The answer to a top-up whose idempotency key is remembered (live) with
/// `first_amount_nanos` and the balance after it: the first answer again,
/// or the key reused for another amount.
pub(crate) fn repeated_top_up(
    first_amount_nanos: i64,
    balance_after: AccountBalance,
    amount_nanos: i64,
) -> TopUpOutcome {
    if first_amount_nanos == amount_nanos {
        TopUpOutcome::Repeated(balance_after)
    } else {
        TopUpOutcome::KeyReused { first_amount_nanos }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::TimeZone;

    use super::*;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 1, 31, 23, 0, 0).unwrap()
    }

    fn request(amount_nanos: i64) -> ReserveRequest {
        ReserveRequest {
            account: "acct".into(),
            key: "k".into(),
            reservation_id: "r1".into(),
            amount_nanos,
            min_amount_nanos: None,
            key_limit: None,
            counts_against_key_limit: true,
            check_balance: true,
            covered_by_balance: true,
            ttl: Duration::from_secs(60),
            lapse_record: None,
        }
    }

    fn view(sums: &UsageSums, balance_nanos: i64, account_held_nanos: i64) -> HoldView<'_> {
        HoldView {
            balance_nanos,
            account_held_nanos,
            key_sums: sums,
            key_held_nanos: 0,
            own_held_on_key_nanos: 0,
            key_terms: None,
            settled: false,
        }
    }

    #[test]
    fn a_hold_takes_what_the_balance_leaves_and_no_less_than_its_least() {
        let sums = UsageSums::default();
        let mut asked = request(100);
        asked.min_amount_nanos = Some(30);
        let decision = decide_hold(&asked, view(&sums, 100, 60), now());
        assert!(matches!(
            decision,
            HoldDecision::Granted { ref hold, .. } if hold.amount_nanos == 40
        ));
        let refused = decide_hold(&asked, view(&sums, 100, 80), now());
        assert_eq!(
            refused,
            HoldDecision::Unchanged(ReserveOutcome::BalanceInsufficient {
                balance_nanos: 100,
                held_nanos: 80
            })
        );
    }

    #[test]
    fn the_stored_terms_bound_a_hold_over_the_request_s_limit() {
        let mut sums = UsageSums::default();
        sums.record(70, false, period_starts_micros(now()));
        let mut asked = request(50);
        asked.key_limit = Some(KeyLimit {
            limit_nanos: 1_000,
            reset: None,
            include_byok: false,
        });
        let mut seen = view(&sums, 1_000, 0);
        seen.key_terms = Some(KeyTerms {
            limit: Some(KeyLimit {
                limit_nanos: 100,
                reset: Some(Period::Day),
                include_byok: false,
            }),
            expires_at: None,
        });
        let refused = decide_hold(&asked, seen, now()).outcome();
        assert!(matches!(
            refused,
            ReserveOutcome::KeyLimitReached {
                used_nanos: 70,
                limit_nanos: 100,
                ..
            }
        ));
    }

    #[test]
    fn a_request_settled_first_holds_nothing() {
        let sums = UsageSums::default();
        let mut seen = view(&sums, 0, 0);
        seen.settled = true;
        assert_eq!(
            decide_hold(&request(10), seen, now()),
            HoldDecision::Unchanged(ReserveOutcome::Reserved {
                used_nanos: 0,
                reserved_nanos: 0,
                held_nanos: 0
            })
        );
    }

    #[test]
    fn a_lapse_charges_in_full_and_its_settlement_gives_it_back() {
        let mut sums = UsageSums::default();
        let mut balance_nanos = 1_000;
        let hold = Hold {
            key: "k".into(),
            amount_nanos: 300,
            admitted_at_micros: Some(unix_micros(now())),
            expires_at_micros: unix_micros(now()),
            covered: true,
            lapse_record: None,
        };
        let now_micros = unix_micros(now());
        let (lapse, record) = lapse(
            "acct",
            "r1",
            &hold,
            Charged {
                key_sums: &mut sums,
                balance_nanos: &mut balance_nanos,
            },
            now_micros,
        );
        assert!(record.is_none());
        assert_eq!((sums.total_nanos, balance_nanos), (300, 700));
        let decision = decide_settlement(
            SettledView {
                settled: false,
                hold_admitted_at_micros: None,
                lapse: Some(&lapse),
            },
            now_micros + 1,
        );
        let SettleDecision::Record {
            undo: Some(undo), ..
        } = decision
        else {
            panic!("a known lapse is undone: {decision:?}");
        };
        undo_lapse(
            &undo,
            Charged {
                key_sums: &mut sums,
                balance_nanos: &mut balance_nanos,
            },
        );
        assert_eq!((sums.total_nanos, balance_nanos), (0, 1_000));
        let repeated = decide_settlement(
            SettledView {
                settled: true,
                hold_admitted_at_micros: None,
                lapse: None,
            },
            now_micros,
        );
        assert_eq!(repeated, SettleDecision::Repeated);
    }

    #[test]
    fn a_renewal_never_shortens_and_only_the_holding_key_renews() {
        let extended = decide_renewal(
            RenewedView::Holding {
                on_its_key: true,
                expires_at_micros: 50,
            },
            40,
            10,
        );
        assert_eq!(
            extended,
            RenewDecision::Extend {
                expires_at_micros: 50
            }
        );
        let other_key = decide_renewal(
            RenewedView::Holding {
                on_its_key: false,
                expires_at_micros: 50,
            },
            90,
            10,
        );
        assert_eq!(other_key, RenewDecision::Nothing);
    }

    #[test]
    fn a_top_up_past_the_largest_amount_is_refused_whole() {
        let full = AccountBalance {
            purchased_nanos: i64::MAX - 5,
            balance_nanos: 0,
        };
        assert!(credit(full, 6).is_err());
        assert_eq!(credit(full, 5).unwrap().purchased_nanos, i64::MAX);
    }
}
