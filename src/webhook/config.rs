//! The webhooks plugin entry (`plugins.entries.webhooks`), read strictly:
//! every error names the route and the field.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use super::layer::WebhookLimits;
use crate::json_input::take_short_text;
use crate::routing::normalized_segments;
use crate::secrets::{MIN_SECRET_BYTES, Secret, SecretRef, SecretSpec};

/// Longest route id, session key, controller id or path accepted.
pub const MAX_FIELD_CHARS: usize = 256;
/// The webhooks plugin entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhooksConfig {
    /// Whether the plugin serves its routes at all.
    pub enabled: bool,
    /// The routes, by route id order.
    pub routes: Vec<RouteConfig>,
    /// The limits every route enforces (`config.limits`; defaults otherwise).
    pub limits: WebhookLimits,
}

/// One configured route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteConfig {
    /// The route's id (its key in `config.routes`).
    pub route_id: String,
    /// A disabled route is not served.
    pub enabled: bool,
    /// Where it is served; default `/plugins/webhooks/<routeId>`.
    pub path: String,
    /// The session whose flows the route may see and change.
    pub session_key: String,
    /// The shared secret, or where to read it at start-up.
    pub secret: SecretSpec,
    /// Given to flows the route creates; default `webhooks/<routeId>`.
    pub controller_id: String,
    /// An operator's note.
    pub description: Option<String>,
}

/// A configuration the plugin refuses, naming the route and field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfigError {
    route: Option<String>,
    field: String,
    problem: String,
}

impl WebhookConfigError {
    fn new(route: Option<&str>, field: &str, problem: impl Into<String>) -> Self {
        WebhookConfigError {
            route: route.map(str::to_owned),
            field: field.to_owned(),
            problem: problem.into(),
        }
    }

    /// The route the error is in, if any.
    pub fn route(&self) -> Option<&str> {
        self.route.as_deref()
    }

    /// The field the error is about.
    pub fn field(&self) -> &str {
        &self.field
    }
}

impl fmt::Display for WebhookConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.route {
            Some(route) => write!(
                f,
                "webhooks route `{route}`: `{}` {}",
                self.field, self.problem
            ),
            None => write!(f, "webhooks: `{}` {}", self.field, self.problem),
        }
    }
}

impl std::error::Error for WebhookConfigError {}

impl WebhooksConfig {
    /// Reads the `plugins.entries.webhooks` value:
    /// `{"enabled": bool, "config": {"routes": {"<routeId>": {…}}}}`.
    ///
    /// ```
    /// use modelgate::webhook::WebhooksConfig;
    ///
    /// let entry = serde_json::json!({"enabled": true, "config": {"routes": {
    ///     "deploys": {"sessionKey": "agent:main", "secret": {"source": "env", "provider": "default", "id": "DEPLOY_HOOK_SECRET"}}
    /// }}});
    /// let config = WebhooksConfig::from_plugin_entry(&entry).unwrap();
    /// assert_eq!(config.routes[0].path, "/plugins/webhooks/deploys");
    /// assert_eq!(config.routes[0].controller_id, "webhooks/deploys");
    ///
    /// let missing = serde_json::json!({"enabled": true, "config": {"routes": {"x": {"secret": "0123456789abcdef"}}}});
    /// let error = WebhooksConfig::from_plugin_entry(&missing).unwrap_err();
    /// assert_eq!(error.to_string(), "webhooks route `x`: `sessionKey` is required");
    /// ```
    pub fn from_plugin_entry(entry: &Value) -> Result<Self, WebhookConfigError> {
        let mut entry = object(entry, None, "plugins.entries.webhooks")?;
        let enabled = take_bool(&mut entry, None, "enabled")?.unwrap_or(false);
        let config = entry.remove("config");
        refuse_unknown(&entry, None)?;
        let Some(config) = config else {
            return Ok(WebhooksConfig {
                enabled,
                routes: Vec::new(),
                limits: WebhookLimits::default(),
            });
        };
        let mut config = object(&config, None, "config")?;
        let routes = config.remove("routes");
        let limits = match config.remove("limits") {
            None | Some(Value::Null) => WebhookLimits::default(),
            Some(limits) => parse_limits(&limits)?,
        };
        refuse_unknown(&config, None)?;
        let routes = match routes {
            None => Map::new(),
            Some(routes) => object(&routes, None, "config.routes")?,
        };
        // BTreeMap: routes in id order, so errors and listings are stable.
        let ordered: BTreeMap<&String, &Value> = routes.iter().collect();
        let routes = ordered
            .into_iter()
            .map(|(route_id, route)| RouteConfig::parse(route_id, route))
            .collect::<Result<Vec<_>, _>>()?;
        let config = WebhooksConfig {
            enabled,
            routes,
            limits,
        };
        config.check()?;
        Ok(config)
    }

