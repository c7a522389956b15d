use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::CreditGuard;
use super::bound::BoundField;
use super::group_commit::GroupCommit;
use super::meter::SettledHook;
use super::pending::{PendingSettlements, Unrecorded};
use super::pricing::Pricing;
use super::renewal::HoldRenewals;
use crate::clock::{Clock, SystemClock};
use crate::keys::{ByokDirectory, ByokProviders};
use crate::store::SharedStore;
use crate::store::{FailurePolicy, KeyLimit};
use crate::usage::Generations;

/// Applies [`CreditGuard`] to a service.
///
/// Cheap to clone: the configuration sits behind an `Arc`.
#[derive(Clone, Debug)]
pub struct CreditGuardLayer {
    pub(crate) config: Arc<CreditGuardConfig>,
}

#[derive(Clone)]
pub(crate) struct CreditGuardConfig {
    pub(crate) store: SharedStore,
    /// Reservations and settlements, grouped per account on Redis.
    pub(crate) ledger: Arc<GroupCommit>,
    pub(crate) pricing: Arc<dyn Pricing>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) policy: FailurePolicy,
    pub(crate) default_max_tokens: u64,
    /// The holds of requests in flight, renewed; their lifetime.
    pub(crate) renewals: HoldRenewals,
    pub(crate) max_scanned_body_bytes: usize,
    /// Per provider (lower case), the request field that carries the
    /// completion bound; `max_tokens` for the others.
    pub(crate) bound_fields: HashMap<String, BoundField>,
    /// The keys accounts set through the management API, looked up per
    /// chat request.
    pub(crate) byok_directory: Option<ByokDirectory>,
    /// The providers whose stored keys may be used.
    pub(crate) byok_providers: ByokProviders,
    /// Settlements not recorded yet.
    pub(crate) pending: PendingSettlements,
    /// Whether the service below marks [`SentUpstream`](super::SentUpstream).
    pub(crate) upstream_reports_sending: bool,
    /// What is recorded of each chat request, when anything is.
    pub(crate) generations: Option<Arc<Generations>>,
    /// Told of each recorded settlement with a cost.
    pub(crate) on_settled: Option<SettledHook>,
    /// The route listing the models served, named in the 400 of a model
    /// without a price; `None` names no route.
    pub(crate) models_route: Option<&'static str>,
}

impl std::fmt::Debug for CreditGuardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreditGuardConfig")
            .field("pricing", &self.pricing)
            .field("clock", &self.clock)
            .field("policy", &self.policy)
            .field("default_max_tokens", &self.default_max_tokens)
            .field("reservation_ttl", &self.renewals.hold_ttl())
            .field("max_scanned_body_bytes", &self.max_scanned_body_bytes)
            .field("bound_fields", &self.bound_fields)
            .field("byok_directory", &self.byok_directory)
            .field("byok_providers", &self.byok_providers)
            .finish_non_exhaustive()
    }
}

impl CreditGuardLayer {
    /// The completion bound written into a request without `max_tokens`,
    /// when the key's limit and the balance pay for it.
    pub const DEFAULT_MAX_TOKENS: u64 = 4096;
    /// How long a hold lasts without renewal: its request's instance renews
    /// it every third of this while the request is in flight, so a hold
    /// that reaches it belongs to an instance that died (or lost the store
    /// that long) and lapses, charged in full.
    pub const DEFAULT_RESERVATION_TTL: Duration = Duration::from_secs(60);
    /// The largest JSON response body read for its usage.
    pub const DEFAULT_MAX_SCANNED_BODY_BYTES: usize = 8 * 1024 * 1024;

    /// Names `route` (such as `GET /api/v1/models`) in the 400 of a model
    /// without a price, as the route that lists the models served. Without
    /// it the message names no route: a service need not have one.
    pub fn models_route(mut self, route: &'static str) -> Self {
        Arc::make_mut(&mut self.config).models_route = Some(route);
        self
    }

