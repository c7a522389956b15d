//! [`WebhookSecretLayer`] and the numbers it enforces ([`WebhookLimits`]).

use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::actions::{FlowActions, TaskRunner};
use super::routes::WebhookRoute;
use super::service::WebhookSecret;
use crate::auth::AuthFailures;
use crate::clock::{Clock, SystemClock};
use crate::in_flight::{UnauthenticatedLimits, UnauthenticatedPlaces};
use crate::store::FailurePolicy;
use crate::store::SharedStore;

/// The numbers a webhook route enforces; every one can be changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WebhookLimits {
    /// Requests one client may send one route per window (default 120).
    pub requests_per_window: u64,
    /// The fixed window of `requests_per_window` (default 60 s).
    pub rate_window: Duration,
    /// Requests one client may have in flight on one route (default 8).
    pub max_in_flight: u64,
    /// Largest body accepted (default 256 KiB).
    pub max_body_bytes: usize,
    /// How long the body may take to arrive (default 15 s).
    pub body_timeout: Duration,
    /// How long an in-flight slot is held at most: a gateway that dies
    /// mid-request frees its slot when the lease ends (default 2 min).
    pub in_flight_lease: Duration,
    /// How long an ended flow (succeeded, failed, cancelled or lost) is
    /// kept after its last change, its ending, before it is removed and
    /// stops counting against `max_flows_per_session` (default 7 days).
    pub ended_flow_retention: Duration,
    /// How long a flow that has not ended is kept after its last change:
    /// every write to it starts this time again, so only a flow its
    /// controller has abandoned is removed (default 30 days).
    ///
    /// Both retentions must be above zero and at most
    /// [`MAX_RECORD_TTL`](crate::store::MAX_RECORD_TTL): the store refuses
    /// other lifetimes, and every flow write would fail (the config file
    /// takes at most 3650 days).
    pub idle_flow_retention: Duration,
    /// Most flows one session holds, ended ones within their retention
    /// included; `create_flow` past it is refused with 409
    /// `too_many_flows`. Decided in the store's atomic write, so it holds
    /// under concurrent creates and across instances (default 1000).
    pub max_flows_per_session: u64,
}

impl Default for WebhookLimits {
    fn default() -> Self {
        WebhookLimits {
            requests_per_window: 120,
            rate_window: Duration::from_secs(60),
            max_in_flight: 8,
            max_body_bytes: 256 * 1024,
            body_timeout: Duration::from_secs(15),
            in_flight_lease: Duration::from_secs(120),
            ended_flow_retention: Duration::from_secs(7 * 86_400),
            idle_flow_retention: Duration::from_secs(30 * 86_400),
            max_flows_per_session: 1000,
        }
    }
}

/// Applies [`WebhookSecret`] to a service: answers the configured webhook
/// routes, passes every other request on.
///
/// Cheap to clone: the configuration sits behind an `Arc`.
#[derive(Clone, Debug)]
pub struct WebhookSecretLayer {
    pub(crate) config: Arc<WebhookConfig>,
}

#[derive(Clone)]
pub(crate) struct WebhookConfig {
    pub(crate) routes: Vec<WebhookRoute>,
    pub(crate) store: SharedStore,
    pub(crate) actions: FlowActions,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) limits: WebhookLimits,
    pub(crate) failure_policy: FailurePolicy,
    pub(crate) auth_failures: Option<AuthFailures>,
    pub(crate) places: Option<UnauthenticatedPlaces>,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Route ids and paths only: secrets and session keys stay out of logs.
        let routes: Vec<(&str, &str)> = self
            .routes
            .iter()
            .map(|route| (route.scope.route_id.as_str(), route.path.as_str()))
            .collect();
        f.debug_struct("WebhookConfig")
            .field("routes", &routes)
            .field("limits", &self.limits)
            .field("failure_policy", &self.failure_policy)
            .finish_non_exhaustive()
    }
}

impl WebhookSecretLayer {
    /// Serves `routes` (see [`resolve_routes`](super::resolve_routes)),
    /// keeping flows, the rate windows and the in-flight counts in `store`,
    /// with the default [`WebhookLimits`].
    pub fn new(store: SharedStore, routes: Vec<WebhookRoute>) -> Self {
        WebhookSecretLayer {
            config: Arc::new(WebhookConfig {
                routes,
                actions: FlowActions::new(Arc::clone(&store)),
                store,
                clock: Arc::new(SystemClock),
                limits: WebhookLimits::default(),
                failure_policy: FailurePolicy::FailOpen,
                auth_failures: None,
                places: None,
            }),
        }
    }

    /// Enforces `limits` instead of the defaults (the flow retention and
    /// the cap per session included).
    pub fn limits(mut self, limits: WebhookLimits) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.actions = config.actions.clone().limits(limits);
        config.limits = limits;
        self
    }

    /// Counts wrong or missing secrets per
    /// [`ClientAddr`](crate::client_addr::ClientAddr) in `failures`: past its
    /// limit an address's failures get 429 `auth_failures` with
    /// `Retry-After` instead of 401, and so is every request from it until
    /// its window ends, a right secret included (checked first, so that a
    /// guess that comes right among many wrong ones is not served). Share the [`AuthFailures`] of
    /// [`BearerAuthLayer::failure_limit`](crate::auth::BearerAuthLayer::failure_limit)
    /// so a client guessing both counts once.
    pub fn failure_limit(mut self, failures: AuthFailures) -> Self {
        Arc::make_mut(&mut self.config).auth_failures = Some(failures);
        self
    }

    /// Bounds the requests on the routes from the secret's check until
    /// their body is read, in all and per client address, and sets the
    /// least rate a body must arrive at; a body too slow (408) counts as a
    /// failed authentication. Default: none of these, only
    /// [`WebhookLimits`] (the proxy sets them from its `unauthenticated`
    /// section, so a trickled body there holds none of its places).
    pub fn unauthenticated_limits(mut self, limits: UnauthenticatedLimits) -> Self {
        Arc::make_mut(&mut self.config).places =
            Some(UnauthenticatedPlaces::new("the webhook routes", limits));
        self
    }

    /// Takes time from `clock` (rate windows, leases, flow timestamps).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.actions = config.actions.clone().clock(Arc::clone(&clock));
        config.clock = clock;
        self
    }

    /// Hands new child tasks to `runner` (default: only recorded).
    pub fn task_runner(mut self, runner: Arc<dyn TaskRunner>) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.actions = config.actions.clone().task_runner(runner);
        self
    }

    /// What to do when the store cannot be reached for the rate window or
    /// the in-flight count: admit (the default, as for every rate limit) or
    /// answer 503. Flow actions always need the store.
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        Arc::make_mut(&mut self.config).failure_policy = policy;
        self
    }

    /// The flow actions the routes run, for a host that reports task ends
    /// ([`FlowActions::set_task_status`]).
    pub fn actions(&self) -> &FlowActions {
        &self.config.actions
    }
}

impl<S> Layer<S> for WebhookSecretLayer {
    type Service = WebhookSecret<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WebhookSecret {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}