    /// Checks the routes as [`from_plugin_entry`](Self::from_plugin_entry)
    /// does, for a configuration built in code: each id, each path in its
    /// plain form and served by one route alone, each inline secret at
    /// least [`MIN_SECRET_BYTES`] long.
    pub fn check(&self) -> Result<(), WebhookConfigError> {
        for (at, route) in self.routes.iter().enumerate() {
            let id = Some(route.route_id.as_str());
            if !is_identifier(&route.route_id) {
                return Err(WebhookConfigError::new(id, "routeId", ROUTE_ID_RULE));
            }
            checked_path(id, route.path.clone())?;
            if let SecretSpec::Inline(secret) = &route.secret {
                check_inline_secret(id, secret.expose())?;
            }
            if let Some(other) = self.routes[..at]
                .iter()
                .find(|other| other.path == route.path)
            {
                return Err(WebhookConfigError::new(
                    id,
                    "path",
                    format!(
                        "{:?} is also the path of route `{}`; give each route its own",
                        route.path, other.route_id
                    ),
                ));
            }
        }
        Ok(())
    }
}

const ROUTE_ID_RULE: &str = "must be 1 to 64 characters of A-Z a-z 0-9 _ -";

fn check_inline_secret(route: Option<&str>, secret: &str) -> Result<(), WebhookConfigError> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(WebhookConfigError::new(
            route,
            "secret",
            format!("must be at least {MIN_SECRET_BYTES} bytes; prefer a SecretRef to inline text"),
        ));
    }
    Ok(())
}

impl RouteConfig {
    fn parse(route_id: &str, value: &Value) -> Result<Self, WebhookConfigError> {
        let route = Some(route_id);
        if !is_identifier(route_id) {
            return Err(WebhookConfigError::new(route, "routeId", ROUTE_ID_RULE));
        }
        let mut fields = object(value, route, "route")?;
        let enabled = take_bool(&mut fields, route, "enabled")?.unwrap_or(true);
        let path = match take_string(&mut fields, route, "path")? {
            Some(path) => checked_path(route, path)?,
            None => format!("/plugins/webhooks/{route_id}"),
        };
        let session_key = take_string(&mut fields, route, "sessionKey")?
            .ok_or_else(|| WebhookConfigError::new(route, "sessionKey", "is required"))?;
        let secret = match fields.remove("secret") {
            None | Some(Value::Null) => {
                return Err(WebhookConfigError::new(route, "secret", "is required"));
            }
            Some(secret) => secret_spec(route, &secret)?,
        };
        let controller_id = take_string(&mut fields, route, "controllerId")?
            .unwrap_or_else(|| format!("webhooks/{route_id}"));
        let description = take_string(&mut fields, route, "description")?;
        refuse_unknown(&fields, route)?;
        Ok(RouteConfig {
            route_id: route_id.to_owned(),
            enabled,
            path,
            session_key,
            secret,
            controller_id,
            description,
        })
    }
}

fn is_identifier(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-'))
}

/// A path served as written: absolute, plain segments, nothing a
/// normaliser would read differently.
fn checked_path(route: Option<&str>, path: String) -> Result<String, WebhookConfigError> {
    let plain_segments = path.split('/').skip(1).all(|segment| {
        !segment.is_empty()
            && segment != "."
            && segment != ".."
            && segment.bytes().all(|byte| {
                byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~')
            })
    });
    let canonical = format!("/{}", normalized_segments(&path).join("/"));
    if !path.starts_with('/')
        || !plain_segments
        || canonical != path
        || path.len() > MAX_FIELD_CHARS
    {
        return Err(WebhookConfigError::new(
            route,
            "path",
            "must be an absolute path of plain segments (A-Z a-z 0-9 - _ . ~), such as /plugins/webhooks/deploys",
        ));
    }
    Ok(path)
}

