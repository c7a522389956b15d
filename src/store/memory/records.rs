//! Records in memory: each collection with its revisions, its order of
//! creation and its records' lifetimes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::store::{MemoryStore, SWEEP_INTERVAL_MICROS, lock, sweep_due};
use crate::clock::unix_micros;
use crate::store::counter::duration_micros;
use crate::store::records::validate_put;
use crate::store::rules::records::expectation_holds;
use crate::store::{
    Expect, PutOptions, PutOutcome, RecordStore, StoreError, Versioned, WriteOutcome,
};

/// Every record collection, and when they are next swept of expired
/// records.
#[derive(Debug, Default)]
pub(super) struct Records {
    pub(super) collections: HashMap<String, Collection>,
    next_sweep_micros: i64,
}

impl Records {
    /// Removes every expired record of every collection, and collections
    /// left empty, at most once a second of store time: a session nobody
    /// calls again still has its expired flows removed.
    fn maybe_sweep(&mut self, now_micros: i64) {
        if sweep_due(self.next_sweep_micros, now_micros) {
            self.sweep(now_micros);
        }
    }

    pub(super) fn sweep(&mut self, now_micros: i64) {
        self.collections.retain(|_, collection| {
            collection.purge(now_micros);
            !collection.records.is_empty()
        });
        self.next_sweep_micros = now_micros.saturating_add(SWEEP_INTERVAL_MICROS);
    }
}

#[derive(Debug, Default)]
pub(super) struct Collection {
    pub(super) records: HashMap<String, StoredRecord>,
    /// Creation sequence number -> id, for newest-first listing.
    order: BTreeMap<u64, String>,
    next_sequence: u64,
    /// (expiry µs, id) of every record with a lifetime, soonest first, so
    /// removing the expired ones never scans the live ones.
    expiring: BTreeSet<(i64, String)>,
}

impl Collection {
    /// Removes every record expired by `now`.
    fn purge(&mut self, now_micros: i64) {
        while self
            .expiring
            .first()
            .is_some_and(|(expires_at_micros, _)| *expires_at_micros <= now_micros)
        {
            if let Some((_, id)) = self.expiring.pop_first()
                && let Some(record) = self.records.remove(&id)
            {
                self.order.remove(&record.sequence);
            }
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(record) = self.records.remove(id) {
            self.order.remove(&record.sequence);
            if let Some(expires_at_micros) = record.expires_at_micros {
                self.expiring.remove(&(expires_at_micros, id.to_owned()));
            }
        }
    }
}

#[derive(Debug)]
pub(super) struct StoredRecord {
    value: Vec<u8>,
    revision: u64,
    sequence: u64,
    /// A record that expires at `t` is live while `now < t`.
    expires_at_micros: Option<i64>,
}

impl StoredRecord {
    fn versioned(&self) -> Versioned<Vec<u8>> {
        Versioned {
            value: self.value.clone(),
            revision: self.revision,
        }
    }

