//! Alerts: the account's owner is e-mailed (and the alert webhook told)
//! when the balance falls below a threshold or a key's usage passes a
//! share of its limit, once per crossing across every instance.
//!
//! **When.** After a request's settlement is recorded,
//! [`CreditGuardLayer::on_settled`](crate::credit::CreditGuardLayer::on_settled)
//! hands the account, the key and its limit to [`Alerts::settled`], which
//! only queues them (a bounded queue; when full the check is dropped and
//! counted). A background task then reads the account's balance
//! ([`LedgerStore::account_balance`](crate::store::LedgerStore::account_balance))
//! and the key's usage in its limit's period
//! ([`KeyUsage::in_period`](crate::store::KeyUsage::in_period)), and for
//! each threshold of the [`AlertRules`] that is crossed:
//!
//! - `balance_below`: the balance is below the threshold (an account that
//!   never bought credits is left alone);
//! - `key_limit_percent`: the key's usage in its period is at least that
//!   share of its limit.
//!
//! **Exactly once.** Each crossing has a marker id ([`balance_marker`],
//! [`key_marker`]); the instance that creates it in the store
//! (`put_json_at` with [`Expect::Absent`](crate::store::Expect::Absent) in
//! [`ALERTS_COLLECTION`], the store's own atomic step) sends the notice,
//! and every other instance finds it there and sends nothing. The balance
//! marker names the account's purchased total, so a top-up arms the
//! thresholds again; the key marker names the start of the limit's period
//! and the limit, so a new period or a changed limit arms it again. A
//! marker lives [`MARKER_TTL`]: a state that lasts longer than that (a
//! limit that never resets, a balance never topped up) is reported once
//! more after it.
//!
//! **Never in the way.** The money path only queues; the checks read the
//! store after the request is settled, one account at a time, and a
//! failed read or write is logged and counted, never retried against the
//! request. Each instance remembers the markers it has claimed or found
//! claimed, so a balance that stays below a threshold writes nothing more.
//!
//! **Delivery** is the [`Notifier`](crate::notify::Notifier)'s
//! ([`Notifier::alert`](crate::notify::Notifier::alert)): e-mail to the
//! account's address (none without one) and the webhook signed as leak
//! notices are, with the same retries, bounds and metric.
//!
//! ```
//! use modelgate::alerts::{balance_marker, key_marker, AlertRules};
//! use serde_json::json;
//!
//! let rules = AlertRules::from_json(&[json!(5), json!(0.5)], &[json!(80), json!(100)]).unwrap();
//! assert_eq!(rules.balance_below_nanos(), &[5_000_000_000, 500_000_000]);
//! let error = AlertRules::from_json(&[json!(5), json!(-1)], &[]).unwrap_err();
//! assert_eq!(error.to_string(), "balance_below[1]: must not be negative");
//!
//! // A top-up (a larger purchased total) is a new crossing.
//! assert_ne!(balance_marker("acct", 5_000_000_000, 10), balance_marker("acct", 5_000_000_000, 20));
//! assert_eq!(key_marker("ab12", 80, None, 7), key_marker("ab12", 80, None, 7));
//! ```

mod marker;
mod rules;
mod worker;

pub use marker::{ALERTS_COLLECTION, MARKER_TTL, balance_marker, key_marker};
pub use rules::{AlertRules, AlertRulesError, MAX_THRESHOLDS};
pub use worker::{Alerts, DEFAULT_MAX_QUEUED_CHECKS};
