//! [`SqliteStore`]: every store trait in one SQLite file, for a gateway on
//! one machine that must keep its keys, balances and records across
//! restarts.
//!
//! One thread owns the connection; the async callers send it jobs and
//! never block the runtime. The thread runs the jobs waiting for it
//! together in one transaction (`BEGIN IMMEDIATE`, a savepoint per job, so
//! a job that fails leaves nothing), and answers them once it commits:
//! many settlements cost one commit. Every job reads what it decides on
//! inside that transaction, so two processes opening the same file (WAL,
//! a busy timeout) decide each limit exactly as one would. CreditGuard's
//! settlements ride on the account's next admission, as on Redis (a
//! settlement waits up to a millisecond for one): a client sending one
//! request after another costs one commit per request, which writes the
//! pages both touch to the WAL once.
//!
//! With `synchronous=NORMAL` (the default) a commit survives the process
//! being killed at any moment, and a power loss may lose the last commits
//! before the latest WAL checkpoint's sync, never the file's consistency.
//! With `FULL` ([`SqliteStoreConfig::synchronous_full`]) every commit is
//! on disk before its callers hear of it, at the cost of a sync per
//! transaction.
//!
//! `ledger.rs`, `counters.rs` and `records.rs` each own their tables and
//! make their decisions with `MemoryStore`'s own functions wherever those
//! are pure, so the stores answer alike; what is forgotten is deleted as
//! the other stores do. The schema's version is `PRAGMA user_version`
//! ([`SQLITE_SCHEMA_VERSION`]): an older file is migrated when opened, a
//! newer one refused. The file is created readable by its owner alone
//! (0600; SQLite gives its `-wal` and `-shm` the same): it holds key
//! hashes, balances and accounts' provider keys. Reservation ids begin
//! with their millisecond, so the ledger's indexes grow at one end.
//!
//! ```
//! use modelgate::store::{LedgerStore, SqliteStore, SqliteStoreConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), modelgate::store::StoreError> {
//! let directory = std::env::temp_dir().join(format!("modelgate-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&directory).unwrap();
//! let path = directory.join("modelgate.db");
//! let store = SqliteStore::open(&path, SqliteStoreConfig::default())?;
//! store.top_up("acct-1", 5_000_000_000).await?;
//! drop(store);
//! // Opened again, the balance is still there.
//! let store = SqliteStore::open(&path, SqliteStoreConfig::default())?;
//! assert_eq!(store.account_balance("acct-1").await?.balance_nanos, 5_000_000_000);
//! # drop(store);
//! # std::fs::remove_dir_all(&directory).unwrap();
//! # Ok(()) }
//! ```

mod busy;
mod checkpoint;
mod counters;
mod file;
mod jobs;
mod ledger;
mod records;
mod store;

pub use file::SQLITE_SCHEMA_VERSION;
pub use store::{SqliteStore, SqliteStoreConfig};
// What the tables' modules (counters, ledger, records) reach the store by.
use store::sql;
