//! `providers`: the upstreams a model's `provider/` prefix names.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

use super::secret_fields::optional_secret_spec;
use crate::credit::BoundField;
use crate::proxy::UpstreamConfig;
use crate::secrets::{Redacted, Secret, SecretSpec};

/// One provider in [`GatewayConfig`](super::GatewayConfig)`.providers`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    /// Its base URL, API version included (`https://api.openai.com/v1`).
    pub base_url: String,
    /// Where its API key comes from: `{"env": "VAR"}`, `{"file": "/path"}`
    /// (the whole file, trimmed) or a SecretRef `{"source": "env"|"file"|"exec",
    /// "provider", "id"}` naming a provider of `secrets.providers`, as the
    /// webhook routes take it. A key that cannot be read stops start-up.
    #[serde(default, deserialize_with = "optional_secret_spec")]
    pub api_key: Option<SecretSpec>,
    /// Extra headers it receives with every request (`OpenAI-Organization`, …).
    /// Their values may be credentials: never printed.
    #[serde(default)]
    pub headers: HashMap<String, Redacted<String>>,
    /// Which of `headers` carry a credential, beside `x-api-key` and
    /// `api-key` (always): none of them is sent with an account's own key.
    #[serde(default)]
    pub credential_headers: Vec<String>,
    /// Whether accounts may bring their own key for it (BYOK): their key
    /// is then sent as `Authorization: Bearer` in place of `api_key`, and
    /// none of the credential headers goes with it. Needs `api_key`: a
    /// provider reached without one (trusted by its network, or with a
    /// credential header only) cannot take an account's key instead.
    /// Default: off.
    #[serde(default)]
    pub byok: bool,
    /// Longest wait for a connection, in ms.
    pub connect_timeout_ms: Option<u64>,
    /// Longest wait for the response headers, in ms.
    pub response_header_timeout_ms: Option<u64>,
    /// `"strip"` (the default) sends `model` without the `provider/`
    /// prefix; `"keep"` sends the gateway's whole id.
    pub model_prefix: Option<ModelPrefix>,
    /// The field the gateway writes a completion bound in when the client
    /// set none: `"max_tokens"` (the default) or `"max_completion_tokens"`
    /// (OpenAI's reasoning models take only that one).
    pub completion_bound_field: Option<BoundField>,
}

/// What a provider calls a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelPrefix {
    /// `openai/gpt-4o` reaches the provider as `gpt-4o`.
    Strip,
    /// `openai/gpt-4o` reaches the provider as `openai/gpt-4o`.
    Keep,
}

impl ProviderSection {
    /// The provider's upstream settings, with `api_key` once it is read.
    pub(super) fn upstream_config(&self, api_key: Option<&Secret>) -> UpstreamConfig {
        let mut config = UpstreamConfig::new(self.base_url.clone());
        config.api_key = api_key.map(|key| Redacted(key.expose().to_owned()));
        config.extra_headers = self
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        config.credential_headers = self.credential_headers.clone();
        if let Some(ms) = self.connect_timeout_ms {
            config.connect_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.response_header_timeout_ms {
            config.response_header_timeout = Duration::from_millis(ms);
        }
        config
    }
}
