//! Records (keys, accounts, BYOK keys, flows) with compare-and-set by
//! revision, an optional lifetime per record and an optional cap on how
//! many records a collection holds.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;

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

/// The longest lifetime a record may be given (100 years): expiry
/// instants stay exact in Redis's scores and Lua's numbers.
pub const MAX_RECORD_TTL: Duration = Duration::from_secs(100 * 365 * 86_400);

/// What a write asks for besides its [`Expect`]: how long the record
/// lives, and how many live records its collection may hold.
///
/// The default is a plain write: a record that never expires, in a
/// collection of any size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PutOptions {
    /// The record expires this long after the write: from then on it reads
    /// as absent (a create may take its id again), it is left out of
    /// listings and counts, and the store removes it. Each write sets the
    /// lifetime afresh; `None` (the default) keeps the record until it is
    /// deleted, also when it had a lifetime before.
    pub ttl: Option<Duration>,
    /// Creating a record (an id with no live record) is refused with
    /// [`PutOutcome::Full`] while the collection already holds this many
    /// live records; expired ones do not count. Rewriting a live record is
    /// never refused by it. Decided in the write's own atomic step, so
    /// concurrent creators never take a collection past it.
    pub max_records: Option<u64>,
}

impl PutOptions {
    /// A record that expires `ttl` after the write.
    pub fn expiring(ttl: Duration) -> Self {
        PutOptions {
            ttl: Some(ttl),
            max_records: None,
        }
    }

    /// The same, refusing to create a record in a collection that holds
    /// `max_records` live ones.
    pub fn max_records(mut self, max_records: u64) -> Self {
        self.max_records = Some(max_records);
        self
    }
}

/// Refuses a lifetime of zero or over [`MAX_RECORD_TTL`].
pub(crate) fn validate_put(options: &PutOptions) -> Result<(), StoreError> {
    match options.ttl {
        Some(ttl) if ttl.is_zero() || ttl > MAX_RECORD_TTL => Err(StoreError::invalid(
            "put_record",
            format!(
                "a record's lifetime must be above zero and at most {MAX_RECORD_TTL:?}, not {ttl:?}"
            ),
        )),
        _ => Ok(()),
    }
}

/// The result of [`RecordStore::put_record_at`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// Written, or refused by its [`Expect`].
    Write(WriteOutcome),
    /// Not written: the record is new and the collection already holds
    /// [`PutOptions::max_records`] live records.
    Full {
        /// The live records the collection holds.
        records: u64,
    },
}

impl PutOutcome {
    /// The outcome of a write that asked for no cap: `Full` cannot be its
    /// answer, so it is a store fault.
    pub fn uncapped(self) -> Result<WriteOutcome, StoreError> {
        match self {
            PutOutcome::Write(outcome) => Ok(outcome),
            PutOutcome::Full { records } => Err(StoreError::corrupt(
                "put_record",
                format!("refused as full ({records} records) without a cap"),
            )),
        }
    }
}

