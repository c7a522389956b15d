//! Webhook routes for managed flows (seed 001): the route configuration
//! and its secrets. The `WebhookSecret` layer and the flow actions build on
//! these.
//!
//! [`WebhooksConfig::from_plugin_entry`] reads `plugins.entries.webhooks`
//! strictly, naming the route and field of every error; two routes on one
//! path are refused. Each route's secret is inline text or a [`SecretRef`]
//! that [`resolve_secret`] reads at start-up from the environment, a file
//! (whole, or a JSON pointer into it) or a command (absolute path, no
//! shell, bounded time and output). A [`Secret`] compares in constant time
//! and never prints.
//!
//! ```
//! use modelgate::webhook::{resolve_secret, ResolveLimits, WebhooksConfig};
//!
//! std::env::set_var("DOC_HOOK_SECRET", "s3cret-value-for-the-doc");
//! let entry = serde_json::json!({"enabled": true, "config": {"routes": {
//!     "deploys": {"sessionKey": "agent:main", "secret": {"source": "env", "provider": "default", "id": "DOC_HOOK_SECRET"}}
//! }}});
//! let config = WebhooksConfig::from_plugin_entry(&entry).unwrap();
//! let secret = resolve_secret(&config.routes[0].secret, &ResolveLimits::default()).unwrap();
//! assert!(secret.matches(b"s3cret-value-for-the-doc"));
//! assert_eq!(format!("{secret:?}"), "Secret(…)");
//! ```

mod config;
mod secret;

pub use config::{
    RouteConfig, WebhookConfigError, WebhooksConfig, MAX_FIELD_CHARS, MIN_SECRET_BYTES,
};
pub use secret::{
    resolve_secret, ResolveError, ResolveLimits, Secret, SecretRef, SecretSource, SecretSpec,
};
