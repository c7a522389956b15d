//! The webhooks plugin entry, the SecretRef reader and the `secrets`
//! providers section on arbitrary JSON: never panic, and what they accept
//! keeps its promises (distinct paths, plain absolute paths, non-empty
//! session keys; a key source is never inline text; providers have safe
//! names, absolute paths and bounded sizes, and `default` always exists).
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::secrets::{
    SecretProvider, SecretProviders, SecretSpec, DEFAULT_PROVIDER, MAX_ALLOWLIST_ENTRIES,
    MAX_EXEC_ARGS, MAX_EXEC_TIMEOUT_MS, MAX_PROVIDERS, MAX_PROVIDER_NAME_CHARS,
};
use modelgate::webhook::{secret_ref_from_json, WebhooksConfig};

fuzz_target!(|text: &str| {
    let Ok(entry) = serde_json::from_str::<serde_json::Value>(text) else {
        return;
    };
    // The same SecretRef reader takes providers' API keys: never inline text.
    if let Ok(spec) = secret_ref_from_json(&entry) {
        assert!(matches!(spec, SecretSpec::Ref(_) | SecretSpec::File(_)));
    }
    // The same document read as a `secrets` section (`{"providers": …}`).
    match SecretProviders::from_json(&entry) {
        Ok(providers) => check_providers(&providers),
        // Every refusal names a field under `secrets`.
        Err(error) => assert!(error.field().starts_with("secrets")),
    }
    if let Ok(config) = WebhooksConfig::from_plugin_entry(&entry) {
        let mut paths: Vec<&str> = config
            .routes
            .iter()
            .map(|route| route.path.as_str())
            .collect();
        paths.sort_unstable();
        let before = paths.len();
        paths.dedup();
        assert_eq!(paths.len(), before, "two routes on one path");
        for route in &config.routes {
            // No dot segments; `..` inside a name (`d..eploys`) is a name.
            assert!(
                route.path.starts_with('/')
                    && !route.path.contains("//")
                    && route.path[1..]
                        .split('/')
                        .all(|segment| segment != "." && segment != "..")
            );
            assert!(!route.session_key.is_empty());
            // An inline secret never shows in Debug: whatever it is, Debug
            // prints the same redaction. (Not a substring check: a secret
            // may well be a piece of the redaction text itself.)
            if let SecretSpec::Inline(_) = &route.secret {
                assert_eq!(format!("{:?}", route.secret), "Inline(Secret(…))");
            }
        }
    }
});

/// What an accepted `secrets` section promises: `default` exists, names
/// are safe, paths absolute, sizes bounded, arguments never in `Debug`.
fn check_providers(providers: &SecretProviders) {
    assert!(providers.get(DEFAULT_PROVIDER).is_some());
    // The declared ones and `default`.
    assert!(providers.iter().count() <= MAX_PROVIDERS + 1);
    for (name, provider) in providers.iter() {
        let safe_byte = |byte: u8| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-';
        assert!((1..=MAX_PROVIDER_NAME_CHARS).contains(&name.len()));
        assert!(name.bytes().all(safe_byte));
        match provider {
            SecretProvider::Env { allowlist } => {
                for variable in allowlist.iter().flatten() {
                    assert!(!variable.is_empty() && !variable.contains('='));
                }
                assert!(allowlist.as_ref().map_or(0, |names| names.len()) <= MAX_ALLOWLIST_ENTRIES);
            }
            SecretProvider::File { path, .. } => assert!(path.is_absolute()),
            SecretProvider::Exec {
                command,
                args,
                timeout,
            } => {
                assert!(command.is_absolute() && args.len() <= MAX_EXEC_ARGS);
                if let Some(timeout) = timeout {
                    assert!(!timeout.is_zero());
                    assert!(timeout.as_millis() <= u128::from(MAX_EXEC_TIMEOUT_MS));
                }
                // Arguments may carry a token: Debug counts them only.
                let shown = format!("{provider:?}");
                assert!(shown.contains(&format!("args: […; {}]", args.len())));
            }
        }
    }
}
