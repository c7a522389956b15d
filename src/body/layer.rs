use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::{BodyLimit, ModelNames};

/// Applies [`BodyLimit`] to a service: buffers each request body once, up to
/// a size limit and within a time limit, and parses chat-completions
/// requests into a [`ChatRequest`](super::ChatRequest).
///
/// Cheap to clone: the configuration sits behind an `Arc`.
#[derive(Clone, Debug)]
pub struct BodyLimitLayer {
    pub(crate) config: Arc<BodyLimitConfig>,
}

#[derive(Clone, Debug)]
pub(crate) struct BodyLimitConfig {
    pub(crate) max_body_bytes: usize,
    pub(crate) read_timeout: Duration,
    pub(crate) model_names: Arc<ModelNames>,
}

impl BodyLimitLayer {
    /// The default body limit: 4 MiB, room for long conversations and a few
    /// inline images.
    pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
    /// The default time to receive a whole body.
    pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

    /// A layer with the default limits.
    pub fn new() -> Self {
        BodyLimitLayer {
            config: Arc::new(BodyLimitConfig {
                max_body_bytes: Self::DEFAULT_MAX_BODY_BYTES,
                read_timeout: Self::DEFAULT_READ_TIMEOUT,
                model_names: Arc::new(ModelNames::new()),
            }),
        }
    }

    /// Bodies larger than this get 413.
    pub fn max_body_bytes(mut self, max_body_bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).max_body_bytes = max_body_bytes;
        self
    }

    /// The bare ids and aliases a model call may name (see [`ModelNames`]):
    /// the parsed request's `model_id` is the model they resolve to, so
    /// prices, limits, quotas and records all see that id, while `model`
    /// and the body the inner service receives stay as the client sent
    /// them (a handler that forwards the body keeps the client's
    /// spelling). Unset, every model id must be `provider/model`.
    pub fn model_names(mut self, names: ModelNames) -> Self {
        Arc::make_mut(&mut self.config).model_names = Arc::new(names);
        self
    }

    /// Bodies not received completely within this get 408.
    pub fn read_timeout(mut self, read_timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).read_timeout = read_timeout;
        self
    }
}

impl Default for BodyLimitLayer {
    fn default() -> Self {
        BodyLimitLayer::new()
    }
}

impl<S> Layer<S> for BodyLimitLayer {
    type Service = BodyLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

impl crate::context::ContextLayer for BodyLimitLayer {
    const NAME: &'static str = "BodyLimit";

    fn adds(&self) -> &'static [crate::context::ContextPart] {
        &[crate::context::ContextPart::ParsedBody]
    }
}
