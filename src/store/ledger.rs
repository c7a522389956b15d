//! The usage ledger: credits as nano-credits, per key and per account, and
//! reservations for requests in flight.
//!
//! The rules every backend keeps, so that every request that reached an
//! upstream is charged exactly once:
//!
//! - **Admission.** A key's limit, reset and expiry are the store's copy
//!   ([`KeyTerms`], written with every key record), read in the admission's
//!   own step and judged by the store's clock; a request's
//!   [`key_limit`](ReserveRequest::key_limit) (from the instance's cached
//!   record) counts only for a key whose terms were never written. A paid, non-BYOK request is admitted
//!   only when the balance less the account's holds and its own stays at
//!   least zero, and the key's usage in its period plus its holds and its
//!   own stays within its limit. A zero balance refuses paid models; a
//!   negative one refuses every model. BYOK requests are not held against
//!   the balance, only against the key's limit when the key counts BYOK.
//!   When the most the request may cost cannot be paid, the store holds
//!   what can be, refusing only below
//!   [`min_amount_nanos`](ReserveRequest::min_amount_nanos) (the prompt
//!   and one token); the caller bounds the request by what was held. A revoked
//!   key ([`LedgerStore::revoke_key`]) is refused by every later hold.
//! - **A hold lives as long as its request**: its instance renews it
//!   ([`LedgerStore::renew_holds`]). A hold renewed no more lapses: the
//!   first call that finds it expired charges its amount, once (the
//!   account's side on the balance, the key's side on the key's usage, own
//!   when the balance covered it too, else BYOK), with a generation
//!   record ([`lapse_record`]) when the hold asked for one
//!   ([`ReserveRequest::lapse_record`]), and keeps that charge for
//!   [`LAPSED_HOLD_MEMORY`] (a renewal that finds it refreshes it).
//! - **Settling is once per id**: each settlement writes a marker with its
//!   cost, kept [`SETTLEMENT_MEMORY`], longer than a caller retries
//!   ([`SETTLEMENT_RETRY_WINDOW`]). A copy that finds the marker records
//!   nothing; one that finds a lapse's charge replaces it with its own
//!   cost; one that finds neither hold nor marker (a hold the store lost)
//!   records its cost all the same. A late admission of an id already
//!   settled holds nothing. A settlement's generation record is kept in
//!   the same step, only when the settlement is new.
//! - **Top-ups**: [`LedgerStore::top_up_once`] keeps the idempotency key,
//!   the amount and the resulting balance in the credit's own atomic step
//!   for [`IDEMPOTENCY_KEY_TTL_HOURS`], so a retry gets the first answer;
//!   one that would overflow is refused whole. Usage periods only roll
//!   forward.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{Check, CheckOutcome, StoreError};
use crate::clock::Period;

/// One credit in nano-credits: the ledger never stores floats.
pub const NANOS_PER_CREDIT: i64 = 1_000_000_000;

/// The longest a reservation may be held: far beyond any request, and
/// small enough that every expiry instant stays exact.
pub const MAX_RESERVATION_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// A key's credit limit as admission needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyLimit {
    /// The limit in nano-credits.
    pub limit_nanos: i64,
    /// The period after which usage starts again from zero; `None` never resets.
    pub reset: Option<Period>,
    /// Whether usage through the account's own provider keys counts too.
    pub include_byok: bool,
}

/// A request to reserve credits for a request about to be sent upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReserveRequest {
    /// The account that pays.
    pub account: String,
    /// The key (its hash) the request came with.
    pub key: String,
    /// Unique per request; settlement names it.
    pub reservation_id: String,
    /// The estimated maximum cost, held until settled.
    pub amount_nanos: i64,
    /// When set, the least worth holding: the store holds as much of
    /// `amount_nanos` as the key's limit and (with `covered_by_balance`)
    /// the balance leave, and refuses only when that is below this. The
    /// caller then bounds the request by what was held.
    pub min_amount_nanos: Option<i64>,
    /// The key's limit; `None` when the key has none. The key's own terms
    /// ([`LedgerStore::set_key_terms`]), once set, are used instead.
    pub key_limit: Option<KeyLimit>,
    /// Whether the hold counts against the key's limit at all: `false` for
    /// BYOK usage a key's limit leaves out, which neither the request's
    /// limit nor the key's terms then bound.
    pub counts_against_key_limit: bool,
    /// Whether a negative account balance rejects (402 `credits`).
    pub check_balance: bool,
    /// Whether the hold is taken from the account's balance: admitted only
    /// when the balance less every hold of the account's requests in flight
    /// covers it, and then held account-wide until settled.
    pub covered_by_balance: bool,
    /// How long the hold lasts unless renewed ([`LedgerStore::renew_holds`])
    /// or settled. A hold that reaches its expiry unsettled (its instance
    /// died) lapses: it is charged in full, once.
    pub ttl: Duration,
    /// When set, a hold that lapses leaves a generation record saying so
    /// ([`lapse_record`]), kept as these settings say.
    pub lapse_record: Option<RecordKeeping>,
}

