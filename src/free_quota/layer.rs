use std::sync::Arc;

use tower_layer::Layer;

use super::{FreeModelQuota, FreeQuotaRules, QuotaRulesError};
use crate::clock::Clock;
use crate::limiter::Limiter;
use crate::store::FailurePolicy;
use crate::store::SharedStore;

/// Applies [`FreeModelQuota`] to a service.
///
/// Cheap to clone: rules, store and caches are shared behind an `Arc`.
#[derive(Clone, Debug)]
pub struct FreeModelQuotaLayer {
    pub(crate) config: Arc<FreeModelQuotaConfig>,
}

#[derive(Clone, Debug)]
pub(crate) struct FreeModelQuotaConfig {
    pub(crate) rules: FreeQuotaRules,
    pub(crate) limiter: Limiter,
    /// Hands its checks to CreditGuard instead of deciding them (set by
    /// [`AdmissionLayers`](crate::admission::AdmissionLayers)).
    pub(crate) deferred: bool,
}

impl FreeModelQuotaLayer {
    /// Seed 000's quota ([`FreeQuotaRules::default`]) counted in `store`;
    /// system clock, fail open, full counters remembered.
    pub fn new(store: SharedStore) -> Self {
        FreeModelQuotaLayer {
            config: Arc::new(FreeModelQuotaConfig {
                rules: FreeQuotaRules::default(),
                limiter: Limiter::new(store, "FreeModelQuota"),
                deferred: false,
            }),
        }
    }

    /// Other numbers than the seed's; refused when a counter could not
    /// hold them.
    pub fn rules(self, rules: FreeQuotaRules) -> Result<Self, QuotaRulesError> {
        rules.validate()?;
        Ok(self.checked_rules(rules))
    }

    /// [`rules`](Self::rules) checked already (the proxy's `GatewayPlan`
    /// checks them once, at load).
    pub(crate) fn checked_rules(mut self, rules: FreeQuotaRules) -> Self {
        debug_assert!(rules.validate().is_ok(), "rules not checked");
        Arc::make_mut(&mut self.config).rules = rules;
        self
    }

    /// Reads time from `clock` (a manual clock in tests).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        Arc::make_mut(&mut self.config).limiter.clock = clock;
        self
    }

    /// What to do when the store fails: admit unchecked (the default) or
    /// answer 503.
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        Arc::make_mut(&mut self.config).limiter.policy = policy;
        self
    }

    /// Whether a counter the store reported full is remembered until the
    /// wait it reported ends (on by default); it only ever refuses what
    /// the store would refuse.
    pub fn remember_full_counters(mut self, remember: bool) -> Self {
        Arc::make_mut(&mut self.config)
            .limiter
            .remember_full_counters = remember;
        self
    }

    pub(crate) fn deferred(mut self) -> Self {
        Arc::make_mut(&mut self.config).deferred = true;
        self
    }
}

impl<S> Layer<S> for FreeModelQuotaLayer {
    type Service = FreeModelQuota<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FreeModelQuota {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

impl crate::context::ContextLayer for FreeModelQuotaLayer {
    const NAME: &'static str = "FreeModelQuota";

    fn reads(&self) -> &'static [crate::context::ContextPart] {
        use crate::context::ContextPart;
        &[ContextPart::Principal, ContextPart::ParsedBody]
    }
}
