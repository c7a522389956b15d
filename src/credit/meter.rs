//! Settlement: the real cost of a request, recorded once, whatever way the
//! request ended.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::keys::SharedStore;
use crate::store::Settlement;

use super::pricing::TokenPrice;
use super::usage::Usage;

/// How a metered request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The whole response arrived; `success` when its status was 2xx.
    Complete { success: bool },
    /// The response body failed part way.
    Interrupted,
    /// The client went away before the end.
    Abandoned,
    /// The inner service failed without a response.
    InnerFailed,
}

/// A reservation waiting for its settlement.
#[derive(Clone)]
pub(crate) struct Meter {
    pub(crate) store: SharedStore,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) account: String,
    pub(crate) key: String,
    pub(crate) reservation_id: String,
    pub(crate) reserved_nanos: i64,
    pub(crate) price: TokenPrice,
    pub(crate) byok: bool,
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("account", &self.account)
            .field("reservation_id", &self.reservation_id)
            .field("reserved_nanos", &self.reserved_nanos)
            .field("byok", &self.byok)
            .finish_non_exhaustive()
    }
}

/// Waits between settlement attempts that run after the response is gone.
const BACKGROUND_RETRY_WAITS: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

impl Meter {
    /// What the request costs: the usage the upstream reported, priced
    /// (or its own `usage.cost`); without usage, nothing for a complete
    /// error response (the upstream did no work it reports), else the whole
    /// reservation, since tokens may have been spent.
    pub(crate) fn cost_nanos(&self, usage: Option<Usage>, ending: Ending) -> (i64, &'static str) {
        match (usage, ending) {
            (Some(usage), _) => (
                usage.cost_nanos.unwrap_or_else(|| {
                    self.price
                        .cost_nanos(usage.prompt_tokens, usage.completion_tokens)
                }),
                "usage",
            ),
            (None, Ending::Complete { success: false }) => (0, "upstream_error_without_usage"),
            (None, _) => (self.reserved_nanos, "reservation"),
        }
    }

    /// Records the cost and releases the reservation. One attempt; when it
    /// fails the rest go on in the background.
    pub(crate) async fn settle(self, usage: Option<Usage>, ending: Ending) {
        let settlement = self.settlement(usage, ending);
        if let Err(error) = self.store.settle(&settlement, self.clock.now()).await {
            tracing::warn!(%error, reservation = %self.reservation_id, "settlement failed; retrying in the background");
            self.retry_in_background(settlement);
        }
    }

    /// Settles without anyone waiting: for a client that went away or an
    /// inner service that failed.
    pub(crate) fn settle_in_background(self, usage: Option<Usage>, ending: Ending) {
        let settlement = self.settlement(usage, ending);
        self.retry_in_background(settlement);
    }

    fn settlement(&self, usage: Option<Usage>, ending: Ending) -> Settlement {
        let (cost_nanos, basis) = self.cost_nanos(usage, ending);
        tracing::debug!(
            account = %self.account,
            reservation = %self.reservation_id,
            cost_nanos,
            basis,
            ?ending,
            "settling"
        );
        Settlement {
            account: self.account.clone(),
            key: self.key.clone(),
            reservation_id: self.reservation_id.clone(),
            cost_nanos,
            byok: self.byok,
        }
    }

    fn retry_in_background(self, settlement: Settlement) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!(
                account = %settlement.account,
                reservation = %settlement.reservation_id,
                cost_nanos = settlement.cost_nanos,
                "no runtime to settle on; the reservation will expire and this cost is unrecorded"
            );
            return;
        };
        runtime.spawn(async move {
            for wait in std::iter::once(Duration::ZERO).chain(BACKGROUND_RETRY_WAITS) {
                tokio::time::sleep(wait).await;
                match self.store.settle(&settlement, self.clock.now()).await {
                    Ok(()) => return,
                    Err(error) => tracing::warn!(%error, reservation = %settlement.reservation_id, "settlement attempt failed"),
                }
            }
            tracing::error!(
                account = %settlement.account,
                reservation = %settlement.reservation_id,
                cost_nanos = settlement.cost_nanos,
                "settlement failed every attempt; the reservation will expire and this cost is unrecorded"
            );
        });
    }
}

/// A meter that settles itself if dropped unsettled: a request whose
/// caller went away before the response arrived is still charged.
#[derive(Debug)]
pub(crate) struct Unsettled(Option<Meter>);

impl Unsettled {
    pub(crate) fn new(meter: Option<Meter>) -> Self {
        Unsettled(meter)
    }

    pub(crate) fn take(&mut self) -> Option<Meter> {
        self.0.take()
    }

    pub(crate) fn is_some(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some(meter) = self.0.take() {
            meter.settle_in_background(None, Ending::Abandoned);
        }
    }
}
