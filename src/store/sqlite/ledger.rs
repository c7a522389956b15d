//! The ledger in SQLite: the rules' decisions (`store::rules::ledger`) over
//! rows, each call one job of the store's thread (so one atomic step, exact
//! across processes sharing the file).
//!
//! Tables (every amount in nano-credits, every instant in µs):
//! - `ledger_accounts`: per account, the balance, purchased total, the sum
//!   of the live holds the balance covers (exact, as decimal text), the
//!   earliest live hold's expiry, the generation records' cap (the last
//!   asked) and when it is next tidied.
//! - `ledger_keys`: per key, its usage all time and per day, week and
//!   month (with each period's start), the sum of its live holds, its
//!   terms once set, and whether it is revoked.
//! - `ledger_requests`: per request id, `H` while it holds (amount, whether
//!   the balance covers it, how its lapse's record is kept, its expiry),
//!   `S` once settled (its marker, until it is forgotten) or `L` once its
//!   hold lapsed (what the lapse charged, until forgotten). An `H` row may
//!   also carry the lapse it was admitted again over, for its settlement
//!   to undo.
//! - `ledger_generations`: the generation records with their expiries.
//! - `ledger_top_ups`: the idempotency keys of recent top-ups.
//!
//! What is forgotten (markers, lapses, records past their time) reads as
//! gone at once and is deleted a minute later, at most ten times a second
//! per account, as the other stores do.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::records::sql_count;
use super::{SqliteStore, counters, sql};
use crate::clock::{Period, unix_micros};
use crate::store::counter::duration_micros;
use crate::store::ledger::{
    idempotency_key_ttl, validate_admit, validate_amount, validate_key_terms, validate_renewals,
    validate_settlements, validate_top_up_once,
};
use crate::store::rules::ledger::{
    self as rules, Charged, Hold, HoldDecision, HoldView, Lapse, PeriodSums, RenewDecision,
    RenewedView, SettleDecision, SettledView, UsageSums, decide_hold, decide_renewal,
    decide_settlement, instant, key_refusal, period_starts_micros, tiered_checks,
};
use crate::store::{
    AccountBalance, AdmitOutcome, AdmitRequest, GenerationsPage, HoldRenewal, KeyLimit, KeyTerms,
    KeyUsage, LedgerStore, RecordKeeping, ReserveOutcome, ReserveRequest, Settlement, StoreError,
    TopUpOutcome,
};

/// The ledger's tables.
pub(super) const SCHEMA: &str = "
CREATE TABLE ledger_accounts (
    account TEXT PRIMARY KEY,
    balance_nanos INTEGER NOT NULL,
    purchased_nanos INTEGER NOT NULL,
    held_nanos TEXT NOT NULL,
    next_expiry_micros INTEGER,
    records_most INTEGER,
    records_count INTEGER NOT NULL,
    tidy_at_micros INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE ledger_keys (
    account TEXT NOT NULL,
    key TEXT NOT NULL,
    total_nanos INTEGER NOT NULL,
    byok_total_nanos INTEGER NOT NULL,
    day_start_micros INTEGER NOT NULL,
    day_nanos INTEGER NOT NULL,
    day_byok_nanos INTEGER NOT NULL,
    week_start_micros INTEGER NOT NULL,
    week_nanos INTEGER NOT NULL,
    week_byok_nanos INTEGER NOT NULL,
    month_start_micros INTEGER NOT NULL,
    month_nanos INTEGER NOT NULL,
    month_byok_nanos INTEGER NOT NULL,
    held_nanos TEXT NOT NULL,
    terms_set INTEGER NOT NULL,
    terms_limit_nanos INTEGER,
    terms_reset INTEGER,
    terms_include_byok INTEGER NOT NULL,
    terms_expires_at_micros INTEGER,
    revoked INTEGER NOT NULL,
    PRIMARY KEY (account, key)
) WITHOUT ROWID;
CREATE TABLE ledger_requests (
    account TEXT NOT NULL,
    id TEXT NOT NULL,
    state TEXT NOT NULL,
    key TEXT NOT NULL,
    at_micros INTEGER NOT NULL,
    amount_nanos INTEGER NOT NULL,
    covered INTEGER NOT NULL,
    record_retention_micros INTEGER,
    record_most INTEGER,
    lapse_forget_at_micros INTEGER,
    lapse_key TEXT,
    lapse_amount_nanos INTEGER,
    lapse_byok INTEGER,
    lapse_day_start_micros INTEGER,
    lapse_week_start_micros INTEGER,
    lapse_month_start_micros INTEGER,
    admitted_at_micros INTEGER,
    record_model TEXT,
    PRIMARY KEY (account, id)
) WITHOUT ROWID;
CREATE INDEX ledger_requests_by_time ON ledger_requests (account, state, at_micros);
CREATE TABLE ledger_generations (
    account TEXT NOT NULL,
    id TEXT NOT NULL,
    record TEXT NOT NULL,
    expires_at_micros INTEGER NOT NULL,
    key_hash TEXT,
    PRIMARY KEY (account, id)
);
CREATE INDEX ledger_generations_by_expiry ON ledger_generations (account, expires_at_micros, id);
CREATE INDEX ledger_generations_by_key ON ledger_generations (account, key_hash, expires_at_micros, id);
CREATE TABLE ledger_top_ups (
    account TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    amount_nanos INTEGER NOT NULL,
    purchased_after_nanos INTEGER NOT NULL,
    balance_after_nanos INTEGER NOT NULL,
    forget_at_micros INTEGER NOT NULL,
    PRIMARY KEY (account, idempotency_key)
) WITHOUT ROWID;
CREATE INDEX ledger_top_ups_by_time ON ledger_top_ups (account, forget_at_micros);
";

/// Schema 2: a hold remembers when it was admitted (`NULL` in the rows of
/// holds schema 1 wrote).
pub(super) const SCHEMA_2: &str = "
ALTER TABLE ledger_requests ADD COLUMN admitted_at_micros INTEGER;
";

/// Schema 3: each generation record names its key, indexed, so that a
/// key's page is read without walking the account's other records (the
/// records schema 2 wrote get theirs from the record); a hold keeps the
/// model its lapse record names.
pub(super) const SCHEMA_3: &str = "
ALTER TABLE ledger_requests ADD COLUMN record_model TEXT;
ALTER TABLE ledger_generations ADD COLUMN key_hash TEXT;
UPDATE ledger_generations SET key_hash = json_extract(record, '$.key_hash')
    WHERE json_valid(record);
CREATE INDEX ledger_generations_by_key ON ledger_generations (account, key_hash, expires_at_micros, id);
";

/// How often an account's forgotten rows are deleted, at most.
const TIDY_INTERVAL_MICROS: i64 = 100_000;
/// How long what is forgotten stays, unseen, before it is deleted: a clock
/// that steps back less than that finds what it found before.
const FORGOTTEN_KEPT_MICROS: i64 = 60_000_000;
/// The most rows one tidy deletes of each kind: bounds a call's work (a
/// thousand at once held the store's other calls off for milliseconds).
const TIDY_BATCH: i64 = 200;
/// How soon an account is tidied again when the last tidy found a whole
/// batch: up to 20,000 rows of each kind a second, in small steps.
const TIDY_BEHIND_MICROS: i64 = 10_000;

fn saturate(nanos: i128) -> i64 {
    i64::try_from(nanos).unwrap_or(if nanos < 0 { i64::MIN } else { i64::MAX })
}

fn period_code(period: Option<Period>) -> Option<i64> {
    period.map(|period| match period {
        Period::Day => 0,
        Period::Week => 1,
        Period::Month => 2,
    })
}

fn period_of(code: Option<i64>) -> Option<Period> {
    match code? {
        0 => Some(Period::Day),
        1 => Some(Period::Week),
        _ => Some(Period::Month),
    }
}

/// A record's bytes, whether kept as text or as a blob.
fn record_bytes(row: &rusqlite::Row<'_>) -> rusqlite::Result<Vec<u8>> {
    Ok(row.get_ref(0)?.as_bytes()?.to_vec())
}

fn held(text: String) -> i128 {
    text.parse().unwrap_or(0)
}

/// An account's row.
#[derive(Debug, Clone)]
struct AccountRow {
    balance_nanos: i64,
    purchased_nanos: i64,
    held_nanos: i128,
    next_expiry_micros: Option<i64>,
    records_most: Option<i64>,
    /// How many generation records the account has, those past their
    /// time or the cap not yet removed included: the cap is applied
    /// without counting them.
    records_count: i64,
    tidy_at_micros: i64,
}

impl Default for AccountRow {
    fn default() -> Self {
        AccountRow {
            balance_nanos: 0,
            purchased_nanos: 0,
            held_nanos: 0,
            next_expiry_micros: None,
            records_most: None,
            records_count: 0,
            tidy_at_micros: i64::MIN,
        }
    }
}

/// A key's row.
#[derive(Debug, Clone, Default)]
struct KeyRow {
    sums: UsageSums,
    held_nanos: i128,
    terms: Option<KeyTerms>,
    revoked: bool,
    dirty: bool,
}

impl KeyRow {
    fn usage(&self, starts: [i64; 3]) -> KeyUsage {
        self.sums.usage(starts, saturate(self.held_nanos))
    }
}

/// A request's row.
#[derive(Debug, Clone)]
enum Request {
    Holding {
        hold: Hold,
        /// The lapse it was admitted again over.
        earlier: Option<Lapse>,
    },
    Settled {
        forget_at_micros: i64,
    },
    Lapsed(Lapse),
}

/// One ledger call on one account, inside the store's transaction: rows
/// read once, the account's and keys' rows written when it ends. Time is
/// what each step is given: the store's `now`, never the system clock.
struct Call<'c> {
    db: &'c Connection,
    account: String,
    row: AccountRow,
    /// Whether the account has a row (or the call gives it one).
    exists: bool,
    row_dirty: bool,
    keys: HashMap<String, KeyRow>,
}

