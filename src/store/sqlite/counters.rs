//! Counters and slots in SQLite.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::Connection;
use std::time::Duration;

use super::SqliteStore;
use crate::store::{Check, CheckOutcome, CounterStore, Decision, SlotOutcome, StoreError};

/// The tables of counters and slots.
pub(super) const SCHEMA: &str = "";

/// Decides `checks` of `scope` at `now` inside the caller's transaction,
/// as `MemoryStore` does: whether all fit and each one's outcome; when all
/// fit and `commit`, adds every amount.
pub(super) fn check_all(
    _connection: &Connection,
    _scope: &str,
    _checks: &[Check],
    _now: DateTime<Utc>,
    _commit: bool,
) -> Result<(bool, Vec<CheckOutcome>), StoreError> {
    Err(StoreError::invalid(
        "check_and_add",
        "TODO(helper): counters on SQLite",
    ))
}

#[async_trait]
impl CounterStore for SqliteStore {
    async fn check_and_add(
        &self,
        _scope: &str,
        _checks: &[Check],
        _now: DateTime<Utc>,
    ) -> Result<Decision, StoreError> {
        Err(StoreError::invalid("check_and_add", "TODO(helper)"))
    }

    async fn acquire_slot(
        &self,
        _scope: &str,
        _name: &str,
        _holder: &str,
        _limit: u64,
        _lease: Duration,
        _now: DateTime<Utc>,
    ) -> Result<SlotOutcome, StoreError> {
        Err(StoreError::invalid("acquire_slot", "TODO(helper)"))
    }

    async fn release_slot(
        &self,
        _scope: &str,
        _name: &str,
        _holder: &str,
    ) -> Result<(), StoreError> {
        Err(StoreError::invalid("release_slot", "TODO(helper)"))
    }
}
