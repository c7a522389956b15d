use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::{AuthCodes, CodeExchange};
use crate::auth::AuthFailures;
use crate::in_flight::{UnauthenticatedLimits, UnauthenticatedPlaces};
use crate::keys::KeyDirectory;

/// Applies [`CodeExchange`] to a service: answers `POST /api/v1/auth/keys`
/// (and its CORS preflight), passes every other request on. See the
/// [module docs](super).
///
/// Cheap to clone: the configuration sits behind an `Arc`.
#[derive(Clone, Debug)]
pub struct CodeExchangeLayer {
    pub(crate) config: Arc<CodeExchangeConfig>,
}

#[derive(Clone, Debug)]
pub(crate) struct CodeExchangeConfig {
    pub(crate) codes: AuthCodes,
    pub(crate) failures: Option<AuthFailures>,
    pub(crate) max_body_bytes: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) places: UnauthenticatedPlaces,
}

impl CodeExchangeLayer {
    /// The largest exchange body read by default: the three fields take a
    /// few hundred bytes.
    pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024;
    /// How long an exchange's body may take to arrive by default.
    pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

    /// Exchanges the codes kept in `directory`'s store for keys of
    /// `directory`; refusals are not counted (see
    /// [`failure_limit`](Self::failure_limit)).
    pub fn new(directory: KeyDirectory) -> Self {
        CodeExchangeLayer {
            config: Arc::new(CodeExchangeConfig {
                codes: AuthCodes::new(directory),
                failures: None,
                max_body_bytes: Self::DEFAULT_MAX_BODY_BYTES,
                body_timeout: Self::DEFAULT_BODY_TIMEOUT,
                places: UnauthenticatedPlaces::new(
                    "the OAuth code exchange",
                    UnauthenticatedLimits::default(),
                ),
            }),
        }
    }

    /// Counts every refused exchange (403: a wrong, used or expired code, a
    /// wrong verifier) as a failed authentication of the client's address
    /// in `failures` (shared with BearerAuth): past its limit the address's
    /// refusals become 429 `auth_failures` with `Retry-After`, so codes
    /// cannot be tried at speed; from then on its exchanges are refused
    /// 429 before the store is read, until its window ends. A body that
    /// arrives too slowly (408) counts too.
    pub fn failure_limit(mut self, failures: AuthFailures) -> Self {
        Arc::make_mut(&mut self.config).failures = Some(failures);
        self
    }

    /// Reads at most `max_body_bytes` of an exchange (413 past it).
    pub fn max_body_bytes(mut self, max_body_bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).max_body_bytes = max_body_bytes;
        self
    }

    /// Waits at most `body_timeout` for an exchange's body (408 past it).
    pub fn body_timeout(mut self, body_timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).body_timeout = body_timeout;
        self
    }

    /// Bounds the exchanges in flight, in all and per client address, and
    /// the least rate their bodies must arrive at (default:
    /// [`UnauthenticatedLimits::default`]); these places are the
    /// exchange's own, none of the gateway's.
    pub fn unauthenticated_limits(mut self, limits: UnauthenticatedLimits) -> Self {
        Arc::make_mut(&mut self.config).places =
            UnauthenticatedPlaces::new("the OAuth code exchange", limits);
        self
    }
}

impl<S> Layer<S> for CodeExchangeLayer {
    type Service = CodeExchange<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CodeExchange {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}
