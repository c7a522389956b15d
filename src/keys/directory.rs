//! [`KeyDirectory`]: keys and accounts in the store, with a short-lived
//! in-process cache in front of the lookups BearerAuth makes.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::index;
use super::key::{ApiKey, KeyHash};
use super::lookup_cache::LookupCache;
use super::record::{
    AccountRecord, DELETED_KEYS, DeletedKey, KeyRecord, KeyUpdate, LeakReport, NewAccount, NewKey,
    OPERATOR_ACCOUNT, OPERATOR_KEY_MINTED, is_valid_account_id,
};
use crate::clock::{Clock, SystemClock};
use crate::store::{
    ACCOUNTS, AccountBalance, Expect, KEYS, KeyTerms, PutOptions, RecordStoreExt, SharedStore,
    StoreError, TopUpOutcome, Versioned, WriteOutcome,
};

/// How often a compare-and-set write is retried when another writer got
/// there first.
pub(super) const MAX_WRITE_ATTEMPTS: usize = 16;

/// Most successors a disable or a leak report follows from one key: far
/// more than rotations made within one grace, a bound on a damaged chain.
const MAX_SUCCESSORS: usize = 64;

/// What [`KeyDirectory::rotate_key`] did.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one value per rotation, a management call"
)]
pub enum RotateOutcome {
    /// The new key (its plaintext, to be shown once, and its record) and
    /// the old key's record as now stored, its grace as its `expires_at`.
    Rotated {
        /// The new key's plaintext.
        key: ApiKey,
        /// The new key's record.
        record: KeyRecord,
        /// The old key's record, rotated.
        previous: KeyRecord,
    },
    /// The key was rotated before: its record.
    AlreadyRotated(KeyRecord),
    /// The key cannot be rotated: it is disabled, reported leaked or past
    /// its expiry (its record says which).
    NotRotatable(KeyRecord),
    /// No key has this hash.
    NoSuchKey,
}

/// What the store says about a key hash.
#[derive(Clone, Debug)]
pub enum KeyState {
    /// The key exists (it may still be disabled or expired).
    Active(Arc<KeyRecord>),
    /// The key existed and was deleted.
    Deleted,
    /// No key has this hash.
    Unknown,
}

/// What [`KeyDirectory::report_leak`] found.
#[derive(Clone, Debug)]
pub enum LeakOutcome {
    /// A key of this gateway, now revoked and disabled. `first` when this
    /// report was the first for it (so that its owner is told once).
    Revoked {
        /// The key's record, with the leak.
        record: Box<KeyRecord>,
        /// Whether this report was the key's first.
        first: bool,
    },
    /// The key had been deleted: nothing is left to revoke.
    Deleted,
    /// No key has this hash.
    Unknown,
}

/// Configures a [`KeyDirectory`]; made by [`KeyDirectory::builder`].
///
/// A builder, so that every handle of one directory shares one cache: a
/// change made through any clone is seen at once by all of them.
pub struct KeyDirectoryBuilder {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    cache_ttl: Duration,
    max_cached_keys: usize,
}

impl fmt::Debug for KeyDirectoryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyDirectoryBuilder")
            .field("clock", &self.clock)
            .field("cache_ttl", &self.cache_ttl)
            .field("max_cached_keys", &self.max_cached_keys)
            .finish_non_exhaustive()
    }
}

impl KeyDirectoryBuilder {
    /// Uses `clock` for expiry, usage periods and the cache.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Trusts a lookup for `cache_ttl`; zero turns the cache off.
    pub fn cache_ttl(mut self, cache_ttl: Duration) -> Self {
        self.cache_ttl = cache_ttl;
        self
    }

    /// Holds at most `max_cached_keys` live keys, and a quarter as many
    /// unknown or deleted ones.
    pub fn max_cached_keys(mut self, max_cached_keys: usize) -> Self {
        self.max_cached_keys = max_cached_keys;
        self
    }

    /// The directory.
    pub fn build(self) -> KeyDirectory {
        KeyDirectory {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock,
                max_cached_keys: self.max_cached_keys,
                cache: LookupCache::new(self.cache_ttl, self.max_cached_keys),
                noting_use: Mutex::default(),
                key_index_built: AtomicBool::new(false),
            }),
        }
    }
}

/// Keys and accounts, read and written through the store, shared by
/// [`BearerAuthLayer`](crate::auth::BearerAuthLayer) and the JSON API's
/// `KeyRoutesLayer`.
///
/// Lookups are cached in process for
/// [`cache_ttl`](KeyDirectoryBuilder::cache_ttl) (default 1 s). A change made through this directory (update, delete) is
/// seen at once by the instance that made it; every other instance sees it
/// within the cache time. A TTL of zero turns the cache off.
///
/// Cheap to clone: clones share the store, clock and cache.
#[derive(Clone)]
pub struct KeyDirectory {
    inner: Arc<Inner>,
}

struct Inner {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    max_cached_keys: usize,
    // Live keys apart from refused ones: the checksum is public, so made-up
    // keys are easy to send.
    cache: LookupCache<KeyHash, KeyState>,
    // Keys whose last use is being written: one write per key at a time.
    noting_use: Mutex<HashSet<KeyHash>>,
    // Whether this instance has seen the store's index of each account's
    // keys complete (`index::is_built`): read once, then never again.
    key_index_built: AtomicBool,
}

impl fmt::Debug for KeyDirectory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyDirectory")
            .field("clock", &self.inner.clock)
            .field("cache_ttl", &self.inner.cache.ttl())
            .field("max_cached_keys", &self.inner.max_cached_keys)
            .finish_non_exhaustive()
    }
}

impl KeyDirectory {
    /// How long a lookup is trusted by default: the longest a deleted or
    /// disabled key keeps working on another instance.
    pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(1);
    /// How many live keys the cache holds by default.
    pub const DEFAULT_MAX_CACHED_KEYS: usize = 100_000;

    /// A directory on `store` with the system clock and the default cache.
    pub fn new(store: SharedStore) -> Self {
        Self::builder(store).build()
    }

    /// A directory on `store` with its clock and cache still to choose.
    pub fn builder(store: SharedStore) -> KeyDirectoryBuilder {
        KeyDirectoryBuilder {
            store,
            clock: Arc::new(SystemClock),
            cache_ttl: Self::DEFAULT_CACHE_TTL,
            max_cached_keys: Self::DEFAULT_MAX_CACHED_KEYS,
        }
    }

    /// The store the directory reads and writes.
    pub fn store(&self) -> &SharedStore {
        &self.inner.store
    }

    /// The directory's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The current time on the directory's clock.
    pub fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    /// Writes one of the directory's records (none of them expires) when
    /// `expect` holds, at the directory's instant.
    pub(super) async fn write_json<T: Serialize + Sync>(
        &self,
        collection: &str,
        id: &str,
        value: &T,
        expect: Expect,
    ) -> Result<WriteOutcome, StoreError> {
        self.inner
            .store
            .put_json_at(
                collection,
                id,
                value,
                expect,
                PutOptions::default(),
                self.now(),
            )
            .await?
            .uncapped()
    }

