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
use super::upstream::{ServedApis, Upstream};
use crate::context::RequestContext;
use crate::keys::ByokProviders;

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
    /// Whether an account's own key for it is sent in place of its
    /// credentials (BYOK). Off, a request booked as BYOK for it is refused
    /// rather than sent with the gateway's credentials.
    pub byok: bool,
}

/// Sends a chat request to its model's provider (`openai/…` to `openai`),
/// with the account's own key for that provider when it brought one
/// ([`ByokCredential`](crate::keys::ByokCredential)); with no providers configured, everything goes to
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

    /// The APIs the upstream `model` goes to serves natively; `None` when
    /// no provider serves it.
    pub fn apis_for(&self, model: &crate::model_id::ModelId) -> Option<ServedApis> {
        match &self.single {
            Some(upstream) => Some(upstream.apis()),
            None => self
                .by_name
                .get(&model.provider().to_ascii_lowercase())
                .map(|provider| provider.upstream.apis()),
        }
    }

    /// What accounts may bring their own keys for: the providers that take
    /// them ([`ProviderUpstream::byok`]) and those that do not.
    pub fn byok_providers(&self) -> ByokProviders {
        if self.single.is_some() {
            return ByokProviders::SingleUpstream;
        }
        let (byok, others) = self
            .by_name
            .iter()
            .partition::<Vec<_>, _>(|(_, provider)| provider.byok);
        let names = |providers: Vec<(&String, &ProviderUpstream)>| {
            providers
                .into_iter()
                .map(|(name, _)| name.clone())
                .collect()
        };
        ByokProviders::Configured {
            byok: names(byok),
            others: names(others),
        }
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
        let context = RequestContext::of(&request);
        let Some(call) = context.and_then(RequestContext::model_call) else {
            return Box::pin(async {
                Err(GatewayError::new(
                    ErrorKind::NotFound,
                    "only model calls are forwarded to a provider",
                ))
            });
        };
        let provider_name = call.model_id.provider().to_ascii_lowercase();
        let Some(provider) = self.by_name.get(&provider_name) else {
            let model = call.model_id.to_string();
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
            let provider_model = call.model_id.as_str()[provider_name.len() + 1..].to_owned();
            if let Some(original) = context.and_then(|context| context.body.as_ref()) {
                let body = body_with_model(original, &provider_model);
                *request.body_mut() = Full::new(body);
            }
        }
        // The account's own key for this provider, when it brought one
        // (CreditGuard found it and accounted the request as BYOK).
        let credential = RequestContext::of(&request)
            .and_then(|context| context.credential.as_ref())
            .filter(|credential| credential.provider.eq_ignore_ascii_case(&provider_name));
        if let Some(credential) = credential {
            // The key alone: the upstream client writes it as the API it
            // speaks takes it.
            let caller_key = http::HeaderValue::from_str(credential.api_key()).ok();
            match caller_key {
                Some(mut value) if provider.byok => {
                    value.set_sensitive(true);
                    request.extensions_mut().insert(CallerKey(value));
                }
                // Booked as unpaid BYOK, yet only the gateway's credentials
                // could go: refused before anything is sent (with
                // `upstream_reports_sending`, as the proxy sets it, it
                // settles as never sent).
                _ => {
                    return Box::pin(async move {
                        Err(GatewayError::new(
                            ErrorKind::Internal,
                            format!(
                                "this request was accounted to the account's own key for {provider_name}, which this gateway does not send; nothing was sent, and the operator must check the provider's `byok` setting"
                            ),
                        ))
                    });
                }
            }
        }
        let mut upstream = provider.upstream.clone();
        upstream.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::ChatRequest;
    use crate::keys::ByokCredential;
    use crate::proxy::UpstreamConfig;

    /// A provider on a port nothing listens on: a request that reaches it
    /// fails with a connect error, not the refusal below.
    fn providers(byok: bool) -> Providers {
        let mut config = UpstreamConfig::new("http://127.0.0.1:9/v1");
        config.api_key = Some("sk-gateway".into());
        let upstream = Upstream::new(&config).unwrap();
        Providers::by_name(HashMap::from([(
            "Alpha".to_owned(),
            ProviderUpstream {
                upstream,
                strip_prefix: true,
                byok,
            },
        )]))
    }

    fn booked_as_byok() -> Request<Full<Bytes>> {
        let body = br#"{"model": "alpha/m1", "messages": [{"role": "user", "content": "hi"}]}"#;
        let mut request = Request::post("/api/v1/chat/completions")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap();
        let context = RequestContext::of_mut(&mut request);
        context.chat = Some(Arc::new(ChatRequest::parse(body).unwrap()));
        context.credential = Some(ByokCredential::new("alpha", "sk-tenant-0001").unwrap());
        request
    }

    #[tokio::test]
    async fn a_request_booked_as_byok_never_goes_with_the_gateways_credentials() {
        let error = providers(false).call(booked_as_byok()).await.unwrap_err();
        assert_eq!(error.status(), 500);
        assert!(
            error.message().contains("nothing was sent"),
            "{}",
            error.message()
        );
        // Taking BYOK, the provider is tried (and here cannot be reached).
        let error = providers(true).call(booked_as_byok()).await.unwrap_err();
        assert_eq!(error.metadata()["upstream_failure"], "connect");
        assert_eq!(
            providers(true).byok_providers(),
            ByokProviders::Configured {
                byok: ["alpha".to_owned()].into(),
                others: Default::default(),
            }
        );
    }
}
