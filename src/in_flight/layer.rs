use std::sync::Arc;

use tokio::sync::Semaphore;
use tower_layer::Layer;

use super::InFlightLimit;

/// Applies [`InFlightLimit`] to a service. Every service made from one
/// layer (each connection's clone included) shares its bound.
#[derive(Clone, Debug)]
pub struct InFlightLimitLayer {
    permits: Arc<Semaphore>,
    max_in_flight: usize,
}

impl InFlightLimitLayer {
    /// At most `max_in_flight` requests at once (at least one).
    pub fn new(max_in_flight: usize) -> Self {
        let max_in_flight = max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
        InFlightLimitLayer {
            permits: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
        }
    }

    /// A bound for this machine: 256 requests per available core. Most of
    /// a gateway's requests wait on an upstream, so the bound is set by
    /// memory (each may hold its request body) rather than by CPU.
    pub fn default_max_in_flight() -> usize {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        256 * cores
    }

    /// The bound.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Requests in flight now, across every service of this layer.
    pub fn in_flight(&self) -> usize {
        self.max_in_flight - self.permits.available_permits()
    }
}

impl<S> Layer<S> for InFlightLimitLayer {
    type Service = InFlightLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightLimit {
            inner,
            permits: Arc::clone(&self.permits),
            max_in_flight: self.max_in_flight,
        }
    }
}