    fn is_live(&self, now_micros: i64) -> bool {
        self.expires_at_micros
            .is_none_or(|expires_at_micros| expires_at_micros > now_micros)
    }
}

#[async_trait]
impl RecordStore for MemoryStore {
    async fn get_record_at(
        &self,
        collection: &str,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Versioned<Vec<u8>>>, StoreError> {
        let now_micros = unix_micros(now);
        let records = lock(&self.records);
        Ok(records
            .collections
            .get(collection)
            .and_then(|collection| collection.records.get(id))
            .filter(|record| record.is_live(now_micros))
            .map(StoredRecord::versioned))
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
        validate_put(&options)?;
        let now_micros = unix_micros(now);
        let mut records = lock(&self.records);
        // Only writers of expiring records sweep every collection: they keep
        // the time those records are judged by (a caller with no clock of
        // its own, at the system's, never removes a test's records early).
        if options.ttl.is_some() {
            records.maybe_sweep(now_micros);
        }
        let collection = records
            .collections
            .entry(collection.to_owned())
            .or_default();
        collection.purge(now_micros);
        let current = collection.records.get(id);
        if !expectation_holds(current.map(|record| record.revision), expect) {
            return Ok(PutOutcome::Write(WriteOutcome::Conflict {
                current: current.map(StoredRecord::versioned),
            }));
        }
        let live = collection.records.len() as u64;
        if current.is_none() && options.max_records.is_some_and(|max| live >= max) {
            return Ok(PutOutcome::Full { records: live });
        }
        let expires_at_micros = options
            .ttl
            .map(|ttl| now_micros.saturating_add(duration_micros(ttl)));
        let (revision, sequence) = match current {
            Some(record) => {
                if let Some(old) = record.expires_at_micros {
                    collection.expiring.remove(&(old, id.to_owned()));
                }
                (record.revision + 1, record.sequence)
            }
            None => {
                collection.next_sequence += 1;
                collection
                    .order
                    .insert(collection.next_sequence, id.to_owned());
                (1, collection.next_sequence)
            }
        };
        if let Some(expires_at_micros) = expires_at_micros {
            collection
                .expiring
                .insert((expires_at_micros, id.to_owned()));
        }
        collection.records.insert(
            id.to_owned(),
            StoredRecord {
                value: value.to_vec(),
                revision,
                sequence,
                expires_at_micros,
            },
        );
        Ok(PutOutcome::Write(WriteOutcome::Written { revision }))
    }

    async fn delete_record_at(
        &self,
        collection: &str,
        id: &str,
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<WriteOutcome, StoreError> {
        let mut records = lock(&self.records);
        let Some(collection) = records.collections.get_mut(collection) else {
            return Ok(match expect {
                Expect::Revision(_) => WriteOutcome::Conflict { current: None },
                Expect::Any | Expect::Absent => WriteOutcome::Written { revision: 0 },
            });
        };
        collection.purge(unix_micros(now));
        let current = collection.records.get(id);
        if !expectation_holds(current.map(|record| record.revision), expect) {
            return Ok(WriteOutcome::Conflict {
                current: current.map(StoredRecord::versioned),
            });
        }
        collection.remove(id);
        Ok(WriteOutcome::Written { revision: 0 })
    }

    async fn list_records_at(
        &self,
        collection: &str,
        offset: usize,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, Versioned<Vec<u8>>)>, StoreError> {
        let mut records = lock(&self.records);
        let Some(collection) = records.collections.get_mut(collection) else {
            return Ok(Vec::new());
        };
        collection.purge(unix_micros(now));
        Ok(collection
            .order
            .values()
            .rev()
            .skip(offset)
            .take(limit)
            .map(|id| (id.clone(), collection.records[id].versioned()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::TimeZone;

    use super::*;

    const SECOND: i64 = 1_000_000;

    /// `micros` after 2024-01-01 00:00:00 UTC.
    fn at(micros: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::microseconds(micros)
    }

    #[tokio::test]
    async fn expired_records_are_removed_even_from_collections_nobody_calls_again() {
        let store = MemoryStore::new();
        let week = PutOptions::expiring(Duration::from_secs(7 * 86_400));
        for session in 0..100 {
            let outcome = store
                .put_record_at(
                    &crate::store::flows(&format!("s{session}")),
                    "f",
                    b"v",
                    Expect::Absent,
                    week,
                    at(0),
                )
                .await
                .unwrap();
            assert_eq!(
                outcome,
                PutOutcome::Write(WriteOutcome::Written { revision: 1 })
            );
        }
        // A write without a lifetime, a year after `at(0)`, removes
        // nothing: only the writers that give records a lifetime sweep.
        store
            .put_record_at(
                crate::store::KEYS,
                "k",
                b"v",
                Expect::Any,
                PutOptions::default(),
                at(365 * 86_400 * SECOND),
            )
            .await
            .unwrap();
        assert_eq!(store.record_count(), 101);
        // An expiring write a week later sweeps every collection.
        store
            .put_record_at(
                &crate::store::flows("s-new"),
                "f",
                b"v",
                Expect::Absent,
                week,
                at(7 * 86_400 * SECOND),
            )
            .await
            .unwrap();
        assert_eq!(store.record_count(), 2);
        assert_eq!(
            lock(&store.records).collections.len(),
            2,
            "empty ones dropped"
        );
        // And so does `evict_expired`.
        store.evict_expired(at(14 * 86_400 * SECOND));
        assert_eq!(store.record_count(), 1);
    }
}
