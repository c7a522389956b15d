//! Keys a service issued itself, recorded by their hash: they live beside
//! `mg-v1-` keys, with the same records, limits and routes.

use super::directory::KeyDirectory;
use super::key::KeyHash;
use super::record::{KeyRecord, NewKey};
use crate::store::StoreError;

impl KeyDirectory {
    /// Records a key the service issued itself, known here by `hash` only:
    /// the SHA-256 of its text ([`KeyHash::of`], or
    /// [`KeyHash::from_hex`] of a stored hex digest) for keys
    /// [`BearerAuthLayer::imported_keys`](crate::auth::BearerAuthLayer::imported_keys)
    /// takes by hash, or [`KeyHash::verified`] of the id a
    /// [`KeyVerifier`](crate::auth::KeyVerifier) names. Its record has
    /// `new`'s settings and no hint (its text is never seen).
    ///
    /// Idempotent: when the key is recorded already the stored record
    /// stands (a start-up may import every key each time), and a deleted
    /// key cannot be imported again.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use modelgate::keys::{KeyDirectory, KeyHash, KeyState, NewKey, SharedStore};
    /// use modelgate::store::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store: SharedStore = Arc::new(MemoryStore::new());
    /// let directory = KeyDirectory::new(store);
    /// let hash = KeyHash::of("sk-live-4f9a2c");
    /// let record = directory.import_key_hash(hash, NewKey::named("legacy")).await.unwrap();
    /// assert_eq!(record.hint, None);
    /// let again = directory.import_key_hash(hash, NewKey::named("renamed")).await.unwrap();
    /// assert_eq!(again.name, "legacy");
    /// assert!(matches!(directory.lookup(&hash).await.unwrap(), KeyState::Active(_)));
    /// # }
    /// ```
    pub async fn import_key_hash(
        &self,
        hash: KeyHash,
        new: NewKey,
    ) -> Result<KeyRecord, StoreError> {
        self.register_hash(hash, None, new).await
    }
}