fn secret_spec(route: Option<&str>, value: &Value) -> Result<SecretSpec, WebhookConfigError> {
    match value {
        Value::String(secret) => {
            check_inline_secret(route, secret)?;
            Ok(SecretSpec::Inline(Secret::new(secret.clone())))
        }
        Value::Object(_) => SecretRef::from_json(value)
            .map(SecretSpec::Ref)
            .map_err(|error| WebhookConfigError::new(route, error.field(), error.problem())),
        _ => Err(WebhookConfigError::new(
            route,
            "secret",
            "must be a string or a SecretRef {source, provider, id}",
        )),
    }
}

/// `config.limits`: `{requestsPerWindow, rateWindowSeconds, maxInFlight,
/// maxBodyBytes, bodyTimeoutSeconds, inFlightLeaseSeconds,
/// endedFlowRetentionSeconds, idleFlowRetentionSeconds,
/// maxFlowsPerSession}`, each optional.
fn parse_limits(value: &Value) -> Result<WebhookLimits, WebhookConfigError> {
    const DAY_SECONDS: u64 = 86_400;
    // Ten years: long enough for any audit trail, short enough that no
    // flow is kept for good.
    const MAX_RETENTION_SECONDS: u64 = 3650 * DAY_SECONDS;
    let mut fields = object(value, None, "config.limits")?;
    let mut limits = WebhookLimits::default();
    let mut take = |name: &str, max: u64| -> Result<Option<u64>, WebhookConfigError> {
        match fields.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(number)) => match number.as_u64() {
                Some(count) if (1..=max).contains(&count) => Ok(Some(count)),
                _ => Err(WebhookConfigError::new(
                    None,
                    &format!("config.limits.{name}"),
                    format!("must be a whole number from 1 to {max}"),
                )),
            },
            Some(_) => Err(WebhookConfigError::new(
                None,
                &format!("config.limits.{name}"),
                "must be a number",
            )),
        }
    };
    if let Some(count) = take("requestsPerWindow", 1_000_000)? {
        limits.requests_per_window = count;
    }
    if let Some(seconds) = take("rateWindowSeconds", DAY_SECONDS)? {
        limits.rate_window = std::time::Duration::from_secs(seconds);
    }
    if let Some(count) = take("maxInFlight", 10_000)? {
        limits.max_in_flight = count;
    }
    if let Some(bytes) = take("maxBodyBytes", 64 * 1024 * 1024)? {
        limits.max_body_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    }
    if let Some(seconds) = take("bodyTimeoutSeconds", 3600)? {
        limits.body_timeout = std::time::Duration::from_secs(seconds);
    }
    if let Some(seconds) = take("inFlightLeaseSeconds", DAY_SECONDS)? {
        limits.in_flight_lease = std::time::Duration::from_secs(seconds);
    }
    if let Some(seconds) = take("endedFlowRetentionSeconds", MAX_RETENTION_SECONDS)? {
        limits.ended_flow_retention = std::time::Duration::from_secs(seconds);
    }
    if let Some(seconds) = take("idleFlowRetentionSeconds", MAX_RETENTION_SECONDS)? {
        limits.idle_flow_retention = std::time::Duration::from_secs(seconds);
    }
    if let Some(count) = take("maxFlowsPerSession", 100_000)? {
        limits.max_flows_per_session = count;
    }
    if let Some(unknown) = fields.keys().next() {
        return Err(WebhookConfigError::new(
            None,
            &format!("config.limits.{unknown}"),
            "is not a limit (requestsPerWindow, rateWindowSeconds, maxInFlight, maxBodyBytes, \
             bodyTimeoutSeconds, inFlightLeaseSeconds, endedFlowRetentionSeconds, \
             idleFlowRetentionSeconds, maxFlowsPerSession)",
        ));
    }
    Ok(limits)
}