    /// What the store says about `hash`, from the cache when fresh.
    pub async fn lookup(&self, hash: &KeyHash) -> Result<KeyState, StoreError> {
        let now = self.now();
        let cache = &self.inner.cache;
        if let Some(state) = cache.get(hash, now) {
            return Ok(state);
        }
        let generation = cache.generation();
        let state = self.fetch(hash).await?;
        let live = matches!(state, KeyState::Active(_));
        cache.remember(*hash, &state, live, now, generation);
        Ok(state)
    }

    /// Whether this instance's cache holds `hash` as a key it found live,
    /// however long ago (a stale entry is read afresh by the next lookup);
    /// never reads the store. Made-up keys are never among them, so a
    /// blocked address's guesses can be refused without a store read while
    /// its keys in use are still looked up and served.
    pub fn is_cached_live(&self, hash: &KeyHash) -> bool {
        self.inner.cache.holds_found(hash)
    }

    /// [`lookup`](Self::lookup), except that a live key is always read
    /// from the store, so that a change made on another instance (a leak,
    /// a disable) counts at once; unknown and deleted keys still come from
    /// the cache. For the requests that never reach the ledger's admission
    /// step, which refuses a revoked key by itself.
    pub async fn lookup_live(&self, hash: &KeyHash) -> Result<KeyState, StoreError> {
        let now = self.now();
        let cache = &self.inner.cache;
        if let Some(state @ (KeyState::Deleted | KeyState::Unknown)) = cache.get(hash, now) {
            return Ok(state);
        }
        let generation = cache.generation();
        let state = self.fetch(hash).await?;
        let live = matches!(state, KeyState::Active(_));
        cache.remember(*hash, &state, live, now, generation);
        Ok(state)
    }

    async fn fetch(&self, hash: &KeyHash) -> Result<KeyState, StoreError> {
        let id = hash.to_hex();
        let store = &self.inner.store;
        let now = self.now();
        if let Some(record) = store.get_json_at::<KeyRecord>(KEYS, &id, now).await? {
            // The record is found by its hash; comparing again, in constant
            // time, guards against a store that answers for the wrong id.
            if record.value.hash != *hash {
                return Err(StoreError::corrupt(
                    "get_record",
                    "a key record's hash does not match its id",
                ));
            }
            return Ok(KeyState::Active(Arc::new(record.value)));
        }
        if store.get_record_at(DELETED_KEYS, &id, now).await?.is_some() {
            return Ok(KeyState::Deleted);
        }
        Ok(KeyState::Unknown)
    }

    /// Drops `hash` from this instance's cache, so its next request reads
    /// the store. Every change made through the directory does this.
    pub fn forget(&self, hash: &KeyHash) {
        self.inner.cache.forget(hash);
    }

