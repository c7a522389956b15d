//! The config as a whole: every section read, refused with its path, shown
//! without its secrets.

use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::secrets::Redacted;

/// `config: <path>…` for `json`.
fn refusal(json: &str) -> String {
    GatewayConfig::from_json(json).expect_err(json).to_string()
}

#[test]
fn model_names_are_checked_when_read() {
    for (json, expected) in [
        (
            r#"{"default_provider": "open ai"}"#,
            "config: default_provider: \"open ai\" is not a provider name",
        ),
        (
            r#"{"model_aliases": {"gpt-*": "openai/gpt-4o"}}"#,
            r#"config: model_aliases["gpt-*"]: a pattern maps to a provider prefix such as "anthropic/""#,
        ),
        (
            r#"{"model_aliases": {"a*b*": "openai/"}}"#,
            r#"config: model_aliases["a*b*"]: a pattern is a prefix and one trailing '*'"#,
        ),
        (
            r#"{"model_aliases": {"mini": "gpt-4o-mini"}}"#,
            r#"config: model_aliases["mini"]: "gpt-4o-mini" is not a model id"#,
        ),
        (
            r#"{"model_aliases": {"openai/gpt-4": "openai/gpt-4o"}}"#,
            r#"config: model_aliases["openai/gpt-4"]: an alias is a bare model id"#,
        ),
    ] {
        let refused = refusal(json);
        assert!(refused.starts_with(expected), "{json}: {refused}");
    }
    let config = GatewayConfig::from_json(
        r#"{"default_provider": "openai", "model_aliases": {"claude-*": "anthropic/"}}"#,
    )
    .unwrap();
    let names = config.model_names().unwrap();
    assert_eq!(
        names.resolve("claude-x").unwrap().as_str(),
        "anthropic/claude-x"
    );
    assert_eq!(names.resolve("gpt-5.5").unwrap().as_str(), "openai/gpt-5.5");
    assert!(
        GatewayConfig::from_json("{}")
            .unwrap()
            .model_names()
            .unwrap()
            .is_empty()
    );
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
        (
            r#"{"max_in_flight": 0}"#,
            "config: max_in_flight must be at least 1",
        ),
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
        (
            r#"{"upstream": {}} trailing"#,
            "config: trailing characters",
        ),
    ] {
        let error = refusal(json);
        assert!(
            error.starts_with(expected),
            "{json}:\n  got {error}\n  not {expected}"
        );
    }
}

/// Every file of the config's sections.
const SOURCES: [&str; 19] = [
    include_str!("alerts.rs"),
    include_str!("body.rs"),
    include_str!("credit.rs"),
    include_str!("demo.rs"),
    include_str!("email.rs"),
    include_str!("error.rs"),
    include_str!("gateway_config.rs"),
    include_str!("generations.rs"),
    include_str!("leak_scanning.rs"),
    include_str!("model_names.rs"),
    include_str!("notify_webhook.rs"),
    include_str!("oauth.rs"),
    include_str!("plan.rs"),
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
                                 "late_answer_seconds": 3, "max_late_answers": 4,
                                 "model_prefix": "keep", "completion_bound_field": "max_completion_tokens"}},
        "fallbacks": {"openai/gpt-4o": ["openai/gpt-4o"]},
        "default_provider": "openai",
        "model_aliases": {"gpt-*": "openai/", "mini": "openai/gpt-4o-mini"},
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
