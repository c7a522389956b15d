//! The index of each account's keys: a record collection per account
//! ([`account_keys`]) holding one entry per key hash, in the order the keys
//! were made, so that listing an account's keys reads that account's keys
//! and never the rest of the store's.
//!
//! A store cannot write two collections in one atomic step (on Redis
//! Cluster they live in different slots), so the order of the writes is
//! what keeps the index true: an entry is written **before** its key's
//! record and removed **after** it, so a crash between the two leaves an
//! entry naming no key (skipped when listed), never a key its account's
//! list misses.

use chrono::{DateTime, Utc};
use futures_util::future::try_join_all;

use super::key::KeyHash;
use super::record::KeyRecord;
use crate::store::{Expect, KEYS, PutOptions, RecordStore, RecordStoreExt, StoreError};

/// The collection of the hashes (lower-case hex) of the keys recorded on
/// `account`, newest first when listed; the operator's keys have theirs on
/// [`OPERATOR_ACCOUNT`](super::OPERATOR_ACCOUNT). An entry's value means
/// nothing: the key's record is in [`KEYS`], and an entry whose record is
/// missing is no key.
pub fn account_keys(account: &str) -> String {
    format!("account_keys/{account}")
}

/// The collection holding one record, [`KEY_INDEX_BUILT_ID`], once every
/// key a store held before the index existed has its entry. Deleting it
/// makes the next [`KeyDirectory::build_key_index`] walk every key again
/// (after instances of an older version made keys on the store).
///
/// [`KeyDirectory::build_key_index`]: super::KeyDirectory::build_key_index
pub const KEY_INDEX_BUILT: &str = "key_index_built";
/// The id of the one record in [`KEY_INDEX_BUILT`].
pub const KEY_INDEX_BUILT_ID: &str = "v1";

/// What an entry holds: nothing anyone reads.
const ENTRY: &[u8] = b"{}";

/// How many index entries a listing reads at a time: as many records are
/// then read at once.
const ENTRIES_PER_BATCH: usize = 100;

/// Adds `hash` to `account`'s index; an entry already there stays, in its
/// place. Written before the key's record.
pub(super) async fn add<S: RecordStore + ?Sized>(
    store: &S,
    account: &str,
    hash: &KeyHash,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    // A conflict is an entry there already, which is the goal.
    store
        .put_record_at(
            &account_keys(account),
            &hash.to_hex(),
            ENTRY,
            Expect::Absent,
            PutOptions::default(),
            now,
        )
        .await?
        .uncapped()?;
    Ok(())
}

/// Removes `hash` from `account`'s index. Removed after the key's record.
pub(super) async fn remove<S: RecordStore + ?Sized>(
    store: &S,
    account: &str,
    hash: &KeyHash,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    store
        .delete_record_at(&account_keys(account), &hash.to_hex(), Expect::Any, now)
        .await?;
    Ok(())
}

/// Whether every key of the store has its index entry (the backfill of a
/// store made before the index has run to its end).
pub(super) async fn is_built<S: RecordStore + ?Sized>(
    store: &S,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    Ok(store
        .get_record_at(KEY_INDEX_BUILT, KEY_INDEX_BUILT_ID, now)
        .await?
        .is_some())
}

/// Records that every key of the store has its index entry.
pub(super) async fn mark_built<S: RecordStore + ?Sized>(
    store: &S,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    // A conflict: another instance finished first.
    store
        .put_json_at(
            KEY_INDEX_BUILT,
            KEY_INDEX_BUILT_ID,
            &serde_json::json!({ "built_at": now }),
            Expect::Absent,
            PutOptions::default(),
            now,
        )
        .await?
        .uncapped()?;
    Ok(())
}

