use std::sync::Arc;

use tower_layer::Layer;

#[cfg(feature = "oauth")]
use crate::oauth::{ApprovalRules, PlainPkce};
use crate::rate_limit::RateRule;
use crate::usage::AppRanking;

use super::KeyRoutes;
use super::management_rate::{DEFAULT_MANAGEMENT_RATE, ManagementRate};
use crate::free_quota::FreeQuotaRules;
use crate::keys::{ByokDirectory, ByokProviders, KeyDirectory, LeakNotifier};

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
    pub(crate) leak_notifier: LeakNotifier,
    pub(crate) app_ranking: Option<AppRanking>,
    /// Whether any key may read the gateway-wide app ranking (by host only).
    pub(crate) public_ranking: bool,
    #[cfg(feature = "oauth")]
    pub(crate) approval_rules: ApprovalRules,
    /// `None`: management calls are not rated.
    pub(crate) management_rate: Option<ManagementRate>,
}

impl KeyRoutesLayer {
    /// Serves the keys and accounts of `directory`, and the accounts'
    /// provider keys in its store; the free-model quota it reports follows
    /// the seed's default rules.
    pub fn new(directory: KeyDirectory) -> Self {
        let byok = ByokDirectory::builder(directory.store().clone())
            .clock(directory.clock().clone())
            .build();
        let management_rate = Some(ManagementRate::new(&directory, DEFAULT_MANAGEMENT_RATE));
        KeyRoutesLayer {
            config: Arc::new(KeyRoutesConfig {
                directory,
                byok,
                free_quota: FreeQuotaRules::default(),
                byok_providers: ByokProviders::Any,
                leak_notifier: LeakNotifier::disabled(),
                app_ranking: None,
                public_ranking: false,
                #[cfg(feature = "oauth")]
                approval_rules: ApprovalRules::default(),
                management_rate,
            }),
        }
    }

    /// Lets every key read the gateway-wide app ranking
    /// (`GET /api/v1/apps?account=*`), each app shown by its address's host
    /// only: no path, no title (either may carry a tenant's data). Default:
    /// off, the gateway-wide ranking is the operator's alone; other keys
    /// read their own account's.
    pub fn public_ranking(mut self, public: bool) -> Self {
        Arc::make_mut(&mut self.config).public_ranking = public;
        self
    }

    /// Whether an app may approve with a `plain` PKCE challenge
    /// (`POST /api/v1/auth/keys/code`). Default: [`PlainPkce::Refused`],
    /// S256 only.
    #[cfg(feature = "oauth")]
    pub fn plain_pkce(mut self, plain: PlainPkce) -> Self {
        Arc::make_mut(&mut self.config).approval_rules.plain = plain;
        self
    }

    /// At most `most` (at least 1) OAuth codes of one account wait for
    /// their exchange at once; past it an approval is 429
    /// `too_many_pending_codes_for_account`. Default:
    /// [`DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT`](crate::oauth::DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT).
    #[cfg(feature = "oauth")]
    pub fn max_pending_codes_per_account(mut self, most: u64) -> Self {
        Arc::make_mut(&mut self.config)
            .approval_rules
            .max_pending_codes_per_account = most.max(1);
        self
    }

    /// The rate of each account's calls to these routes (every request of
    /// its management keys, and of its inference keys to the usage routes;
    /// the operator's key is not counted), decided in the store so it holds across instances; past
    /// it, 429 with `limit_source` `management_rate`. `None` turns it off.
    /// Default: [`DEFAULT_MANAGEMENT_RATE`] (600 a minute, bursts of 60).
    pub fn management_rate(mut self, rule: Option<RateRule>) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.management_rate = rule.map(|rule| ManagementRate::new(&config.directory, rule));
        self
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
    #[cfg(feature = "notify")]
    pub fn leak_notifier(mut self, notifier: crate::notify::Notifier) -> Self {
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

impl crate::context::ContextLayer for KeyRoutesLayer {
    const NAME: &'static str = "KeyRoutes";

    fn reads(&self) -> &'static [crate::context::ContextPart] {
        use crate::context::ContextPart;
        &[ContextPart::Principal, ContextPart::ParsedBody]
    }
}
