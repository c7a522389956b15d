//! The config as a whole: every section read, refused with its path, shown
//! without its secrets.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::keys::{ByokProviders, SharedStore};
use crate::proxy::{Providers, Upstream, UpstreamConfig};
use crate::secrets::{Redacted, SecretProviders, SecretSpec};
use crate::usage::AppRanking;
use crate::webhook::WebhooksConfig;

fn providers_config(providers: Value) -> GatewayConfig {
    GatewayConfig::from_json(&serde_json::json!({ "providers": providers }).to_string()).unwrap()
}

#[test]
fn byok_is_off_unless_a_provider_with_an_api_key_opts_in() {
    std::env::set_var("MODELGATE_UNIT_BYOK_KEY", "sk-unit-provider-0001");
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
    let upstreams = config.provider_upstreams().unwrap();
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
        std::env::set_var("MODELGATE_UNIT_BYOK_KEY", "sk-unit-provider-0001");
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
                let upstreams = config.provider_upstreams().unwrap();
                proptest::prop_assert_eq!(upstreams["p"].byok, byok);
                proptest::prop_assert!(!byok || with_key);
            }
            Err(error) => {
                proptest::prop_assert!(error.to_string().starts_with("config: providers.p"), "{}", error);
            }
        }
    }
}

#[test]
fn credit_byok_is_refused_with_what_to_do_instead() {
    let error = GatewayConfig::from_json(r#"{"credit": {"byok": {"acme": ["openai"]}}}"#)
        .expect_err("credit.byok is refused");
    let message = error.to_string();
    for words in [
        "credit.byok is no longer accepted",
        "`providers` section",
        "PUT /api/v1/accounts/{id}/byok/{provider}",
        "management key",
    ] {
        assert!(message.contains(words), "{words:?} missing: {message}");
    }
    // Even empty: the field itself is what is retired.
    assert!(GatewayConfig::from_json(r#"{"credit": {"byok": {}}}"#).is_err());
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
    let vault = config(serde_json::json!({"source": "file", "provider": "vault", "id": "/openai"}));
    assert!(vault.provider_upstreams().is_ok());
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
    let error = missing
        .provider_upstreams()
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

#[test]
fn generations_settings_are_checked_at_load() {
    let store: SharedStore = Arc::new(crate::store::MemoryStore::new());
    let settings = |json: &str| {
        GatewayConfig::from_json(json)
            .unwrap()
            .generations
            .settings(AppRanking::new(Arc::clone(&store)))
    };
    let kept = settings(r#"{"generations": {"retention_days": 7, "max_per_account": 10}}"#);
    assert_eq!(kept.retention, Duration::from_secs(7 * 86_400));
    assert_eq!(kept.max_per_account, 10);
    let default = settings("{}");
    assert_eq!(default.retention, crate::usage::DEFAULT_RETENTION);
    for (json, words) in [
        (
            r#"{"generations": {"retention_days": 0}}"#,
            "config: generations.retention_days must be from 1 to 3650, not 0",
        ),
        (
            r#"{"generations": {"retention_days": 3651}}"#,
            "config: generations.retention_days must be from 1 to 3650, not 3651",
        ),
        (
            r#"{"generations": {"max_per_account": 0}}"#,
            "config: generations.max_per_account must be at least 1",
        ),
    ] {
        let error = GatewayConfig::from_json(json).unwrap_err().to_string();
        assert_eq!(error, words, "{json}");
    }
    assert!(GatewayConfig::from_json(r#"{"generations": {"days": 1}}"#).is_err());
}

#[test]
fn the_shutdown_grace_is_read_and_defaults_to_30_seconds() {
    let config = GatewayConfig::from_json(r#"{"shutdown_grace_seconds": 2}"#).unwrap();
    assert_eq!(config.shutdown_grace(), Duration::from_secs(2));
    let config = GatewayConfig::from_json("{}").unwrap();
    assert_eq!(config.shutdown_grace(), Duration::from_secs(30));
    assert!(GatewayConfig::from_json(r#"{"shutdown_grace_seconds": -1}"#).is_err());
}

#[test]
fn the_other_credit_fields_are_read_and_unknown_ones_refused() {
    let config = GatewayConfig::from_json(
        r#"{"credit": {"default_max_tokens": 7, "reservation_ttl_seconds": 60}}"#,
    )
    .unwrap();
    assert_eq!(config.credit.default_max_tokens, Some(7));
    assert_eq!(config.credit.reservation_ttl_seconds, Some(60));
    for bad in ["0", "2", "31536001"] {
        let error = GatewayConfig::from_json(&format!(
            r#"{{"credit": {{"reservation_ttl_seconds": {bad}}}}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("credit.reservation_ttl_seconds must be from 3"),
            "{error}"
        );
    }
    let config = GatewayConfig::from_json(r#"{"credit": {}}"#).unwrap();
    assert_eq!(config.credit.default_max_tokens, None);
    let error = GatewayConfig::from_json(r#"{"credit": {"max_tokens": 7}}"#)
        .expect_err("unknown fields are refused");
    assert!(
        error.to_string().contains("unknown field `max_tokens`"),
        "{error}"
    );
}

/// `config: <path>…` for `json`.
fn refusal(json: &str) -> String {
    GatewayConfig::from_json(json).expect_err(json).to_string()
}

#[test]
fn each_section_refuses_a_bad_value_naming_its_path_and_what_is_expected() {
    for (json, expected) in [
        (
            r#"{"pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": -1, "completion_per_million": 1}}}}"#,
            r#"config: pricing.models["openai/gpt-4o"].prompt_per_million must be a number of credits from 0 to 1000000"#,
        ),
        (
            r#"{"pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": "1", "completion_per_million": 1}}}}"#,
            r#"config: pricing.models["openai/gpt-4o"].prompt_per_million: invalid type: string "1", expected f64"#,
        ),
        (
            r#"{"pricing": {"default": {"prompt_per_million": 1, "completion_per_million": 1, "context_length": 0}}}"#,
            "config: pricing.default.context_length must be a whole number of tokens from 1 to 1000000000, not 0",
        ),
        (
            r#"{"pricing": {"free_models": ["a/b"]}}"#,
            r#"config: pricing: free_models: "a/b" is not a model id ending in :free (provider/model:free)"#,
        ),
        (
            r#"{"pricing": {"free_models": ["a/b:free", 5]}}"#,
            "config: pricing.free_models[1]: invalid type: integer `5`, expected a string",
        ),
        (
            r#"{"providers": {"openai": {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-inline-0123456789"}}}"#,
            r#"config: providers.openai.api_key: must be {"env": "VAR"}, {"file": "/path"} or a SecretRef {source, provider, id}, not inline text"#,
        ),
        (
            r#"{"providers": {"openai": {"base_url": "ftp://127.0.0.1/v1"}}}"#,
            "config: providers.openai: upstream: ftp is not http or https",
        ),
        (
            r#"{"providers": {"open ai": {"base_url": "http://127.0.0.1:9/v1"}}}"#,
            r#"config: providers: "open ai" must be 1 to 64 characters of A-Z a-z 0-9 - _ ."#,
        ),
        (
            r#"{"providers": {"p": {"base_url": "http://127.0.0.1:9/v1", "headers": {"host": "x"}}}}"#,
            "config: providers.p: upstream: the header host is set by the gateway, not the config",
        ),
        (
            r#"{"upstream": {"base_url": "api.openai.com"}}"#,
            r#"config: upstream.base_url: upstream: "api.openai.com" needs a scheme and a host, such as https://api.openai.com/v1"#,
        ),
        (
            r#"{"fallbacks": {"openai/gpt-4o": ["gpt-4o-mini"]}}"#,
            r#"config: fallbacks.openai/gpt-4o: "gpt-4o-mini" is not a model id"#,
        ),
        (
            r#"{"retry": {"max_attempts": 9}}"#,
            "config: retry.max_attempts: ",
        ),
        (
            r#"{"email": {"smtp": "smtp://127.0.0.1:25", "from": "m <m@example.com>"}, "alerts": {"balance_below": [5, -1]}}"#,
            "config: alerts.balance_below[1]: must not be negative",
        ),
        (
            r#"{"email": {"smtp": "smtp://127.0.0.1:25", "from": "m <m@example.com>"}, "alerts": {"key_limit_percent": [80, 120]}}"#,
            "config: alerts.key_limit_percent[1]: must be a whole number from 1 to 100, not 120",
        ),
        (
            r#"{"email": {"smtp": "smtp://127.0.0.1:25", "from": "m <m@example.com>"}, "alerts": {}}"#,
            "config: alerts: names no threshold; set balance_below or key_limit_percent",
        ),
        (
            r#"{"alerts": {"balance_below": [5]}}"#,
            "config: alerts: nothing to send them with; set the email section or alerts.webhook",
        ),
        (
            r#"{"alerts": {"balance_below": [5], "webhook": {"url": "ftp://ops.example.com/h", "secret": {"env": "ALERT_SECRET"}}}}"#,
            "config: alerts.webhook: notify webhook_url: ftp is not http or https",
        ),
        (
            r#"{"alerts": {"balance_below": [5], "webhook": {"url": "https://ops.example.com/h", "secret": "0123456789abcdef0123"}}}"#,
            "config: alerts.webhook.secret: must be {\"env\": \"VAR\"}",
        ),
        (
            r#"{"alerts": {"balance_below": 5}}"#,
            "config: alerts.balance_below: invalid type",
        ),
        (r#"{"max_in_flight": 0}"#, "config: max_in_flight must be at least 1"),
        (
            r#"{"unauthenticated": {"max_in_flight": 0}}"#,
            "config: unauthenticated.max_in_flight must be at least 1",
        ),
        (
            r#"{"auth_failures": {"max_failures": 0}}"#,
            "config: auth_failures.max_failures must be at least 1",
        ),
        (
            r#"{"trusted_proxies": ["10.0.0.0/8", "proxy.local"]}"#,
            r#"config: trusted_proxies: "proxy.local" is neither an IP address nor a network such as 10.0.0.0/8"#,
        ),
        (
            r#"{"rate_limits": {"account": {"gcra": {"requests": 0, "period_seconds": 60, "burst": 1}}}}"#,
            "config: rate_limits",
        ),
        (
            r#"{"free_quota": {"requests_per_minute": 0}}"#,
            "config: free_quota",
        ),
        (
            r#"{"leak_scanning": {"public_keys": "-----BEGIN PUBLIC KEY-----"}}"#,
            "config: leak_scanning.public_keys: must be {\"env\": \"VAR\"}",
        ),
        (
            r#"{"leak_scanning": {"public_keys": {"file": "/k.json"}, "notify_webhook": {"url": "ftp://ops.example.com/h", "secret": {"env": "LEAK_SECRET"}}}}"#,
            "config: leak_scanning.notify_webhook: notify webhook_url: ftp is not http or https",
        ),
        (
            r#"{"leak_scanning": {"public_keys": {"file": "/k.json"}, "notify_webhook": {"url": "https://ops.example.com/h", "secret": "0123456789abcdef0123"}}}"#,
            "config: leak_scanning.notify_webhook.secret: must be {\"env\": \"VAR\"}",
        ),
        (
            r#"{"email": {"smtp": "smtp://user:pass@mail.example.com", "from": "keys@example.com"}}"#,
            "config: email: notify smtp_url: smtp://user@mail.example.com would send its password unencrypted",
        ),
        (
            r#"{"email": {"smtp": {"env": "SMTP_URL"}, "from": "not a mailbox"}}"#,
            r#"config: email: notify from: "not a mailbox" is not a mailbox"#,
        ),
        (
            r#"{"email": {"smtp": 25, "from": "keys@example.com"}}"#,
            "config: email.smtp: expected an smtp:// or smtps:// URL, or where to read it: must be",
        ),
        (
            r#"{"plugins": {}}"#,
            "config: plugins: missing field `entries`",
        ),
        (
            r#"{"plugins": {"entries": {"webhook": {}}}}"#,
            "config: plugins.entries.webhook: unknown field `webhook`, expected `webhooks`",
        ),
        (
            r#"{"plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {"x": {"sessionKey": "s", "secret": "short"}}}}}}}"#,
            "config: plugins.entries.webhooks: webhooks route `x`: `secret` must be at least 16 bytes",
        ),
        (
            r#"{"oauth": {"max_pending_codes_per_account": 0}}"#,
            "config: oauth.max_pending_codes_per_account must be at least 1",
        ),
        (
            r#"{"management_rate": {"gcra": {"requests": 0, "period_seconds": 60, "burst": 1}}}"#,
            "config: management_rate: ",
        ),
        (
            r#"{"credit": {"reservation_ttl_seconds": 1}}"#,
            "config: credit.reservation_ttl_seconds must be from 3 to",
        ),
        (
            r#"{"secrets": {"providers": {"v": {"source": "file", "path": "keys.json"}}}}"#,
            "config: secrets",
        ),
        (
            r#"{"sqlite": {"synchronous": "off"}}"#,
            "config: sqlite.synchronous: unknown variant `off`",
        ),
        (r#"{"upstream": {}} trailing"#, "config: trailing characters"),
    ] {
        let error = refusal(json);
        assert!(error.starts_with(expected), "{json}:\n  got {error}\n  not {expected}");
    }
}

#[test]
fn a_config_accepted_at_load_builds_but_for_what_is_outside_it() {
    let config = GatewayConfig::from_json(
        r#"{"leak_scanning": {"public_keys": {"file": "/nonexistent/modelgate-keys.json"}},
            "email": {"smtp": {"env": "MODELGATE_UNIT_UNSET_SMTP"}, "from": "keys@example.com"}}"#,
    )
    .unwrap();
    let error = config.scanning_keys().unwrap_err().to_string();
    assert!(
        error.starts_with("config: leak_scanning.public_keys: "),
        "{error}"
    );
    let error = config.leak_notifier().unwrap_err().to_string();
    assert!(error.starts_with("config: email.smtp: "), "{error}");
    // A config built in code is checked as a read one is.
    let config = GatewayConfig {
        max_in_flight: Some(0),
        ..GatewayConfig::default()
    };
    assert_eq!(
        config.validate().unwrap_err().to_string(),
        "config: max_in_flight must be at least 1"
    );
    // Read straight from a config built in code, the providers are
    // checked all the same: a BYOK provider needs its own key.
    let config = GatewayConfig {
        providers: HashMap::from([(
            "internal".to_owned(),
            ProviderSection {
                base_url: "http://10.0.0.7/v1".into(),
                byok: true,
                ..ProviderSection::default()
            },
        )]),
        ..GatewayConfig::default()
    };
    let error = config.provider_upstreams().unwrap_err().to_string();
    assert!(
        error.contains("providers.internal.byok needs providers.internal.api_key"),
        "{error}"
    );
    // And so are the webhook routes.
    let short = crate::webhook::RouteConfig {
        route_id: "deploys".into(),
        enabled: true,
        path: "/plugins/webhooks/deploys".into(),
        session_key: "s".into(),
        secret: SecretSpec::Inline(crate::secrets::Secret::new("short".to_owned())),
        controller_id: "webhooks/deploys".into(),
        description: None,
    };
    let config = GatewayConfig {
        plugins: Some(PluginsSection {
            entries: PluginEntries {
                webhooks: Some(WebhooksConfig {
                    enabled: true,
                    routes: vec![short],
                    limits: Default::default(),
                }),
            },
        }),
        ..GatewayConfig::default()
    };
    let error = config.validate().unwrap_err().to_string();
    assert!(
        error.contains("`secret` must be at least 16 bytes"),
        "{error}"
    );
}

/// Every file of the config's sections.
const SOURCES: [&str; 17] = [
    include_str!("alerts.rs"),
    include_str!("body.rs"),
    include_str!("credit.rs"),
    include_str!("demo.rs"),
    include_str!("email.rs"),
    include_str!("error.rs"),
    include_str!("gateway_config.rs"),
    include_str!("generations.rs"),
    include_str!("leak_scanning.rs"),
    include_str!("notify_webhook.rs"),
    include_str!("oauth.rs"),
    include_str!("plugins.rs"),
    include_str!("providers.rs"),
    include_str!("retry.rs"),
    include_str!("secret_fields.rs"),
    include_str!("sqlite.rs"),
    include_str!("upstream.rs"),
];

/// The `pub` fields of `declaration` in the config's files.
fn declared_fields(declaration: &str) -> Vec<&'static str> {
    let source = SOURCES
        .iter()
        .find(|source| source.contains(declaration))
        .expect(declaration);
    let body = &source[source.find(declaration).expect(declaration)..];
    let body = &body[..body.find("\n}").unwrap()];
    body.lines()
        .filter_map(|line| line.trim().strip_prefix("pub "))
        .filter_map(|field| field.split_once(':').map(|(name, _)| name))
        .collect()
}

#[test]
fn debug_shows_every_field_and_no_secret() {
    let secrets = [
        "header-value-secret-3141",
        "smtp-password-secret-2718",
        "notify-url-token-secret-1618",
        "route-inline-secret-0123456789",
        "exec-argument-secret-1414",
    ];
    let text = serde_json::json!({
        "upstream": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "OPENAI_API_KEY",
                     "connect_timeout_ms": 1, "response_header_timeout_ms": 2},
        "pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": 1, "completion_per_million": 2}}},
        "rate_limits": {"account": {"gcra": {"requests": 600, "period_seconds": 60, "burst": 60}}},
        "free_quota": {"requests_per_minute": 20, "requests_per_day": 50},
        "body": {"max_body_bytes": 4096, "read_timeout_ms": 1000},
        "retry": {"max_attempts": 2, "max_wait_ms": 10},
        "credit": {"default_max_tokens": 7, "reservation_ttl_seconds": 60},
        "secrets": {"providers": {"keyring": {"source": "exec", "command": "/usr/bin/keyring",
                                              "args": ["--token", secrets[4]]}}},
        "plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {
            "deploys": {"sessionKey": "agent:main", "secret": secrets[3]}}}}}},
        "providers": {"openai": {"base_url": "http://127.0.0.1:9/v1",
                                 "api_key": {"source": "exec", "provider": "keyring", "id": "openai"},
                                 "headers": {"x-goog-api-key": secrets[0]},
                                 "credential_headers": ["x-goog-api-key"], "byok": true,
                                 "connect_timeout_ms": 1, "response_header_timeout_ms": 2,
                                 "model_prefix": "keep", "completion_bound_field": "max_completion_tokens"}},
        "fallbacks": {"openai/gpt-4o": ["openai/gpt-4o"]},
        "max_in_flight": 8,
        "unauthenticated": {"max_in_flight": 4},
        "auth_failures": {"max_failures": 3, "window_seconds": 60},
        "trusted_proxies": ["10.0.0.0/8"],
        "leak_scanning": {"public_keys": {"file": "/etc/modelgate/keys.json"},
                          "notify_webhook": {"url": format!("https://ops.example.com/hooks/{}", secrets[2]),
                                             "secret": {"env": "LEAK_WEBHOOK_SECRET"}}},
        "email": {"smtp": format!("smtps://user:{}@mail.example.com", secrets[1]),
                  "from": "modelgate <keys@example.com>"},
        "alerts": {"balance_below": [5], "key_limit_percent": [80],
                   "webhook": {"url": format!("https://ops.example.com/alerts/{}", secrets[2]),
                               "secret": {"env": "ALERT_WEBHOOK_SECRET"}}},
        "generations": {"retention_days": 30, "max_per_account": 10, "public_ranking": true},
        "oauth": {"allow_plain_pkce": true, "max_pending_codes_per_account": 5},
        "management_rate": {"gcra": {"requests": 60, "period_seconds": 60, "burst": 6}},
        "shutdown_grace_seconds": 3,
        "sqlite": {"synchronous": "full"}
    })
    .to_string();
    let config = GatewayConfig::from_json(&text).unwrap();
    let shown = format!("{config:?}");
    for secret in secrets {
        assert!(!shown.contains(secret), "{secret} shown: {shown}");
    }
    for declaration in [
        "pub struct GatewayConfig {",
        "pub struct UpstreamSection {",
        "pub struct BodySection {",
        "pub struct RetrySection {",
        "pub struct CreditSection {",
        "pub struct ProviderSection {",
        "pub struct GenerationsSection {",
        "pub struct OAuthSection {",
        "pub struct LeakScanningSection {",
        "pub struct NotifyWebhookSection {",
        "pub struct EmailSection {",
        "pub struct AlertsSection {",
        "pub struct PluginsSection {",
        "pub struct PluginEntries {",
        "pub struct SqliteSection {",
    ] {
        let fields = declared_fields(declaration);
        assert!(!fields.is_empty(), "{declaration}");
        for field in fields {
            assert!(
                shown.contains(&format!("{field}: ")),
                "{declaration} {field} not shown: {shown}"
            );
        }
    }
}

#[test]
fn redacted_prints_nothing_of_its_value_and_reads_as_the_value() {
    let header: Redacted<String> = serde_json::from_str(r#""sk-secret""#).unwrap();
    assert_eq!(header.expose(), "sk-secret");
    assert_eq!(format!("{header:?}"), "[redacted]");
}

/// JSON shaped like a config: its section and field names, and values
/// of every kind.
fn config_like_json() -> impl Strategy<Value = Value> {
    let names: Vec<&'static str> = [
        "upstream",
        "pricing",
        "rate_limits",
        "free_quota",
        "body",
        "retry",
        "credit",
        "secrets",
        "plugins",
        "providers",
        "fallbacks",
        "max_in_flight",
        "unauthenticated",
        "auth_failures",
        "trusted_proxies",
        "leak_scanning",
        "email",
        "alerts",
        "balance_below",
        "key_limit_percent",
        "webhook",
        "generations",
        "oauth",
        "management_rate",
        "shutdown_grace_seconds",
        "sqlite",
        "models",
        "default",
        "free_models",
        "prompt_per_million",
        "completion_per_million",
        "base_url",
        "api_key",
        "headers",
        "byok",
        "entries",
        "webhooks",
        "enabled",
        "config",
        "routes",
        "smtp",
        "from",
        "public_keys",
        "notify_webhook",
        "url",
        "secret",
        "env",
        "file",
        "source",
        "provider",
        "id",
        "retention_days",
        "max_attempts",
        "openai/gpt-4o",
    ]
    .to_vec();
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[a-zA-Z0-9/:._ -]{0,24}".prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        let key = prop_oneof![
            proptest::sample::select(names.clone()).prop_map(str::to_owned),
            "[a-z_]{1,8}"
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(key, inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn any_json_is_a_config_or_an_error_naming_where_never_a_panic(value in config_like_json()) {
        match GatewayConfig::from_json(&value.to_string()) {
            Ok(config) => prop_assert!(config.validate().is_ok()),
            Err(error) => prop_assert!(error.to_string().starts_with("config: ")),
        }
    }

    #[test]
    fn any_text_is_a_config_or_an_error_never_a_panic(text in "\\PC{0,200}") {
        let _ = GatewayConfig::from_json(&text);
    }
}