/// How a lapse's generation record is kept (for how long, and how many an
/// account keeps at most) and the model it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordKeeping {
    /// How long it is kept: it reads as absent after this and is removed.
    pub retention: Duration,
    /// The most records the account keeps: writing one more removes the
    /// oldest.
    pub max_per_account: u64,
    /// The model the request asked for, which the record names (so a
    /// lapse counts under its model in activity); `None` names none. At
    /// most [`MAX_LAPSE_MODEL_BYTES`] of printable ASCII, without `"` or
    /// `\`, as every model id is.
    pub model: Option<String>,
}

/// The longest model name a lapse record keeps.
pub const MAX_LAPSE_MODEL_BYTES: usize = 256;

/// Whether `model` may be named by a lapse record ([`RecordKeeping::model`]):
/// printable ASCII without `"` or `\`, at most [`MAX_LAPSE_MODEL_BYTES`]
/// (so each store writes it into the record as it is).
pub fn is_lapse_model(model: &str) -> bool {
    model.len() <= MAX_LAPSE_MODEL_BYTES
        && model
            .bytes()
            .all(|byte| byte.is_ascii_graphic() && byte != b'"' && byte != b'\\')
}

/// A key's terms as the store keeps them beside its usage
/// ([`LedgerStore::set_key_terms`]): once set, every admission of the key
/// decides by them, by the store's clock, in place of what the request
/// says (an instance's copy of the key may be a second old).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyTerms {
    /// The key's credit limit; `None` for none.
    pub limit: Option<KeyLimit>,
    /// When the key stops being accepted; `None` never.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A hold to keep while its request is in flight ([`LedgerStore::renew_holds`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldRenewal {
    /// The key (its hash) the request came with.
    pub key: String,
    /// The request's reservation id.
    pub reservation_id: String,
}

/// The generation record a lapsed hold leaves ([`ReserveRequest::lapse_record`]):
/// JSON with the request's id, its charge (the held amount) as
/// `total_cost` and `usage`, `cost_basis` `"lapsed"`, `is_byok`,
/// `lapsed: true`, when it lapsed (`created_at`, RFC 3339), the account
/// (`user_id`), the key (`key_hash`) and, when the hold named one
/// ([`RecordKeeping::model`]), the model the request asked for (`model`).
/// A late settlement of the request replaces it with the full record.
/// Every backend writes the same bytes.
pub fn lapse_record(
    account: &str,
    key: &str,
    reservation_id: &str,
    charged_nanos: i64,
    byok: bool,
    lapsed_at: DateTime<Utc>,
    model: Option<&str>,
) -> bytes::Bytes {
    let cost = credits_text(charged_nanos);
    let created_at = lapsed_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let model = model
        .map(|model| format!(",\"model\":{}", json_string(model)))
        .unwrap_or_default();
    let text = format!(
        "{{\"id\":{},\"total_cost\":{cost},\"usage\":{cost},\"cost_basis\":\"lapsed\",\
         \"is_byok\":{byok},\"lapsed\":true,\"created_at\":{},\"user_id\":{},\"key_hash\":{}{model}}}",
        json_string(&format!("{GENERATION_ID_PREFIX}{reservation_id}")),
        json_string(&created_at),
        json_string(account),
        json_string(key),
    );
    bytes::Bytes::from(text)
}

/// What a generation id starts with, before its reservation id.
pub(crate) const GENERATION_ID_PREFIX: &str = "gen-";

