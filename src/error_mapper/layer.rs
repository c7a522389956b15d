use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::ErrorMapper;

/// Applies [`ErrorMapper`], the outermost layer: every failure leaves the
/// gateway in the canonical error body.
///
/// Cheap to clone: the configuration sits behind an `Arc`.
#[derive(Clone, Debug)]
pub struct ErrorMapperLayer {
    pub(crate) config: Arc<ErrorMapperConfig>,
}

#[derive(Clone, Debug)]
pub(crate) struct ErrorMapperConfig {
    pub(crate) max_error_body_bytes: usize,
    pub(crate) error_body_timeout: Duration,
    pub(crate) max_upstream_message_chars: usize,
    /// Whether a 4xx the inner service wrote itself passes as it is.
    pub(crate) own_client_errors_pass: bool,
    /// How messages name the inner service: "the upstream", "this service".
    pub(crate) inner_name: &'static str,
}

impl ErrorMapperLayer {
    /// The most of an upstream error body read to judge and rewrite it.
    pub const DEFAULT_MAX_ERROR_BODY_BYTES: usize = 64 * 1024;
    /// The longest an upstream error body may take to arrive.
    pub const DEFAULT_ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(10);
    /// The most of the upstream's own message kept in `metadata`.
    pub const DEFAULT_MAX_UPSTREAM_MESSAGE_CHARS: usize = 500;

    /// A layer with the default limits.
    pub fn new() -> Self {
        ErrorMapperLayer {
            config: Arc::new(ErrorMapperConfig {
                max_error_body_bytes: Self::DEFAULT_MAX_ERROR_BODY_BYTES,
                error_body_timeout: Self::DEFAULT_ERROR_BODY_TIMEOUT,
                max_upstream_message_chars: Self::DEFAULT_MAX_UPSTREAM_MESSAGE_CHARS,
                own_client_errors_pass: false,
                inner_name: super::upstream::UPSTREAM,
            }),
        }
    }

    /// The layer for a service whose own handler stands behind it, not an
    /// upstream: its 4xx pass as it wrote them
    /// ([`handler_client_errors_as_written`](Self::handler_client_errors_as_written)),
    /// and the messages of its failures name "this service", never an
    /// upstream it does not have ("this service did not answer in time").
    pub fn for_own_handler() -> Self {
        let mut layer = Self::new().handler_client_errors_as_written();
        Arc::make_mut(&mut layer.config).inner_name = "this service";
        layer
    }

    /// Reads at most this much of an error body; a larger one is rewritten
    /// without its text.
    pub fn max_error_body_bytes(mut self, max_error_body_bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).max_error_body_bytes = max_error_body_bytes;
        self
    }

    /// Stops reading an upstream error body after this long and answers
    /// without its text, so a stalled upstream cannot hold the client.
    pub fn error_body_timeout(mut self, error_body_timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).error_body_timeout = error_body_timeout;
        self
    }

    /// Keeps at most this many characters of the upstream's message.
    pub fn max_upstream_message_chars(mut self, max_upstream_message_chars: usize) -> Self {
        Arc::make_mut(&mut self.config).max_upstream_message_chars = max_upstream_message_chars;
        self
    }

    /// Lets a 4xx that the service's own handler wrote (a 405 from its
    /// router, its own 400) reach the client as the handler wrote it,
    /// instead of rewriting it as an upstream's error. The layers' own
    /// refusals (which carry [`Refusal`](crate::error::Refusal)) are still
    /// in the one format, and 5xx are still rewritten. For a service whose
    /// handler answers itself; a proxy, whose inner service is an
    /// upstream, leaves it off.
    pub fn handler_client_errors_as_written(mut self) -> Self {
        Arc::make_mut(&mut self.config).own_client_errors_pass = true;
        self
    }
}

impl Default for ErrorMapperLayer {
    fn default() -> Self {
        ErrorMapperLayer::new()
    }
}

impl<S> Layer<S> for ErrorMapperLayer {
    type Service = ErrorMapper<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ErrorMapper {
            inner,
            config: Arc::clone(&self.config),
            not_ready: None,
        }
    }
}
