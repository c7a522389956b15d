//! [`ByokDirectory`]: the provider keys an account brings itself (BYOK),
//! one store record per account and provider, with a short-lived
//! in-process cache in front of the lookups CreditGuard makes.
//!
//! A provider key, once set, leaves the directory only as a
//! [`ByokCredential`] for the upstream client; everything shown to people
//! (the management API, `Debug`) carries a masked [`hint`] at most.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::directory::{MAX_WRITE_ATTEMPTS, too_contended};
use super::lookup_cache::LookupCache;
use super::record::is_valid_account_id;
use crate::clock::{Clock, SystemClock};
use crate::store::SharedStore;
use crate::store::{Expect, PutOptions, RecordStoreExt, StoreError, WriteOutcome, byok_keys};

/// Longest provider name accepted.
pub const MAX_PROVIDER_CHARS: usize = 64;
/// Shortest provider key accepted, in bytes.
pub const MIN_BYOK_KEY_BYTES: usize = 8;
/// Longest provider key accepted, in bytes.
pub const MAX_BYOK_KEY_BYTES: usize = 4096;
/// Most provider keys one account may hold: one per provider it uses is
/// far fewer, so the store stays bounded whoever sets them.
pub const MAX_BYOK_KEYS_PER_ACCOUNT: usize = 64;

/// Why a provider key cannot be set.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ByokError {
    /// The account id is not 1 to 64 characters of `A-Z a-z 0-9 . _ -`.
    #[error("an account id is 1 to 64 characters of A-Z a-z 0-9 . _ -")]
    InvalidAccount,
    /// The provider name is not 1 to 64 characters of `a-z 0-9 _ -`.
    #[error("a provider name is 1 to 64 characters of a-z 0-9 _ - (in any case)")]
    InvalidProvider,
    /// The key is unusable; the text says how (never what it is).
    #[error("the provider key {0}")]
    InvalidKey(&'static str),
    /// The account holds [`MAX_BYOK_KEYS_PER_ACCOUNT`] keys already.
    #[error(
        "the account holds {MAX_BYOK_KEYS_PER_ACCOUNT} provider keys already, the most it may; delete one it no longer uses first"
    )]
    TooManyKeys,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The provider name as the directory keeps it (lower case), or
/// [`ByokError::InvalidProvider`].
pub fn provider_id(name: &str) -> Result<String, ByokError> {
    let valid = (1..=MAX_PROVIDER_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-'));
    if valid {
        Ok(name.to_ascii_lowercase())
    } else {
        Err(ByokError::InvalidProvider)
    }
}

/// Whether `api_key` can be a provider key: 8 to 4096 bytes of visible
/// ASCII, so it fits an HTTP header as it is. Nothing is trimmed: a key
/// pasted with a line break is refused, not silently changed.
pub fn check_api_key(api_key: &str) -> Result<(), ByokError> {
    if api_key.bytes().any(|byte| byte.is_ascii_whitespace()) {
        return Err(ByokError::InvalidKey(
            "must not contain spaces, tabs or line breaks",
        ));
    }
    if !api_key.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(ByokError::InvalidKey(
            "must be visible ASCII characters only (no control or non-ASCII characters)",
        ));
    }
    if !(MIN_BYOK_KEY_BYTES..=MAX_BYOK_KEY_BYTES).contains(&api_key.len()) {
        return Err(ByokError::InvalidKey("must be 8 to 4096 characters long"));
    }
    Ok(())
}

/// What may be shown of `api_key`: its first 3 and last 4 characters
/// (`sk-…abcd`), or only its last 2 (`…cd`) when it is shorter than 12, so
/// at least 5 characters stay hidden.
pub fn hint(api_key: &str) -> String {
    let chars: Vec<char> = api_key.chars().collect();
    if chars.len() >= 12 {
        let head: String = chars[..3].iter().collect();
        let tail: String = chars[chars.len() - 4..].iter().collect();
        format!("{head}…{tail}")
    } else {
        let tail: String = chars[chars.len().saturating_sub(2)..].iter().collect();
        format!("…{tail}")
    }
}

/// The key an account brought for a provider, as CreditGuard puts it into
/// a BYOK request's context (`RequestContext::credential`): the upstream client sends it instead of
/// the gateway's own key for that provider.
///
/// `Debug` hides the key.
#[derive(Clone)]
pub struct ByokCredential {
    /// The provider, lower case (`openai`).
    pub provider: String,
    api_key: String,
}

