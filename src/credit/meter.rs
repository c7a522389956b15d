//! Settlement: the real cost of a request, recorded once, whatever way the
//! request ended.

use crate::context::ModelApi;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::store::{KeyLimit, SETTLEMENT_RETRY_WINDOW, Settlement};
use crate::usage::{GenerationContext, GenerationEnd, TokenDetails};

use super::group_commit::GroupCommit;
use super::pending::{PendingSettlements, Tracked};
use super::pricing::TokenPrice;
use super::renewal::RenewalTicket;
use super::usage::Usage;
use crate::context::SentUpstream;

/// How a metered request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The whole response arrived.
    Complete,
    /// The response body failed part way.
    Interrupted,
    /// The client went away before the end.
    Abandoned,
    /// The gateway, stopping, ended the response before its end
    /// ([`PendingSettlements::end_streams`]): charged like a response cut
    /// short.
    ShutDown,
    /// The inner service failed without a response.
    InnerFailed,
    /// The upstream had the request and gave no answer that says what it
    /// used: none came in time (a late answer's deadline), its connection
    /// failed, or no place was free to wait for one. Charged its hold, as a
    /// lapse is.
    Unanswered,
    /// The request never reached the upstream (admission was cut short,
    /// or the [`SentUpstream`] mark was not set when it ended): no cost, no
    /// generation record.
    NotSent,
}

/// A request's hold, waiting for its settlement.
#[derive(Clone)]
pub(crate) struct Meter {
    pub(crate) ledger: Arc<GroupCommit>,
    pub(crate) account: String,
    pub(crate) key: String,
    pub(crate) reservation_id: String,
    /// Whether the store answered that it holds the reservation
    /// ([`Settlement::hold_granted`]).
    pub(crate) hold_granted: bool,
    /// What the request can cost within its completion bound (no more
    /// than it holds): what one that ends without usage is charged.
    pub(crate) estimate_nanos: i64,
    /// Shared, not copied: a price is hundreds of bytes, and a meter moves
    /// with its request's futures.
    pub(crate) price: Arc<TokenPrice>,
    /// The API the request spoke: how its answer reports usage.
    pub(crate) api: ModelApi,
    /// A `:free` variant: never charged, whatever the upstream says.
    pub(crate) free: bool,
    pub(crate) byok: bool,
    /// Whether the response's status was 2xx, once there is a response.
    pub(crate) response_success: Option<bool>,
    /// Whether the response metered is a late answer, read after the
    /// client was answered with an error: one that ends without usage
    /// before its end is charged its hold.
    pub(crate) late: bool,
    /// The prompt's likely tokens (its text at a token per 3 bytes, as a
    /// stream's text is counted; parts at their bound; never above the
    /// held bound), and the completion tokens a stream carried (once its
    /// body has been read): what a stream that reports no usage is charged.
    pub(crate) prompt_tokens: u64,
    pub(crate) streamed_tokens: Option<u64>,
    /// Where a settlement not yet recorded is known until it is.
    pub(crate) pending: PendingSettlements,
    /// Keeps a granted hold renewed until the settlement is recorded or
    /// given up (dropped with the last clone of the meter).
    #[allow(dead_code, reason = "held for its Drop, which ends the renewals")]
    pub(crate) renewal: Option<Arc<RenewalTicket>>,
    /// What the request's generation record needs, when one is kept.
    pub(crate) generation: Option<Box<GenerationContext>>,
    /// The call's `chat` span: its usage is recorded at settlement, and it
    /// ends there.
    pub(crate) span: tracing::Span,
    /// The key's limit, handed to `on_settled` with the account and key.
    pub(crate) key_limit: Option<KeyLimit>,
    /// Told of each settlement with a cost once it is recorded
    /// ([`CreditGuardLayer::on_settled`](super::CreditGuardLayer::on_settled)).
    pub(crate) on_settled: Option<SettledHook>,
}

/// What [`CreditGuardLayer::on_settled`](super::CreditGuardLayer::on_settled)
/// calls: the account, the key's hash (hex) and its limit.
pub type SettledHook = Arc<dyn Fn(&str, &str, Option<KeyLimit>) + Send + Sync>;

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("account", &self.account)
            .field("reservation_id", &self.reservation_id)
            .field("estimate_nanos", &self.estimate_nanos)
            .field("free", &self.free)
            .field("byok", &self.byok)
            .field("response_success", &self.response_success)
            .finish_non_exhaustive()
    }
}

/// Waits between settlement attempts that run after the response is gone,
/// then [`LONGEST_RETRY_WAIT`] between the others, for
/// [`SETTLEMENT_RETRY_WINDOW`] from the first: a store outage shorter than
/// that loses nothing, and one longer lets the hold lapse, charged in full.
/// Settling is idempotent by reservation id (the store keeps a marker
/// longer than the window), so retrying after a reply that was lost can
/// never charge twice.
const BACKGROUND_RETRY_WAITS: [Duration; 5] = [
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
];
const LONGEST_RETRY_WAIT: Duration = Duration::from_secs(10);

