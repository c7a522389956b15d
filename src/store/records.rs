//! Records (keys, accounts, BYOK keys, flows) with compare-and-set by
//! revision.

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::StoreError;

/// The collection of API keys, by the SHA-256 hash of the key.
pub const KEYS: &str = "keys";
/// The collection of accounts, by account id.
pub const ACCOUNTS: &str = "accounts";

/// The collection of the flows owned by one webhook session.
pub fn flows(session_key: &str) -> String {
    format!("flows/{session_key}")
}

/// The collection of the provider keys `account` brought itself (BYOK),
/// by lower-case provider name.
pub fn byok_keys(account: &str) -> String {
    format!("byok/{account}")
}

/// A stored value and its revision: 1 when created, plus 1 on every write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// Its revision.
    pub revision: u64,
}

/// The condition a write needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Write whatever is there (create or replace).
    Any,
    /// Create only: the record must not exist.
    Absent,
    /// The record must exist at exactly this revision.
    Revision(u64),
}

/// The result of a conditional write or delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Done; the record's new revision (0 after a delete).
    Written {
        /// The new revision.
        revision: u64,
    },
    /// The condition did not hold; nothing changed.
    Conflict {
        /// What is there now (`None`: no record).
        current: Option<Versioned<Vec<u8>>>,
    },
}

/// Records as opaque bytes (JSON in practice) with revisions.
///
/// Each collection keeps its records in creation order, so listings can
/// go newest first.
#[async_trait]
pub trait RecordStore: Send + Sync + 'static {
    /// The record `id` of `collection`.
    async fn get_record(
        &self,
        collection: &str,
        id: &str,
    ) -> Result<Option<Versioned<Vec<u8>>>, StoreError>;

    /// Writes `value` when `expect` holds, as one atomic step.
    async fn put_record(
        &self,
        collection: &str,
        id: &str,
        value: &[u8],
        expect: Expect,
    ) -> Result<WriteOutcome, StoreError>;

    /// Deletes `id` when `expect` holds; deleting nothing with `Expect::Any` is `Written`.
    async fn delete_record(
        &self,
        collection: &str,
        id: &str,
        expect: Expect,
    ) -> Result<WriteOutcome, StoreError>;

    /// Up to `limit` records after skipping `offset`, newest first.
    async fn list_records(
        &self,
        collection: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<(String, Versioned<Vec<u8>>)>, StoreError>;
}

/// Typed access to a [`RecordStore`] through serde JSON.
#[async_trait]
pub trait RecordStoreExt: RecordStore {
    /// The record `id`, decoded.
    async fn get_json<T: DeserializeOwned>(
        &self,
        collection: &str,
        id: &str,
    ) -> Result<Option<Versioned<T>>, StoreError> {
        match self.get_record(collection, id).await? {
            None => Ok(None),
            Some(record) => Ok(Some(decode("get_record", record)?)),
        }
    }

    /// Encodes and writes `value` when `expect` holds.
    async fn put_json<T: Serialize + Sync>(
        &self,
        collection: &str,
        id: &str,
        value: &T,
        expect: Expect,
    ) -> Result<WriteOutcome, StoreError> {
        let bytes =
            serde_json::to_vec(value).map_err(|error| StoreError::invalid("put_record", error))?;
        self.put_record(collection, id, &bytes, expect).await
    }
}

impl<S: RecordStore + ?Sized> RecordStoreExt for S {}

/// Decodes a stored JSON record.
pub fn decode<T: DeserializeOwned>(
    operation: &'static str,
    record: Versioned<Vec<u8>>,
) -> Result<Versioned<T>, StoreError> {
    let value = serde_json::from_slice(&record.value)
        .map_err(|error| StoreError::corrupt(operation, error.to_string()))?;
    Ok(Versioned {
        value,
        revision: record.revision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Account {
        id: String,
        byok_providers: Vec<String>,
    }

    #[tokio::test]
    async fn typed_records_round_trip_through_json() {
        let store = MemoryStore::new();
        let account = Account {
            id: "acct-1".into(),
            byok_providers: vec!["openai".into()],
        };
        let written = store
            .put_json(ACCOUNTS, "acct-1", &account, Expect::Absent)
            .await
            .unwrap();
        assert_eq!(written, WriteOutcome::Written { revision: 1 });
        let read: Versioned<Account> = store.get_json(ACCOUNTS, "acct-1").await.unwrap().unwrap();
        assert_eq!(
            read,
            Versioned {
                value: account,
                revision: 1
            }
        );
        assert!(store
            .get_json::<Account>(ACCOUNTS, "none")
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn a_record_that_is_not_the_expected_json_is_reported_not_panicked() {
        let store = MemoryStore::new();
        store
            .put_record(KEYS, "bad", b"not json", Expect::Any)
            .await
            .unwrap();
        let error = store.get_json::<Account>(KEYS, "bad").await.unwrap_err();
        assert_eq!(error.operation(), "get_record");
        assert!(matches!(
            error.kind(),
            crate::store::StoreErrorKind::Corrupt(_)
        ));
    }
}
