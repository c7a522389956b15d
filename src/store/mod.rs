//! Where shared state lives: counters, the usage ledger and records.
//!
//! The traits say what the layers need, not what Redis offers:
//!
//! - [`CounterStore`]: atomic check-and-add on fixed windows, rolling
//!   windows, GCRA buckets and UTC calendar windows, several at once; and
//!   in-flight slots, leases that bound concurrent requests and end by
//!   themselves when a holder never gives its slot back.
//! - [`LedgerStore`]: credits in nano-credits (`i64`), per key and per
//!   account, with reservations for requests in flight, and each request's
//!   generation record kept with its settlement.
//! - [`RecordStore`]: keys, accounts, BYOK keys and flows with compare-and-set
//!   by revision, and optionally a lifetime per record and a cap on the
//!   records of a collection.
//! - [`AppUsageStore`]: requests and tokens per calling app and model in the
//!   current UTC day, week and month, for the app ranking.
//!
//! Three backends implement all four, their sum being [`Store`]:
//! [`MemoryStore`], in process, for one gateway instance; [`SqliteStore`],
//! one file on one machine (processes sharing the file stay exact); and
//! [`RedisStore`], for many instances sharing Redis or Redis Cluster. Each
//! answers exactly as the others (one conformance suite,
//! `tests/it/store_conformance.rs`, drives all three). Time is always passed
//! in, from the layer's [`Clock`](crate::clock::Clock); a backend may
//! decide by its own clock instead ([`TimeSource`]), so that instances
//! whose clocks differ agree. Where a store can fail, a layer's
//! [`FailurePolicy`] says whether it admits or refuses; [`StoreLocation`]
//! is the proxy's `--store`, and [`StoreLocation::open`] opens it.
//!
//! The record collections the crate keeps: `keys`, `accounts`,
//! `deleted_keys`, `provisioned_keys/<account>` and `grants/<account>`
//! (what `KeyDirectory::ensure_key` and `grant_once` made), `byok/<account>`, `flows/<sessionKey>`, `auth_codes`,
//! `auth_codes/<account>`, `alerts` (each alert crossing's marker, written
//! only if absent, for 40 days), and `operator_key_minted` (one marker: the
//! first start's operator key, written only if absent). A record written
//! with [`PutOptions`] may have a lifetime (`ttl`) and its collection a
//! cap (`max_records`, refused as [`PutOutcome::Full`] in the write's
//! atomic step); every record method takes the instant it acts at.
//!
//! ```
//! use std::time::Duration;
//! use modelgate::clock::{Clock, SystemClock};
//! use modelgate::store::{Check, CounterStore, Limit, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), modelgate::store::StoreError> {
//! let store = MemoryStore::new();
//! let per_minute = Check::new("free:minute", Limit::Rolling { limit: 2, window: Duration::from_secs(60) }, 1);
//! let per_day = Check::new("free:day", Limit::Calendar { limit: 50, period: modelgate::clock::Period::Day }, 1);
//! let now = SystemClock.now();
//! for _ in 0..2 {
//!     assert!(store.check_and_add("acct-1", &[per_minute.clone(), per_day.clone()], now).await?.admitted);
//! }
//! let third = store.check_and_add("acct-1", &[per_minute, per_day.clone()], now).await?;
//! assert!(!third.admitted);
//! assert_eq!(third.rejected_by(), Some(0));
//! // The rejected request consumed nothing from the daily counter.
//! assert_eq!(third.outcomes[1].used, 2);
//! # Ok(()) }
//! ```

mod apps;
#[cfg(feature = "redis")]
mod breaker;
mod counter;
mod error;
mod ledger;
mod location;
mod memory;
mod policy;
mod records;
#[cfg(feature = "redis")]
mod redis;
mod rules;
mod shared;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use apps::{
    AppUsage, AppUsageStore, MAX_APP_USAGE_FIELD_BYTES, MAX_APP_USAGE_ROWS, is_valid_app_usage,
};
pub use counter::{Check, CheckOutcome, CounterStore, Decision, Limit, MAX_EXACT, SlotOutcome};
pub use error::{StoreError, StoreErrorKind};
pub(crate) use ledger::validate_admit;
pub use ledger::{
    AccountBalance, AdmitOutcome, AdmitRequest, GenerationsPage, HoldRenewal,
    IDEMPOTENCY_KEY_TTL_HOURS, KeyLimit, KeyTerms, KeyUsage, LAPSED_HOLD_MEMORY, LedgerStore,
    MAX_IDEMPOTENCY_KEY_BYTES, MAX_LAPSE_MODEL_BYTES, MAX_RECORD_RETENTION, MAX_RESERVATION_TTL,
    NANOS_PER_CREDIT, PurchaseTier, RecordKeeping, ReserveOutcome, ReserveRequest,
    SETTLEMENT_MEMORY, SETTLEMENT_RETRY_WINDOW, Settlement, SettlementRecord, TopUpOutcome,
    is_lapse_model, is_valid_idempotency_key, lapse_record,
};
pub use location::{InvalidStoreLocation, OpenOptions, OpenStoreError, StoreLocation};
pub use memory::MemoryStore;
pub use policy::FailurePolicy;
pub use records::{
    ACCOUNTS, Expect, KEYS, MAX_RECORD_TTL, PutOptions, PutOutcome, RecordStore, RecordStoreExt,
    Versioned, WriteOutcome, byok_keys, decode, flows,
};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{LEDGER_LAYOUT, RedisStore, RedisStoreConfig, TimeSource};
pub(crate) use shared::FastMap;
pub use shared::{SharedStore, Store};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::{SQLITE_SCHEMA_VERSION, SqliteStore, SqliteStoreConfig};
