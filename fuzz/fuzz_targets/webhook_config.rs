//! The webhooks plugin entry on arbitrary JSON: never panics, and what it
//! accepts keeps its promises (distinct paths, plain absolute paths,
//! non-empty session keys).
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::webhook::WebhooksConfig;

fuzz_target!(|text: &str| {
    let Ok(entry) = serde_json::from_str::<serde_json::Value>(text) else {
        return;
    };
    if let Ok(config) = WebhooksConfig::from_plugin_entry(&entry) {
        let mut paths: Vec<&str> = config.routes.iter().map(|route| route.path.as_str()).collect();
        paths.sort_unstable();
        let before = paths.len();
        paths.dedup();
        assert_eq!(paths.len(), before, "two routes on one path");
        for route in &config.routes {
            assert!(route.path.starts_with('/') && !route.path.contains("//") && !route.path.contains(".."));
            assert!(!route.session_key.is_empty());
            assert!(!format!("{route:?}").contains("\"secret\""));
        }
    }
});