impl ByokCredential {
    /// A credential for `provider` (any case) with `api_key`, checked as
    /// the directory checks what it stores.
    pub fn new(provider: &str, api_key: impl Into<String>) -> Result<Self, ByokError> {
        let api_key = api_key.into();
        check_api_key(&api_key)?;
        Ok(ByokCredential {
            provider: provider_id(provider)?,
            api_key,
        })
    }

    /// The provider key, to send upstream; never to show or log.
    pub fn api_key(&self) -> &str {
        &self.api_key
    }
}

impl fmt::Debug for ByokCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByokCredential")
            .field("provider", &self.provider)
            .field("api_key", &format_args!("…"))
            .finish()
    }
}

/// A provider key as the management API shows it: never the key, only
/// its [`hint`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ByokEntry {
    /// The provider, lower case.
    pub provider: String,
    /// The masked key, such as `sk-…abcd`.
    pub hint: String,
    /// When a key was first set for this provider.
    pub created_at: DateTime<Utc>,
    /// When the key was last set (its creation, or its latest replacement).
    pub updated_at: DateTime<Utc>,
}

/// The stored record. No `Debug`: it holds the key.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredKey {
    provider: String,
    api_key: String,
    hint: String,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl StoredKey {
    fn entry(&self) -> ByokEntry {
        ByokEntry {
            provider: self.provider.clone(),
            hint: self.hint.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

/// Configures a [`ByokDirectory`]; made by [`ByokDirectory::builder`].
///
/// A builder, so that every handle of one directory shares one cache: a
/// change made through any clone is seen at once by all of them.
pub struct ByokDirectoryBuilder {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    cache_ttl: Duration,
    max_cached_entries: usize,
}

impl fmt::Debug for ByokDirectoryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByokDirectoryBuilder")
            .field("clock", &self.clock)
            .field("cache_ttl", &self.cache_ttl)
            .field("max_cached_entries", &self.max_cached_entries)
            .finish_non_exhaustive()
    }
}

impl ByokDirectoryBuilder {
    /// Uses `clock` for the records' times and the cache.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Trusts a lookup for `cache_ttl`; zero turns the cache off.
    pub fn cache_ttl(mut self, cache_ttl: Duration) -> Self {
        self.cache_ttl = cache_ttl;
        self
    }

    /// Holds at most `max_cached_entries` keys found, and a quarter as many
    /// answers that there is none.
    pub fn max_cached_entries(mut self, max_cached_entries: usize) -> Self {
        self.max_cached_entries = max_cached_entries;
        self
    }

    /// The directory.
    pub fn build(self) -> ByokDirectory {
        ByokDirectory {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock,
                max_cached_entries: self.max_cached_entries,
                cache: LookupCache::new(self.cache_ttl, self.max_cached_entries),
            }),
        }
    }
}

/// The providers an account may set its own key for through the JSON
/// API (`KeyRoutes`), and whose stored key
/// [`CreditGuard`](crate::credit::CreditGuard) may use: only those the
/// service below sends such a key to *instead of* the gateway's own
/// credential, since a key that is never sent, or sent beside the
/// gateway's, would still make the account's requests BYOK, unpaid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ByokProviders {
    /// Any provider: the service below sends each request's
    /// [`ByokCredential`] to its provider in place
    /// of its own credential (the default, for a stack built with the
    /// library).
    #[default]
    Any,
    /// The proxy's `providers` section: keys are taken for the providers in
    /// `byok` (lower case; those with `"byok": true`); the ones in `others`
    /// are configured but keep the gateway's credential (422
    /// `byok_not_allowed`); any other name is no provider of the gateway
    /// (400 `unknown_provider`).
    Configured {
        /// The providers that take an account's key, lower case.
        byok: BTreeSet<String>,
        /// The providers that do not, lower case.
        others: BTreeSet<String>,
    },
    /// None: every request goes to one upstream with the gateway's own key.
    SingleUpstream,
}

impl ByokProviders {
    /// Whether an account's key for `provider` (any case) is sent in place
    /// of the gateway's credential, so a request with it may be BYOK.
    pub fn accepts(&self, provider: &str) -> bool {
        match self {
            ByokProviders::Any => true,
            ByokProviders::Configured { byok, .. } => {
                byok.contains(provider.to_ascii_lowercase().as_str())
            }
            ByokProviders::SingleUpstream => false,
        }
    }
}

