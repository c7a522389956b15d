use std::sync::Arc;

use tokio::sync::Semaphore;
use tower_layer::Layer;

use super::service::LookupBound;
use super::{AuthFailures, BearerAuth};
use crate::keys::KeyDirectory;

/// Applies [`BearerAuth`] to a service: every request must carry
/// `Authorization: Bearer <key>` with a live modelgate key.
///
/// Cheap to clone: the directory is shared.
#[derive(Clone, Debug)]
pub struct BearerAuthLayer {
    directory: KeyDirectory,
    failures: Option<AuthFailures>,
    lookups: Option<LookupBound>,
}

impl BearerAuthLayer {
    /// Authenticates against the keys of `directory`.
    pub fn new(directory: KeyDirectory) -> Self {
        BearerAuthLayer {
            directory,
            failures: None,
            lookups: None,
        }
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
        }
    }
}

impl crate::context::ContextLayer for BearerAuthLayer {
    const NAME: &'static str = "BearerAuth";

    fn adds(&self) -> &'static [crate::context::ContextPart] {
        &[crate::context::ContextPart::Principal]
    }
}
