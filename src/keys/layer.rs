use std::sync::Arc;

use tower_layer::Layer;

use super::{KeyDirectory, KeyRoutes};
use crate::free_quota::FreeQuotaRules;

/// Applies [`KeyRoutes`] to a service: answers the key management API and
/// the key, credits and balance queries; passes every other request on.
///
/// Cheap to clone: the configuration sits behind an `Arc`.
#[derive(Clone, Debug)]
pub struct KeyRoutesLayer {
    pub(crate) config: Arc<KeyRoutesConfig>,
}

#[derive(Clone, Debug)]
pub(crate) struct KeyRoutesConfig {
    pub(crate) directory: KeyDirectory,
    pub(crate) free_quota: FreeQuotaRules,
}

impl KeyRoutesLayer {
    /// Serves the keys and accounts of `directory`; the free-model quota it
    /// reports follows the seed's default rules.
    pub fn new(directory: KeyDirectory) -> Self {
        KeyRoutesLayer {
            config: Arc::new(KeyRoutesConfig {
                directory,
                free_quota: FreeQuotaRules::default(),
            }),
        }
    }

    /// Reports the free-model daily quota under `rules`; give the same rules
    /// as the FreeModelQuota layer.
    pub fn free_quota_rules(mut self, rules: FreeQuotaRules) -> Self {
        Arc::make_mut(&mut self.config).free_quota = rules;
        self
    }
}

impl<S> Layer<S> for KeyRoutesLayer {
    type Service = KeyRoutes<S>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyRoutes {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}