/// Records as opaque bytes (JSON in practice) with revisions.
///
/// Each collection keeps its records in creation order, so listings can
/// go newest first. A record may have a lifetime ([`PutOptions::ttl`]):
/// the store judges it by the instant each `…_at` call passes (on
/// [`RedisStore`](super::RedisStore) by Redis's own clock unless it takes
/// the caller's, [`TimeSource`](super::TimeSource)), as it judges windows.
/// Every call takes its instant: a caller passes its
/// [`Clock`](crate::clock::Clock)'s, so no record is judged by a time the
/// caller did not choose. Records without a lifetime do not depend on it.
#[async_trait]
pub trait RecordStore: Send + Sync + 'static {
    /// The live record `id` of `collection` at `now`.
    async fn get_record_at(
        &self,
        collection: &str,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Versioned<Vec<u8>>>, StoreError>;

    /// Writes `value` when `expect` holds and `options` allow, as one
    /// atomic step at `now`. An expired record is absent: `Expect::Absent`
    /// holds, and the record is created anew at revision 1.
    async fn put_record_at(
        &self,
        collection: &str,
        id: &str,
        value: &[u8],
        expect: Expect,
        options: PutOptions,
        now: DateTime<Utc>,
    ) -> Result<PutOutcome, StoreError>;

    /// Deletes `id` when `expect` holds at `now`; deleting nothing with
    /// `Expect::Any` is `Written`.
    async fn delete_record_at(
        &self,
        collection: &str,
        id: &str,
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<WriteOutcome, StoreError>;

    /// Up to `limit` records live at `now` after skipping `offset` of them,
    /// newest first.
    async fn list_records_at(
        &self,
        collection: &str,
        offset: usize,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, Versioned<Vec<u8>>)>, StoreError>;
}

/// Typed access to a [`RecordStore`] through serde JSON.
#[async_trait]
pub trait RecordStoreExt: RecordStore {
    /// The record `id` live at `now`, decoded.
    async fn get_json_at<T: DeserializeOwned>(
        &self,
        collection: &str,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Versioned<T>>, StoreError> {
        match self.get_record_at(collection, id, now).await? {
            None => Ok(None),
            Some(record) => Ok(Some(decode("get_record", record)?)),
        }
    }

    /// Encodes and writes `value` when `expect` holds and `options` allow.
    async fn put_json_at<T: Serialize + Sync>(
        &self,
        collection: &str,
        id: &str,
        value: &T,
        expect: Expect,
        options: PutOptions,
        now: DateTime<Utc>,
    ) -> Result<PutOutcome, StoreError> {
        let bytes =
            serde_json::to_vec(value).map_err(|error| StoreError::invalid("put_record", error))?;
        self.put_record_at(collection, id, &bytes, expect, options, now)
            .await
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
    use chrono::TimeZone;

    /// Any instant will do: these records never expire.
    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap()
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Account {
        id: String,
        byok_providers: Vec<String>,
    }

    /// Each check on MemoryStore and on SqliteStore.
    macro_rules! on_both_embedded_stores {
        ($($check:ident),*) => {$(
            mod $check {
                #[tokio::test]
                async fn memory() {
                    super::$check(crate::store::MemoryStore::new()).await;
                }

                #[cfg(feature = "sqlite")]
                #[tokio::test]
                async fn sqlite() {
                    let directory = tempfile::tempdir().unwrap();
                    let store = crate::store::SqliteStore::open(
                        directory.path().join("modelgate.db"),
                        crate::store::SqliteStoreConfig::default(),
                    )
                    .unwrap();
                    super::$check(store).await;
                }
            }
        )*};
    }

    on_both_embedded_stores!(
        typed_records_round_trip_through_json,
        a_record_that_is_not_the_expected_json_is_reported_not_panicked
    );

    async fn typed_records_round_trip_through_json(store: impl RecordStore) {
        let account = Account {
            id: "acct-1".into(),
            byok_providers: vec!["openai".into()],
        };
        let written = store
            .put_json_at(
                ACCOUNTS,
                "acct-1",
                &account,
                Expect::Absent,
                PutOptions::default(),
                now(),
            )
            .await
            .unwrap();
        assert_eq!(
            written,
            PutOutcome::Write(WriteOutcome::Written { revision: 1 })
        );
        let read: Versioned<Account> = store
            .get_json_at(ACCOUNTS, "acct-1", now())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            read,
            Versioned {
                value: account,
                revision: 1
            }
        );
        assert!(
            store
                .get_json_at::<Account>(ACCOUNTS, "none", now())
                .await
                .unwrap()
                .is_none()
        );
    }

    async fn a_record_that_is_not_the_expected_json_is_reported_not_panicked(
        store: impl RecordStore,
    ) {
        store
            .put_record_at(
                KEYS,
                "bad",
                b"not json",
                Expect::Any,
                PutOptions::default(),
                now(),
            )
            .await
            .unwrap();
        let error = store
            .get_json_at::<Account>(KEYS, "bad", now())
            .await
            .unwrap_err();
        assert_eq!(error.operation(), "get_record");
        assert!(matches!(
            error.kind(),
            crate::store::StoreErrorKind::Corrupt(_)
        ));
    }
}