/// The provider keys accounts bring themselves, per account and provider,
/// read and written through the store; shared by
/// the JSON API's `KeyRoutesLayer` (which sets, lists and
/// deletes them) and [`CreditGuardLayer`](crate::credit::CreditGuardLayer)
/// (which looks them up for each chat request).
///
/// Records live in the collection [`byok_keys(account)`](byok_keys),
/// under the lower-case provider name, as `{provider, apiKey, hint,
/// createdAt, updatedAt}`. Lookups are cached in process for
/// [`cache_ttl`](ByokDirectoryBuilder::cache_ttl) (default 1 s). A change
/// made through this directory is seen at once by it and its clones; every
/// other instance sees it within the cache time.
///
/// Cheap to clone: clones share the store, clock and cache. `Debug` shows
/// no key.
///
/// ```
/// use std::sync::Arc;
/// use modelgate::keys::{ByokDirectory, SharedStore};
/// use modelgate::store::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store: SharedStore = Arc::new(MemoryStore::new());
/// let byok = ByokDirectory::new(store);
/// let entry = byok.set("team-a", "OpenAI", "sk-proj-0123456789abcdef").await.unwrap();
/// assert_eq!((entry.provider.as_str(), entry.hint.as_str()), ("openai", "sk-…cdef"));
/// let credential = byok.lookup("team-a", "openai").await.unwrap().unwrap();
/// assert_eq!(credential.api_key(), "sk-proj-0123456789abcdef");
/// assert!(!format!("{credential:?}").contains("0123"));
/// assert!(byok.delete("team-a", "openai").await.unwrap());
/// assert!(byok.lookup("team-a", "openai").await.unwrap().is_none());
/// # }
/// ```
#[derive(Clone)]
pub struct ByokDirectory {
    inner: Arc<Inner>,
}

struct Inner {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    max_cached_entries: usize,
    // Keys found apart from answers that there is none: a caller can name
    // any provider in a model id.
    cache: LookupCache<Slot, Option<ByokCredential>>,
}

/// (account, provider).
type Slot = (String, String);

impl fmt::Debug for ByokDirectory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByokDirectory")
            .field("clock", &self.inner.clock)
            .field("cache_ttl", &self.inner.cache.ttl())
            .field("max_cached_entries", &self.inner.max_cached_entries)
            .finish_non_exhaustive()
    }
}

impl ByokDirectory {
    /// How long a lookup is trusted by default: the longest a deleted or
    /// replaced key keeps being used on another instance.
    pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(1);
    /// How many found keys the cache holds by default.
    pub const DEFAULT_MAX_CACHED_ENTRIES: usize = 100_000;

    /// A directory on `store` with the system clock and the default cache.
    pub fn new(store: SharedStore) -> Self {
        Self::builder(store).build()
    }

