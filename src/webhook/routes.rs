//! From configured routes to served ones: secrets resolved at start-up, a
//! route whose secret cannot be resolved skipped with a warning.

use super::actions::RouteScope;
use super::config::WebhooksConfig;
use crate::secrets::{ResolveLimits, Secret, SecretProviders, resolve_secret};

/// A route ready to serve: where, as whom, and its resolved secret.
#[derive(Clone, Debug)]
pub struct WebhookRoute {
    /// The exact request path it answers.
    pub path: String,
    /// Its id, session and controller.
    pub scope: RouteScope,
    /// Its shared secret.
    pub secret: Secret,
}

/// A configured route that is not served, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedRoute {
    /// The route's id.
    pub route_id: String,
    /// Why: the route is disabled, or its secret could not be resolved,
    /// its provider not configured included (the reason never contains
    /// the secret).
    pub reason: String,
}

/// The routes of `config` to serve, their secrets read from `providers`,
/// and the ones skipped.
///
/// Nothing is served when the plugin is disabled. A route whose secret
/// cannot be resolved (its provider not configured, or of another source,
/// included) is skipped and logged at `warn` with its id and the reason,
/// so its path answers as if no route were there.
///
/// ```
/// use modelgate::secrets::{ResolveLimits, SecretProviders};
/// use modelgate::webhook::{resolve_routes, WebhooksConfig};
///
/// let entry = serde_json::json!({"enabled": true, "config": {"routes": {
///     "ci": {"sessionKey": "agent:ci", "secret": "a-long-inline-secret-value"},
///     "gone": {"sessionKey": "agent:x", "secret": {"source": "env", "provider": "default", "id": "DOC_UNSET_SECRET_VAR"}},
///     "nowhere": {"sessionKey": "agent:y", "secret": {"source": "file", "provider": "vault", "id": "/hooks/y"}}
/// }}});
/// let config = WebhooksConfig::from_plugin_entry(&entry).unwrap();
/// let (served, skipped) = resolve_routes(&config, &SecretProviders::default(), &ResolveLimits::default());
/// assert_eq!(served[0].path, "/plugins/webhooks/ci");
/// assert_eq!(skipped[0].route_id, "gone");
/// assert_eq!(skipped[1].route_id, "nowhere");
/// assert!(skipped[1].reason.contains("no secrets provider is named \"vault\""));
/// ```
pub fn resolve_routes(
    config: &WebhooksConfig,
    providers: &SecretProviders,
    limits: &ResolveLimits,
) -> (Vec<WebhookRoute>, Vec<SkippedRoute>) {
    let mut served = Vec::new();
    let mut skipped = Vec::new();
    if !config.enabled {
        return (served, skipped);
    }
    for route in &config.routes {
        if !route.enabled {
            tracing::info!(route = %route.route_id, "webhook route disabled; not served");
            skipped.push(SkippedRoute {
                route_id: route.route_id.clone(),
                reason: "disabled".into(),
            });
            continue;
        }
        match resolve_secret(&route.secret, providers, limits) {
            Ok(secret) => served.push(WebhookRoute {
                path: route.path.clone(),
                scope: RouteScope {
                    route_id: route.route_id.clone(),
                    session_key: route.session_key.clone(),
                    controller_id: route.controller_id.clone(),
                },
                secret,
            }),
            Err(error) => {
                tracing::warn!(
                    route = %route.route_id,
                    path = %route.path,
                    reason = %error,
                    "webhook route skipped: its secret could not be resolved"
                );
                skipped.push(SkippedRoute {
                    route_id: route.route_id.clone(),
                    reason: error.to_string(),
                });
            }
        }
    }
    (served, skipped)
}