/// Non-negative nano-credits as exact decimal credits: `0.4`, `12`, `0.000000001`.
fn credits_text(nanos: i64) -> String {
    let whole = nanos / NANOS_PER_CREDIT;
    let fraction = nanos % NANOS_PER_CREDIT;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:09}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// What admission decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// Admitted; the amount is now held.
    Reserved {
        /// The key's usage counted against its limit, before this reservation.
        used_nanos: i64,
        /// Credits held by the key's requests in flight, this one included.
        reserved_nanos: i64,
        /// What this request holds: `amount_nanos`, or less (down to
        /// `min_amount_nanos`) when that is all the limit and balance leave.
        held_nanos: i64,
    },
    /// The key's usage plus its reservations has reached its limit.
    KeyLimitReached {
        /// Usage in the period plus reservations in flight.
        used_nanos: i64,
        /// The key's limit.
        limit_nanos: i64,
        /// When the period resets; `None` for a limit that never resets.
        resets_at: Option<DateTime<Utc>>,
    },
    /// The account balance is negative.
    BalanceNegative {
        /// The balance.
        balance_nanos: i64,
    },
    /// The balance, less what the account's requests in flight hold, does
    /// not cover this request (`covered_by_balance`).
    BalanceInsufficient {
        /// The balance.
        balance_nanos: i64,
        /// Held by the account's requests in flight, on every key.
        held_nanos: i64,
    },
    /// The key was revoked ([`LedgerStore::revoke_key`]): no hold of it is
    /// ever granted again.
    KeyRevoked,
    /// The key is past the expiry its terms give ([`LedgerStore::set_key_terms`]),
    /// by the store's clock.
    KeyExpired {
        /// When it expired.
        expired_at: DateTime<Utc>,
    },
}

impl ReserveOutcome {
    /// Whether the request was admitted.
    pub fn is_reserved(&self) -> bool {
        matches!(self, ReserveOutcome::Reserved { .. })
    }
}

/// A request's counter checks and credit hold, decided as one atomic step:
/// admitted only when every check fits and the hold is granted, and then
/// counted in all of them; refused by any, counted in none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmitRequest {
    /// The account: the scope of the checks and the ledger the hold is in.
    pub account: String,
    /// Counters to check and add to (rate rules, free-model quota); names
    /// distinct.
    pub checks: Vec<Check>,
    /// A check whose capacity rises once the account has bought enough.
    pub purchase_tier: Option<PurchaseTier>,
    /// The credit hold, of the same account; `None` for counters only.
    pub hold: Option<ReserveRequest>,
}

/// A check of an [`AdmitRequest`] whose capacity is raised when the
/// account's purchased total has reached a threshold (the free-model daily
/// quota: 50 a day, 1000 once 10 credits were bought). The store reads the
/// purchased total in the same atomic step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PurchaseTier {
    /// The index of the check in [`AdmitRequest::checks`].
    pub check_index: usize,
    /// The purchased total, in nano-credits, from which the raised capacity applies.
    pub threshold_nanos: i64,
    /// The capacity then, in place of the check's own.
    pub raised_capacity: u64,
}

/// What an [`AdmitRequest`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmitOutcome {
    /// Whether every check fit and the hold (if any) was granted, so that
    /// every amount was added and the hold is held.
    pub admitted: bool,
    /// One outcome per check, in order: after adding when admitted,
    /// unchanged otherwise. `limit` is the capacity in force (a purchase
    /// tier's when raised).
    pub checks: Vec<CheckOutcome>,
    /// The hold's outcome; `None` when none was asked or a check refused
    /// first (then the hold was not decided).
    pub hold: Option<ReserveOutcome>,
    /// The instant the store decided at: on Redis, Redis's own clock.
    pub decided_at: DateTime<Utc>,
}

