//! The money and limit rules, written once: pure functions over a view of
//! the state they read (a counter, a slot set, an account's ledger, a key,
//! what the ledger knows of one request), returning what changes.
//!
//! `MemoryStore` and `SqliteStore` keep their state their own way (maps
//! behind a shard's lock; rows in one transaction) and decide with these;
//! neither reads the other. Redis keeps its Functions, because one atomic
//! call in the account's slot is the point there; a differential test
//! (`tests/it/redis_store.rs`) runs the same random operations through
//! these rules and through the Lua on a real `redis-server` and compares
//! every answer and the state left. The conformance suite
//! (`tests/it/store_conformance.rs`) guards how each store keeps its state.

pub(crate) mod counter;
pub(crate) mod ledger;
pub(crate) mod records;
pub(crate) mod slots;
