//! The ledger in SQLite.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::SqliteStore;
use crate::store::{
    AccountBalance, AdmitOutcome, AdmitRequest, HoldRenewal, KeyTerms, KeyUsage, LedgerStore,
    Settlement, StoreError, TopUpOutcome,
};

/// The ledger's tables.
pub(super) const SCHEMA: &str = "";

fn todo<T>(operation: &'static str) -> Result<T, StoreError> {
    Err(StoreError::invalid(operation, "TODO: the ledger on SQLite"))
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn admit_after_settling(
        &self,
        _settlements: &[Settlement],
        _request: &AdmitRequest,
        _now: DateTime<Utc>,
    ) -> Result<AdmitOutcome, StoreError> {
        todo("admit")
    }
    async fn settle(&self, _settlement: &Settlement, _now: DateTime<Utc>) -> Result<(), StoreError> {
        todo("settle")
    }
    async fn renew_holds(
        &self,
        _account: &str,
        _holds: &[HoldRenewal],
        _ttl: Duration,
        _now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        todo("renew_holds")
    }
    async fn key_usage(
        &self,
        _account: &str,
        _key: &str,
        _now: DateTime<Utc>,
    ) -> Result<KeyUsage, StoreError> {
        todo("key_usage")
    }
    async fn top_up(&self, _account: &str, _amount_nanos: i64) -> Result<AccountBalance, StoreError> {
        todo("top_up")
    }
    async fn top_up_once(
        &self,
        _account: &str,
        _amount_nanos: i64,
        _idempotency_key: &str,
        _now: DateTime<Utc>,
    ) -> Result<TopUpOutcome, StoreError> {
        todo("top_up_once")
    }
    async fn account_balance(&self, _account: &str) -> Result<AccountBalance, StoreError> {
        todo("account_balance")
    }
    async fn set_key_terms(
        &self,
        _account: &str,
        _key: &str,
        _terms: &KeyTerms,
    ) -> Result<(), StoreError> {
        todo("set_key_terms")
    }
    async fn revoke_key(&self, _account: &str, _key: &str, _now: DateTime<Utc>) -> Result<(), StoreError> {
        todo("revoke_key")
    }
    async fn generation(
        &self,
        _account: &str,
        _reservation_id: &str,
        _now: DateTime<Utc>,
    ) -> Result<Option<bytes::Bytes>, StoreError> {
        todo("generation")
    }
    async fn recent_generations(
        &self,
        _account: &str,
        _limit: usize,
        _now: DateTime<Utc>,
    ) -> Result<Vec<bytes::Bytes>, StoreError> {
        todo("recent_generations")
    }
}