const OPERATION: &str = "ledger";

impl<'c> Call<'c> {
    fn begin(db: &'c Connection, account: &str) -> Result<Self, StoreError> {
        let row = db
            .prepare_cached(
                "SELECT balance_nanos, purchased_nanos, held_nanos, next_expiry_micros,
                        records_most, records_count, tidy_at_micros
                 FROM ledger_accounts WHERE account = ?1",
            )
            .and_then(|mut statement| {
                statement
                    .query_row([account], |row| {
                        Ok(AccountRow {
                            balance_nanos: row.get(0)?,
                            purchased_nanos: row.get(1)?,
                            held_nanos: held(row.get(2)?),
                            next_expiry_micros: row.get(3)?,
                            records_most: row.get(4)?,
                            records_count: row.get(5)?,
                            tidy_at_micros: row.get(6)?,
                        })
                    })
                    .optional()
            })
            .map_err(sql(OPERATION))?;
        Ok(Call {
            db,
            account: account.to_owned(),
            exists: row.is_some(),
            row: row.unwrap_or_default(),
            row_dirty: false,
            keys: HashMap::new(),
        })
    }

    fn key(&mut self, key: &str) -> Result<&mut KeyRow, StoreError> {
        if !self.keys.contains_key(key) {
            let row = self
                .db
                .prepare_cached(
                    "SELECT total_nanos, byok_total_nanos,
                            day_start_micros, day_nanos, day_byok_nanos,
                            week_start_micros, week_nanos, week_byok_nanos,
                            month_start_micros, month_nanos, month_byok_nanos,
                            held_nanos, terms_set, terms_limit_nanos, terms_reset,
                            terms_include_byok, terms_expires_at_micros, revoked
                     FROM ledger_keys WHERE account = ?1 AND key = ?2",
                )
                .and_then(|mut statement| {
                    statement
                        .query_row([self.account.as_str(), key], |row| {
                            let period = |at: usize| -> rusqlite::Result<PeriodSums> {
                                Ok(PeriodSums {
                                    start_micros: row.get(at)?,
                                    nanos: row.get(at + 1)?,
                                    byok_nanos: row.get(at + 2)?,
                                })
                            };
                            let terms_set: bool = row.get(12)?;
                            let limit_nanos: Option<i64> = row.get(13)?;
                            let terms = terms_set.then(|| -> rusqlite::Result<KeyTerms> {
                                Ok(KeyTerms {
                                    limit: match limit_nanos {
                                        Some(limit_nanos) => Some(KeyLimit {
                                            limit_nanos,
                                            reset: period_of(row.get(14)?),
                                            include_byok: row.get(15)?,
                                        }),
                                        None => None,
                                    },
                                    expires_at: row.get::<_, Option<i64>>(16)?.map(instant),
                                })
                            });
                            Ok(KeyRow {
                                sums: UsageSums {
                                    total_nanos: row.get(0)?,
                                    byok_total_nanos: row.get(1)?,
                                    periods: [period(2)?, period(5)?, period(8)?],
                                },
                                held_nanos: held(row.get(11)?),
                                terms: terms.transpose()?,
                                revoked: row.get(17)?,
                                dirty: false,
                            })
                        })
                        .optional()
                })
                .map_err(sql(OPERATION))?;
            self.keys.insert(key.to_owned(), row.unwrap_or_default());
        }
        Ok(self.keys.get_mut(key).expect("inserted above"))
    }

