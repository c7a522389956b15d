//! The embedded store: every trait in process, for a single gateway instance.
//!
//! State is sharded by scope (an account) over 64 mutexes; a call takes
//! one (`store.rs`). Ended windows and leases are swept from a shard about
//! once a second (`counters.rs`). Expired records read as absent at once
//! and are removed on their collection's next write or listing, and from
//! every collection at most once a second by writes that give records a
//! lifetime (`records.rs`). Each account's ledger (`ledger.rs`) keeps its
//! holds with their sums and their order by expiry, so an admission never
//! walks the holds in flight; settled and lapsed ids, and records past
//! their time or the account's cap, are hidden at once and removed a
//! minute later, at most ten times a second per account, exactly as
//! `RedisStore` does, so the two answer alike. Every decision is the
//! rules' (`store::rules`).

mod apps;
mod counters;
mod ledger;
mod records;
mod store;

pub use store::MemoryStore;
