//! The webhooks plugin entry and the SecretRef reader on arbitrary JSON:
//! never panic, and what they accept keeps its promises (distinct paths,
//! plain absolute paths, non-empty session keys; a key source is never
//! inline text).
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::webhook::{secret_ref_from_json, SecretSpec, WebhooksConfig};

fuzz_target!(|text: &str| {
    let Ok(entry) = serde_json::from_str::<serde_json::Value>(text) else {
        return;
    };
    // The same SecretRef reader takes providers' API keys: never inline text.
    if let Ok(spec) = secret_ref_from_json(&entry) {
        assert!(matches!(spec, SecretSpec::Ref(_)));
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