    /// Creates a key and its account if new; returns the plaintext (to be
    /// shown once) and the stored record. An operator's key goes on
    /// [`OPERATOR_ACCOUNT`], whatever `new.account` says.
    pub async fn create_key(&self, new: NewKey) -> Result<(ApiKey, KeyRecord), StoreError> {
        let new = self.place(new).await?;
        let now = self.now();
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let key = ApiKey::generate();
            let hash = key.hash();
            let record = KeyRecord {
                hash,
                name: new.name.clone(),
                account: new.account.clone(),
                management: new.management,
                scoped_to_account: new.management && new.scoped_to_account,
                disabled: false,
                disabled_by_operator: false,
                limit_nanos: new.limit_nanos,
                limit_reset: new.limit_reset,
                include_byok_in_limit: new.include_byok_in_limit,
                created_at: now,
                updated_at: None,
                expires_at: new.expires_at,
                last_used_at: None,
                leak: None,
                hint: Some(key.hint()),
                rotated_to: None,
                allowed_models: new.allowed_models.clone(),
                rate_limit: new.rate_limit,
            };
            // The ledger's terms first: a key is never live with terms the
            // ledger does not have. Then its account's index entry: a key
            // is never missing from its account's list. (After a collision
            // below, the entry names another key, listed only by its own
            // account.)
            self.keep_terms(&record).await?;
            index::add(&*self.inner.store, &record.account, &hash, now).await?;
            match self
                .write_json(KEYS, &record.hash.to_hex(), &record, Expect::Absent)
                .await?
            {
                WriteOutcome::Written { .. } => {
                    self.forget(&hash);
                    return Ok((key, record));
                }
                // Two keys with one hash: 256 random bits make this a
                // broken random source, not bad luck; try again anyway.
                WriteOutcome::Conflict { .. } => continue,
            }
        }
        Err(StoreError::corrupt(
            "put_record",
            "every newly generated key collided with an existing one",
        ))
    }

    /// Records `key`, a plaintext chosen outside (an operator's key from
    /// the environment), with `new`'s settings; when it is recorded already
    /// the stored record stands. A deleted key stays deleted.
    pub async fn register_key(&self, key: &ApiKey, new: NewKey) -> Result<KeyRecord, StoreError> {
        self.register_hash(key.hash(), Some(key.hint()), new).await
    }

    /// Records the key whose hash is `hash` (with `hint`, when its text is
    /// known), as [`register_key`](Self::register_key) says.
    pub(super) async fn register_hash(
        &self,
        hash: KeyHash,
        hint: Option<String>,
        new: NewKey,
    ) -> Result<KeyRecord, StoreError> {
        if self
            .inner
            .store
            .get_record_at(DELETED_KEYS, &hash.to_hex(), self.now())
            .await?
            .is_some()
        {
            return Err(StoreError::invalid(
                "put_record",
                "this key was deleted; a deleted key cannot be registered again",
            ));
        }
        let new = self.place(new).await?;
        let record = KeyRecord {
            hash,
            name: new.name,
            account: new.account,
            management: new.management,
            scoped_to_account: new.management && new.scoped_to_account,
            disabled: false,
            disabled_by_operator: false,
            limit_nanos: new.limit_nanos,
            limit_reset: new.limit_reset,
            include_byok_in_limit: new.include_byok_in_limit,
            created_at: self.now(),
            updated_at: None,
            expires_at: new.expires_at,
            last_used_at: None,
            leak: None,
            hint,
            rotated_to: None,
            allowed_models: new.allowed_models,
            rate_limit: new.rate_limit,
        };
        // The index entry before the record: a key is never missing from
        // its account's list.
        index::add(&*self.inner.store, &record.account, &hash, self.now()).await?;
        let outcome = self
            .write_json(KEYS, &record.hash.to_hex(), &record, Expect::Absent)
            .await?;
        self.forget(&hash);
        match outcome {
            WriteOutcome::Written { .. } => {
                self.keep_terms(&record).await?;
                Ok(record)
            }
            // The stored record stands, and its terms and index entry are
            // written again (repairing any a failed write left behind); an
            // entry just written on another account goes.
            WriteOutcome::Conflict {
                current: Some(current),
            } => {
                let stored = crate::store::decode::<KeyRecord>("get_record", current)?.value;
                self.keep_terms(&stored).await?;
                let now = self.now();
                index::add(&*self.inner.store, &stored.account, &hash, now).await?;
                if stored.account != record.account {
                    index::remove(&*self.inner.store, &record.account, &hash, now).await?;
                }
                Ok(stored)
            }
            WriteOutcome::Conflict { current: None } => Err(too_contended("put_record")),
        }
    }

    /// Gives the ledger the key's limit and expiry, which every admission
    /// of the key then decides by, by the store's clock: a change is in
    /// force on every instance at once, not when their caches of the
    /// record catch up.
    async fn keep_terms(&self, record: &KeyRecord) -> Result<(), StoreError> {
        let terms = KeyTerms {
            limit: record.key_limit(),
            expires_at: record.expires_at,
        };
        self.inner
            .store
            .set_key_terms(&record.account, &record.hash.to_hex(), &terms)
            .await
    }

    /// Writes every key's terms into the ledger (as each key write does
    /// since the ledger's layout 2); how many keys. Run once when moving a
    /// store from layout 1, with no older instance running; running it
    /// again changes nothing.
    pub async fn write_every_key_s_terms(&self) -> Result<usize, StoreError> {
        let mut records = Vec::new();
        self.each_key(|record| records.push(record)).await?;
        for record in &records {
            self.keep_terms(record).await?;
        }
        Ok(records.len())
    }

    /// The account and hash of every key in the store: what a migration of
    /// the ledger's layout moves, key by key.
    pub async fn every_key_s_account(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut keys = Vec::new();
        self.each_key(|record| keys.push((record.account, record.hash.to_hex())))
            .await?;
        Ok(keys)
    }

    /// `new` on the account its key belongs to: an operator's key on
    /// [`OPERATOR_ACCOUNT`] (no account record: it is no tenant's), any
    /// other on its account, recorded if new.
    async fn place(&self, mut new: NewKey) -> Result<NewKey, StoreError> {
        if new.management && !new.scoped_to_account {
            new.account = OPERATOR_ACCOUNT.to_owned();
        } else {
            self.ensure_account(&new.account).await?;
        }
        Ok(new)
    }

    /// Every operator's key ([`KeyRecord::is_operator`]) in the store,
    /// disabled ones included.
    pub async fn operator_keys(&self) -> Result<Vec<KeyRecord>, StoreError> {
        let mut found = Vec::new();
        self.each_key(|record| {
            if record.is_operator() {
                found.push(record);
            }
        })
        .await?;
        Ok(found)
    }

    /// Moves every operator's key recorded on a tenant account (as stores
    /// written before [`OPERATOR_ACCOUNT`] have them, on `default`) to
    /// [`OPERATOR_ACCOUNT`], so that account's management keys no longer
    /// reach it. Returns how many moved; run at start-up, idempotent.
    pub async fn move_operator_keys(&self) -> Result<usize, StoreError> {
        let mut moved = 0;
        for record in self.operator_keys().await? {
            if record.account == OPERATOR_ACCOUNT {
                continue;
            }
            let hash = record.hash;
            let edited = self
                .edit(&hash, |record| {
                    let misplaced = record.is_operator() && record.account != OPERATOR_ACCOUNT;
                    if misplaced {
                        record.account = OPERATOR_ACCOUNT.to_owned();
                    }
                    misplaced
                })
                .await?;
            if matches!(edited, Some((_, true))) {
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// Makes an operator's key named `name` when the store has none and
    /// none was ever made this way: the key a first start prints. The
    /// decision is one create-if-absent write of a marker, so of any number
    /// of callers at once (proxies starting together on an empty store)
    /// exactly one gets `Some`; the others, and every later call, `None`.
    /// After a loss the way back is
    /// [`replace_operator_keys`](Self::replace_operator_keys).
    pub async fn mint_operator_key(&self, name: &str) -> Result<Option<ApiKey>, StoreError> {
        if !self.operator_keys().await?.is_empty() {
            return Ok(None);
        }
        let key = ApiKey::generate();
        let marker = OperatorKeyMinted {
            hash: key.hash().to_hex(),
            minted_at: self.now(),
        };
        let outcome = self
            .write_json(OPERATOR_KEY_MINTED, MINTED_ID, &marker, Expect::Absent)
            .await?;
        if let WriteOutcome::Conflict { .. } = outcome {
            return Ok(None);
        }
        let new = NewKey {
            management: true,
            ..NewKey::named(name)
        };
        self.register_key(&key, new).await?;
        Ok(Some(key))
    }

    /// Disables every operator's key and creates one new one, named
    /// `name`: the way back in when the operator's key is lost (or leaked).
    /// Returns the new key (to be shown once) and how many were disabled.
    pub async fn replace_operator_keys(&self, name: &str) -> Result<(ApiKey, usize), StoreError> {
        self.move_operator_keys().await?;
        let disable = KeyUpdate {
            disabled: Some(true),
            ..KeyUpdate::default()
        };
        let mut disabled = 0;
        for record in self.operator_keys().await? {
            if record.disabled {
                continue;
            }
            let hash = record.hash;
            if self.update(&hash, &disable).await?.is_some() {
                disabled += 1;
            }
        }
        let (key, _) = self
            .create_key(NewKey {
                management: true,
                ..NewKey::named(name)
            })
            .await?;
        Ok((key, disabled))
    }

    /// Calls `visit` once with every key record in the store through the
    /// walk, in the store's order (newest first); a key made meanwhile may
    /// be visited or not.
    ///
    /// Pages are read by offset, and a key deleted meanwhile moves every
    /// older one a place forward: so each page is read from a little
    /// before where the last one ended, further back until it starts with
    /// a key visited already, and then no key can have slipped past.
    async fn each_key(&self, mut visit: impl FnMut(KeyRecord)) -> Result<(), StoreError> {
        const BATCH: usize = 500;
        const OVERLAP: usize = 32;
        let store = &self.inner.store;
        let mut visited = HashSet::new();
        // How many places of the order the walk has read.
        let mut cursor: usize = 0;
        loop {
            let mut back = OVERLAP;
            let (start, limit, batch) = loop {
                let start = cursor.saturating_sub(back);
                let limit = cursor - start + BATCH;
                let batch = store
                    .list_records_at(KEYS, start, limit, self.now())
                    .await?;
                let anchored =
                    start == 0 || batch.first().is_some_and(|(id, _)| visited.contains(id));
                if anchored {
                    break (start, limit, batch);
                }
                back = back.saturating_mul(2);
            };
            let fetched = batch.len();
            for (id, record) in batch {
                if visited.insert(id) {
                    visit(crate::store::decode::<KeyRecord>("list_records", record)?.value);
                }
            }
            if fetched < limit {
                return Ok(());
            }
            cursor = start + fetched;
        }
    }

    /// The stored record of `hash`, read from the store (not the cache).
    pub async fn get(&self, hash: &KeyHash) -> Result<Option<Versioned<KeyRecord>>, StoreError> {
        self.inner
            .store
            .get_json_at(KEYS, &hash.to_hex(), self.now())
            .await
    }

    /// Applies `update` to the key `hash`, as the operator; `None` when
    /// there is no such key. See [`update_as`](Self::update_as).
    pub async fn update(
        &self,
        hash: &KeyHash,
        update: &KeyUpdate,
    ) -> Result<Option<KeyRecord>, StoreError> {
        self.update_as(hash, update, true).await
    }

    /// Applies `update` to the key `hash`, made by the operator when
    /// `by_operator`, else by an account's management key (which cannot
    /// enable a key the operator disabled); `None` when there is no such
    /// key. A disable of a rotated key still in its grace reaches its
    /// successors: whoever holds the key may have made them.
    pub async fn update_as(
        &self,
        hash: &KeyHash,
        update: &KeyUpdate,
        by_operator: bool,
    ) -> Result<Option<KeyRecord>, StoreError> {
        let edited = self
            .edit(hash, |record| {
                update.apply(record, self.now(), by_operator);
                true
            })
            .await?;
        if let Some((record, _)) = &edited
            && update.disabled == Some(true)
        {
            for successor in self.successors_in_grace(record).await? {
                self.edit(&successor, |record| {
                    if record.disabled && (record.disabled_by_operator || !by_operator) {
                        return false;
                    }
                    super::record::disable(record, by_operator);
                    record.updated_at = Some(self.now());
                    true
                })
                .await?;
            }
        }
        Ok(edited.map(|(record, _)| record))
    }

    /// The keys that succeed `record` through rotations made while each
    /// predecessor was still in its grace: its successor while `record`'s
    /// grace runs, that one's while its own runs, and so on (a chain
    /// bounded by [`MAX_SUCCESSORS`], which rotations make one at a time).
    async fn successors_in_grace(&self, record: &KeyRecord) -> Result<Vec<KeyHash>, StoreError> {
        let now = self.now();
        let mut successors = Vec::new();
        let mut current = record.clone();
        while let Some(next) = current.rotated_to
            && !current.is_expired(now)
            && successors.len() < MAX_SUCCESSORS
            && !successors.contains(&next)
        {
            successors.push(next);
            match self.get(&next).await? {
                Some(found) => current = found.value,
                None => break,
            }
        }
        Ok(successors)
    }

    /// Reads the key `hash`, lets `change` edit it, and writes it back when
    /// `change` says so (compare-and-set, read again after a conflict).
    /// `None` when there is no such key; else the record and whether it was
    /// written.
    async fn edit(
        &self,
        hash: &KeyHash,
        mut change: impl FnMut(&mut KeyRecord) -> bool,
    ) -> Result<Option<(KeyRecord, bool)>, StoreError> {
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let Some(Versioned {
                value: mut record,
                revision,
            }) = self.get(hash).await?
            else {
                return Ok(None);
            };
            let account_before = record.account.clone();
            if !change(&mut record) {
                return Ok(Some((record, false)));
            }
            // The ledger's terms before the record: a failure leaves the
            // key as it was, and the caller's retry writes both.
            self.keep_terms(&record).await?;
            // A key moved to another account (an operator's key off a
            // tenant's) is in the new account's index before its record
            // says so, and leaves the old one's after.
            let moved = record.account != account_before;
            if moved {
                index::add(&*self.inner.store, &record.account, hash, self.now()).await?;
            }
            let outcome = self
                .write_json(
                    KEYS,
                    &record.hash.to_hex(),
                    &record,
                    Expect::Revision(revision),
                )
                .await?;
            if let WriteOutcome::Written { .. } = outcome {
                self.forget(hash);
                if moved {
                    self.unindex(&account_before, hash).await;
                }
                return Ok(Some((record, true)));
            }
        }
        Err(too_contended("put_record"))
    }

    /// Removes `hash` from `account`'s index of keys, once the key's
    /// record has left it (deleted, or moved to another account): the
    /// change is made already, so a failure is logged, not returned; the
    /// entry left is skipped by every listing of `account`.
    async fn unindex(&self, account: &str, hash: &KeyHash) {
        if let Err(error) = index::remove(&*self.inner.store, account, hash, self.now()).await {
            tracing::warn!(%error, account, "a key's entry in its account's index was not removed; listings skip it");
        }
    }

    /// Replaces the key `hash` with a new one of the same name, account,
    /// kind, limit, reset, BYOK rule, expiry, model list and rate. The old key keeps working
    /// for `grace` (no longer than its own expiry), then is refused with
    /// 401 `rotated_key`. A key is rotated once: two rotations at once make
    /// one successor between them.
    pub async fn rotate_key(
        &self,
        hash: &KeyHash,
        grace: std::time::Duration,
    ) -> Result<RotateOutcome, StoreError> {
        let Some(Versioned { value: old, .. }) = self.get(hash).await? else {
            return Ok(RotateOutcome::NoSuchKey);
        };
        if old.rotated_to.is_some() {
            return Ok(RotateOutcome::AlreadyRotated(old));
        }
        // Only a key that works gets a successor; checked again in the
        // write, which a disable or a leak report may race.
        let rotatable = |record: &KeyRecord, now| {
            !record.disabled && record.leak.is_none() && !record.is_expired(now)
        };
        if !rotatable(&old, self.now()) {
            return Ok(RotateOutcome::NotRotatable(old));
        }
        let (key, record) = self
            .create_key(NewKey {
                name: old.name.clone(),
                account: old.account.clone(),
                management: old.management,
                scoped_to_account: old.scoped_to_account,
                limit_nanos: old.limit_nanos,
                limit_reset: old.limit_reset,
                include_byok_in_limit: old.include_byok_in_limit,
                expires_at: old.expires_at,
                allowed_models: old.allowed_models.clone(),
                rate_limit: old.rate_limit,
            })
            .await?;
        let now = self.now();
        let grace_ends =
            now + chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::MAX / 2);
        let edited = self
            .edit(hash, |current| {
                if current.rotated_to.is_some() || !rotatable(current, now) {
                    return false;
                }
                current.rotated_to = Some(record.hash);
                current.expires_at = Some(
                    current
                        .expires_at
                        .map_or(grace_ends, |at| at.min(grace_ends)),
                );
                current.updated_at = Some(now);
                true
            })
            .await;
        let edited = match edited {
            Ok(edited) => edited,
            // The write may have landed with its answer lost: then the
            // rotation happened, and its successor must not be lost.
            Err(error) => {
                return match self.get(hash).await {
                    Ok(Some(current))
                        if current.value.rotated_to.as_ref() == Some(&record.hash) =>
                    {
                        Ok(RotateOutcome::Rotated {
                            key,
                            record,
                            previous: current.value,
                        })
                    }
                    _ => {
                        // Best effort: a successor left behind works until
                        // deleted, and is listed under the old key's name.
                        let _ = self.delete(&key.hash()).await;
                        Err(error)
                    }
                };
            }
        };
        match edited {
            Some((previous, true)) => Ok(RotateOutcome::Rotated {
                key,
                record,
                previous,
            }),
            // Another rotation, a disable, a leak report or a deletion came
            // first: the key made for this one never served and goes.
            other => {
                self.delete(&key.hash()).await?;
                Ok(match other {
                    Some((current, _)) if current.rotated_to.is_some() => {
                        RotateOutcome::AlreadyRotated(current)
                    }
                    Some((current, _)) => RotateOutcome::NotRotatable(current),
                    None => RotateOutcome::NoSuchKey,
                })
            }
        }
    }

    /// Deletes the key `hash`, leaving a tombstone so it is answered
    /// "deleted"; `false` when there was no such key.
    pub async fn delete(&self, hash: &KeyHash) -> Result<bool, StoreError> {
        let id = hash.to_hex();
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let Some(current) = self.get(hash).await? else {
                return Ok(false);
            };
            // The tombstone goes first: between the two writes the key is
            // "deleted" already, never "unknown" nor still usable.
            let tombstone = DeletedKey {
                account: current.value.account.clone(),
                deleted_at: self.now(),
            };
            self.write_json(DELETED_KEYS, &id, &tombstone, Expect::Any)
                .await?;
            let outcome = self
                .inner
                .store
                .delete_record_at(KEYS, &id, Expect::Revision(current.revision), self.now())
                .await?;
            if let WriteOutcome::Written { .. } = outcome {
                self.forget(hash);
                // The index entry last, and the key is deleted whether or
                // not it goes: one left names no key, and listings skip it.
                self.unindex(&current.value.account, hash).await;
                return Ok(true);
            }
        }
        Err(too_contended("delete_record"))
    }

    /// Revokes and disables the key `hash`, reported leaked by `report`.
    ///
    /// The key is revoked in the ledger first
    /// ([`LedgerStore::revoke_key`](crate::store::LedgerStore::revoke_key)),
    /// so that from then on no instance admits a chat request with it
    /// whatever its cache holds; then its record is disabled for good and
    /// keeps the report (the first one, when it is reported again). Its
    /// usage stays readable. An error leaves the key revoked or not, never
    /// half-written: report it again.
    pub async fn report_leak(
        &self,
        hash: &KeyHash,
        report: &LeakReport,
    ) -> Result<LeakOutcome, StoreError> {
        let Some(current) = self.get(hash).await? else {
            return Ok(match self.fetch(hash).await? {
                KeyState::Deleted => LeakOutcome::Deleted,
                _ => LeakOutcome::Unknown,
            });
        };
        // Whoever holds a key in its grace may have made its successors
        // (a management key rotating itself): they leak with it.
        let successors = self.successors_in_grace(&current.value).await?;
        let outcome = self.revoke(hash, &current.value.account, report).await?;
        for successor in successors {
            if let Some(found) = self.get(&successor).await? {
                self.revoke(&successor, &found.value.account, report)
                    .await?;
            }
        }
        Ok(outcome)
    }

    /// Revokes the key `hash` of `account` in the ledger, then records its
    /// leak and disables it (the first report stands).
    async fn revoke(
        &self,
        hash: &KeyHash,
        account: &str,
        report: &LeakReport,
    ) -> Result<LeakOutcome, StoreError> {
        // A key never changes account: the revocation stays in the right ledger.
        self.inner
            .store
            .revoke_key(account, &hash.to_hex(), self.now())
            .await?;
        let edited = self
            .edit(hash, |record| {
                // Reported before: the first report stands.
                if record.leak.is_some() {
                    return false;
                }
                record.leak = Some(report.clone());
                record.disabled = true;
                record.updated_at = Some(self.now());
                true
            })
            .await?;
        self.forget(hash);
        Ok(match edited {
            Some((record, first)) => LeakOutcome::Revoked {
                record: Box::new(record),
                first,
            },
            None => LeakOutcome::Deleted,
        })
    }

    /// How stale a key's `last_used_at` may get: it is written at most once
    /// per this time per key, so a busy key costs one store write a minute.
    pub const LAST_USED_RESOLUTION: Duration = Duration::from_secs(60);

    /// Notes that the key `hash` (whose record the caller has, perhaps from
    /// the cache) was just used: when its `last_used_at` is older than
    /// [`LAST_USED_RESOLUTION`](Self::LAST_USED_RESOLUTION), writes the
    /// current time in a background task. Needs a tokio runtime; never
    /// waits and never fails the request (a failed write is logged).
    pub fn note_use(&self, hash: KeyHash, record: &KeyRecord) {
        let now = self.now();
        if !last_use_is_stale(record.last_used_at, now) {
            return;
        }
        if !self.noting_use().insert(hash) {
            return;
        }
        let directory = self.clone();
        tokio::spawn(async move {
            if let Err(error) = directory.write_last_use(&hash, now).await {
                tracing::debug!(%error, "the key's last use was not recorded; a later request will");
            }
            directory.noting_use().remove(&hash);
        });
    }

    fn noting_use(&self) -> std::sync::MutexGuard<'_, HashSet<KeyHash>> {
        self.inner
            .noting_use
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn write_last_use(&self, hash: &KeyHash, now: DateTime<Utc>) -> Result<(), StoreError> {
        let cache = &self.inner.cache;
        let generation = cache.generation();
        let read_at = self.now();
        let Some(Versioned {
            value: mut record,
            revision,
        }) = self.get(hash).await?
        else {
            return Ok(());
        };
        if last_use_is_stale(record.last_used_at, now) {
            record.last_used_at = Some(now);
            let outcome = self
                .write_json(
                    KEYS,
                    &record.hash.to_hex(),
                    &record,
                    Expect::Revision(revision),
                )
                .await?;
            // A conflict means another writer (another instance's note, a
            // change) got there first: the next use reads again.
            if let WriteOutcome::Conflict { .. } = outcome {
                return Ok(());
            }
        }
        // The cache learns the record as just read (and written), so this
        // instance stops noting until it is stale again, without dropping
        // the entry: a store outage right after must not cost the key.
        cache.remember(
            *hash,
            &KeyState::Active(Arc::new(record)),
            true,
            read_at,
            generation,
        );
        Ok(())
    }

    /// Keys newest first, skipping `offset` of those shown; disabled keys
    /// only when `include_disabled`; only the keys of `account` when one is
    /// named ([`KeyRecord::belongs_to`]: never an operator's key). At most
    /// `page_size` records.
    ///
    /// An account's keys are read through its index of keys, so the call
    /// costs what the account's keys up to the page do, however many keys
    /// other accounts have; on a store made before the index, the first
    /// such call builds it ([`build_key_index`](Self::build_key_index)).
    /// Without an account, every key in the store is read up to the page.
    pub async fn list(
        &self,
        offset: usize,
        include_disabled: bool,
        account: Option<&str>,
        page_size: usize,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        if let Some(account) = account {
            self.ensure_key_index().await?;
            return index::list(
                &*self.inner.store,
                account,
                offset,
                include_disabled,
                page_size,
                self.now(),
            )
            .await;
        }
        const BATCH: usize = 500;
        let mut skipped = 0;
        let mut page = Vec::new();
        let mut cursor = 0;
        while page.len() < page_size {
            let batch = self
                .inner
                .store
                .list_records_at(KEYS, cursor, BATCH, self.now())
                .await?;
            let fetched = batch.len();
            for (_, record) in batch {
                let record = crate::store::decode::<KeyRecord>("list_records", record)?.value;
                if record.disabled && !include_disabled {
                    continue;
                }
                if skipped < offset {
                    skipped += 1;
                } else if page.len() < page_size {
                    page.push(record);
                }
            }
            if fetched < BATCH {
                break;
            }
            cursor += fetched;
        }
        Ok(page)
    }

    /// Gives every key of a store made before the index of each account's
    /// keys its entry there, once: when the store records the index built
    /// ([`KEY_INDEX_BUILT`](super::KEY_INDEX_BUILT)) it does nothing and
    /// answers 0; else it walks every key, writes the missing entries
    /// (oldest first, so an account's list keeps its order), records the
    /// index built, and answers how many keys it walked. Idempotent, and
    /// safe with other instances doing it at once or making and deleting
    /// keys meanwhile (each of those writes its own entries). Run at
    /// start-up; an account's first listing runs it otherwise.
    pub async fn build_key_index(&self) -> Result<usize, StoreError> {
        let store = &*self.inner.store;
        if index::is_built(store, self.now()).await? {
            self.inner.key_index_built.store(true, Ordering::Release);
            return Ok(0);
        }
        let mut keys = Vec::new();
        self.each_key(|record| keys.push((record.account, record.hash)))
            .await?;
        for (account, hash) in keys.iter().rev() {
            index::add(store, account, hash, self.now()).await?;
        }
        index::mark_built(store, self.now()).await?;
        self.inner.key_index_built.store(true, Ordering::Release);
        Ok(keys.len())
    }

    /// [`build_key_index`](Self::build_key_index) unless this instance has
    /// seen the index built.
    async fn ensure_key_index(&self) -> Result<(), StoreError> {
        if !self.inner.key_index_built.load(Ordering::Acquire) {
            self.build_key_index().await?;
        }
        Ok(())
    }

    /// Records the account `id` if it is new, with nothing purchased.
    pub async fn ensure_account(&self, id: &str) -> Result<(), StoreError> {
        if !is_valid_account_id(id) {
            return Err(invalid_account_id());
        }
        let account = AccountRecord {
            id: id.to_owned(),
            name: String::new(),
            email: None,
            created_at: self.now(),
        };
        // A conflict means the account exists already, which is the goal.
        self.write_json(ACCOUNTS, id, &account, Expect::Absent)
            .await?;
        Ok(())
    }

    /// Creates the account `new`; `None` when an account with its id
    /// exists already (made by the API or by its first key).
    pub async fn create_account(
        &self,
        new: NewAccount,
    ) -> Result<Option<AccountRecord>, StoreError> {
        if !is_valid_account_id(&new.id) {
            return Err(invalid_account_id());
        }
        let account = AccountRecord {
            id: new.id,
            name: new.name,
            email: new.email,
            created_at: self.now(),
        };
        Ok(
            match self
                .write_json(ACCOUNTS, &account.id, &account, Expect::Absent)
                .await?
            {
                WriteOutcome::Written { .. } => Some(account),
                WriteOutcome::Conflict { .. } => None,
            },
        )
    }

    /// The account `id`, if it exists.
    pub async fn account(&self, id: &str) -> Result<Option<AccountRecord>, StoreError> {
        Ok(self
            .inner
            .store
            .get_json_at::<AccountRecord>(ACCOUNTS, id, self.now())
            .await?
            .map(|versioned| versioned.value))
    }

    /// Accounts in the store's order, skipping `offset`; at most
    /// `page_size`.
    pub async fn accounts(
        &self,
        offset: usize,
        page_size: usize,
    ) -> Result<Vec<AccountRecord>, StoreError> {
        self.inner
            .store
            .list_records_at(ACCOUNTS, offset, page_size, self.now())
            .await?
            .into_iter()
            .map(|(_, record)| {
                crate::store::decode::<AccountRecord>("list_records", record)
                    .map(|versioned| versioned.value)
            })
            .collect()
    }

    /// Whether the account `id` has been used.
    pub async fn account_exists(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .inner
            .store
            .get_record_at(ACCOUNTS, id, self.now())
            .await?
            .is_some())
    }

    /// Records a purchase of `amount_nanos` for the account `id` (created if
    /// new): its balance and purchased total rise by the amount.
    pub async fn top_up(&self, id: &str, amount_nanos: i64) -> Result<AccountBalance, StoreError> {
        self.ensure_account(id).await?;
        self.inner.store.top_up(id, amount_nanos).await
    }

    /// [`top_up`](Self::top_up) once per `idempotency_key` of the account
    /// ([`LedgerStore::top_up_once`](crate::store::LedgerStore::top_up_once),
    /// at the directory's clock): a retry with the same key and amount
    /// credits nothing and answers the balance the first call answered.
    pub async fn top_up_once(
        &self,
        id: &str,
        amount_nanos: i64,
        idempotency_key: &str,
    ) -> Result<TopUpOutcome, StoreError> {
        self.ensure_account(id).await?;
        self.inner
            .store
            .top_up_once(id, amount_nanos, idempotency_key, self.now())
            .await
    }
}

