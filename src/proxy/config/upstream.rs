//! `upstream`: the one upstream every model goes to without `providers`.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use crate::proxy::{ServedApis, UpstreamConfig};
use crate::secrets::Redacted;

/// `upstream` in [`GatewayConfig`](super::GatewayConfig).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamSection {
    /// The upstream's base URL, its version path included.
    pub base_url: Option<String>,
    /// The environment variable holding the upstream's API key.
    pub api_key_env: Option<String>,
    /// Longest wait for a connection, in ms.
    pub connect_timeout_ms: Option<u64>,
    /// Longest wait for the response headers, in ms (default 600 000:
    /// as long as OpenAI's SDKs wait). Past it the client gets 504 at once.
    pub response_header_timeout_ms: Option<u64>,
    /// After such a 504, how long the upstream's answer is still read, in
    /// seconds (default 600): the request is charged the usage it reports
    /// (`cost_basis` `late_answer`), or, with none by then or a connection
    /// that fails, what it was held for (`unanswered`). 0: not read, the
    /// hold is charged at once.
    pub late_answer_seconds: Option<u64>,
    /// The most late answers read at once (default 1024); past it, a
    /// request that timed out is charged what it was held for at once.
    pub max_late_answers: Option<usize>,
    /// The APIs it serves natively: `["chat"]` (the default),
    /// `["messages"]` or both; a request in another is translated.
    pub apis: Option<Vec<String>>,
}

impl UpstreamSection {
    /// `base_url` is one an upstream client takes, even when the command
    /// line overrides it, and so are the timeouts.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if let Some(apis) = &self.apis {
            ServedApis::from_names(apis)
                .map_err(|error| ConfigError::new(format!("upstream.apis: {error}")))?;
        }
        // Any base URL the command line gives: the rest first.
        self.settings("http://127.0.0.1/v1".to_owned())
            .check()
            .map_err(|error| ConfigError::at("upstream", error))?;
        match &self.base_url {
            Some(base_url) => UpstreamConfig::new(base_url.clone())
                .check()
                .map_err(|error| ConfigError::at("upstream.base_url", error)),
            None => Ok(()),
        }
    }

    /// The section's settings for the upstream at `base_url`, without its key.
    fn settings(&self, base_url: String) -> UpstreamConfig {
        let mut config = UpstreamConfig::new(base_url);
        if let Some(ms) = self.connect_timeout_ms {
            config.connect_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.response_header_timeout_ms {
            config.response_header_timeout = Duration::from_millis(ms);
        }
        if let Some(seconds) = self.late_answer_seconds {
            config.late_answer = Duration::from_secs(seconds);
        }
        if let Some(max) = self.max_late_answers {
            config.max_late_answers = max;
        }
        if let Some(apis) = self
            .apis
            .as_deref()
            .and_then(|apis| ServedApis::from_names(apis).ok())
        {
            config.apis = apis;
        }
        config
    }

    /// The upstream client's settings, its key read from the environment
    /// now; `base_url` overrides the section's.
    pub(super) fn upstream_config(
        &self,
        base_url: Option<&str>,
    ) -> Result<UpstreamConfig, ConfigError> {
        let base_url = base_url
            .map(str::to_owned)
            .or_else(|| self.base_url.clone())
            .ok_or_else(|| ConfigError::new("upstream.base_url is missing"))?;
        let mut config = self.settings(base_url);
        if let Some(variable) = &self.api_key_env {
            let key = std::env::var(variable).map_err(|_| {
                ConfigError::new(format!(
                    "upstream.api_key_env names {variable}, which is not set"
                ))
            })?;
            config.api_key = Some(Redacted(key));
        }
        Ok(config)
    }
}