    /// The key's usage and the account's balance, for the rules to charge.
    fn charged(&mut self, key: &str) -> Result<Charged<'_>, StoreError> {
        self.key(key)?;
        let row = self.keys.get_mut(key).expect("read above");
        row.dirty = true;
        self.row_dirty = true;
        Ok(Charged {
            key_sums: &mut row.sums,
            balance_nanos: &mut self.row.balance_nanos,
        })
    }

    fn request(&self, id: &str) -> Result<Option<Request>, StoreError> {
        self.db
            .prepare_cached(
                "SELECT state, key, at_micros, amount_nanos, covered, record_retention_micros,
                        record_most, lapse_forget_at_micros, lapse_key, lapse_amount_nanos,
                        lapse_byok, lapse_day_start_micros, lapse_week_start_micros,
                        lapse_month_start_micros, admitted_at_micros, record_model
                 FROM ledger_requests WHERE account = ?1 AND id = ?2",
            )
            .and_then(|mut statement| {
                statement
                    .query_row([self.account.as_str(), id], |row| {
                        let state: String = row.get(0)?;
                        let lapse = match row.get::<_, Option<i64>>(7)? {
                            Some(forget_at_micros) => Some(Lapse {
                                forget_at_micros,
                                key: row.get::<_, String>(8)?.into(),
                                amount_nanos: row.get(9)?,
                                byok: row.get(10)?,
                                starts: [row.get(11)?, row.get(12)?, row.get(13)?],
                            }),
                            None => None,
                        };
                        let at_micros: i64 = row.get(2)?;
                        Ok(match state.as_str() {
                            "H" => {
                                let retention: Option<i64> = row.get(5)?;
                                let most: Option<i64> = row.get(6)?;
                                let model: Option<String> = row.get(15)?;
                                Request::Holding {
                                    hold: Hold {
                                        key: row.get::<_, String>(1)?.into(),
                                        admitted_at_micros: row.get(14)?,
                                        expires_at_micros: at_micros,
                                        amount_nanos: row.get(3)?,
                                        covered: row.get(4)?,
                                        lapse_record: retention.zip(most).map(
                                            |(retention_micros, most)| RecordKeeping {
                                                retention: Duration::from_micros(
                                                    retention_micros.max(0) as u64,
                                                ),
                                                max_per_account: most.max(0) as u64,
                                                model: model.clone(),
                                            },
                                        ),
                                    },
                                    earlier: lapse,
                                }
                            }
                            "S" => Request::Settled {
                                forget_at_micros: at_micros,
                            },
                            _ => match lapse {
                                Some(lapse) => Request::Lapsed(lapse),
                                None => Request::Settled {
                                    forget_at_micros: i64::MIN,
                                },
                            },
                        })
                    })
                    .optional()
            })
            .map_err(sql(OPERATION))
    }

    fn put_request(&self, id: &str, request: &Request) -> Result<(), StoreError> {
        let none = None::<i64>;
        let admitted_at_micros = match request {
            Request::Holding { hold, .. } => hold.admitted_at_micros,
            _ => None,
        };
        let (state, key, at_micros, amount_nanos, covered, record, lapse) = match request {
            Request::Holding { hold, earlier } => (
                "H",
                &*hold.key,
                hold.expires_at_micros,
                hold.amount_nanos,
                hold.covered,
                hold.lapse_record.as_ref().map(|keeping| {
                    (
                        duration_micros(keeping.retention),
                        i64::try_from(keeping.max_per_account).unwrap_or(i64::MAX),
                        keeping.model.as_deref(),
                    )
                }),
                earlier.as_ref(),
            ),
            Request::Settled { forget_at_micros } => {
                ("S", "", *forget_at_micros, 0, false, None, None)
            }
            Request::Lapsed(lapse) => (
                "L",
                &*lapse.key,
                lapse.forget_at_micros,
                lapse.amount_nanos,
                false,
                None,
                Some(lapse),
            ),
        };
        self.db
            .prepare_cached(
                "INSERT INTO ledger_requests
                     (account, id, state, key, at_micros, amount_nanos, covered,
                  record_retention_micros, record_most, lapse_forget_at_micros, lapse_key,
                  lapse_amount_nanos, lapse_byok, lapse_day_start_micros,
                  lapse_week_start_micros, lapse_month_start_micros, admitted_at_micros,
                  record_model)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)
                     ON CONFLICT (account, id) DO UPDATE SET state = excluded.state, key = excluded.key, at_micros = excluded.at_micros, amount_nanos = excluded.amount_nanos, covered = excluded.covered, record_retention_micros = excluded.record_retention_micros, record_most = excluded.record_most, lapse_forget_at_micros = excluded.lapse_forget_at_micros, lapse_key = excluded.lapse_key, lapse_amount_nanos = excluded.lapse_amount_nanos, lapse_byok = excluded.lapse_byok, lapse_day_start_micros = excluded.lapse_day_start_micros, lapse_week_start_micros = excluded.lapse_week_start_micros, lapse_month_start_micros = excluded.lapse_month_start_micros, admitted_at_micros = excluded.admitted_at_micros, record_model = excluded.record_model",
            )
            .and_then(|mut statement| {
                statement.execute(params![
                    self.account,
                    id,
                    state,
                    key,
                    at_micros,
                    amount_nanos,
                    covered,
                    record.map(|(retention, _, _)| retention),
                    record.map(|(_, most, _)| most),
                    lapse.map(|lapse| lapse.forget_at_micros),
                    lapse.map(|lapse| &*lapse.key),
                    lapse.map(|lapse| lapse.amount_nanos),
                    lapse.map(|lapse| lapse.byok),
                    lapse.map_or(none, |lapse| Some(lapse.starts[0])),
                    lapse.map_or(none, |lapse| Some(lapse.starts[1])),
                    lapse.map_or(none, |lapse| Some(lapse.starts[2])),
                    admitted_at_micros,
                    record.and_then(|(_, _, model)| model),
                ])
            })
            .map_err(sql(OPERATION))?;
        Ok(())
    }

    /// Takes a live hold off its key's and (when it covers it) the
    /// account's sums.
    fn release(&mut self, hold: &Hold) -> Result<(), StoreError> {
        let row = self.key(&hold.key)?;
        row.held_nanos -= i128::from(hold.amount_nanos);
        row.dirty = true;
        if hold.covered {
            self.row.held_nanos -= i128::from(hold.amount_nanos);
            self.row_dirty = true;
        }
        Ok(())
    }

    /// Lapses every hold of the account that has reached its expiry
    /// unsettled, in the order of their expiries (then ids), as the rules
    /// charge a lapse, keeping each as lapsed for a late settlement.
    fn lapse_expired(&mut self, now_micros: i64) -> Result<(), StoreError> {
        if self
            .row
            .next_expiry_micros
            .is_none_or(|next| next > now_micros)
        {
            return Ok(());
        }
        let expired: Vec<String> = self
            .db
            .prepare_cached(
                "SELECT id FROM ledger_requests
                 WHERE account = ?1 AND state = 'H' AND at_micros <= ?2
                 ORDER BY at_micros, id",
            )
            .and_then(|mut statement| {
                statement
                    .query_map(params![self.account, now_micros], |row| row.get(0))?
                    .collect()
            })
            .map_err(sql(OPERATION))?;
        for id in expired {
            let Some(Request::Holding { hold, .. }) = self.request(&id)? else {
                continue;
            };
            self.release(&hold)?;
            let account = self.account.clone();
            let (lapse, record) =
                rules::lapse(&account, &id, &hold, self.charged(&hold.key)?, now_micros);
            if let Some(record) = record {
                self.keep_generation(
                    &id,
                    &hold.key,
                    &record.bytes,
                    duration_micros(record.retention),
                    i64::try_from(record.max_per_account).unwrap_or(i64::MAX),
                    now_micros,
                )?;
            }
            // A lapse it was admitted again over gives way to this one.
            self.put_request(&id, &Request::Lapsed(lapse))?;
        }
        self.row.next_expiry_micros = self
            .db
            .prepare_cached(
                "SELECT MIN(at_micros) FROM ledger_requests WHERE account = ?1 AND state = 'H'",
            )
            .and_then(|mut statement| statement.query_row([&self.account], |row| row.get(0)))
            .map_err(sql(OPERATION))?;
        self.row_dirty = true;
        Ok(())
    }

    /// Removes the generation record of `id`, if it has one.
    fn remove_generation(&mut self, id: &str) -> Result<(), StoreError> {
        let removed = self
            .db
            .prepare_cached("DELETE FROM ledger_generations WHERE account = ?1 AND id = ?2")
            .and_then(|mut statement| statement.execute([self.account.as_str(), id]))
            .map_err(sql(OPERATION))?;
        self.count_removed_records(removed);
        Ok(())
    }

    fn count_removed_records(&mut self, removed: usize) {
        if removed > 0 {
            self.row.records_count = self.row.records_count.saturating_sub(removed as i64);
            self.row_dirty = true;
        }
    }

    /// Records `settlement` once per reservation id and releases its hold,
    /// as the rules decide.
    fn settle(&mut self, settlement: &Settlement, now_micros: i64) -> Result<(), StoreError> {
        let id = settlement.reservation_id.as_str();
        let (settled, hold_admitted_at_micros, lapse) = match self.request(id)? {
            Some(Request::Settled { forget_at_micros }) => {
                (forget_at_micros > now_micros, None, None)
            }
            Some(Request::Holding { hold, earlier }) => {
                self.release(&hold)?;
                (false, hold.admitted_at_micros, earlier)
            }
            Some(Request::Lapsed(lapse)) => (false, None, Some(lapse)),
            None => (false, None, None),
        };
        let view = SettledView {
            settled,
            hold_admitted_at_micros,
            lapse: lapse.as_ref(),
        };
        let SettleDecision::Record {
            undo,
            charge_starts,
            marker_until_micros,
        } = decide_settlement(view, now_micros)
        else {
            return Ok(());
        };
        if let Some(lapse) = undo {
            rules::undo_lapse(&lapse, self.charged(&lapse.key)?);
            self.remove_generation(id)?;
        }
        rules::charge(
            settlement.cost_nanos,
            settlement.byok,
            self.charged(&settlement.key)?,
            charge_starts,
        );
        if let Some(record) = &settlement.record {
            self.keep_generation(
                id,
                &settlement.key,
                &record.bytes,
                duration_micros(record.retention),
                i64::try_from(record.max_per_account).unwrap_or(i64::MAX),
                now_micros,
            )?;
        }
        self.put_request(
            id,
            &Request::Settled {
                forget_at_micros: marker_until_micros,
            },
        )
    }

    fn keep_generation(
        &mut self,
        id: &str,
        key: &str,
        bytes: &[u8],
        retention_micros: i64,
        most: i64,
        now_micros: i64,
    ) -> Result<(), StoreError> {
        // Its earlier record, if any, goes first, so that the count holds.
        self.remove_generation(id)?;
        self.db
            .prepare_cached(
                "INSERT INTO ledger_generations (account, id, record, expires_at_micros, key_hash)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut statement| {
                // As text, so that SQLite's JSON functions read it (they
                // take a blob for their own binary form); bytes that are
                // not UTF-8, which the gateway never writes, stay a blob.
                let record = match std::str::from_utf8(bytes) {
                    Ok(text) => rusqlite::types::Value::Text(text.to_owned()),
                    Err(_) => rusqlite::types::Value::Blob(bytes.to_vec()),
                };
                statement.execute(params![
                    self.account,
                    id,
                    record,
                    now_micros.saturating_add(retention_micros),
                    key
                ])
            })
            .map_err(sql(OPERATION))?;
        self.row.records_most = Some(most);
        self.row.records_count = self.row.records_count.saturating_add(1);
        self.row_dirty = true;
        Ok(())
    }

    /// Extends `renewal`'s live hold to `expires_at_micros` or keeps a
    /// lapsed one's charge known, as the rules decide. Whether it was live.
    fn renew(
        &mut self,
        renewal: &HoldRenewal,
        expires_at_micros: i64,
        now_micros: i64,
    ) -> Result<bool, StoreError> {
        let id = renewal.reservation_id.as_str();
        let request = self.request(id)?;
        let view = match &request {
            Some(Request::Holding { hold, .. }) => RenewedView::Holding {
                on_its_key: *hold.key == *renewal.key,
                expires_at_micros: hold.expires_at_micros,
            },
            Some(Request::Lapsed(lapse)) => RenewedView::Lapsed {
                on_its_key: *lapse.key == *renewal.key,
                lapse,
            },
            _ => RenewedView::Other,
        };
        let decision = decide_renewal(view, expires_at_micros, now_micros);
        match (decision, request) {
            (
                RenewDecision::Extend { expires_at_micros },
                Some(Request::Holding { mut hold, earlier }),
            ) if hold.expires_at_micros != expires_at_micros => {
                hold.expires_at_micros = expires_at_micros;
                self.put_request(id, &Request::Holding { hold, earlier })?;
            }
            (RenewDecision::KeepLapse { forget_at_micros }, Some(Request::Lapsed(mut lapse))) => {
                lapse.forget_at_micros = forget_at_micros;
                self.put_request(id, &Request::Lapsed(lapse))?;
            }
            _ => {}
        }
        Ok(decision.renewed())
    }

    /// Decides the hold `request` by the rules, and keeps it when granted.
    fn hold(
        &mut self,
        request: &ReserveRequest,
        now: DateTime<Utc>,
    ) -> Result<ReserveOutcome, StoreError> {
        let id = request.reservation_id.as_str();
        let previous = self.request(id)?;
        let now_micros = unix_micros(now);
        // The hold of the same id this one would replace.
        let replaced = match &previous {
            Some(Request::Holding { hold, .. }) => Some(hold.clone()),
            _ => None,
        };
        let account_held_nanos = if request.covered_by_balance {
            let mut held = self.row.held_nanos;
            if let Some(replaced) = replaced.as_ref().filter(|hold| hold.covered) {
                held -= i128::from(replaced.amount_nanos);
            }
            saturate(held)
        } else {
            0
        };
        let own_held_on_key_nanos = replaced
            .as_ref()
            .filter(|hold| *hold.key == *request.key)
            .map_or(0, |hold| hold.amount_nanos);
        let settled = matches!(previous, Some(Request::Settled { forget_at_micros }) if forget_at_micros > now_micros);
        let balance_nanos = self.row.balance_nanos;
        let key = self.key(&request.key)?;
        let view = HoldView {
            balance_nanos,
            account_held_nanos,
            key_sums: &key.sums,
            key_held_nanos: saturate(key.held_nanos - i128::from(own_held_on_key_nanos)),
            own_held_on_key_nanos,
            key_terms: key.terms,
            settled,
        };
        let (outcome, hold) = match decide_hold(request, view, now) {
            HoldDecision::Unchanged(outcome) => return Ok(outcome),
            HoldDecision::Granted { outcome, hold } => (outcome, hold),
        };
        // Granted: the hold it replaces is released; a lapse it is admitted
        // again over stays known for its settlement.
        let earlier = match previous {
            Some(Request::Holding { earlier, .. }) => earlier,
            Some(Request::Lapsed(lapse)) if lapse.is_known(now_micros) => Some(lapse),
            _ => None,
        };
        if let Some(replaced) = &replaced {
            self.release(replaced)?;
        }
        let key = self.key(&hold.key)?;
        key.held_nanos += i128::from(hold.amount_nanos);
        key.dirty = true;
        if hold.covered {
            self.row.held_nanos += i128::from(hold.amount_nanos);
        }
        self.row.next_expiry_micros = Some(
            self.row
                .next_expiry_micros
                .map_or(hold.expires_at_micros, |next| {
                    next.min(hold.expires_at_micros)
                }),
        );
        self.row_dirty = true;
        self.put_request(id, &Request::Holding { hold, earlier })?;
        Ok(outcome)
    }

    /// At most ten times a second: deletes the forgotten markers and
    /// lapses and the records past their time or the cap (each a bounded
    /// batch; forgotten top-up keys go with the next top-up).
    fn tidy(&mut self, now_micros: i64) -> Result<(), StoreError> {
        if self.row.tidy_at_micros > now_micros {
            return Ok(());
        }
        self.row.tidy_at_micros = now_micros.saturating_add(TIDY_INTERVAL_MICROS);
        self.row_dirty = true;
        let before_micros = now_micros.saturating_sub(FORGOTTEN_KEPT_MICROS);
        let forgotten = self
            .db
            .prepare_cached(
                "DELETE FROM ledger_requests WHERE account = ?1 AND id IN (SELECT id FROM ledger_requests
                 WHERE account = ?1 AND state IN ('S', 'L') AND at_micros <= ?2 LIMIT ?3)",
            )
            .and_then(|mut statement| {
                statement.execute(params![self.account, before_micros, TIDY_BATCH])
            })
            .map_err(sql(OPERATION))?;
        let expired = self
            .db
            .prepare_cached(
                "DELETE FROM ledger_generations WHERE rowid IN (SELECT rowid FROM ledger_generations
                 WHERE account = ?1 AND expires_at_micros <= ?2 ORDER BY expires_at_micros LIMIT ?3)",
            )
            .and_then(|mut statement| {
                statement.execute(params![self.account, before_micros, TIDY_BATCH])
            })
            .map_err(sql(OPERATION))?;
        self.count_removed_records(expired);
        let over = self
            .row
            .records_most
            .map_or(0, |most| self.row.records_count.saturating_sub(most));
        if over > 0 {
            let capped = self
                .db
                .prepare_cached(
                    "DELETE FROM ledger_generations WHERE rowid IN (
                       SELECT rowid FROM ledger_generations WHERE account = ?1
                       ORDER BY expires_at_micros, id LIMIT ?2)",
                )
                .and_then(|mut statement| {
                    statement.execute(params![self.account, over.min(TIDY_BATCH)])
                })
                .map_err(sql(OPERATION))?;
            self.count_removed_records(capped);
        }
        let batch = TIDY_BATCH as usize;
        if forgotten == batch || expired == batch || over > TIDY_BATCH {
            self.row.tidy_at_micros = now_micros.saturating_add(TIDY_BEHIND_MICROS);
        }
        Ok(())
    }

    /// Writes the account's and changed keys' rows.
    fn end(self) -> Result<(), StoreError> {
        if self.row_dirty || !self.exists && self.keys.values().any(|key| key.dirty) {
            let row = &self.row;
            self.db
                .prepare_cached(
                    "INSERT INTO ledger_accounts
                     (account, balance_nanos, purchased_nanos, held_nanos, next_expiry_micros,
                      records_most, records_count, tidy_at_micros)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                     ON CONFLICT (account) DO UPDATE SET balance_nanos = excluded.balance_nanos,
                       purchased_nanos = excluded.purchased_nanos, held_nanos = excluded.held_nanos,
                       next_expiry_micros = excluded.next_expiry_micros,
                       records_most = excluded.records_most, records_count = excluded.records_count,
                       tidy_at_micros = excluded.tidy_at_micros",
                )
                .and_then(|mut statement| {
                    statement.execute(params![
                        self.account,
                        row.balance_nanos,
                        row.purchased_nanos,
                        row.held_nanos.to_string(),
                        row.next_expiry_micros,
                        row.records_most,
                        row.records_count,
                        row.tidy_at_micros
                    ])
                })
                .map_err(sql(OPERATION))?;
        }
        for (key, row) in &self.keys {
            if !row.dirty {
                continue;
            }
            let [day, week, month] = row.sums.periods;
            let limit = row.terms.and_then(|terms| terms.limit);
            self.db
                .prepare_cached(
                    "INSERT INTO ledger_keys
                     (account, key, total_nanos, byok_total_nanos,
                      day_start_micros, day_nanos, day_byok_nanos,
                      week_start_micros, week_nanos, week_byok_nanos,
                      month_start_micros, month_nanos, month_byok_nanos,
                      held_nanos, terms_set, terms_limit_nanos, terms_reset,
                      terms_include_byok, terms_expires_at_micros, revoked)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,
                             ?15, ?16, ?17, ?18, ?19, ?20)
                     ON CONFLICT (account, key) DO UPDATE SET total_nanos = excluded.total_nanos, byok_total_nanos = excluded.byok_total_nanos, day_start_micros = excluded.day_start_micros, day_nanos = excluded.day_nanos, day_byok_nanos = excluded.day_byok_nanos, week_start_micros = excluded.week_start_micros, week_nanos = excluded.week_nanos, week_byok_nanos = excluded.week_byok_nanos, month_start_micros = excluded.month_start_micros, month_nanos = excluded.month_nanos, month_byok_nanos = excluded.month_byok_nanos, held_nanos = excluded.held_nanos, terms_set = excluded.terms_set, terms_limit_nanos = excluded.terms_limit_nanos, terms_reset = excluded.terms_reset, terms_include_byok = excluded.terms_include_byok, terms_expires_at_micros = excluded.terms_expires_at_micros, revoked = excluded.revoked",
                )
                .and_then(|mut statement| {
                    statement.execute(params![
                        self.account,
                        key,
                        row.sums.total_nanos,
                        row.sums.byok_total_nanos,
                        day.start_micros,
                        day.nanos,
                        day.byok_nanos,
                        week.start_micros,
                        week.nanos,
                        week.byok_nanos,
                        month.start_micros,
                        month.nanos,
                        month.byok_nanos,
                        row.held_nanos.to_string(),
                        row.terms.is_some(),
                        limit.map(|limit| limit.limit_nanos),
                        limit.and_then(|limit| period_code(limit.reset)),
                        limit.is_some_and(|limit| limit.include_byok),
                        row.terms
                            .and_then(|terms| terms.expires_at)
                            .map(unix_micros),
                        row.revoked,
                    ])
                })
                .map_err(sql(OPERATION))?;
        }
        Ok(())
    }
}