/// The id of the one record in [`OPERATOR_KEY_MINTED`].
const MINTED_ID: &str = "first";

/// What [`KeyDirectory::mint_operator_key`] writes: which key it made,
/// when (the plaintext is never stored).
#[derive(Serialize, Deserialize)]
struct OperatorKeyMinted {
    hash: String,
    minted_at: DateTime<Utc>,
}

fn last_use_is_stale(last_used_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
    last_used_at.is_none_or(|at| {
        (now - at)
            .to_std()
            .is_ok_and(|since| since >= KeyDirectory::LAST_USED_RESOLUTION)
    })
}

fn invalid_account_id() -> StoreError {
    StoreError::invalid(
        "put_record",
        "an account id is 1 to 64 characters of A-Z a-z 0-9 . _ -",
    )
}

pub(super) fn too_contended(operation: &'static str) -> StoreError {
    StoreError::new(
        operation,
        crate::store::StoreErrorKind::Backend(format!(
            "another writer changed the record {MAX_WRITE_ATTEMPTS} times in a row"
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::{MemoryStore, RecordStore};
    use chrono::TimeZone;

    /// The ids in `account`'s index of keys.
    async fn indexed(directory: &KeyDirectory, account: &str) -> Vec<String> {
        directory
            .store()
            .list_records_at(&index::account_keys(account), 0, 100, directory.now())
            .await
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }

    fn directory(ttl: Duration) -> (KeyDirectory, ManualClock) {
        let clock = ManualClock::new(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
        let store: SharedStore = Arc::new(MemoryStore::new());
        let directory = KeyDirectory::builder(store)
            .clock(Arc::new(clock.clone()))
            .cache_ttl(ttl)
            .build();
        (directory, clock)
    }

    /// Disables a key behind the directory's back, as another instance would.
    async fn disable_elsewhere(directory: &KeyDirectory, hash: &KeyHash) {
        let mut record = directory.get(hash).await.unwrap().unwrap().value;
        record.disabled = true;
        directory
            .write_json(KEYS, &record.hash.to_hex(), &record, Expect::Any)
            .await
            .unwrap();
    }

    fn is_disabled(state: KeyState) -> bool {
        matches!(state, KeyState::Active(record) if record.disabled)
    }

    #[tokio::test]
    async fn a_lookup_is_trusted_for_less_than_the_ttl_and_no_longer() {
        let (directory, clock) = directory(Duration::from_millis(500));
        let (key, _) = directory.create_key(NewKey::named("k")).await.unwrap();
        let hash = key.hash();
        assert!(!is_disabled(directory.lookup(&hash).await.unwrap()));
        disable_elsewhere(&directory, &hash).await;
        clock.advance(Duration::from_millis(499));
        assert!(!is_disabled(directory.lookup(&hash).await.unwrap()));
        clock.advance(Duration::from_millis(1));
        assert!(is_disabled(directory.lookup(&hash).await.unwrap()));
    }

    #[tokio::test]
    async fn a_clock_that_goes_back_does_not_keep_an_entry_alive() {
        let (directory, clock) = directory(Duration::from_secs(1));
        let (key, _) = directory.create_key(NewKey::named("k")).await.unwrap();
        let hash = key.hash();
        directory.lookup(&hash).await.unwrap();
        disable_elsewhere(&directory, &hash).await;
        clock.set(Utc.with_ymd_and_hms(2025, 12, 31, 0, 0, 0).unwrap());
        assert!(is_disabled(directory.lookup(&hash).await.unwrap()));
    }

    #[tokio::test]
    async fn changes_through_the_directory_are_seen_at_once() {
        let (directory, _clock) = directory(Duration::from_secs(3600));
        let (key, _) = directory.create_key(NewKey::named("k")).await.unwrap();
        let hash = key.hash();
        directory.lookup(&hash).await.unwrap();
        let update = KeyUpdate {
            disabled: Some(true),
            ..KeyUpdate::default()
        };
        directory.update(&hash, &update).await.unwrap().unwrap();
        assert!(is_disabled(directory.lookup(&hash).await.unwrap()));
        assert!(directory.delete(&hash).await.unwrap());
        assert!(matches!(
            directory.lookup(&hash).await.unwrap(),
            KeyState::Deleted
        ));
        assert!(!directory.delete(&hash).await.unwrap());
        assert!(directory.update(&hash, &update).await.unwrap().is_none());
        assert!(matches!(
            directory
                .lookup(&KeyHash::of("never issued"))
                .await
                .unwrap(),
            KeyState::Unknown
        ));
    }

    #[tokio::test]
    async fn made_up_keys_never_push_live_keys_out_of_the_cache() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let directory = KeyDirectory::builder(store).max_cached_keys(8).build();
        let mut live = Vec::new();
        for index in 0..8 {
            let (key, _) = directory
                .create_key(NewKey::named(format!("k{index}")))
                .await
                .unwrap();
            directory.lookup(&key.hash()).await.unwrap();
            live.push(key.hash());
        }
        for index in 0..100 {
            directory
                .lookup(&KeyHash::of(&format!("made up {index}")))
                .await
                .unwrap();
            let (live_cached, refused_cached) = directory.inner.cache.sizes();
            assert!(refused_cached <= 2);
            assert_eq!(live_cached, 8);
        }
        let now = directory.now();
        assert!(
            live.iter()
                .all(|hash| directory.inner.cache.get(hash, now).is_some())
        );
    }

    #[tokio::test]
    async fn keys_found_live_stay_known_past_their_freshness_and_guesses_never_are() {
        let (directory, clock) = directory(Duration::from_secs(1));
        let (key, _) = directory.create_key(NewKey::named("k")).await.unwrap();
        let guess = KeyHash::of("made up");
        assert!(!directory.is_cached_live(&key.hash()));
        directory.lookup(&key.hash()).await.unwrap();
        directory.lookup(&guess).await.unwrap();
        clock.advance(Duration::from_secs(60));
        assert!(directory.is_cached_live(&key.hash()));
        assert!(!directory.is_cached_live(&guess));
        // Deleted behind this instance's back: the next lookup learns it.
        let other = KeyDirectory::new(directory.store().clone());
        assert!(other.delete(&key.hash()).await.unwrap());
        assert!(matches!(
            directory.lookup(&key.hash()).await.unwrap(),
            KeyState::Deleted
        ));
        assert!(!directory.is_cached_live(&key.hash()));
    }

    #[tokio::test]
    async fn clones_share_one_cache() {
        let (directory, _clock) = directory(Duration::from_secs(3600));
        let (key, _) = directory.create_key(NewKey::named("k")).await.unwrap();
        let other_handle = directory.clone();
        other_handle.lookup(&key.hash()).await.unwrap();
        assert!(directory.delete(&key.hash()).await.unwrap());
        assert!(matches!(
            other_handle.lookup(&key.hash()).await.unwrap(),
            KeyState::Deleted
        ));
    }

    #[tokio::test]
    async fn a_record_under_the_wrong_id_is_an_error_not_a_login() {
        let (directory, _clock) = directory(Duration::ZERO);
        let (key, record) = directory.create_key(NewKey::named("k")).await.unwrap();
        let other = KeyHash::of("another key");
        directory
            .write_json(KEYS, &other.to_hex(), &record, Expect::Any)
            .await
            .unwrap();
        assert!(directory.lookup(&other).await.is_err());
        assert!(directory.lookup(&key.hash()).await.is_ok());
    }

    #[tokio::test]
    async fn an_operator_key_is_registered_once_and_a_deleted_one_never_again() {
        let (directory, _clock) = directory(Duration::ZERO);
        let key = ApiKey::generate();
        let admin = NewKey {
            management: true,
            ..NewKey::named("operator")
        };
        let first = directory.register_key(&key, admin.clone()).await.unwrap();
        assert!(first.management);
        let again = directory
            .register_key(&key, NewKey::named("renamed"))
            .await
            .unwrap();
        assert_eq!(again, first, "the stored record stands");
        assert!(matches!(
            directory.lookup(&key.hash()).await.unwrap(),
            KeyState::Active(_)
        ));
        directory.delete(&key.hash()).await.unwrap();
        assert!(directory.register_key(&key, admin).await.is_err());
    }

    fn operator(name: &str) -> NewKey {
        NewKey {
            management: true,
            ..NewKey::named(name)
        }
    }

    #[tokio::test]
    async fn operator_keys_belong_to_no_account_and_older_ones_move_off_theirs() {
        let (directory, _clock) = directory(Duration::ZERO);
        let (_, record) = directory.create_key(operator("operator")).await.unwrap();
        assert_eq!(record.account, OPERATOR_ACCOUNT);
        assert!(!directory.account_exists(OPERATOR_ACCOUNT).await.unwrap());
        // An older store's operator key, recorded on `default`.
        let (_, mut old) = directory.create_key(NewKey::named("old")).await.unwrap();
        old.management = true;
        directory
            .write_json(KEYS, &old.hash.to_hex(), &old, Expect::Any)
            .await
            .unwrap();
        let (_, manager) = directory
            .create_key(NewKey {
                scoped_to_account: true,
                ..operator("default admin")
            })
            .await
            .unwrap();
        let listed = directory.list(0, true, Some("default"), 100).await.unwrap();
        assert_eq!(
            listed,
            std::slice::from_ref(&manager),
            "never listed as default's"
        );
        assert_eq!(directory.move_operator_keys().await.unwrap(), 1);
        assert_eq!(directory.move_operator_keys().await.unwrap(), 0);
        // Its index entry moved with it.
        let hex = old.hash.to_hex();
        assert!(!indexed(&directory, "default").await.contains(&hex));
        assert!(indexed(&directory, OPERATOR_ACCOUNT).await.contains(&hex));
        let hash = old.hash;
        let moved = directory.get(&hash).await.unwrap().unwrap().value;
        assert_eq!(moved.account, OPERATOR_ACCOUNT);
        assert_eq!(directory.operator_keys().await.unwrap().len(), 2);
        let hash = manager.hash;
        let stayed = directory.get(&hash).await.unwrap().unwrap().value;
        assert_eq!(stayed.account, "default", "an account's manager stays");
    }

    #[tokio::test]
    async fn replacing_the_operators_keys_disables_every_one_and_makes_one() {
        let (directory, _clock) = directory(Duration::ZERO);
        let (first, _) = directory.create_key(operator("a")).await.unwrap();
        let (second, _) = directory.create_key(operator("b")).await.unwrap();
        let (client, _) = directory.create_key(NewKey::named("client")).await.unwrap();
        let (new, disabled) = directory.replace_operator_keys("operator").await.unwrap();
        assert_eq!(disabled, 2);
        for old in [&first, &second] {
            assert!(is_disabled(directory.lookup(&old.hash()).await.unwrap()));
        }
        assert!(!is_disabled(
            directory.lookup(&client.hash()).await.unwrap()
        ));
        match directory.lookup(&new.hash()).await.unwrap() {
            KeyState::Active(record) => assert!(record.is_operator() && !record.disabled),
            other => panic!("{other:?}"),
        }
        let (_, disabled) = directory.replace_operator_keys("operator").await.unwrap();
        assert_eq!(disabled, 1, "only the one still enabled");
    }

    #[tokio::test]
    async fn an_account_s_listing_never_reads_other_keys_records() {
        let (directory, _clock) = directory(Duration::ZERO);
        let mut new = NewKey::named("mine");
        new.account = "acme".into();
        let (_, mine) = directory.create_key(new).await.unwrap();
        let listed = directory.list(0, false, Some("acme"), 100).await.unwrap();
        assert_eq!(listed, std::slice::from_ref(&mine));
        // Records no listing could read: one that scanned the store's keys
        // would fail on them.
        for index in 0..10 {
            directory
                .inner
                .store
                .put_record_at(
                    KEYS,
                    &format!("unreadable{index}"),
                    b"not json",
                    Expect::Any,
                    PutOptions::default(),
                    directory.now(),
                )
                .await
                .unwrap();
        }
        let listed = directory.list(0, false, Some("acme"), 100).await.unwrap();
        assert_eq!(listed, std::slice::from_ref(&mine));
        assert!(
            directory.list(0, false, None, 100).await.is_err(),
            "the list of every key reads them all"
        );
    }

    #[tokio::test]
    async fn a_walk_of_every_key_skips_none_when_others_are_deleted_meanwhile() {
        let memory = Arc::new(MemoryStore::new());
        let directory = KeyDirectory::new(memory.clone());
        let mut made = Vec::new();
        for _ in 0..1200 {
            made.push(
                directory
                    .create_key(NewKey::named("k"))
                    .await
                    .unwrap()
                    .1
                    .hash,
            );
        }
        // While the first page is visited, another instance deletes 100 of
        // its keys: every key older than them moves 100 places forward.
        let now = directory.now();
        let mut visited = Vec::new();
        directory
            .each_key(|record| {
                if visited.len() == 10 {
                    for hash in &made[1100..] {
                        let id = hash.to_hex();
                        let deleted = memory.delete_record_at(KEYS, &id, Expect::Any, now);
                        futures::executor::block_on(deleted).unwrap();
                    }
                }
                visited.push(record.hash);
            })
            .await
            .unwrap();
        let mut visited: Vec<String> = visited.iter().map(KeyHash::to_hex).collect();
        visited.sort();
        let count = visited.len();
        visited.dedup();
        assert_eq!(visited.len(), count, "each once");
        let skipped = made[..1100]
            .iter()
            .filter(|hash| visited.binary_search(&hash.to_hex()).is_err())
            .count();
        assert_eq!(skipped, 0, "none of those still there skipped");
    }

    #[tokio::test]
    async fn accounts_are_made_on_first_use_and_ids_are_checked() {
        let (directory, _clock) = directory(Duration::ZERO);
        assert!(!directory.account_exists("acme").await.unwrap());
        let balance = directory.top_up("acme", 5).await.unwrap();
        assert_eq!((balance.purchased_nanos, balance.balance_nanos), (5, 5));
        assert!(directory.account_exists("acme").await.unwrap());
        directory.ensure_account("acme").await.unwrap();
        assert!(directory.ensure_account("a b").await.is_err());
        let mut bad = NewKey::named("k");
        bad.account = "a/b".into();
        assert!(directory.create_key(bad).await.is_err());
    }
}