fn object(
    value: &Value,
    route: Option<&str>,
    field: &str,
) -> Result<Map<String, Value>, WebhookConfigError> {
    match value {
        Value::Object(map) => Ok(map.clone()),
        _ => Err(WebhookConfigError::new(
            route,
            field,
            "must be a JSON object",
        )),
    }
}

fn take_bool(
    fields: &mut Map<String, Value>,
    route: Option<&str>,
    name: &str,
) -> Result<Option<bool>, WebhookConfigError> {
    match fields.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(value)) => Ok(Some(value)),
        Some(_) => Err(WebhookConfigError::new(
            route,
            name,
            "must be true or false",
        )),
    }
}

/// A non-empty string, trimmed, of at most [`MAX_FIELD_CHARS`] characters.
fn take_string(
    fields: &mut Map<String, Value>,
    route: Option<&str>,
    name: &str,
) -> Result<Option<String>, WebhookConfigError> {
    let key = name.rsplit('.').next().unwrap_or(name);
    take_short_text(fields, key, MAX_FIELD_CHARS)
        .map_err(|problem| WebhookConfigError::new(route, name, problem))
}

fn refuse_unknown(
    fields: &Map<String, Value>,
    route: Option<&str>,
) -> Result<(), WebhookConfigError> {
    match fields.keys().next() {
        Some(unknown) => Err(WebhookConfigError::new(
            route,
            unknown,
            "is not a known field",
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretSource;
    use proptest::prelude::*;
    use serde_json::json;

    fn entry(routes: Value) -> Value {
        json!({"enabled": true, "config": {"routes": routes}})
    }

    /// Found by the `webhook_config` fuzz target, whose check mistook dots
    /// inside a segment for a dot segment: `d..eploys` is a plain name.
    #[test]
    fn dots_inside_a_segment_are_a_name_and_dot_segments_are_refused() {
        let secret = "0123456788abcdef0123";
        let config = WebhooksConfig::from_plugin_entry(&entry(json!({
            "deploys": {"sessionKey": "agent:main", "secret": secret, "path": "/hooks/d..eploys"}
        })))
        .unwrap();
        assert_eq!(config.routes[0].path, "/hooks/d..eploys");
        for path in ["/hooks/../deploys", "/hooks/./deploys", "/hooks/.."] {
            let refused = WebhooksConfig::from_plugin_entry(&entry(json!({
                "deploys": {"sessionKey": "agent:main", "secret": secret, "path": path}
            })));
            assert!(refused.is_err(), "{path} was accepted");
        }
    }

    #[test]
    fn limits_are_read_from_config_limits_and_checked() {
        let route = json!({"r": {"sessionKey": "s", "secret": "0123456789abcdef"}});
        let config = WebhooksConfig::from_plugin_entry(&json!({"enabled": true, "config": {
            "routes": route, "limits": {"requestsPerWindow": 5, "rateWindowSeconds": 10, "maxInFlight": 2,
                "maxBodyBytes": 1024, "bodyTimeoutSeconds": 3, "inFlightLeaseSeconds": 30,
                "endedFlowRetentionSeconds": 3600, "idleFlowRetentionSeconds": 86400,
                "maxFlowsPerSession": 50}
        }}))
        .unwrap();
        assert_eq!(
            config.limits,
            WebhookLimits {
                requests_per_window: 5,
                rate_window: std::time::Duration::from_secs(10),
                max_in_flight: 2,
                max_body_bytes: 1024,
                body_timeout: std::time::Duration::from_secs(3),
                in_flight_lease: std::time::Duration::from_secs(30),
                ended_flow_retention: std::time::Duration::from_secs(3600),
                idle_flow_retention: std::time::Duration::from_secs(86400),
                max_flows_per_session: 50,
            }
        );
        for (limits, field) in [
            (json!({"maxInFlight": 0}), "config.limits.maxInFlight"),
            (
                json!({"requestsPerWindow": -1}),
                "config.limits.requestsPerWindow",
            ),
            (
                json!({"bodyTimeoutSeconds": "3"}),
                "config.limits.bodyTimeoutSeconds",
            ),
            (
                json!({"rateWindowSeconds": 1.5}),
                "config.limits.rateWindowSeconds",
            ),
            (json!({"burst": 1}), "config.limits.burst"),
            (
                json!({"endedFlowRetentionSeconds": 0}),
                "config.limits.endedFlowRetentionSeconds",
            ),
            (
                json!({"idleFlowRetentionSeconds": 3650 * 86_400 + 1}),
                "config.limits.idleFlowRetentionSeconds",
            ),
            (
                json!({"maxFlowsPerSession": 100_001}),
                "config.limits.maxFlowsPerSession",
            ),
            (
                json!({"maxFlowsPerSession": "1000"}),
                "config.limits.maxFlowsPerSession",
            ),
            (
                json!({"endedFlowRetention": 60}),
                "config.limits.endedFlowRetention",
            ),
        ] {
            let error = WebhooksConfig::from_plugin_entry(&json!({"enabled": true, "config": {
                "routes": route, "limits": limits
            }}))
            .unwrap_err();
            assert_eq!(error.field(), field, "{error}");
        }
        let defaults = WebhooksConfig::from_plugin_entry(&entry(route)).unwrap();
        assert_eq!(defaults.limits, WebhookLimits::default());
    }

    #[test]
    fn flow_retention_and_the_session_cap_have_bounded_defaults_and_ranges() {
        let defaults = WebhookLimits::default();
        assert_eq!(
            (
                defaults.ended_flow_retention.as_secs(),
                defaults.idle_flow_retention.as_secs(),
                defaults.max_flows_per_session
            ),
            (7 * 86_400, 30 * 86_400, 1000)
        );
        let route = json!({"r": {"sessionKey": "s", "secret": "0123456789abcdef"}});
        let parsed = |limits: Value| {
            WebhooksConfig::from_plugin_entry(&json!({"enabled": true, "config": {
                "routes": route, "limits": limits
            }}))
        };
        // The ends of each range are accepted, one past them is refused
        // with the field and the range named.
        let widest = parsed(json!({"endedFlowRetentionSeconds": 3650 * 86_400,
            "idleFlowRetentionSeconds": 1, "maxFlowsPerSession": 100_000}))
        .unwrap();
        assert_eq!(widest.limits.ended_flow_retention.as_secs(), 3650 * 86_400);
        assert_eq!(widest.limits.idle_flow_retention.as_secs(), 1);
        assert_eq!(widest.limits.max_flows_per_session, 100_000);
        let error = parsed(json!({"maxFlowsPerSession": 0})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "webhooks: `config.limits.maxFlowsPerSession` must be a whole number from 1 to 100000"
        );
        let error = parsed(json!({"endedFlowRetentionSeconds": 3650 * 86_400 + 1})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "webhooks: `config.limits.endedFlowRetentionSeconds` must be a whole number from 1 \
             to 315360000"
        );
        let error = parsed(json!({"idleFlowRetentionSeconds": null, "flowTtl": 5})).unwrap_err();
        assert_eq!(error.field(), "config.limits.flowTtl");
        assert!(
            error.to_string().contains("idleFlowRetentionSeconds"),
            "the known limits are named: {error}"
        );
    }

    #[test]
    fn defaults_fill_the_gaps_the_seed_names() {
        let config = WebhooksConfig::from_plugin_entry(&entry(json!({
            "b": {"sessionKey": " agent:b ", "secret": "0123456789abcdef-b"},
            "a": {"sessionKey": "agent:a", "secret": {"source": "file", "provider": "vault", "id": "/a"},
                  "path": "/hooks/a", "enabled": false, "controllerId": "ci/a", "description": "CI"},
        })))
        .unwrap();
        assert!(config.enabled);
        let [a, b] = [&config.routes[0], &config.routes[1]];
        assert_eq!(
            (
                a.route_id.as_str(),
                a.enabled,
                a.path.as_str(),
                a.controller_id.as_str()
            ),
            ("a", false, "/hooks/a", "ci/a")
        );
        assert_eq!(
            (
                b.path.as_str(),
                b.session_key.as_str(),
                b.controller_id.as_str()
            ),
            ("/plugins/webhooks/b", "agent:b", "webhooks/b")
        );
        assert!(matches!(
            &a.secret,
            SecretSpec::Ref(SecretRef {
                source: SecretSource::File,
                ..
            })
        ));
        assert!(
            !format!("{config:?}").contains("0123456789abcdef"),
            "Debug never shows a secret"
        );
        assert!(
            !WebhooksConfig::from_plugin_entry(&json!({}))
                .unwrap()
                .enabled
        );
    }

    #[test]
    fn each_error_names_its_route_and_field() {
        let secret = "0123456789abcdef";
        for (routes, route, field) in [
            (json!({"x": {"secret": secret}}), Some("x"), "sessionKey"),
            (json!({"x": {"sessionKey": "s"}}), Some("x"), "secret"),
            (
                json!({"x": {"sessionKey": "s", "secret": "short"}}),
                Some("x"),
                "secret",
            ),
            (
                json!({"x": {"sessionKey": "s", "secret": {"source": "vault", "provider": "p", "id": "i"}}}),
                Some("x"),
                "secret.source",
            ),
            (
                json!({"x": {"sessionKey": "s", "secret": {"source": "env", "id": "i"}}}),
                Some("x"),
                "secret.provider",
            ),
            (
                json!({"x": {"sessionKey": "s", "secret": {"source": "env", "provider": "p", "id": "i", "key": 1}}}),
                Some("x"),
                "secret.key",
            ),
            (
                json!({"x": {"sessionKey": "s", "secret": 5}}),
                Some("x"),
                "secret",
            ),
            (
                json!({"x": {"sessionKey": "s", "secret": secret, "path": "relative"}}),
                Some("x"),
                "path",
            ),
            (
                json!({"x": {"sessionKey": "s", "secret": secret, "path": "/a/../b"}}),
                Some("x"),
                "path",
            ),
            (
                json!({"x": {"sessionKey": "s", "secret": secret, "path": "/a//b"}}),
                Some("x"),
                "path",
            ),
            (
                json!({"x": {"sessionKey": "s", "secret": secret, "path": "/a%2Fb"}}),
                Some("x"),
                "path",
            ),
            (
                json!({"x": {"sessionKey": "s", "secret": secret, "enabled": "yes"}}),
                Some("x"),
                "enabled",
            ),
            (
                json!({"x": {"sessionKey": "s", "secret": secret, "sesionKey": "t"}}),
                Some("x"),
                "sesionKey",
            ),
            (
                json!({"x": {"sessionKey": "", "secret": secret}}),
                Some("x"),
                "sessionKey",
            ),
            (
                json!({"bad id": {"sessionKey": "s", "secret": secret}}),
                Some("bad id"),
                "routeId",
            ),
            (
                json!({"a": {"sessionKey": "s", "secret": secret, "path": "/p"}, "b": {"sessionKey": "s", "secret": secret, "path": "/p"}}),
                Some("b"),
                "path",
            ),
        ] {
            let error = WebhooksConfig::from_plugin_entry(&entry(routes.clone())).unwrap_err();
            assert_eq!(
                (error.route(), error.field()),
                (route, field),
                "{routes}: {error}"
            );
            assert!(!error.to_string().contains(secret), "{error}");
        }
        let error =
            WebhooksConfig::from_plugin_entry(&json!({"enabled": true, "extra": 1})).unwrap_err();
        assert_eq!((error.route(), error.field()), (None, "extra"));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-zA-Z/:._ -]{0,20}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("enabled".to_owned()),
                        Just("config".to_owned()),
                        Just("routes".to_owned()),
                        Just("sessionKey".to_owned()),
                        Just("secret".to_owned()),
                        Just("path".to_owned()),
                        Just("source".to_owned()),
                        Just("id".to_owned()),
                        Just("provider".to_owned()),
                        "[a-z]{1,6}"
                    ],
                    inner,
                    0..5
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_json_is_a_config_or_an_error_never_a_panic(value in json_value()) {
            if let Ok(config) = WebhooksConfig::from_plugin_entry(&value) {
                let mut paths: Vec<_> = config.routes.iter().map(|route| route.path.clone()).collect();
                paths.sort();
                paths.dedup();
                prop_assert_eq!(paths.len(), config.routes.len(), "no two routes on one path");
            }
        }
    }
}
