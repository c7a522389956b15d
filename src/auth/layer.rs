use tower_layer::Layer;

use super::BearerAuth;
use crate::keys::KeyDirectory;

/// Applies [`BearerAuth`] to a service: every request must carry
/// `Authorization: Bearer <key>` with a live modelgate key.
///
/// Cheap to clone: the directory is shared.
#[derive(Clone, Debug)]
pub struct BearerAuthLayer {
    directory: KeyDirectory,
}

impl BearerAuthLayer {
    /// Authenticates against the keys of `directory`.
    pub fn new(directory: KeyDirectory) -> Self {
        BearerAuthLayer { directory }
    }
}

impl<S> Layer<S> for BearerAuthLayer {
    type Service = BearerAuth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BearerAuth {
            inner,
            directory: self.directory.clone(),
        }
    }
}
