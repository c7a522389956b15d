//! From configured routes to served ones: secrets resolved at start-up, a
//! route whose secret cannot be resolved skipped with a warning, routes
//! that share a secret named in a warning.

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
    for ids in shared_secrets(&served) {
        tracing::warn!(
            routes = %ids.join(", "),
            "webhook routes share one secret: whoever holds it can act as each of them; give every route a strong secret of its own"
        );
    }
    (served, skipped)
}

/// The ids of the routes in `routes` that share a secret, a group per
/// secret held by two routes or more (in the routes' order).
pub(crate) fn shared_secrets(routes: &[WebhookRoute]) -> Vec<Vec<String>> {
    let mut groups: Vec<(&str, Vec<String>)> = Vec::new();
    for route in routes {
        let id = route.scope.route_id.clone();
        match groups
            .iter_mut()
            .find(|(secret, _)| *secret == route.secret.expose())
        {
            Some((_, ids)) => ids.push(id),
            None => groups.push((route.secret.expose(), vec![id])),
        }
    }
    groups
        .into_iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|(_, ids)| ids)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_sharing_a_secret_are_named_together() {
        let entry = serde_json::json!({"enabled": true, "config": {"routes": {
            "a": {"sessionKey": "agent:a", "secret": "one-long-secret-value-0123"},
            "b": {"sessionKey": "agent:b", "secret": "two-long-secret-value-0123"},
            "c": {"sessionKey": "agent:c", "secret": "one-long-secret-value-0123"},
        }}});
        let config = WebhooksConfig::from_plugin_entry(&entry).unwrap();
        let (served, _) = resolve_routes(
            &config,
            &SecretProviders::default(),
            &ResolveLimits::default(),
        );
        let mut groups = shared_secrets(&served);
        groups.iter_mut().for_each(|ids| ids.sort());
        assert_eq!(groups, vec![vec!["a".to_owned(), "c".to_owned()]]);
        assert!(shared_secrets(&served[..1]).is_empty());
    }
}