    /// Charges requests at `pricing`, in `store`; system clock, fails closed.
    pub fn new(store: SharedStore, pricing: Arc<dyn Pricing>) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        CreditGuardLayer {
            config: Arc::new(CreditGuardConfig {
                ledger: GroupCommit::new(store.clone(), clock.clone()),
                renewals: HoldRenewals::new(
                    store.clone(),
                    clock.clone(),
                    Self::DEFAULT_RESERVATION_TTL,
                ),
                store,
                pricing,
                clock,
                policy: FailurePolicy::FailClosed,
                default_max_tokens: Self::DEFAULT_MAX_TOKENS,
                max_scanned_body_bytes: Self::DEFAULT_MAX_SCANNED_BODY_BYTES,
                bound_fields: HashMap::new(),
                byok_directory: None,
                byok_providers: ByokProviders::Any,
                pending: PendingSettlements::default(),
                upstream_reports_sending: false,
                generations: None,
                on_settled: None,
                models_route: None,
            }),
        }
    }

    /// Reads time from `clock` (a manual clock in tests).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.ledger = GroupCommit::new(config.store.clone(), clock.clone());
        config.renewals = HoldRenewals::new(
            config.store.clone(),
            clock.clone(),
            config.renewals.hold_ttl(),
        );
        config.clock = clock;
        self
    }

    /// Records each chat request it admits (see [`crate::usage`]): its
    /// response carries `X-Generation-Id`, and its record is kept with its
    /// settlement (none for a request that never reached the upstream, see
    /// [`upstream_reports_sending`](Self::upstream_reports_sending)). The app headers are then checked (a malformed one is a
    /// 400 before admission) and, with an
    /// [`AppRanking`](crate::usage::AppRanking), counted.
    pub fn generations(mut self, generations: Generations) -> Self {
        Arc::make_mut(&mut self.config).generations = Some(Arc::new(generations));
        self
    }

    /// What to do when the store fails at admission: answer 503 (the
    /// default) or admit, still recording the cost when it can.
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        Arc::make_mut(&mut self.config).policy = policy;
        self
    }

    /// Completion tokens assumed when a request gives no `max_tokens`.
    pub fn default_max_tokens(mut self, max_tokens: u64) -> Self {
        Arc::make_mut(&mut self.config).default_max_tokens = max_tokens;
        self
    }

    /// How long a hold lasts without renewal (default
    /// [`DEFAULT_RESERVATION_TTL`](Self::DEFAULT_RESERVATION_TTL)). While
    /// its request is in flight the layer renews it every third of this,
    /// one store call per account, so a stream of any length keeps its
    /// hold; a hold whose instance died lapses this long after its last
    /// renewal and is charged in full, until its settlement (if one ever
    /// comes) replaces that with the real cost.
    pub fn reservation_ttl(mut self, ttl: Duration) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.renewals = HoldRenewals::new(config.store.clone(), config.clock.clone(), ttl);
        self
    }

    /// The largest JSON response body read for its usage; a larger one is
    /// charged its reservation.
    pub fn max_scanned_body_bytes(mut self, max_bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).max_scanned_body_bytes = max_bytes;
        self
    }

    /// The request field that carries the completion bound for `provider`'s
    /// models: `max_tokens` by default; OpenAI's reasoning models take only
    /// `max_completion_tokens`. The gateway writes the bound there when the
    /// client set none.
    pub fn completion_bound_field(mut self, provider: impl AsRef<str>, field: BoundField) -> Self {
        Arc::make_mut(&mut self.config)
            .bound_fields
            .insert(provider.as_ref().to_ascii_lowercase(), field);
        self
    }

    /// Looks up, before each chat request, whether its account has set its
    /// own key for the model's provider (`PUT
    /// /api/v1/accounts/{id}/byok/{provider}`): one store read, cached by
    /// the directory. A request with such a key is BYOK usage (kept in its
    /// own totals, not taken from the balance) and carries the key in its
    /// context as a [`ByokCredential`](crate::keys::ByokCredential); the
    /// service below must send that key upstream instead of its own (the
    /// proxy's `Providers` does), or the gateway pays for usage booked as
    /// the account's. A store
    /// that fails this lookup is treated as the reservation's would be:
    /// 503 when failing closed (the default), or admitted as the account's
    /// own usage, with no credential, when failing open.
    ///
    /// Give it a clone of the directory
    /// [`KeyRoutesLayer::byok_directory`](crate::api::KeyRoutesLayer::byok_directory)
    /// serves, so changes made there are seen here at once.
    pub fn byok_directory(mut self, directory: ByokDirectory) -> Self {
        Arc::make_mut(&mut self.config).byok_directory = Some(directory);
        self
    }

    /// Looks up an account's key only for `providers`: a key stored for
    /// any other (set before the configuration changed) is not used, and
    /// the request is charged as the account's own usage. Give it what
    /// [`KeyRoutesLayer::byok_providers`](crate::api::KeyRoutesLayer::byok_providers)
    /// is given. Default: [`ByokProviders::Any`].
    pub fn byok_providers(mut self, providers: ByokProviders) -> Self {
        Arc::make_mut(&mut self.config).byok_providers = providers;
        self
    }
}

impl CreditGuardLayer {
    /// Whether the service below marks the [`SentUpstream`](super::SentUpstream)
    /// each metered request carries once the upstream has it, and clears
    /// it while a retry waits (the proxy's upstream client and retry policy
    /// do). On, a request that ends unmarked (dropped, or answered by an
    /// error the service below made itself) is released at no cost and has
    /// no generation record; off (the default), a request dropped before
    /// its response is charged what its bound allows, as the upstream may
    /// be working on it.
    pub fn upstream_reports_sending(mut self, reports: bool) -> Self {
        Arc::make_mut(&mut self.config).upstream_reports_sending = reports;
        self
    }

    /// The settlements of this layer (and its clones) not recorded yet:
    /// settlements retried after a failure (for at most
    /// [`SETTLEMENT_RETRY_WINDOW`](crate::store::SETTLEMENT_RETRY_WINDOW))
    /// and those of clients that went away.
    pub fn pending_settlements(&self) -> PendingSettlements {
        self.config.pending.clone()
    }

    /// Waits until every settlement of this layer is recorded, or until
    /// `deadline`; returns (and logs, and counts) those that were not. A
    /// gateway that stops calls this once the requests in flight have ended.
    pub async fn flush(&self, deadline: Duration) -> Vec<Unrecorded> {
        self.config.pending.flush(deadline).await
    }
}

impl CreditGuardLayer {
    /// Calls `hook` with the account, the key's hash (hex) and the key's
    /// limit each time a settlement that cost something has been recorded
    /// (the proxy's `alerts` check balances and limits so). It runs on the settling task after the
    /// fact: it must return at once (queue, never wait), and nothing it
    /// does can change the request or its settlement.
    pub fn on_settled(
        mut self,
        hook: impl Fn(&str, &str, Option<KeyLimit>) + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.config).on_settled = Some(Arc::new(hook));
        self
    }
}

impl<S> Layer<S> for CreditGuardLayer {
    type Service = CreditGuard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CreditGuard {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

impl crate::context::ContextLayer for CreditGuardLayer {
    const NAME: &'static str = "CreditGuard";

    fn reads(&self) -> &'static [crate::context::ContextPart] {
        use crate::context::ContextPart;
        &[ContextPart::Principal, ContextPart::ParsedBody]
    }
}
