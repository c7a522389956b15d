//! Records and app usage in SQLite.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::SqliteStore;
use crate::clock::Period;
use crate::store::{
    AppUsage, AppUsageStore, Expect, PutOptions, PutOutcome, RecordStore, StoreError, Versioned,
    WriteOutcome,
};

/// The tables of records and app usage.
pub(super) const SCHEMA: &str = "";

#[async_trait]
impl RecordStore for SqliteStore {
    async fn get_record_at(
        &self,
        _collection: &str,
        _id: &str,
        _now: DateTime<Utc>,
    ) -> Result<Option<Versioned<Vec<u8>>>, StoreError> {
        Err(StoreError::invalid("get_record", "TODO(helper)"))
    }

    async fn put_record_at(
        &self,
        _collection: &str,
        _id: &str,
        _value: &[u8],
        _expect: Expect,
        _options: PutOptions,
        _now: DateTime<Utc>,
    ) -> Result<PutOutcome, StoreError> {
        Err(StoreError::invalid("put_record", "TODO(helper)"))
    }

    async fn delete_record_at(
        &self,
        _collection: &str,
        _id: &str,
        _expect: Expect,
        _now: DateTime<Utc>,
    ) -> Result<WriteOutcome, StoreError> {
        Err(StoreError::invalid("delete_record", "TODO(helper)"))
    }

    async fn list_records_at(
        &self,
        _collection: &str,
        _offset: usize,
        _limit: usize,
        _now: DateTime<Utc>,
    ) -> Result<Vec<(String, Versioned<Vec<u8>>)>, StoreError> {
        Err(StoreError::invalid("list_records", "TODO(helper)"))
    }
}

#[async_trait]
impl AppUsageStore for SqliteStore {
    async fn add_app_usage(
        &self,
        _scope: &str,
        _rows: &[AppUsage],
        _now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        Err(StoreError::invalid("add_app_usage", "TODO(helper)"))
    }

    async fn app_usage(
        &self,
        _scope: &str,
        _period: Period,
        _now: DateTime<Utc>,
    ) -> Result<Vec<AppUsage>, StoreError> {
        Err(StoreError::invalid("app_usage", "TODO(helper)"))
    }
}