    /// A directory on `store` with its clock and cache still to choose.
    pub fn builder(store: SharedStore) -> ByokDirectoryBuilder {
        ByokDirectoryBuilder {
            store,
            clock: Arc::new(SystemClock),
            cache_ttl: Self::DEFAULT_CACHE_TTL,
            max_cached_entries: Self::DEFAULT_MAX_CACHED_ENTRIES,
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

    /// Sets `account`'s key for `provider` (any case), creating or
    /// replacing it; a replacement keeps the first `created_at`.
    pub async fn set(
        &self,
        account: &str,
        provider: &str,
        api_key: &str,
    ) -> Result<ByokEntry, ByokError> {
        if !is_valid_account_id(account) {
            return Err(ByokError::InvalidAccount);
        }
        let provider = provider_id(provider)?;
        check_api_key(api_key)?;
        let collection = byok_keys(account);
        let store = &self.inner.store;
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let now = self.now();
            let (created_at, expect) = match store
                .get_json_at::<StoredKey>(&collection, &provider, now)
                .await?
            {
                Some(current) => (current.value.created_at, Expect::Revision(current.revision)),
                None => {
                    let held = store
                        .list_records_at(&collection, 0, MAX_BYOK_KEYS_PER_ACCOUNT, now)
                        .await?;
                    if held.len() >= MAX_BYOK_KEYS_PER_ACCOUNT {
                        return Err(ByokError::TooManyKeys);
                    }
                    (now, Expect::Absent)
                }
            };
            let stored = StoredKey {
                provider: provider.clone(),
                api_key: api_key.to_owned(),
                hint: hint(api_key),
                created_at,
                updated_at: now,
            };
            if let WriteOutcome::Written { .. } = store
                .put_json_at(
                    &collection,
                    &provider,
                    &stored,
                    expect,
                    PutOptions::default(),
                    now,
                )
                .await?
                .uncapped()?
            {
                self.forget(account, &provider);
                return Ok(stored.entry());
            }
        }
        Err(too_contended("put_record").into())
    }

    /// Deletes `account`'s key for `provider` (any case); `false` when it
    /// had none.
    pub async fn delete(&self, account: &str, provider: &str) -> Result<bool, StoreError> {
        let Some((account, provider)) = slot(account, provider) else {
            return Ok(false);
        };
        let collection = byok_keys(&account);
        let store = &self.inner.store;
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let now = self.now();
            let Some(current) = store.get_record_at(&collection, &provider, now).await? else {
                // Gone already, perhaps through another instance: this
                // instance stops using it at once all the same.
                self.forget(&account, &provider);
                return Ok(false);
            };
            let outcome = store
                .delete_record_at(
                    &collection,
                    &provider,
                    Expect::Revision(current.revision),
                    now,
                )
                .await?;
            if let WriteOutcome::Written { .. } = outcome {
                self.forget(&account, &provider);
                return Ok(true);
            }
        }
        Err(too_contended("delete_record"))
    }

    /// `account`'s keys, by provider name, each with its hint only.
    pub async fn list(&self, account: &str) -> Result<Vec<ByokEntry>, StoreError> {
        const BATCH: usize = 100;
        if !is_valid_account_id(account) {
            return Ok(Vec::new());
        }
        let collection = byok_keys(account);
        let mut entries = Vec::new();
        let mut offset = 0;
        loop {
            let batch = self
                .inner
                .store
                .list_records_at(&collection, offset, BATCH, self.now())
                .await?;
            let fetched = batch.len();
            for (_, record) in batch {
                let stored = crate::store::decode::<StoredKey>("list_records", record)?.value;
                entries.push(stored.entry());
            }
            if fetched < BATCH {
                break;
            }
            offset += fetched;
        }
        entries.sort_by(|a, b| a.provider.cmp(&b.provider));
        Ok(entries)
    }

    /// `account`'s key for `provider` (any case), from the cache when
    /// fresh; `None` when it has none (or either name could never have
    /// one, which costs no store read).
    pub async fn lookup(
        &self,
        account: &str,
        provider: &str,
    ) -> Result<Option<ByokCredential>, StoreError> {
        let Some(slot) = slot(account, provider) else {
            return Ok(None);
        };
        let now = self.now();
        let cache = &self.inner.cache;
        if let Some(credential) = cache.get(&slot, now) {
            return Ok(credential);
        }
        let generation = cache.generation();
        let credential = self.fetch(&slot).await?;
        let found = credential.is_some();
        cache.remember(slot, &credential, found, now, generation);
        Ok(credential)
    }

    async fn fetch(
        &self,
        (account, provider): &Slot,
    ) -> Result<Option<ByokCredential>, StoreError> {
        let Some(stored) = self
            .inner
            .store
            .get_json_at::<StoredKey>(&byok_keys(account), provider, self.now())
            .await?
        else {
            return Ok(None);
        };
        let stored = stored.value;
        // Found by its provider; a record that names another one was put
        // there by something else, and its key must not go to this provider.
        if stored.provider != *provider || check_api_key(&stored.api_key).is_err() {
            return Err(StoreError::corrupt(
                "get_record",
                "a BYOK record does not match its provider or holds an unusable key",
            ));
        }
        Ok(Some(ByokCredential {
            provider: stored.provider,
            api_key: stored.api_key,
        }))
    }

    /// Drops `account`'s key for `provider` from this instance's cache, so
    /// its next lookup reads the store. Every change made through the
    /// directory does this.
    pub fn forget(&self, account: &str, provider: &str) {
        let Some(slot) = slot(account, provider) else {
            return;
        };
        self.inner.cache.forget(&slot);
    }
}