/// The real cost of a finished request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The account that pays.
    pub account: String,
    /// The key (its hash).
    pub key: String,
    /// The reservation to release.
    pub reservation_id: String,
    /// Whether the store granted this reservation a hold: its admission
    /// answered [`ReserveOutcome::Reserved`]. The store records a
    /// settlement the same way either way: once per reservation id within
    /// [`SETTLEMENT_MEMORY`] (its marker is written with its cost), hold or
    /// not, so a hold the store lost with its data (a Redis restart from an
    /// older snapshot, a failover to a replica that had not received it)
    /// still has its cost recorded. The caller retries a settlement for at
    /// most [`SETTLEMENT_RETRY_WINDOW`].
    pub hold_granted: bool,
    /// The cost in nano-credits.
    pub cost_nanos: i64,
    /// Whether the request used the account's own provider key (BYOK): its
    /// cost goes to the BYOK totals and not to the balance.
    pub byok: bool,
    /// The request's generation record, kept with the cost in the same
    /// atomic step (so a record exists exactly when its cost was
    /// recorded, once): readable with [`LedgerStore::generation`].
    pub record: Option<SettlementRecord>,
}

/// A generation record written with its [`Settlement`], under the
/// settlement's reservation id, in the account's ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettlementRecord {
    /// The record (JSON in practice), stored as given.
    pub bytes: bytes::Bytes,
    /// How long it is kept: it reads as absent after this and is removed.
    pub retention: Duration,
    /// The most records the account keeps: writing one more removes the
    /// oldest.
    pub max_per_account: u64,
}

/// The longest a generation record may be kept.
pub const MAX_RECORD_RETENTION: Duration = Duration::from_secs(10 * 365 * 86_400);

/// A key's usage, in nano-credits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyUsage {
    /// All-time usage.
    pub total_nanos: i64,
    /// Usage in the current UTC day.
    pub day_nanos: i64,
    /// Usage in the current UTC week (from Monday).
    pub week_nanos: i64,
    /// Usage in the current UTC month.
    pub month_nanos: i64,
    /// All-time BYOK usage.
    pub byok_total_nanos: i64,
    /// BYOK usage in the current UTC day.
    pub byok_day_nanos: i64,
    /// BYOK usage in the current UTC week.
    pub byok_week_nanos: i64,
    /// BYOK usage in the current UTC month.
    pub byok_month_nanos: i64,
    /// Credits held by requests in flight (unexpired reservations).
    pub reserved_nanos: i64,
}

impl KeyUsage {
    /// Usage in `reset` (all time for `None`), with BYOK when asked.
    pub fn in_period(&self, reset: Option<Period>, include_byok: bool) -> i64 {
        let (own, byok) = match reset {
            None => (self.total_nanos, self.byok_total_nanos),
            Some(Period::Day) => (self.day_nanos, self.byok_day_nanos),
            Some(Period::Week) => (self.week_nanos, self.byok_week_nanos),
            Some(Period::Month) => (self.month_nanos, self.byok_month_nanos),
        };
        if include_byok {
            own.saturating_add(byok)
        } else {
            own
        }
    }
}

/// An account's money, in nano-credits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccountBalance {
    /// Everything ever purchased.
    pub purchased_nanos: i64,
    /// What is left: purchases minus non-BYOK usage.
    pub balance_nanos: i64,
}

/// How long [`LedgerStore::top_up_once`] remembers an idempotency key: a
/// client retrying a purchase within a day (the usual window of payment
/// APIs) is credited once.
pub const IDEMPOTENCY_KEY_TTL_HOURS: u64 = 24;

/// The longest idempotency key, in bytes (visible ASCII: one byte each).
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// Whether `key` may name a purchase for [`LedgerStore::top_up_once`]: 1 to
/// [`MAX_IDEMPOTENCY_KEY_BYTES`] visible ASCII characters (`!` to `~`), so
/// that a UUID or any token a client generates fits, and nothing unbounded
/// is remembered.
pub fn is_valid_idempotency_key(key: &str) -> bool {
    (1..=MAX_IDEMPOTENCY_KEY_BYTES).contains(&key.len())
        && key.bytes().all(|byte| byte.is_ascii_graphic())
}

/// [`IDEMPOTENCY_KEY_TTL_HOURS`] as a duration.
pub(crate) fn idempotency_key_ttl() -> Duration {
    Duration::from_secs(IDEMPOTENCY_KEY_TTL_HOURS * 3600)
}

