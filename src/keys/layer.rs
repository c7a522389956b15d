use std::collections::BTreeSet;
use std::sync::Arc;

use tower_layer::Layer;

use crate::notify::Notifier;
use crate::usage::AppRanking;

use super::{ByokDirectory, KeyDirectory, KeyRoutes};
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
    pub(crate) byok: ByokDirectory,
    pub(crate) free_quota: FreeQuotaRules,
    pub(crate) byok_providers: ByokProviders,
    pub(crate) leak_notifier: Notifier,
    pub(crate) app_ranking: Option<AppRanking>,
}

/// The providers an account may set its own key for through
/// [`KeyRoutes`](super::KeyRoutes), and whose stored key
/// [`CreditGuard`](crate::credit::CreditGuard) may use: only those the
/// service below sends such a key to *instead of* the gateway's own
/// credential, since a key that is never sent, or sent beside the
/// gateway's, would still make the account's requests BYOK, unpaid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ByokProviders {
    /// Any provider: the service below sends each request's
    /// [`ByokCredential`](super::ByokCredential) to its provider in place
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

impl KeyRoutesLayer {
    /// Serves the keys and accounts of `directory`, and the accounts'
    /// provider keys in its store; the free-model quota it reports follows
    /// the seed's default rules.
    pub fn new(directory: KeyDirectory) -> Self {
        let byok = ByokDirectory::builder(directory.store().clone())
            .clock(directory.clock().clone())
            .build();
        KeyRoutesLayer {
            config: Arc::new(KeyRoutesConfig {
                directory,
                byok,
                free_quota: FreeQuotaRules::default(),
                byok_providers: ByokProviders::Any,
                leak_notifier: Notifier::disabled(),
                app_ranking: None,
            }),
        }
    }

    /// Serves the accounts' provider keys (BYOK) from `byok`. Give
    /// [`CreditGuardLayer::byok_directory`](crate::credit::CreditGuardLayer::byok_directory)
    /// a clone of the same directory, so a key set, replaced or deleted
    /// here is used or dropped at once on this instance (other instances
    /// follow within its cache time).
    pub fn byok_directory(mut self, byok: ByokDirectory) -> Self {
        Arc::make_mut(&mut self.config).byok = byok;
        self
    }

    /// Accepts provider keys (`PUT /api/v1/accounts/{id}/byok/{provider}`)
    /// only for `providers`; listing and deleting stay open, so keys set
    /// before can be cleaned up. Give
    /// [`CreditGuardLayer::byok_providers`](crate::credit::CreditGuardLayer::byok_providers)
    /// the same, so a key stored before is not used either. Default:
    /// [`ByokProviders::Any`].
    pub fn byok_providers(mut self, providers: ByokProviders) -> Self {
        Arc::make_mut(&mut self.config).byok_providers = providers;
        self
    }

    /// Tells a key's owner through `notifier` when a management key reports
    /// the key leaked (`POST /api/v1/keys/{hash}/leaked`). Default: nobody
    /// is told.
    pub fn leak_notifier(mut self, notifier: Notifier) -> Self {
        Arc::make_mut(&mut self.config).leak_notifier = notifier;
        self
    }

    /// Writes this instance's app counts before answering
    /// `GET /api/v1/apps`, so a client sees its own requests at once: give
    /// the [`AppRanking`] CreditGuard counts in.
    pub fn app_ranking(mut self, ranking: AppRanking) -> Self {
        Arc::make_mut(&mut self.config).app_ranking = Some(ranking);
        self
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