/// The cache and store slot of `account` and `provider`; `None` when
/// either name could never have a key.
fn slot(account: &str, provider: &str) -> Option<Slot> {
    if !is_valid_account_id(account) {
        return None;
    }
    Some((account.to_owned(), provider_id(provider).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::MemoryStore;
    use chrono::TimeZone;
    use proptest::prelude::*;

    const SECRET: &str = "sk-proj-SECRETSECRET-wxyz";

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
    }

    fn directory(ttl: Duration) -> (ByokDirectory, ManualClock) {
        let clock = ManualClock::new(t0());
        let store: SharedStore = Arc::new(MemoryStore::new());
        let directory = ByokDirectory::builder(store)
            .clock(Arc::new(clock.clone()))
            .cache_ttl(ttl)
            .build();
        (directory, clock)
    }

    /// Replaces a key behind the directory's back, as another instance would.
    async fn replace_elsewhere(directory: &ByokDirectory, account: &str, api_key: &str) {
        let other = ByokDirectory::builder(directory.store().clone())
            .cache_ttl(Duration::ZERO)
            .build();
        other.set(account, "openai", api_key).await.unwrap();
    }

    async fn key_of(directory: &ByokDirectory, account: &str, provider: &str) -> Option<String> {
        directory
            .lookup(account, provider)
            .await
            .unwrap()
            .map(|credential| credential.api_key().to_owned())
    }

    #[test]
    fn provider_names_are_plain_words_kept_in_lower_case() {
        for (name, id) in [
            ("openai", "openai"),
            ("OpenAI", "openai"),
            ("meta-llama", "meta-llama"),
            ("x_ai2", "x_ai2"),
        ] {
            assert_eq!(provider_id(name).unwrap(), id);
        }
        let longest = "p".repeat(MAX_PROVIDER_CHARS);
        assert!(provider_id(&longest).is_ok());
        for name in [
            "",
            "z.ai",
            "a/b",
            "a b",
            "ümlaut",
            "open ai",
            &format!("{longest}p"),
        ] {
            assert!(
                matches!(provider_id(name), Err(ByokError::InvalidProvider)),
                "{name}"
            );
        }
    }

    #[test]
    fn keys_are_8_to_4096_visible_ascii_characters() {
        assert!(check_api_key(&"k".repeat(MIN_BYOK_KEY_BYTES)).is_ok());
        assert!(check_api_key(&"k".repeat(MAX_BYOK_KEY_BYTES)).is_ok());
        assert!(check_api_key("sk-!#$%&'()*+,./:;<=>?@[]^_`{|}~\"\\").is_ok());
        for (key, problem) in [
            ("k".repeat(MIN_BYOK_KEY_BYTES - 1), "8 to 4096"),
            ("k".repeat(MAX_BYOK_KEY_BYTES + 1), "8 to 4096"),
            (format!("{SECRET}\n"), "line breaks"),
            (format!(" {SECRET}"), "spaces"),
            ("sk-abc\tdefgh".to_owned(), "tabs"),
            ("sk-abc\u{7f}defgh".to_owned(), "visible ASCII"),
            ("sk-abc\u{0}defgh".to_owned(), "visible ASCII"),
            ("sk-abcdéfgh".to_owned(), "visible ASCII"),
        ] {
            match check_api_key(&key) {
                Err(ByokError::InvalidKey(text)) => assert!(text.contains(problem), "{text}"),
                other => panic!("{key:?}: {other:?}"),
            }
        }
        let message = ByokError::InvalidKey("must be 8 to 4096 characters long").to_string();
        assert!(message.contains(&MIN_BYOK_KEY_BYTES.to_string()));
        assert!(message.contains(&MAX_BYOK_KEY_BYTES.to_string()));
    }

    #[test]
    fn hints_show_the_ends_and_hide_the_middle() {
        assert_eq!(hint("sk-proj-0123456789abcd"), "sk-…abcd");
        assert_eq!(hint("abcdefghijkl"), "abc…ijkl");
        assert_eq!(hint("abcdefghijk"), "…jk");
        assert_eq!(hint("abcdefgh"), "…gh");
    }

    #[test]
    fn debug_never_shows_a_key() {
        let credential = ByokCredential::new("OpenAI", SECRET).unwrap();
        assert_eq!(credential.provider, "openai");
        assert_eq!(credential.api_key(), SECRET);
        let (directory, _clock) = directory(Duration::from_secs(1));
        let shown = format!(
            "{credential:?} {directory:?} {:?}",
            ByokDirectory::builder(directory.store().clone())
        );
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(ByokCredential::new("a.b", SECRET).is_err());
        assert!(ByokCredential::new("openai", "short").is_err());
    }

    #[tokio::test]
    async fn keys_are_set_replaced_listed_and_deleted() {
        let (directory, clock) = directory(Duration::from_secs(3600));
        let created = directory.set("acme", "OpenAI", SECRET).await.unwrap();
        assert_eq!(
            created,
            ByokEntry {
                provider: "openai".into(),
                hint: "sk-…wxyz".into(),
                created_at: t0(),
                updated_at: t0(),
            }
        );
        clock.advance(Duration::from_secs(60));
        let replaced = directory
            .set("acme", "openai", "sk-ant-another-key-0042")
            .await
            .unwrap();
        assert_eq!(
            replaced.created_at,
            t0(),
            "a replacement keeps its creation"
        );
        assert_eq!(replaced.updated_at, t0() + chrono::Duration::seconds(60));
        assert_eq!(replaced.hint, "sk-…0042");
        directory.set("acme", "anthropic", SECRET).await.unwrap();
        let listed = directory.list("acme").await.unwrap();
        let providers: Vec<&str> = listed.iter().map(|entry| entry.provider.as_str()).collect();
        assert_eq!(providers, ["anthropic", "openai"]);
        assert_eq!(listed[1], replaced);
        assert!(directory.list("other").await.unwrap().is_empty());
        assert!(directory.list("not an id").await.unwrap().is_empty());

        assert!(directory.delete("acme", "OPENAI").await.unwrap());
        assert!(!directory.delete("acme", "openai").await.unwrap());
        assert!(!directory.delete("acme", "a.b").await.unwrap());
        assert_eq!(directory.list("acme").await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn the_stored_record_has_the_documented_fields() {
        let (directory, _clock) = directory(Duration::ZERO);
        directory.set("acme", "openai", SECRET).await.unwrap();
        let record = directory
            .store()
            .get_record_at(&byok_keys("acme"), "openai", t0())
            .await
            .unwrap()
            .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
        let mut fields: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            ["apiKey", "createdAt", "hint", "provider", "updatedAt"]
        );
        assert_eq!(value["apiKey"], SECRET);
    }

    #[tokio::test]
    async fn bad_names_are_refused_and_never_looked_up() {
        let (directory, _clock) = directory(Duration::ZERO);
        assert!(matches!(
            directory.set("a b", "openai", SECRET).await,
            Err(ByokError::InvalidAccount)
        ));
        assert!(matches!(
            directory.set("acme", "z.ai", SECRET).await,
            Err(ByokError::InvalidProvider)
        ));
        assert!(matches!(
            directory.set("acme", "openai", "sk short").await,
            Err(ByokError::InvalidKey(_))
        ));
        assert!(directory.lookup("acme", "z.ai").await.unwrap().is_none());
        assert!(directory.lookup("a/b", "openai").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn an_account_holds_a_bounded_number_of_keys() {
        let (directory, _clock) = directory(Duration::ZERO);
        for index in 0..MAX_BYOK_KEYS_PER_ACCOUNT {
            directory
                .set("acme", &format!("p{index}"), SECRET)
                .await
                .unwrap();
        }
        assert!(matches!(
            directory.set("acme", "one-more", SECRET).await,
            Err(ByokError::TooManyKeys)
        ));
        // Replacing one it holds is no new key.
        directory
            .set("acme", "p0", "sk-replacement-1")
            .await
            .unwrap();
        directory.set("other", "one-more", SECRET).await.unwrap();
    }

    #[tokio::test]
    async fn a_lookup_is_trusted_for_less_than_the_ttl_and_no_longer() {
        let (directory, clock) = directory(Duration::from_millis(500));
        directory.set("acme", "openai", SECRET).await.unwrap();
        assert_eq!(
            key_of(&directory, "acme", "openai").await.as_deref(),
            Some(SECRET)
        );
        assert_eq!(key_of(&directory, "acme", "anthropic").await, None);
        replace_elsewhere(&directory, "acme", "sk-from-elsewhere").await;
        clock.advance(Duration::from_millis(499));
        assert_eq!(
            key_of(&directory, "acme", "openai").await.as_deref(),
            Some(SECRET)
        );
        clock.advance(Duration::from_millis(1));
        assert_eq!(
            key_of(&directory, "acme", "openai").await.as_deref(),
            Some("sk-from-elsewhere")
        );
        // A clock that goes back does not keep an entry alive.
        replace_elsewhere(&directory, "acme", "sk-later-still").await;
        clock.set(t0() - chrono::Duration::days(1));
        assert_eq!(
            key_of(&directory, "acme", "openai").await.as_deref(),
            Some("sk-later-still")
        );
    }

    #[tokio::test]
    async fn changes_through_any_clone_are_seen_at_once() {
        let (directory, _clock) = directory(Duration::from_secs(3600));
        let other_handle = directory.clone();
        assert_eq!(key_of(&other_handle, "acme", "openai").await, None);
        directory.set("acme", "openai", SECRET).await.unwrap();
        assert_eq!(
            key_of(&other_handle, "acme", "OpenAI").await.as_deref(),
            Some(SECRET)
        );
        directory
            .set("acme", "openai", "sk-replaced-0001")
            .await
            .unwrap();
        assert_eq!(
            key_of(&other_handle, "acme", "openai").await.as_deref(),
            Some("sk-replaced-0001")
        );
        assert!(directory.delete("acme", "openai").await.unwrap());
        assert_eq!(key_of(&other_handle, "acme", "openai").await, None);
    }

    #[tokio::test]
    async fn made_up_providers_never_push_found_keys_out_of_the_cache() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let directory = ByokDirectory::builder(store).max_cached_entries(8).build();
        for index in 0..8 {
            let account = format!("a{index}");
            directory.set(&account, "openai", SECRET).await.unwrap();
            directory.lookup(&account, "openai").await.unwrap();
        }
        for index in 0..100 {
            directory
                .lookup("a0", &format!("made-up-{index}"))
                .await
                .unwrap();
            let (found, absent) = directory.inner.cache.sizes();
            assert!(absent <= 2);
            assert_eq!(found, 8);
        }
    }

    #[tokio::test]
    async fn a_record_under_the_wrong_provider_is_an_error_not_a_key() {
        let (directory, _clock) = directory(Duration::ZERO);
        directory.set("acme", "openai", SECRET).await.unwrap();
        let record = directory
            .store()
            .get_record_at(&byok_keys("acme"), "openai", t0())
            .await
            .unwrap()
            .unwrap();
        directory
            .store()
            .put_record_at(
                &byok_keys("acme"),
                "anthropic",
                &record.value,
                Expect::Any,
                PutOptions::default(),
                t0(),
            )
            .await
            .unwrap();
        assert!(directory.lookup("acme", "anthropic").await.is_err());
        assert!(directory.lookup("acme", "openai").await.is_ok());
    }

    fn accepted_key() -> impl Strategy<Value = String> {
        proptest::collection::vec(0x21u8..=0x7e, MIN_BYOK_KEY_BYTES..200)
            .prop_map(|bytes| String::from_utf8(bytes).unwrap())
    }

    proptest! {
        #[test]
        fn a_hint_shows_at_most_7_characters_and_never_the_key(key in accepted_key()) {
            let shown = hint(&key);
            prop_assert!(shown.chars().filter(|c| *c != '…').count() <= 7, "{}", shown);
            prop_assert!(!shown.contains(key.as_str()));
            prop_assert!(check_api_key(&key).is_ok());
        }

        #[test]
        fn any_accepted_key_round_trips(key in accepted_key(), provider in "[A-Za-z0-9_-]{1,64}") {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (entry, found) = runtime.block_on(async {
                let (directory, _clock) = directory(Duration::from_secs(1));
                let entry = directory.set("acme", &provider, &key).await.unwrap();
                (entry, directory.lookup("acme", &provider.to_ascii_uppercase()).await.unwrap())
            });
            let found = found.unwrap();
            prop_assert_eq!(found.api_key(), key.as_str());
            prop_assert_eq!(&found.provider, &provider.to_ascii_lowercase());
            prop_assert_eq!(entry.hint, hint(&key));
        }

        #[test]
        fn no_text_panics_the_checks(text in "\\PC{0,80}") {
            let _ = provider_id(&text);
            let _ = check_api_key(&text);
            let _ = hint(&text);
        }
    }
}