/// What [`LedgerStore::top_up_once`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopUpOutcome {
    /// The purchase was recorded now; the balance after it.
    Credited(AccountBalance),
    /// The key was used for this amount already: nothing was recorded; the
    /// balance right after that first top-up, so a retry answers as the
    /// first call did.
    Repeated(AccountBalance),
    /// The key was used for another amount: nothing was recorded.
    KeyReused {
        /// The amount the key was first used for.
        first_amount_nanos: i64,
    },
}

impl TopUpOutcome {
    /// The balance after the key's top-up, unless the key was reused for
    /// another amount.
    pub fn balance(&self) -> Option<AccountBalance> {
        match self {
            TopUpOutcome::Credited(balance) | TopUpOutcome::Repeated(balance) => Some(*balance),
            TopUpOutcome::KeyReused { .. } => None,
        }
    }
}

/// A top-up's arguments for [`LedgerStore::top_up_once`].
pub(crate) fn validate_top_up_once(
    amount_nanos: i64,
    idempotency_key: &str,
) -> Result<(), StoreError> {
    validate_amount("top_up", amount_nanos)?;
    if !is_valid_idempotency_key(idempotency_key) {
        return Err(StoreError::invalid(
            "top_up",
            "an idempotency key must be 1 to 255 visible ASCII characters",
        ));
    }
    Ok(())
}

