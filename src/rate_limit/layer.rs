use std::sync::Arc;

use tower_layer::Layer;

use super::{GlobalRateLimit, RateLimitRules, RulesError};
use crate::clock::Clock;
use crate::limiter::Limiter;
use crate::store::FailurePolicy;
use crate::store::SharedStore;

/// Applies [`GlobalRateLimit`] to a service.
///
/// Cheap to clone: rules, store and memo are shared behind an `Arc`.
#[derive(Clone, Debug)]
pub struct GlobalRateLimitLayer {
    pub(crate) config: Arc<GlobalRateLimitConfig>,
}

#[derive(Clone, Debug)]
pub(crate) struct GlobalRateLimitConfig {
    pub(crate) rules: RateLimitRules,
    pub(crate) limiter: Limiter,
    /// Hands its checks to CreditGuard instead of deciding them (set by
    /// [`AdmissionLayers`](crate::admission::AdmissionLayers)).
    pub(crate) deferred: bool,
    /// Which requests count: the others pass through uncounted.
    pub(crate) counts: Option<ServedRoutes>,
}

/// Whether a request (its method and path) is one the service below
/// serves: see [`GlobalRateLimitLayer::served_routes`].
pub type ServedRoutes = fn(&http::Method, &str) -> bool;

/// The model calls ([`ServedRoutes`] for a service whose gated routes are
/// model calls): a POST to chat completions, the Messages API (and its
/// `count_tokens`), the Responses API or embeddings, read as every check
/// reads a path. Anything else the service answers itself (a 405 for
/// another method, its own 404) then spends no rate.
pub fn model_calls(method: &http::Method, path: &str) -> bool {
    crate::routing::is_model_call(method, path)
}

impl GlobalRateLimitLayer {
    /// Limits requests by `rules`, counted in `store`; system clock, fail
    /// open, full counters remembered. Rules a counter store cannot hold
    /// are refused here, not on every request.
    pub fn new(store: SharedStore, rules: RateLimitRules) -> Result<Self, RulesError> {
        rules.validate()?;
        Ok(Self::with_checked_rules(store, rules))
    }

    /// [`new`](Self::new) with rules checked already (the proxy's
    /// `GatewayPlan` checks them once, at load).
    pub(crate) fn with_checked_rules(store: SharedStore, rules: RateLimitRules) -> Self {
        debug_assert!(rules.validate().is_ok(), "rules not checked");
        GlobalRateLimitLayer {
            config: Arc::new(GlobalRateLimitConfig {
                rules,
                limiter: Limiter::new(store, "GlobalRateLimit"),
                deferred: false,
                counts: None,
            }),
        }
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

    /// Counts only the requests `served` says the service below serves,
    /// passing the others on uncounted (it answers them 404 at no cost):
    /// a request to a path nobody serves then spends no rate. Without it,
    /// every request that reaches the layer counts.
    pub fn served_routes(mut self, served: ServedRoutes) -> Self {
        Arc::make_mut(&mut self.config).counts = Some(served);
        self
    }

    /// Whether a counter the store reported full is remembered in process
    /// until the wait it reported ends, refusing without a round trip (on by
    /// default). It only ever refuses what the store would refuse.
    pub fn remember_full_counters(mut self, remember: bool) -> Self {
        Arc::make_mut(&mut self.config)
            .limiter
            .remember_full_counters = remember;
        self
    }
}

impl GlobalRateLimitLayer {
    pub(crate) fn deferred(mut self) -> Self {
        Arc::make_mut(&mut self.config).deferred = true;
        self
    }
}

impl<S> Layer<S> for GlobalRateLimitLayer {
    type Service = GlobalRateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GlobalRateLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

impl crate::context::ContextLayer for GlobalRateLimitLayer {
    const NAME: &'static str = "GlobalRateLimit";

    fn reads(&self) -> &'static [crate::context::ContextPart] {
        use crate::context::ContextPart;
        &[ContextPart::Principal, ContextPart::ParsedBody]
    }
}