impl Meter {
    /// What the request costs, and on what basis:
    ///
    /// - a `:free` variant: nothing;
    /// - the usage the upstream reported: its `usage.cost`, else the tokens
    ///   priced;
    /// - no usage and an error status, or never sent: nothing (no work was
    ///   reported, so nothing is known to be owed);
    /// - no usage from an event stream (a client gone, a stream cut short,
    ///   an upstream that reports none): its prompt and what it streamed
    ///   ([`UsageScanner::streamed_tokens`](super::UsageScanner::streamed_tokens)),
    ///   at most what its bound allows;
    /// - no usage otherwise (a JSON body cut short, an inner failure): what
    ///   its bound allows, since tokens may have been spent;
    /// - a late answer (read after the client was answered an error): its
    ///   usage on basis `late_answer`; none by its deadline, a connection
    ///   that failed, or an answer cut short: its hold (`unanswered`), as
    ///   a lapse is charged.
    pub(crate) fn cost_nanos(&self, usage: Option<Usage>, ending: Ending) -> (i64, &'static str) {
        if self.free {
            return (0, "free_model");
        }
        match usage {
            Some(usage) => (
                usage
                    .cost_nanos
                    .unwrap_or_else(|| self.price.charge_nanos(&usage)),
                if self.late { "late_answer" } else { "usage" },
            ),
            None if ending == Ending::NotSent => (0, "not_sent"),
            None if ending == Ending::Unanswered || (self.late && ending != Ending::Complete) => {
                (self.estimate_nanos, "unanswered")
            }
            None if self.response_success == Some(false) => (0, "upstream_error_without_usage"),
            // What was streamed, within the bound the request was held for.
            None => match self.streamed_tokens {
                Some(tokens) => (
                    self.price
                        .charge_nanos(&Usage {
                            prompt_tokens: self.prompt_tokens,
                            completion_tokens: tokens,
                            ..Usage::default()
                        })
                        .min(self.estimate_nanos),
                    "streamed",
                ),
                None => (self.estimate_nanos, "estimate"),
            },
        }
    }

    /// Records the cost and releases the hold, without anyone waiting: on
    /// Redis with the account's next ledger call (see [`GroupCommit`]),
    /// then again with backoff should it fail. Pending until recorded (see
    /// [`PendingSettlements`]).
    pub(crate) fn settle_in_background(mut self, usage: Option<Usage>, ending: Ending) {
        let settlement = Arc::new(self.settlement(usage, ending));
        // The call ends here, however long its settlement takes to record.
        drop(std::mem::replace(&mut self.span, tracing::Span::none()));
        let tracked = self.pending.track(Arc::clone(&settlement));
        self.retry_in_background(settlement, tracked, Duration::ZERO);
    }

    /// The settlement of this request, its names moved out of the meter
    /// (whose last use this is).
    fn settlement(&mut self, usage: Option<Usage>, ending: Ending) -> Settlement {
        let (cost_nanos, basis) = self.cost_nanos(usage, ending);
        if cost_nanos > self.estimate_nanos {
            // Charged in full all the same: the upstream did the work.
            let over_nanos = cost_nanos - self.estimate_nanos;
            tracing::warn!(
                account = %self.account,
                reservation = %self.reservation_id,
                cost_nanos,
                bound_nanos = self.estimate_nanos,
                "the upstream charged past the completion bound the request was held for"
            );
            metrics::counter!(crate::telemetry::COST_OVER_HOLD_NANOCREDITS_TOTAL)
                .increment(u64::try_from(over_nanos).unwrap_or(0));
        }
        tracing::debug!(
            account = %self.account,
            reservation = %self.reservation_id,
            cost_nanos,
            basis,
            ?ending,
            "settling"
        );
        CHARGED
            .get(&self.byok, || {
                let counter = metrics::counter!(
                    crate::telemetry::CHARGED_NANOCREDITS_TOTAL,
                    "byok" => if self.byok { "true" } else { "false" }
                );
                (self.byok, counter)
            })
            .increment(u64::try_from(cost_nanos).unwrap_or(0));
        // A request that never went upstream (refused after a store error,
        // or whose client left during admission) generated nothing.
        let generated = self
            .generation
            .as_ref()
            .filter(|_| ending != Ending::NotSent);
        let tokens = match (usage, self.streamed_tokens) {
            (Some(usage), _) => Some((usage.prompt_tokens, usage.completion_tokens)),
            (None, Some(streamed)) => Some((self.prompt_tokens, streamed)),
            (None, None) => None,
        };
        if let Some((prompt, completion)) = tokens.filter(|_| !self.span.is_none()) {
            self.span.record("gen_ai.usage.input_tokens", prompt);
            self.span.record("gen_ai.usage.output_tokens", completion);
        }
        let record = generated.map(|generation| {
            generation.finish(
                &self.account,
                &self.key,
                &self.reservation_id,
                GenerationEnd {
                    tokens,
                    details: usage.map(|usage| TokenDetails {
                        cache_read: usage.cache_read_tokens,
                        cache_write: usage
                            .cache_write_tokens
                            .saturating_add(usage.cache_write_1h_tokens),
                        reasoning: usage.reasoning_tokens,
                        web_searches: usage.web_search_requests,
                    }),
                    cost_nanos,
                    // Only a charge the gateway priced from the usage has parts.
                    cost_details: usage
                        .filter(|usage| usage.cost_nanos.is_none() && !self.free)
                        .map(|usage| self.price.charge_breakdown(&usage)),
                    cost_basis: basis,
                    byok: self.byok,
                    cancelled: ending == Ending::Abandoned,
                },
            )
        });
        Settlement {
            account: std::mem::take(&mut self.account),
            key: std::mem::take(&mut self.key),
            reservation_id: std::mem::take(&mut self.reservation_id),
            hold_granted: self.hold_granted,
            cost_nanos,
            byok: self.byok,
            record,
        }
    }