/// The keys of `account` ([`KeyRecord::belongs_to`]) in its index's order,
/// newest first, skipping `offset` of those shown; disabled ones only when
/// `include_disabled`; at most `page_size`. Reads the account's entries
/// and their records, never another account's: the cost follows the
/// account's keys (up to `offset + page_size` of them), not the store's.
pub(super) async fn list<S: RecordStore + ?Sized>(
    store: &S,
    account: &str,
    offset: usize,
    include_disabled: bool,
    page_size: usize,
    now: DateTime<Utc>,
) -> Result<Vec<KeyRecord>, StoreError> {
    let collection = account_keys(account);
    let mut skipped = 0;
    let mut page = Vec::new();
    let mut cursor = 0;
    while page.len() < page_size {
        let entries = store
            .list_records_at(&collection, cursor, ENTRIES_PER_BATCH, now)
            .await?;
        let fetched = entries.len();
        let records = try_join_all(
            entries
                .iter()
                .map(|(id, _)| store.get_json_at::<KeyRecord>(KEYS, id, now)),
        )
        .await?;
        for ((id, _), record) in entries.iter().zip(records) {
            // No record: a key whose creation stopped after its entry, or
            // one deleted before its entry was removed.
            let Some(record) = record else { continue };
            let record = record.value;
            if record.hash.to_hex() != *id {
                return Err(StoreError::corrupt(
                    "get_record",
                    "a key record's hash does not match its id",
                ));
            }
            // `belongs_to` also leaves out an entry the key's account has
            // moved from, and an operator's key on a tenant account.
            if (record.disabled && !include_disabled) || !record.belongs_to(account) {
                continue;
            }
            if skipped < offset {
                skipped += 1;
            } else if page.len() < page_size {
                page.push(record);
            }
        }
        if fetched < ENTRIES_PER_BATCH {
            break;
        }
        cursor += fetched;
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::keys::{KeyDirectory, NewKey};
    use crate::store::{MemoryStore, PutOutcome, Versioned, WriteOutcome};

    /// A record store that counts the key records read through it.
    struct Counting {
        inner: Arc<MemoryStore>,
        keys_read: AtomicUsize,
    }

    impl Counting {
        fn take(&self) -> usize {
            self.keys_read.swap(0, Ordering::Relaxed)
        }
    }

    #[async_trait]
    impl RecordStore for Counting {
        async fn get_record_at(
            &self,
            collection: &str,
            id: &str,
            now: DateTime<Utc>,
        ) -> Result<Option<Versioned<Vec<u8>>>, StoreError> {
            let record = self.inner.get_record_at(collection, id, now).await?;
            if collection == KEYS && record.is_some() {
                self.keys_read.fetch_add(1, Ordering::Relaxed);
            }
            Ok(record)
        }

        async fn put_record_at(
            &self,
            collection: &str,
            id: &str,
            value: &[u8],
            expect: Expect,
            options: PutOptions,
            now: DateTime<Utc>,
        ) -> Result<PutOutcome, StoreError> {
            self.inner
                .put_record_at(collection, id, value, expect, options, now)
                .await
        }

        async fn delete_record_at(
            &self,
            collection: &str,
            id: &str,
            expect: Expect,
            now: DateTime<Utc>,
        ) -> Result<WriteOutcome, StoreError> {
            self.inner
                .delete_record_at(collection, id, expect, now)
                .await
        }

        async fn list_records_at(
            &self,
            collection: &str,
            offset: usize,
            limit: usize,
            now: DateTime<Utc>,
        ) -> Result<Vec<(String, Versioned<Vec<u8>>)>, StoreError> {
            let records = self
                .inner
                .list_records_at(collection, offset, limit, now)
                .await?;
            if collection == KEYS {
                self.keys_read.fetch_add(records.len(), Ordering::Relaxed);
            }
            Ok(records)
        }
    }

    fn on(account: &str) -> NewKey {
        NewKey {
            account: account.to_owned(),
            ..NewKey::named("k")
        }
    }

    #[tokio::test]
    async fn listing_an_account_reads_its_own_keys_whatever_other_accounts_hold() {
        let memory = Arc::new(MemoryStore::new());
        let directory = KeyDirectory::new(memory.clone());
        let counting = Counting {
            inner: memory,
            keys_read: AtomicUsize::new(0),
        };
        let now = directory.now();
        for _ in 0..5 {
            directory.create_key(on("acme")).await.unwrap();
        }
        let mut reads = Vec::new();
        for _ in 0..3 {
            let listed = list(&counting, "acme", 0, false, 100, now).await.unwrap();
            assert_eq!(listed.len(), 5);
            let paged = list(&counting, "acme", 2, false, 2, now).await.unwrap();
            assert_eq!(paged.len(), 2);
            reads.push(counting.take());
            for _ in 0..500 {
                directory.create_key(on("other")).await.unwrap();
            }
        }
        // Five keys read for the first call, all five again for the
        // second (its batch reads them together), with none or a thousand
        // other keys in the store.
        assert_eq!(reads, [10, 10, 10]);
    }
}
