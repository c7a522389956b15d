//! `providers`: the upstreams a model's `provider/` prefix names.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::secret_fields::{check_reference, optional_secret_spec, read_secret};
use crate::credit::BoundField;
use crate::proxy::{ProviderUpstream, ServedApis, Upstream, UpstreamConfig};
use crate::secrets::{Redacted, Secret, SecretProviders, SecretSpec};

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
    /// Which of `headers` are safe to send beside an account's own key
    /// (BYOK), such as a harmless `x-title`; every other one goes only
    /// with the gateway's own key. Default: none.
    #[serde(default)]
    pub byok_headers: Vec<String>,
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
    /// `"strip"` (the default) sends `model` without the `provider/`
    /// prefix; `"keep"` sends the gateway's whole id.
    pub model_prefix: Option<ModelPrefix>,
    /// The field the gateway writes a completion bound in when the client
    /// set none: `"max_tokens"` (the default) or `"max_completion_tokens"`
    /// (OpenAI's reasoning models take only that one).
    pub completion_bound_field: Option<BoundField>,
    /// The APIs it serves natively: `["chat"]` (the default),
    /// `["messages"]` (Anthropic's) or both. A request in another API is
    /// translated to one it serves.
    pub apis: Option<Vec<String>>,
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
    /// Checks the provider `name` as far as the config shows it: its name,
    /// a key for BYOK, the secrets provider its key names, its upstream
    /// settings.
    pub(super) fn check(&self, name: &str, secrets: &SecretProviders) -> Result<(), ConfigError> {
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'));
        if !valid_name {
            return Err(ConfigError::new(format!(
                "providers: {name:?} must be 1 to 64 characters of A-Z a-z 0-9 - _ ."
            )));
        }
        if self.byok && self.api_key.is_none() {
            // Its credential, if any, is not the header an account's
            // key replaces: the key would ride on the gateway's access.
            return Err(ConfigError::new(format!(
                "providers.{name}.byok needs providers.{name}.api_key: an account's own key is sent in place of the provider's api_key, and this provider has none (it is trusted by its network or by a configured header), so a request with an account's key would still be the gateway's. Remove \"byok\", or give the provider its api_key"
            )));
        }
        if let Some(key) = &self.api_key {
            check_reference(&format!("providers.{name}.api_key"), key, secrets)?;
        }
        if let Some(apis) = &self.apis {
            ServedApis::from_names(apis)
                .map_err(|error| ConfigError::new(format!("providers.{name}.apis: {error}")))?;
        }
        self.upstream_config(None)
            .check()
            .map_err(|error| ConfigError::at(&format!("providers.{name}"), error))
    }

    /// The provider's client, its key read now: what is left to fail once
    /// [`check`](Self::check) passed is outside the config (the secret).
    pub(super) fn upstream(
        &self,
        name: &str,
        secrets: &SecretProviders,
    ) -> Result<ProviderUpstream, ConfigError> {
        let api_key = self
            .api_key
            .as_ref()
            .map(|key| read_secret(&format!("providers.{name}.api_key"), key, secrets))
            .transpose()?;
        let upstream = Upstream::new(&self.upstream_config(api_key.as_ref()))
            .map_err(|error| ConfigError::new(format!("providers.{name}: {error}")))?;
        Ok(ProviderUpstream {
            upstream,
            strip_prefix: self.model_prefix != Some(ModelPrefix::Keep),
            byok: self.byok,
        })
    }

    /// The provider's upstream settings, with `api_key` once it is read.
    fn upstream_config(&self, api_key: Option<&Secret>) -> UpstreamConfig {
        let mut config = UpstreamConfig::new(self.base_url.clone());
        config.api_key = api_key.map(|key| Redacted(key.expose().to_owned()));
        config.extra_headers = self
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        config.credential_headers = self.credential_headers.clone();
        config.byok_headers = self.byok_headers.clone();
        if let Some(apis) = self
            .apis
            .as_deref()
            .and_then(|apis| ServedApis::from_names(apis).ok())
        {
            config.apis = apis;
        }
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
        config
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::*;
    use crate::keys::ByokProviders;
    use crate::proxy::{GatewayConfig, GatewayPlan, Providers};

    /// The providers' clients of `config`'s plan, their keys read.
    fn provider_upstreams(
        config: &GatewayConfig,
    ) -> Result<HashMap<String, ProviderUpstream>, ConfigError> {
        GatewayPlan::new(config).map(|plan| plan.loaded.providers.unwrap_or_default())
    }

    fn providers_config(providers: Value) -> GatewayConfig {
        GatewayConfig::from_json(&serde_json::json!({ "providers": providers }).to_string())
            .unwrap()
    }

    #[test]
    fn byok_is_off_unless_a_provider_with_an_api_key_opts_in() {
        // MODELGATE_UNIT_BYOK_KEY is set for the tests in .cargo/config.toml.
        let key = serde_json::json!({"env": "MODELGATE_UNIT_BYOK_KEY"});
        let config = providers_config(serde_json::json!({
            "keyed": {"base_url": "http://127.0.0.1:9/v1", "api_key": key},
            "opted": {"base_url": "http://127.0.0.1:9/v1", "api_key": key, "byok": true,
                      "headers": {"x-api-key": "gateway-x", "x-goog-api-key": "gateway-g"},
                      "credential_headers": ["x-goog-api-key"]},
            "headed": {"base_url": "http://127.0.0.1:9/v1", "headers": {"x-api-key": "gateway-x"}},
        }));
        assert!(!config.providers["keyed"].byok, "off by default");
        let shown = format!("{config:?}");
        assert!(
            shown.contains("x-goog-api-key") && !shown.contains("gateway-g"),
            "{shown}"
        );
        let upstreams = provider_upstreams(&config).unwrap();
        let byok: BTreeSet<&str> = upstreams
            .iter()
            .filter(|(_, provider)| provider.byok)
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(byok, BTreeSet::from(["opted"]));
        assert_eq!(
            Providers::by_name(upstreams).byok_providers(),
            ByokProviders::Configured {
                byok: ["opted".to_owned()].into(),
                others: ["headed".to_owned(), "keyed".to_owned()].into(),
            }
        );
        let single = Upstream::new(&UpstreamConfig::new("http://127.0.0.1:9/v1")).unwrap();
        assert_eq!(
            Providers::single(single).byok_providers(),
            ByokProviders::SingleUpstream
        );
    }

    #[test]
    fn byok_without_an_api_key_is_refused_at_load_naming_the_field() {
        let refused = |providers: Value| {
            GatewayConfig::from_json(&serde_json::json!({ "providers": providers }).to_string())
                .expect_err("refused")
                .to_string()
        };
        for section in [
            // Trusted by its network.
            serde_json::json!({"base_url": "http://127.0.0.1:9/v1", "byok": true}),
            // Its credential is a configured header, not the one an
            // account's key replaces.
            serde_json::json!({"base_url": "http://127.0.0.1:9/v1", "byok": true,
                               "headers": {"x-api-key": "gateway-x"}}),
        ] {
            let error = refused(serde_json::json!({ "local": section }));
            assert!(
                error.starts_with("config: providers.local.byok needs providers.local.api_key"),
                "{error}"
            );
            assert!(!error.contains("gateway-x"), "{error}");
        }
        let error = refused(serde_json::json!({"p": {
            "base_url": "http://127.0.0.1:9/v1",
            "headers": {"x-goog-api-key": "gateway-g"},
            "credential_headers": ["x-goog-apikey"]}}));
        assert_eq!(
            error,
            "config: providers.p: upstream: credential_headers names x-goog-apikey, which is not one of the configured headers"
        );
        // Only a configured header that is no credential is safe for BYOK.
        for named in ["x-title-typo", "x-api-key", "x-goog-api-key"] {
            let error = refused(serde_json::json!({"p": {
                "base_url": "http://127.0.0.1:9/v1",
                "headers": {"x-goog-api-key": "gateway-g", "x-api-key": "gateway-x",
                            "x-title": "modelgate"},
                "credential_headers": ["x-goog-api-key"],
                "byok_headers": ["x-title", named]}}));
            assert_eq!(
                error,
                format!(
                    "config: providers.p: upstream: byok_headers names {named:?}, which is not one of the configured headers, or is a credential"
                )
            );
        }
        for bad in [r#""byok": "yes""#, r#""credential_headers": "x-api-key""#] {
            let text = format!(r#"{{"providers": {{"p": {{"base_url": "http://x/v1", {bad}}}}}}}"#);
            let error = GatewayConfig::from_json(&text).unwrap_err().to_string();
            assert!(error.starts_with("config: providers.p."), "{text}: {error}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_provider_section_loads_or_is_refused_and_byok_always_has_an_api_key(
            byok in proptest::bool::ANY,
            with_key in proptest::bool::ANY,
            headers in proptest::collection::btree_map("[A-Za-z0-9 -]{0,10}", "[ -~]{0,10}", 0..3),
            credential_headers in proptest::collection::vec("[A-Za-z0-9 -]{0,10}", 0..3),
        ) {
            let mut section = serde_json::json!({
                "base_url": "http://127.0.0.1:9/v1", "byok": byok,
                "headers": headers, "credential_headers": credential_headers,
            });
            if with_key {
                section["api_key"] = serde_json::json!({"env": "MODELGATE_UNIT_BYOK_KEY"});
            }
            let text = serde_json::json!({"providers": {"p": section}}).to_string();
            match GatewayConfig::from_json(&text) {
                Ok(config) => {
                    // Accepted at load: building fails for nothing in the text.
                    let upstreams = provider_upstreams(&config).unwrap();
                    proptest::prop_assert_eq!(upstreams["p"].byok, byok);
                    proptest::prop_assert!(!byok || with_key);
                }
                Err(error) => {
                    proptest::prop_assert!(error.to_string().starts_with("config: providers.p"), "{}", error);
                }
            }
        }
    }

    #[tokio::test]
    async fn api_keys_come_from_named_providers_and_an_unknown_one_stops_start_up() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys.json");
        std::fs::write(&keys, r#"{"openai": "sk-from-the-vault-0123456789"}"#).unwrap();
        let config = |api_key: Value| {
            GatewayConfig::from_json(
                &serde_json::json!({
                    "secrets": {"providers": {"vault": {"source": "file", "path": keys, "mode": "json"}}},
                    "providers": {"openai": {"base_url": "http://127.0.0.1:9/v1", "api_key": api_key}}
                })
                .to_string(),
            )
            .unwrap()
        };
        let vault =
            config(serde_json::json!({"source": "file", "provider": "vault", "id": "/openai"}));
        assert!(provider_upstreams(&vault).is_ok());
        assert!(!format!("{vault:?}").contains("sk-from-the-vault"));
        let refused = |api_key: Value| {
            GatewayConfig::from_json(
                &serde_json::json!({
                    "secrets": {"providers": {"vault": {"source": "file", "path": keys, "mode": "json"}}},
                    "providers": {"openai": {"base_url": "http://127.0.0.1:9/v1", "api_key": api_key}}
                })
                .to_string(),
            )
            .expect_err("a reference to no declared provider is refused at load")
            .to_string()
        };
        for (api_key, words) in [
            // Written the old way, with the file's path as the provider.
            (
                serde_json::json!({"source": "file", "provider": "/run/keys/openai", "id": "value"}),
                ["\"/run/keys/openai\"", "a path is no longer a provider"],
            ),
            (
                serde_json::json!({"source": "file", "provider": "elsewhere", "id": "/openai"}),
                ["\"elsewhere\"", "secrets.providers"],
            ),
            (
                serde_json::json!({"source": "env", "provider": "vault", "id": "OPENAI_API_KEY"}),
                ["\"vault\"", "has source \"file\""],
            ),
        ] {
            let error = refused(api_key.clone());
            assert!(
                error.starts_with("config: providers.openai.api_key: "),
                "{error}"
            );
            for word in words {
                assert!(error.contains(word), "{api_key}: {word:?} missing: {error}");
            }
        }
        // What only the outside decides still stops start-up: a key missing
        // from the vault.
        let missing =
            config(serde_json::json!({"source": "file", "provider": "vault", "id": "/anthropic"}));
        let error = provider_upstreams(&missing)
            .expect_err("no such key")
            .to_string();
        assert!(
            error.starts_with("config: providers.openai.api_key: "),
            "{error}"
        );
        // A bad section is refused when the config is read, naming the field.
        for (json, field) in [
            (
                r#"{"secrets": {"providers": {"v": {"source": "file", "path": "keys.json"}}}}"#,
                "secrets.providers.v.path",
            ),
            (r#"{"secrets": {"provider": {}}}"#, "secrets.provider"),
        ] {
            let error = GatewayConfig::from_json(json).unwrap_err().to_string();
            assert!(error.contains(field), "{json}: {error}");
        }
        assert_eq!(
            GatewayConfig::from_json("{}").unwrap().secrets,
            SecretProviders::default()
        );
    }
}