    /// Attempts `settlement` after `first_wait`, then again with backoff
    /// until it is recorded or the store no longer knows its hold;
    /// `tracked` keeps it pending meanwhile.
    fn retry_in_background(
        self,
        settlement: Arc<Settlement>,
        tracked: Tracked,
        first_wait: Duration,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            unrecorded(&settlement, "no runtime to settle on");
            return;
        };
        let retry_until = tokio::time::Instant::now() + first_wait + SETTLEMENT_RETRY_WINDOW;
        let mut attempts = Box::pin(async move {
            let _pending = tracked;
            let mut waits = BACKGROUND_RETRY_WAITS
                .into_iter()
                .chain(std::iter::repeat(LONGEST_RETRY_WAIT));
            let mut wait = first_wait;
            loop {
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                match self.ledger.settle(&settlement).await {
                    Ok(()) => {
                        // Told after the fact and never waited for: the
                        // hook only queues.
                        if let Some(hook) = self
                            .on_settled
                            .as_ref()
                            .filter(|_| settlement.cost_nanos > 0)
                        {
                            hook(&settlement.account, &settlement.key, self.key_limit);
                        }
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(%error, reservation = %settlement.reservation_id, "settlement attempt failed")
                    }
                }
                let now = tokio::time::Instant::now();
                if now >= retry_until {
                    unrecorded(
                        &settlement,
                        "the store never took the settlement within its retry window",
                    );
                    return;
                }
                wait = waits
                    .next()
                    .unwrap_or(LONGEST_RETRY_WAIT)
                    .min(retry_until - now);
            }
        });
        // A store that answers at once (MemoryStore) settles right here: no
        // task to spawn and wake per request. Anything that has to wait (a
        // round trip, a retry) goes on in a task, which polls it again with
        // a waker of its own.
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        if attempts.as_mut().poll(&mut context).is_pending() {
            runtime.spawn(attempts);
        }
    }
}

/// `modelgate_charged_nanocredits_total` by `byok`.
static CHARGED: crate::telemetry::HandleCache<bool, metrics::Counter> =
    crate::telemetry::HandleCache::new();

/// Logs and counts a settlement the store could not record (see
/// [`super::pending::report_unrecorded`]).
fn unrecorded(settlement: &Settlement, why: &str) {
    super::pending::report_unrecorded(
        &settlement.account,
        &settlement.key,
        Some(&settlement.reservation_id),
        settlement.cost_nanos,
        settlement.hold_granted,
        why,
    );
}

/// A hold that settles itself if dropped unsettled: `ending` says how
/// (a request cut short before it was sent costs nothing; one whose caller
/// went away while the upstream worked is charged).
#[derive(Debug)]
pub(crate) struct Unsettled {
    meter: Option<Meter>,
    ending: Ending,
    /// When the upstream client reports sending: unmarked, the request
    /// is not at the upstream, whatever `ending` says.
    sent: Option<SentUpstream>,
}

impl Unsettled {
    pub(crate) fn new(meter: Option<Meter>, ending: Ending) -> Self {
        Unsettled {
            meter,
            ending,
            sent: None,
        }
    }

    /// Settles at no cost if dropped before `sent` is marked.
    pub(crate) fn unless_unsent(mut self, sent: Option<SentUpstream>) -> Self {
        self.sent = sent;
        self
    }

    /// How a request that ended `ending` settles: as never sent when the
    /// service below reports sending and the request is not at the
    /// upstream (never sent, or cleared by a failed connect or a retry's
    /// wait).
    pub(crate) fn ending(&self, ending: Ending) -> Ending {
        if self.sent.as_ref().is_some_and(|sent| !sent.is_marked()) {
            Ending::NotSent
        } else {
            ending
        }
    }

    /// The late answer the service below left for a request still at the
    /// upstream (see [`SentUpstream`]), when a meter is there to settle it.
    pub(crate) fn late_answer(&self) -> Option<crate::context::LateAnswer> {
        self.meter.as_ref()?;
        self.sent.as_ref()?.take_late_answer()
    }

    pub(crate) fn take(&mut self) -> Option<Meter> {
        self.meter.take()
    }

    pub(crate) fn is_some(&self) -> bool {
        self.meter.is_some()
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some(meter) = self.meter.take() {
            let ending = self.ending(self.ending);
            meter.settle_in_background(None, ending);
        }
    }
}
