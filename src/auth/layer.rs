use tower_layer::Layer;

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
}

impl BearerAuthLayer {
    /// Authenticates against the keys of `directory`.
    pub fn new(directory: KeyDirectory) -> Self {
        BearerAuthLayer {
            directory,
            failures: None,
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
}

impl<S> Layer<S> for BearerAuthLayer {
    type Service = BearerAuth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BearerAuth {
            inner,
            directory: self.directory.clone(),
            failures: self.failures.clone(),
        }
    }
}
