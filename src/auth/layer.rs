use std::sync::Arc;

use tokio::sync::Semaphore;
use tower_layer::Layer;

use super::checked::CheckedKeys;
use super::imported::ImportedKeys;
use super::service::LookupBound;
use super::words::AuthWords;
use super::{AuthFailures, BearerAuth};
use crate::keys::KeyDirectory;

/// Applies [`BearerAuth`] to a service: every request must carry
/// `Authorization: Bearer <key>` with a live key: a modelgate key, or one
/// of the service's own keys it [imports](BearerAuthLayer::imported_keys).
///
/// Its refusals name the service as [`realm`](BearerAuthLayer::realm) and
/// [`product_name`](BearerAuthLayer::product_name) say (`modelgate` unless
/// set). Cheap to clone: the directory is shared.
#[derive(Clone, Debug)]
pub struct BearerAuthLayer {
    directory: KeyDirectory,
    failures: Option<AuthFailures>,
    lookups: Option<LookupBound>,
    words: AuthWords,
    imported: Vec<ImportedKeys>,
    checked: Arc<CheckedKeys>,
}

impl BearerAuthLayer {
    /// Authenticates against the keys of `directory`.
    pub fn new(directory: KeyDirectory) -> Self {
        BearerAuthLayer {
            directory,
            failures: None,
            lookups: None,
            words: AuthWords::default(),
            imported: Vec::new(),
            checked: Arc::default(),
        }
    }

    /// The realm of the `WWW-Authenticate: Bearer realm="…"` challenge on
    /// every 401 (`modelgate` by default).
    ///
    /// # Panics
    ///
    /// When `realm` is empty or has a character other than printable ASCII,
    /// or a `"` or `\` (which the challenge would have to escape): it is the
    /// service's own constant, so a bad one is a bug caught at start-up.
    pub fn realm(mut self, realm: &str) -> Self {
        self.words = match self.words.with_realm(realm) {
            Ok(words) => words,
            Err(_) => panic!(
                "BearerAuthLayer::realm: {realm:?} must be non-empty printable ASCII without `\"` or `\\`"
            ),
        };
        self
    }

    /// The product whose keys the messages name: "send `Authorization:
    /// Bearer <your acme key>`", "unknown API key: no acme key with this
    /// value exists" (`modelgate` by default).
    pub fn product_name(mut self, product: impl Into<String>) -> Self {
        self.words.product = product.into();
        self
    }

    /// Accepts the service's own keys of `shapes` beside modelgate's
    /// `mg-v1-` keys (which stay the only ones
    /// [`create_key`](KeyDirectory::create_key) makes). A key of these
    /// shapes is looked up by its SHA-256, or by the identity the shapes'
    /// [`KeyVerifier`](super::KeyVerifier) names; its record is made with
    /// [`KeyDirectory::import_key_hash`]. Called again, it adds shapes:
    /// the first that a token has decides.
    ///
    /// The header rules stay (one header, a token68 value of at most
    /// [`MAX_AUTHORIZATION_BYTES`](super::MAX_AUTHORIZATION_BYTES)), and so
    /// do [`failure_limit`](Self::failure_limit) and
    /// [`max_concurrent_lookups`](Self::max_concurrent_lookups): an
    /// imported key counts as a modelgate key does, and a token for a
    /// verifier is never known live before it has run, so it always waits
    /// on both.
    pub fn imported_keys(mut self, shapes: ImportedKeys) -> Self {
        self.imported.push(shapes);
        self
    }

    /// Counts failed authentications per [`ClientAddr`](crate::client_addr::ClientAddr):
    /// past the limit, an address's failures are answered 429 with
    /// `Retry-After` instead of 401, and its keys are looked up no more
    /// (no store read): only a key the directory's cache has found live is
    /// still served.
    /// Share one [`AuthFailures`] between the layers that check secrets
    /// (the webhook routes take it too) so they count together.
    pub fn failure_limit(mut self, failures: AuthFailures) -> Self {
        self.failures = Some(failures);
        self
    }

    /// Bounds the store reads made at once for keys the directory's cache
    /// has not found live: past `max_concurrent` (at least 1), such a key
    /// is answered 503 `overloaded` with `Retry-After: 1` without a read,
    /// so unknown keys from many addresses cannot pile reads on the store.
    /// A key the cache has found live never waits for nor is refused by it.
    pub fn max_concurrent_lookups(mut self, max_concurrent: usize) -> Self {
        let max_concurrent = max_concurrent.clamp(1, Semaphore::MAX_PERMITS);
        self.lookups = Some(LookupBound {
            permits: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
        });
        self
    }
}

impl<S> Layer<S> for BearerAuthLayer {
    type Service = BearerAuth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BearerAuth {
            inner,
            directory: self.directory.clone(),
            failures: self.failures.clone(),
            lookups: self.lookups.clone(),
            words: Arc::new(self.words.clone()),
            imported: self.imported.clone().into(),
            checked: Arc::clone(&self.checked),
        }
    }
}

impl crate::context::ContextLayer for BearerAuthLayer {
    const NAME: &'static str = "BearerAuth";

    fn adds(&self) -> &'static [crate::context::ContextPart] {
        &[crate::context::ContextPart::Principal]
    }
}