/// Records settlements (validated, one account) and tidies once.
fn settle_all(
    db: &Connection,
    settlements: &[Settlement],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let Some(first) = settlements.first() else {
        return Ok(());
    };
    let now_micros = unix_micros(now);
    let mut call = Call::begin(db, &first.account)?;
    call.lapse_expired(now_micros)?;
    for settlement in settlements {
        call.settle(settlement, now_micros)?;
    }
    call.tidy(now_micros)?;
    call.end()
}

fn balance_of(db: &Connection, account: &str) -> Result<AccountBalance, StoreError> {
    let row = Call::begin(db, account)?.row;
    Ok(AccountBalance {
        purchased_nanos: row.purchased_nanos,
        balance_nanos: row.balance_nanos,
    })
}

/// Credits a purchase; refused (nothing changes) past the i64 bounds.
fn credit(db: &Connection, account: &str, amount_nanos: i64) -> Result<AccountBalance, StoreError> {
    let mut call = Call::begin(db, account)?;
    let after = rules::credit(
        AccountBalance {
            purchased_nanos: call.row.purchased_nanos,
            balance_nanos: call.row.balance_nanos,
        },
        amount_nanos,
    )?;
    call.row.purchased_nanos = after.purchased_nanos;
    call.row.balance_nanos = after.balance_nanos;
    call.row_dirty = true;
    call.end()?;
    Ok(after)
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn admit_after_settling(
        &self,
        settlements: &[Settlement],
        request: &AdmitRequest,
        now: DateTime<Utc>,
    ) -> Result<AdmitOutcome, StoreError> {
        validate_admit(settlements, request)?;
        let settlements = settlements.to_vec();
        let request = request.clone();
        self.call("admit", move |db| {
            let now_micros = unix_micros(now);
            let mut call = Call::begin(db, &request.account)?;
            // What lapses, lapses first, whatever is decided after.
            call.lapse_expired(now_micros)?;
            for settlement in &settlements {
                call.settle(settlement, now_micros)?;
            }
            let checks = tiered_checks(&request, call.row.purchased_nanos);
            let mut counters = counters::ScopeCounters::read(db, &request.account, &checks, now)?;
            let fit = counters.fit(&checks, now);
            let hold = match &request.hold {
                Some(hold) => {
                    let key = call.key(&hold.key)?;
                    // A revoked or expired key is refused first, whatever
                    // its counters say.
                    match key_refusal(key.revoked, key.terms.as_ref(), now) {
                        Some(refusal) => Some(refusal),
                        None if fit.admitted => Some(call.hold(hold, now)?),
                        None => None,
                    }
                }
                None => None,
            };
            call.tidy(now_micros)?;
            call.end()?;
            let admitted = fit.admitted && hold.as_ref().is_none_or(ReserveOutcome::is_reserved);
            // Added only when the hold was taken too.
            let outcomes = counters.outcomes(&fit, &checks, admitted);
            counters.write(db, &checks)?;
            Ok(AdmitOutcome {
                admitted,
                checks: outcomes,
                hold,
                decided_at: now,
            })
        })
        .await
    }

    async fn settle(&self, settlement: &Settlement, now: DateTime<Utc>) -> Result<(), StoreError> {
        validate_settlements("settle", std::slice::from_ref(settlement), None)?;
        let settlements = vec![settlement.clone()];
        self.call("settle", move |db| settle_all(db, &settlements, now))
            .await
    }

    /// A settlement rides on the account's next admission (one
    /// transaction, one commit): the rows and index pages both touch are
    /// written to the WAL, and later checkpointed, once instead of twice.
    fn batches_settlements(&self) -> bool {
        true
    }

    async fn settle_many(
        &self,
        settlements: &[Settlement],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        validate_settlements("settle_many", settlements, None)?;
        let settlements = settlements.to_vec();
        self.call("settle_many", move |db| settle_all(db, &settlements, now))
            .await
    }

    async fn renew_holds(
        &self,
        account: &str,
        holds: &[HoldRenewal],
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        validate_renewals(ttl)?;
        let account = account.to_owned();
        let holds = holds.to_vec();
        self.call("renew_holds", move |db| {
            let now_micros = unix_micros(now);
            let mut call = Call::begin(db, &account)?;
            if !call.exists {
                return Ok(0);
            }
            call.lapse_expired(now_micros)?;
            let expires_at_micros = now_micros.saturating_add(duration_micros(ttl));
            let mut renewed = 0;
            for hold in &holds {
                if call.renew(hold, expires_at_micros, now_micros)? {
                    renewed += 1;
                }
            }
            if !holds.is_empty() {
                call.tidy(now_micros)?;
            }
            call.end()?;
            Ok(renewed)
        })
        .await
    }

    async fn key_usage(
        &self,
        account: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<KeyUsage, StoreError> {
        let (account, key) = (account.to_owned(), key.to_owned());
        self.call("key_usage", move |db| {
            let now_micros = unix_micros(now);
            let mut call = Call::begin(db, &account)?;
            if !call.exists {
                return Ok(KeyUsage::default());
            }
            call.lapse_expired(now_micros)?;
            let known: bool = db
                .prepare_cached("SELECT COUNT(*) FROM ledger_keys WHERE account = ?1 AND key = ?2")
                .and_then(|mut statement| {
                    statement.query_row([account.as_str(), key.as_str()], |row| row.get(0))
                })
                .map_err(sql("key_usage"))?;
            // A key with holds has a row: what lapsed is read from it.
            let usage = if known {
                call.key(&key)?.usage(period_starts_micros(now))
            } else {
                KeyUsage::default()
            };
            call.tidy(now_micros)?;
            call.end()?;
            Ok(usage)
        })
        .await
    }

    async fn top_up(&self, account: &str, amount_nanos: i64) -> Result<AccountBalance, StoreError> {
        validate_amount("top_up", amount_nanos)?;
        let account = account.to_owned();
        self.call("top_up", move |db| credit(db, &account, amount_nanos))
            .await
    }

    async fn top_up_once(
        &self,
        account: &str,
        amount_nanos: i64,
        idempotency_key: &str,
        now: DateTime<Utc>,
    ) -> Result<TopUpOutcome, StoreError> {
        validate_top_up_once(amount_nanos, idempotency_key)?;
        let (account, idempotency_key) = (account.to_owned(), idempotency_key.to_owned());
        self.call("top_up_once", move |db| {
            let now_micros = unix_micros(now);
            let remembered: Option<(i64, i64, i64)> = db
                .prepare_cached(
                    "SELECT amount_nanos, purchased_after_nanos, balance_after_nanos
                     FROM ledger_top_ups
                     WHERE account = ?1 AND idempotency_key = ?2 AND forget_at_micros > ?3",
                )
                .and_then(|mut statement| {
                    statement
                        .query_row(params![account, idempotency_key, now_micros], |row| {
                            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                        })
                        .optional()
                })
                .map_err(sql("top_up_once"))?;
            if let Some((first_amount_nanos, purchased_nanos, balance_nanos)) = remembered {
                let after = AccountBalance {
                    purchased_nanos,
                    balance_nanos,
                };
                return Ok(rules::repeated_top_up(
                    first_amount_nanos,
                    after,
                    amount_nanos,
                ));
            }
            let after = credit(db, &account, amount_nanos)?;
            db.prepare_cached(
                "INSERT OR REPLACE INTO ledger_top_ups
                 (account, idempotency_key, amount_nanos, purchased_after_nanos,
                  balance_after_nanos, forget_at_micros)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut statement| {
                statement.execute(params![
                    account,
                    idempotency_key,
                    amount_nanos,
                    after.purchased_nanos,
                    after.balance_nanos,
                    now_micros.saturating_add(duration_micros(idempotency_key_ttl()))
                ])
            })
            .map_err(sql("top_up_once"))?;
            // Keys whose time has passed go, a batch at a time.
            db.prepare_cached(
                "DELETE FROM ledger_top_ups WHERE account = ?1 AND idempotency_key IN (
                 SELECT idempotency_key FROM ledger_top_ups
                 WHERE account = ?1 AND forget_at_micros <= ?2 LIMIT ?3)",
            )
            .and_then(|mut statement| statement.execute(params![account, now_micros, TIDY_BATCH]))
            .map_err(sql("top_up_once"))?;
            Ok(TopUpOutcome::Credited(after))
        })
        .await
    }

    async fn account_balance(&self, account: &str) -> Result<AccountBalance, StoreError> {
        let account = account.to_owned();
        self.call("account_balance", move |db| balance_of(db, &account))
            .await
    }

    async fn set_key_terms(
        &self,
        account: &str,
        key: &str,
        terms: &KeyTerms,
    ) -> Result<(), StoreError> {
        validate_key_terms(terms)?;
        let (account, key, terms) = (account.to_owned(), key.to_owned(), *terms);
        self.call("set_key_terms", move |db| {
            let mut call = Call::begin(db, &account)?;
            let row = call.key(&key)?;
            row.terms = Some(terms);
            row.dirty = true;
            call.end()
        })
        .await
    }

    async fn revoke_key(
        &self,
        account: &str,
        key: &str,
        _now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let (account, key) = (account.to_owned(), key.to_owned());
        self.call("revoke_key", move |db| {
            let mut call = Call::begin(db, &account)?;
            let row = call.key(&key)?;
            row.revoked = true;
            row.dirty = true;
            call.end()
        })
        .await
    }

    async fn generation(
        &self,
        account: &str,
        reservation_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<bytes::Bytes>, StoreError> {
        let (account, id) = (account.to_owned(), reservation_id.to_owned());
        self.call("generation", move |db| {
            let most = Call::begin(db, &account)?.row.records_most;
            db.prepare_cached(
                "SELECT record FROM ledger_generations AS g
                 WHERE account = ?1 AND id = ?2 AND expires_at_micros > ?3
                   AND (?4 IS NULL OR (SELECT COUNT(*) FROM ledger_generations AS later
                        WHERE later.account = ?1
                          AND (later.expires_at_micros > g.expires_at_micros
                               OR (later.expires_at_micros = g.expires_at_micros
                                   AND later.id > g.id))) < ?4)",
            )
            .and_then(|mut statement| {
                statement
                    .query_row(params![account, id, unix_micros(now), most], record_bytes)
                    .optional()
            })
            .map(|record| record.map(bytes::Bytes::from))
            .map_err(sql("generation"))
        })
        .await
    }

    async fn generations_page(
        &self,
        account: &str,
        page: GenerationsPage<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<bytes::Bytes>, StoreError> {
        const OPERATION: &str = "generations_page";
        let (account, key) = (account.to_owned(), page.key.map(str::to_owned));
        let (skip, limit) = (sql_count(page.skip), sql_count(page.limit));
        self.call(OPERATION, move |db| {
            let row = Call::begin(db, &account)?.row;
            let now_micros = unix_micros(now);
            // Past the cap, records wait for the account's next tidying
            // unseen: none older than the newest `most`'s oldest is read.
            // Found from the oldest end, past only the records over the
            // cap (a few between tidyings), not the `most` kept.
            let edge: (i64, String) = match row.records_most {
                Some(most) if row.records_count > most => db
                    .prepare_cached(
                        "SELECT expires_at_micros, id FROM ledger_generations
                         WHERE account = ?1 ORDER BY expires_at_micros, id
                         LIMIT 1 OFFSET ?2",
                    )
                    .and_then(|mut statement| {
                        statement
                            .query_row(params![account, row.records_count - most], |row| {
                                Ok((row.get(0)?, row.get(1)?))
                            })
                            .optional()
                    })
                    .map_err(sql(OPERATION))?
                    .unwrap_or((i64::MIN, String::new())),
                _ => (i64::MIN, String::new()),
            };
            // Two statements, so that each walks its own index.
            let text = if key.is_some() {
                "SELECT record FROM ledger_generations INDEXED BY ledger_generations_by_key
                 WHERE account = ?1 AND key_hash = ?2 AND expires_at_micros > ?3
                   AND (expires_at_micros > ?4 OR (expires_at_micros = ?4 AND id >= ?5))
                 ORDER BY expires_at_micros DESC, id DESC LIMIT ?6 OFFSET ?7"
            } else {
                "SELECT record FROM ledger_generations INDEXED BY ledger_generations_by_expiry
                 WHERE account = ?1 AND ?2 IS NULL AND expires_at_micros > ?3
                   AND (expires_at_micros > ?4 OR (expires_at_micros = ?4 AND id >= ?5))
                 ORDER BY expires_at_micros DESC, id DESC LIMIT ?6 OFFSET ?7"
            };
            db.prepare_cached(text)
                .and_then(|mut statement| {
                    statement
                        .query_map(
                            params![account, key, now_micros, edge.0, edge.1, limit, skip],
                            |row| record_bytes(row).map(bytes::Bytes::from),
                        )?
                        .collect()
                })
                .map_err(sql(OPERATION))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::store::SettlementRecord;

    fn settled(id: usize, most: u64) -> Settlement {
        Settlement {
            account: "acct".into(),
            key: "key".into(),
            reservation_id: format!("r{id:04}"),
            hold_granted: false,
            cost_nanos: 1,
            byok: false,
            record: Some(SettlementRecord {
                bytes: bytes::Bytes::from(format!("{{\"id\":{id}}}")),
                retention: Duration::from_secs(3600),
                max_per_account: most,
            }),
        }
    }

    /// A store on a new file (kept while the directory is).
    fn fresh_store() -> (tempfile::TempDir, SqliteStore) {
        let directory = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(directory.path().join("m.db"), Default::default()).unwrap();
        (directory, store)
    }

    /// The instant `step` tidy intervals and more (200 ms each) after the
    /// tests' start.
    fn at(step: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap()
            + chrono::Duration::milliseconds(200 * step)
    }

    /// The file's record rows and the account's count of them.
    async fn records(store: &SqliteStore) -> (i64, i64) {
        store
            .call("test", |db| {
                let rows: i64 = db
                    .query_row("SELECT count(*) FROM ledger_generations", [], |row| {
                        row.get(0)
                    })
                    .map_err(sql("test"))?;
                let counted: i64 = db
                    .query_row("SELECT records_count FROM ledger_accounts", [], |row| {
                        row.get(0)
                    })
                    .map_err(sql("test"))?;
                Ok((rows, counted))
            })
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_past_the_cap_leave_the_file_and_the_count_follows() {
        let (_directory, store) = fresh_store();
        for id in 0..10 {
            store.settle(&settled(id, 3), at(0)).await.unwrap();
        }
        // Hidden at once, counted, removed when next tidied.
        assert_eq!(records(&store).await, (10, 10));
        assert_eq!(
            store
                .recent_generations("acct", 100, at(0))
                .await
                .unwrap()
                .len(),
            3
        );
        // A settlement again (a retry) replaces nothing and counts nothing.
        store.settle(&settled(9, 3), at(0)).await.unwrap();
        assert_eq!(records(&store).await, (10, 10));
        store.settle(&settled(10, 3), at(1)).await.unwrap();
        assert_eq!(records(&store).await, (3, 3));
        let newest = store.recent_generations("acct", 100, at(1)).await.unwrap();
        assert_eq!(newest[0], bytes::Bytes::from("{\"id\":10}"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_tidy_removes_a_bounded_batch_and_the_next_call_goes_on() {
        let (_directory, store) = fresh_store();
        let past_the_cap = 2 * TIDY_BATCH as usize + 50;
        for id in 0..past_the_cap {
            store.settle(&settled(id, 1_000_000), at(0)).await.unwrap();
        }
        // The cap falls to 1: the next calls, each 10 ms after the one
        // before, remove a batch each until only the cap is left; then the
        // next tidy waits its whole interval again (the fourth call's
        // record stays, hidden, until then).
        let mut kept = Vec::new();
        for (id, step) in (past_the_cap..).zip(0..4) {
            let then = at(1) + chrono::Duration::microseconds(TIDY_BEHIND_MICROS * step);
            store.settle(&settled(id, 1), then).await.unwrap();
            kept.push(records(&store).await.0);
        }
        let batch = TIDY_BATCH;
        let all = past_the_cap as i64;
        assert_eq!(kept, [all + 1 - batch, all + 2 - 2 * batch, 1, 2]);
    }
}
