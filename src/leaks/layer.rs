use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::{LeakAlerts, ScanningKeys};
use crate::auth::AuthFailures;
use crate::in_flight::{UnauthenticatedLimits, UnauthenticatedPlaces};
use crate::keys::KeyDirectory;
use crate::notify::Notifier;

/// Applies [`LeakAlerts`] to a service: answers `POST /api/v1/leaks`.
#[derive(Clone, Debug)]
pub struct LeakAlertsLayer {
    // `None`: the route is not served (the proxy without `leak_scanning`).
    config: Option<Arc<LeakAlertsConfig>>,
}

#[derive(Clone, Debug)]
pub(crate) struct LeakAlertsConfig {
    pub(crate) directory: KeyDirectory,
    pub(crate) keys: ScanningKeys,
    pub(crate) notifier: Notifier,
    pub(crate) failures: Option<AuthFailures>,
    pub(crate) max_body_bytes: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) places: UnauthenticatedPlaces,
}

impl LeakAlertsLayer {
    /// The largest alert body read by default: a thousand tokens with
    /// their URLs fit many times over.
    pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
    /// How long an alert's body may take to arrive by default.
    pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

    /// Alerts signed by one of `keys`, about the keys of `directory`; nobody
    /// is told (see [`notifier`](Self::notifier)).
    pub fn new(directory: KeyDirectory, keys: ScanningKeys) -> Self {
        LeakAlertsLayer {
            config: Some(Arc::new(LeakAlertsConfig {
                directory,
                keys,
                notifier: Notifier::disabled(),
                failures: None,
                max_body_bytes: Self::DEFAULT_MAX_BODY_BYTES,
                body_timeout: Self::DEFAULT_BODY_TIMEOUT,
                places: UnauthenticatedPlaces::new(
                    "secret-scanning alerts",
                    UnauthenticatedLimits::default(),
                ),
            })),
        }
    }

    /// A layer that passes every request on: no alerts are taken.
    #[cfg(feature = "proxy")]
    pub(crate) fn off() -> Self {
        LeakAlertsLayer { config: None }
    }

    fn configure(mut self, change: impl FnOnce(&mut LeakAlertsConfig)) -> Self {
        if let Some(config) = &mut self.config {
            change(Arc::make_mut(config));
        }
        self
    }

    /// Tells each leaked key's owner through `notifier` (once per key).
    pub fn notifier(self, notifier: Notifier) -> Self {
        self.configure(|config| config.notifier = notifier)
    }

    /// Counts a missing or bad signature as a failed authentication of the
    /// client's address in `failures` (shared with BearerAuth): past its
    /// limit the address's forged alerts are answered 429 with
    /// `Retry-After`, while a correctly signed alert is still taken.
    pub fn failure_limit(self, failures: AuthFailures) -> Self {
        self.configure(|config| config.failures = Some(failures))
    }

    /// Reads at most `max_body_bytes` of an alert (413 past it).
    pub fn max_body_bytes(self, max_body_bytes: usize) -> Self {
        self.configure(|config| config.max_body_bytes = max_body_bytes)
    }

    /// Waits at most `body_timeout` for an alert's body (408 past it).
    pub fn body_timeout(self, body_timeout: Duration) -> Self {
        self.configure(|config| config.body_timeout = body_timeout)
    }

    /// Bounds the alerts in flight, in all and per client address, and the
    /// least rate their bodies must arrive at (default:
    /// [`UnauthenticatedLimits::default`]); these places are the route's
    /// own, none of the gateway's. A body too slow (408) counts as a failed
    /// authentication.
    pub fn unauthenticated_limits(self, limits: UnauthenticatedLimits) -> Self {
        self.configure(|config| {
            config.places = UnauthenticatedPlaces::new("secret-scanning alerts", limits)
        })
    }
}

impl<S> Layer<S> for LeakAlertsLayer {
    type Service = LeakAlerts<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LeakAlerts {
            inner,
            config: self.config.clone(),
        }
    }
}
