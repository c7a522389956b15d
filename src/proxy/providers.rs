//! [`Providers`]: the bottom of the stack, sending each chat request to
//! the upstream of its model's provider.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use tower_service::Service;

use super::fallback::body_with_model;
use super::upstream::Upstream;
use crate::body::{BufferedBody, ChatRequest};
use crate::keys::ByokCredential;

/// The `Authorization` a request carries to its provider instead of the
/// provider's configured key: the account's own (BYOK).
#[derive(Clone, Debug)]
pub(crate) struct CallerKey(pub(crate) http::HeaderValue);
use crate::error::{ErrorKind, GatewayError};

/// One provider's upstream, and what it calls a model.
#[derive(Clone, Debug)]
pub struct ProviderUpstream {
    /// Where its requests go.
    pub upstream: Upstream,
    /// Whether it receives `model` without the `provider/` prefix (the
    /// default: `openai/gpt-4o` reaches OpenAI as `gpt-4o`) or as the
    /// gateway's whole id (an aggregator that routes by provider itself).
    pub strip_prefix: bool,
}

/// Sends a chat request to its model's provider (`openai/…` to `openai`),
/// with the account's own key for that provider when it brought one
/// ([`ByokCredential`]); with no providers configured, everything goes to
/// one upstream as it is, with its key.
/// A provider that is not configured is a 400 (the catalog refuses such a
/// model earlier, before any limit counts it).
#[derive(Clone, Debug)]
pub struct Providers {
    by_name: Arc<HashMap<String, ProviderUpstream>>,
    single: Option<Upstream>,
}

impl Providers {
    /// Every request to `upstream`, its body as it is.
    pub fn single(upstream: Upstream) -> Self {
        Providers {
            by_name: Arc::new(HashMap::new()),
            single: Some(upstream),
        }
    }

    /// Requests by provider name (any case).
    pub fn by_name(providers: HashMap<String, ProviderUpstream>) -> Self {
        Providers {
            by_name: Arc::new(
                providers
                    .into_iter()
                    .map(|(name, provider)| (name.to_ascii_lowercase(), provider))
                    .collect(),
            ),
            single: None,
        }
    }

    /// The configured provider names, lower case; `None` for a single upstream.
    pub fn names(&self) -> Option<std::collections::HashSet<String>> {
        self.single
            .is_none()
            .then(|| self.by_name.keys().cloned().collect())
    }
}

impl Service<Request<Full<Bytes>>> for Providers {
    type Response = Response<Incoming>;
    type Error = GatewayError;
    type Future = BoxFuture<'static, Result<Response<Incoming>, GatewayError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each upstream's pool queues requests itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Full<Bytes>>) -> Self::Future {
        if let Some(upstream) = &self.single {
            let mut upstream = upstream.clone();
            return upstream.call(request);
        }
        let Some(chat) = request.extensions().get::<ChatRequest>() else {
            return Box::pin(async {
                Err(GatewayError::new(
                    ErrorKind::NotFound,
                    "only chat completions are forwarded to a provider",
                ))
            });
        };
        let provider_name = chat.model_id.provider().to_ascii_lowercase();
        let Some(provider) = self.by_name.get(&provider_name) else {
            let model = chat.model_id.to_string();
            return Box::pin(async move {
                Err(GatewayError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "no provider is configured for the model {model}; \
                         GET /api/v1/models lists the models this gateway serves"
                    ),
                )
                .with_metadata("param", "model"))
            });
        };
        if provider.strip_prefix {
            // What follows `provider/`, variant included.
            let provider_model = chat.model_id.as_str()[provider_name.len() + 1..].to_owned();
            if let Some(BufferedBody(original)) = request.extensions().get::<BufferedBody>() {
                let body = body_with_model(original, &provider_model);
                *request.body_mut() = Full::new(body);
            }
        }
        // The account's own key for this provider, when it brought one
        // (CreditGuard found it and accounted the request as BYOK).
        let caller_key = request
            .extensions()
            .get::<ByokCredential>()
            .filter(|credential| credential.provider.eq_ignore_ascii_case(&provider_name))
            .and_then(|credential| {
                let mut value =
                    http::HeaderValue::from_str(&format!("Bearer {}", credential.api_key()))
                        .ok()?;
                value.set_sensitive(true);
                Some(CallerKey(value))
            });
        if let Some(caller_key) = caller_key {
            request.extensions_mut().insert(caller_key);
        }
        let mut upstream = provider.upstream.clone();
        upstream.call(request)
    }
}