/// The usage ledger.
#[async_trait]
pub trait LedgerStore: Send + Sync + 'static {
    /// Settles `settlements` (as [`settle_many`](Self::settle_many)), then
    /// decides `request` as one atomic step: every counter check fits (a
    /// purchase tier applied) and the hold is granted, or nothing is added
    /// anywhere. All settlements must be of the request's account.
    ///
    /// The hold is refused when the key's usage in its period (plus BYOK
    /// when asked) plus its holds would pass its limit, when asked and the
    /// balance is negative, or, when covered by the balance, when the
    /// balance less the account's holds does not cover it; otherwise as
    /// much of `amount_nanos` is held as they allow (at least
    /// `min_amount_nanos`, or exactly the amount) until settled or expired.
    ///
    /// An error says neither whether the settlements were recorded nor
    /// whether anything was added: settle them again, and release the
    /// reservation (settle it at no cost) if it may have been held.
    async fn admit_after_settling(
        &self,
        settlements: &[Settlement],
        request: &AdmitRequest,
        now: DateTime<Utc>,
    ) -> Result<AdmitOutcome, StoreError>;

    /// [`admit_after_settling`](Self::admit_after_settling) with nothing to settle.
    async fn admit(
        &self,
        request: &AdmitRequest,
        now: DateTime<Utc>,
    ) -> Result<AdmitOutcome, StoreError> {
        self.admit_after_settling(&[], request, now).await
    }

    /// A hold alone, decided as [`admit`](Self::admit) decides one.
    async fn reserve(
        &self,
        request: &ReserveRequest,
        now: DateTime<Utc>,
    ) -> Result<ReserveOutcome, StoreError> {
        self.reserve_after_settling(&[], request, now).await
    }

    /// Records the real cost and releases the reservation, as one atomic step.
    async fn settle(&self, settlement: &Settlement, now: DateTime<Utc>) -> Result<(), StoreError>;

    /// Settles several requests of one account, each exactly as
    /// [`settle`](Self::settle) would (once per reservation id). Settlements
    /// of different accounts are refused, so that a backend can record them
    /// in one step in one place (one Redis Cluster slot).
    ///
    /// On an error, some may have been recorded and others not: settling
    /// all of them again records each exactly once.
    ///
    /// The default settles them one by one; a store that is a round trip
    /// away records them in one call and says so in
    /// [`batches_settlements`](Self::batches_settlements).
    async fn settle_many(
        &self,
        settlements: &[Settlement],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        validate_settlements("settle_many", settlements, None)?;
        for settlement in settlements {
            self.settle(settlement, now).await?;
        }
        Ok(())
    }

    /// Extends every live hold of `holds` (all of `account`) to `ttl` from
    /// now, as one atomic step, and says how many were live. A hold already
    /// settled, lapsed or never granted is left as it is. An instance calls
    /// this for its requests in flight, one call per account, at a fraction
    /// of the hold's lifetime: so a hold lasts as long as its request,
    /// however long, and lapses soon after its instance dies.
    async fn renew_holds(
        &self,
        account: &str,
        holds: &[HoldRenewal],
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError>;

    /// Settles `settlements` and then decides the hold `request`, as
    /// [`admit_after_settling`](Self::admit_after_settling) with no checks.
    async fn reserve_after_settling(
        &self,
        settlements: &[Settlement],
        request: &ReserveRequest,
        now: DateTime<Utc>,
    ) -> Result<ReserveOutcome, StoreError> {
        let admit = AdmitRequest {
            account: request.account.clone(),
            checks: Vec::new(),
            purchase_tier: None,
            hold: Some(request.clone()),
        };
        let outcome = self.admit_after_settling(settlements, &admit, now).await?;
        outcome
            .hold
            .ok_or_else(|| StoreError::corrupt("reserve", "no hold decided"))
    }

    /// Whether [`settle_many`](Self::settle_many) and
    /// [`admit_after_settling`](Self::admit_after_settling) cost one
    /// call to the backend however many settlements they carry, so that
    /// [`CreditGuard`](crate::credit::CreditGuard) saves round trips by
    /// grouping settlements: `true` for [`RedisStore`](super::RedisStore)
    /// and [`SqliteStore`](super::SqliteStore) (one transaction writes the
    /// pages a settlement and the next admission both touch once); `false`
    /// (the default) for [`MemoryStore`](super::MemoryStore), where
    /// grouping would only add waiting. Grouping waits on tokio's timer (a
    /// settlement waits about a millisecond for an admission to carry it),
    /// so a store that says `true` needs a runtime with time enabled.
    fn batches_settlements(&self) -> bool {
        false
    }

    /// The key's usage in the periods containing `now`.
    async fn key_usage(
        &self,
        account: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<KeyUsage, StoreError>;

    /// Records a purchase: the purchased total and the balance rise.
    ///
    /// Each call is a new purchase: a caller that may call twice for the
    /// same purchase (its own retry after an error) uses
    /// [`top_up_once`](Self::top_up_once) with a key of its own. The call
    /// itself is safe to resend: a store across a network gives it a
    /// random key of its own (128 bits) and credits it through the same
    /// atomic step as `top_up_once`, so the same call reaching the store
    /// twice (a lost reply, a connection dropped and resent) is credited
    /// once. An error says nothing of whether it was credited.
    async fn top_up(&self, account: &str, amount_nanos: i64) -> Result<AccountBalance, StoreError>;

    /// Records a purchase once per `idempotency_key` of the account, as one
    /// atomic step: the first top-up with the key credits `amount_nanos`
    /// (as [`top_up`](Self::top_up)) and remembers the amount and the
    /// balance after it for [`IDEMPOTENCY_KEY_TTL_HOURS`]; the same key
    /// again within that time credits nothing and answers
    /// [`TopUpOutcome::Repeated`] with that remembered balance, or
    /// [`TopUpOutcome::KeyReused`] when it names another amount. Keys are
    /// per account: two accounts may use the same one. Past its time a key
    /// is forgotten and credits again.
    ///
    /// The key is 1 to [`MAX_IDEMPOTENCY_KEY_BYTES`] visible ASCII
    /// characters ([`is_valid_idempotency_key`]); others are refused as
    /// invalid. `now` decides the key's expiry (on Redis, as
    /// [`TimeSource`](super::TimeSource) says). A refused overflow
    /// remembers nothing. An error says neither whether the purchase was
    /// recorded nor whether the key was remembered: call again with the
    /// same key, which records it exactly once.
    async fn top_up_once(
        &self,
        account: &str,
        amount_nanos: i64,
        idempotency_key: &str,
        now: DateTime<Utc>,
    ) -> Result<TopUpOutcome, StoreError>;

    /// The account's purchased total and balance.
    async fn account_balance(&self, account: &str) -> Result<AccountBalance, StoreError>;

    /// Keeps `terms` as the key's own, replacing any it had: from the moment
    /// this returns, every admission of the key (on any instance sharing
    /// the store) checks its hold against this limit and refuses the key
    /// past this expiry ([`ReserveOutcome::KeyExpired`]), whatever the
    /// request's [`ReserveRequest::key_limit`] says. Until a key's terms
    /// are first set, the request's limit is used.
    async fn set_key_terms(
        &self,
        account: &str,
        key: &str,
        terms: &KeyTerms,
    ) -> Result<(), StoreError>;

    /// Revokes the key `key` of `account` for good: from the moment this
    /// returns, every hold of the key (so every admission of a chat request
    /// made with it, on any instance sharing the store) is refused with
    /// [`ReserveOutcome::KeyRevoked`], whatever the instance's cache of key
    /// records says. A leaked key is revoked so. Idempotent; holds granted
    /// before stay until settled.
    async fn revoke_key(
        &self,
        account: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// The generation record kept with the settlement `reservation_id` of
    /// `account` ([`Settlement::record`]), while it lives.
    async fn generation(
        &self,
        account: &str,
        reservation_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<bytes::Bytes>, StoreError>;

    /// A page of the account's live generation records, newest first: all
    /// of them, or one key's ([`GenerationsPage`]). Read by index, so a
    /// page costs about the same however many records the account or the
    /// store holds.
    async fn generations_page(
        &self,
        account: &str,
        page: GenerationsPage<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<bytes::Bytes>, StoreError>;

    /// The account's `limit` newest live generation records, newest first.
    async fn recent_generations(
        &self,
        account: &str,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<bytes::Bytes>, StoreError> {
        self.generations_page(account, GenerationsPage::newest(limit), now)
            .await
    }
}

/// Which of an account's generation records [`LedgerStore::generations_page`]
/// reads: newest first, only `key`'s when it names one, the first `skip`
/// passed over, then at most `limit`. Records past the account's cap
/// (`max_per_account`) are never read, whichever key made them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenerationsPage<'a> {
    /// The key (its hash) whose records are read; `None`: every key's.
    pub key: Option<&'a str>,
    /// How many of the newest (of `key`'s) to pass over.
    pub skip: usize,
    /// How many to read at most.
    pub limit: usize,
}

impl GenerationsPage<'_> {
    /// The account's `limit` newest, of any key.
    pub fn newest(limit: usize) -> Self {
        GenerationsPage {
            key: None,
            skip: 0,
            limit,
        }
    }
}

/// An admission's arguments: its checks, its tier and its hold, all of its
/// account, and its settlements too.
pub(crate) fn validate_admit(
    settlements: &[Settlement],
    request: &AdmitRequest,
) -> Result<(), StoreError> {
    const OPERATION: &str = "admit";
    super::counter::validate_checks(OPERATION, &request.checks)?;
    if let Some(tier) = request.purchase_tier {
        let Some(check) = request.checks.get(tier.check_index) else {
            return Err(StoreError::invalid(
                OPERATION,
                "purchase_tier names a check that is not there",
            ));
        };
        if tier.raised_capacity > super::MAX_EXACT
            || !matches!(
                check.limit,
                super::Limit::FixedWindow { .. }
                    | super::Limit::Calendar { .. }
                    | super::Limit::Rolling { .. }
            )
        {
            return Err(StoreError::invalid(
                OPERATION,
                "purchase_tier raises a window's capacity, at most 2^53",
            ));
        }
    }
    if let Some(hold) = &request.hold {
        validate_reserve(hold)?;
        if hold.account != request.account {
            return Err(StoreError::invalid(
                OPERATION,
                "the hold must be of the admission's account",
            ));
        }
    }
    validate_settlements(OPERATION, settlements, Some(&request.account))
}

pub(crate) fn validate_reserve(request: &ReserveRequest) -> Result<(), StoreError> {
    if request.amount_nanos < 0 {
        return Err(StoreError::invalid(
            "reserve",
            "amount_nanos must not be negative",
        ));
    }
    if request
        .min_amount_nanos
        .is_some_and(|min| min < 0 || min > request.amount_nanos)
    {
        return Err(StoreError::invalid(
            "reserve",
            "min_amount_nanos must be from 0 to amount_nanos",
        ));
    }
    if request.key_limit.is_some_and(|limit| limit.limit_nanos < 0) {
        return Err(StoreError::invalid(
            "reserve",
            "limit_nanos must not be negative",
        ));
    }
    validate_renewals(request.ttl)?;
    if let Some(keeping) = &request.lapse_record {
        if keeping
            .model
            .as_deref()
            .is_some_and(|model| !is_lapse_model(model))
        {
            return Err(StoreError::invalid(
                "reserve",
                "a lapse record's model must be printable ASCII without quotes or backslashes, at most 256 bytes",
            ));
        }
        validate_record(
            "reserve",
            Some(&SettlementRecord {
                bytes: bytes::Bytes::new(),
                retention: keeping.retention,
                max_per_account: keeping.max_per_account,
            }),
        )?;
    }
    Ok(())
}

/// A key's terms: a limit that is not negative.
pub(crate) fn validate_key_terms(terms: &KeyTerms) -> Result<(), StoreError> {
    if terms.limit.is_some_and(|limit| limit.limit_nanos < 0) {
        return Err(StoreError::invalid(
            "set_key_terms",
            "limit_nanos must not be negative",
        ));
    }
    Ok(())
}

/// A hold's lifetime: positive and at most [`MAX_RESERVATION_TTL`].
pub(crate) fn validate_renewals(ttl: Duration) -> Result<(), StoreError> {
    if ttl.is_zero() || ttl > MAX_RESERVATION_TTL {
        return Err(StoreError::invalid(
            "reserve",
            "ttl must be positive and at most a year",
        ));
    }
    Ok(())
}

/// Settlements to record together: no negative cost, and all of one
/// account (`account` when given, else the first's).
pub(crate) fn validate_settlements(
    operation: &'static str,
    settlements: &[Settlement],
    account: Option<&str>,
) -> Result<(), StoreError> {
    let Some(account) = account.or_else(|| settlements.first().map(|s| s.account.as_str())) else {
        return Ok(());
    };
    for settlement in settlements {
        validate_amount(operation, settlement.cost_nanos)?;
        validate_record(operation, settlement.record.as_ref())?;
        if settlement.account != account {
            return Err(StoreError::invalid(
                operation,
                "settlements recorded together must all be of one account",
            ));
        }
    }
    Ok(())
}

/// A settlement's record: kept for a time above zero and within
/// [`MAX_RECORD_RETENTION`], at least one per account.
pub(crate) fn validate_record(
    operation: &'static str,
    record: Option<&SettlementRecord>,
) -> Result<(), StoreError> {
    match record {
        Some(record)
            if record.retention.is_zero()
                || record.retention > MAX_RECORD_RETENTION
                || record.max_per_account == 0 =>
        {
            Err(StoreError::invalid(
                operation,
                "a generation record must be kept above zero and at most ten years, \
                 with room for at least one per account",
            ))
        }
        _ => Ok(()),
    }
}

pub(crate) fn validate_amount(
    operation: &'static str,
    amount_nanos: i64,
) -> Result<(), StoreError> {
    if amount_nanos < 0 {
        return Err(StoreError::invalid(
            operation,
            "amount must not be negative",
        ));
    }
    Ok(())
}

/// A purchase that would take the purchased total or the balance past
/// `i64::MAX` nano-credits is refused whole, on every backend.
pub(crate) fn top_up_overflow() -> StoreError {
    StoreError::invalid(
        "top_up",
        "the purchased total or balance would exceed the largest amount a ledger holds",
    )
}

/// How long a caller retries a settlement that failed (or whose reply was
/// lost) before giving it up. A settlement given up stops its hold's
/// renewals: the hold lapses and is charged in full, so a cost the store
/// never took is overcharged, never lost.
pub const SETTLEMENT_RETRY_WINDOW: Duration = Duration::from_secs(2 * 60);

/// How long a settlement's marker is kept: the store records each
/// reservation id once within this time, however often its settlement
/// comes. Longer than [`SETTLEMENT_RETRY_WINDOW`] by a minute, for clocks
/// that run at slightly different rates and a last attempt in flight.
pub const SETTLEMENT_MEMORY: Duration = Duration::from_secs(3 * 60);

/// How long a lapsed hold (one that reached its expiry unsettled, and was
/// charged in full) is known: the first settlement of its id within that
/// time replaces the lapse's charge with its own cost. Only holds that
/// lapse are kept this way: the memory is for requests of an instance that
/// died, or cut off from the store for longer than their hold.
pub const LAPSED_HOLD_MEMORY: Duration = Duration::from_secs(24 * 3600);
