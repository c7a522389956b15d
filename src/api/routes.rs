//! The route table: every endpoint of the JSON API as data (path, methods,
//! who may call it, handler), and the one dispatcher that reads it.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use http::Method;
use http::header::{ALLOW, HeaderValue};

use super::layer::KeyRoutesConfig;
use super::{accounts, byok, keys, usage};
use crate::answer::Answer;
use crate::auth::Principal;
use crate::error::{ErrorKind, GatewayError};
use crate::keys::{KeyDirectory, input};
use crate::routing::{api_path, normalized_segments, pattern_params};

/// Who may call a route. The dispatcher checks it once, before the
/// handler runs; a handler only narrows what an allowed caller sees (an
/// account's management key, its own account's keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    /// Any key: the route answers about the calling key or its account.
    AnyKey,
    /// The operator's key, or any key of the account the path names
    /// (`{id}`). Its refusal names its one route's action, listing the
    /// account's provider keys.
    AccountKey,
    /// Any management key: the operator's for every account, an account's
    /// for its own (the handler keeps it there).
    Manager,
    /// The operator's key, or the management key of the account the path
    /// names (`{id}`).
    AccountManager,
    /// The operator's management key only; `what` ends "only the
    /// operator's management key can …".
    Operator {
        /// The refused action, as in "create accounts".
        what: &'static str,
    },
}

impl Caller {
    /// Whether only a management key may call the route.
    fn needs_management_key(self) -> bool {
        !matches!(self, Caller::AnyKey | Caller::AccountKey)
    }
}

/// A handler: a small async function from the checked call to its answer.
pub(crate) type Handler = fn(Call) -> BoxFuture<'static, Result<Answer, GatewayError>>;

/// One entry of the route table.
#[derive(Clone, Copy)]
pub(crate) struct Route {
    /// The path: `{name}` takes one segment; other segments match in any
    /// case, after [normalization](crate::routing::normalized_segments).
    pub(crate) path: &'static str,
    /// The methods this entry answers (`HEAD` is answered as `GET`). A
    /// path may have several entries, each for its own methods.
    pub(crate) methods: &'static [Method],
    /// Who may call it.
    pub(crate) caller: Caller,
    /// What a normal key is told in place of the general 403, when this
    /// route needs a management key; `{id}` is the path's account.
    pub(crate) management_key_message: Option<&'static str>,
    /// Answers the call.
    pub(crate) handler: Handler,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Route")
            .field("path", &self.path)
            .field("methods", &self.methods)
            .field("caller", &self.caller)
            .finish_non_exhaustive()
    }
}

/// The JSON API. A path's entries are in the order its `Allow` header
/// names their methods.
pub(crate) static ROUTES: &[Route] = &[
    Route {
        path: api_path::KEY,
        methods: &[Method::GET],
        caller: Caller::AnyKey,
        management_key_message: None,
        handler: |call| Box::pin(keys::key_status(call)),
    },
    Route {
        path: api_path::CREDITS,
        methods: &[Method::GET],
        caller: Caller::AnyKey,
        management_key_message: None,
        handler: |call| Box::pin(accounts::credits(call)),
    },
    Route {
        path: api_path::USER_BALANCE,
        methods: &[Method::GET],
        caller: Caller::AnyKey,
        management_key_message: None,
        handler: |call| Box::pin(accounts::user_balance(call)),
    },
    Route {
        path: api_path::GENERATION,
        methods: &[Method::GET],
        caller: Caller::AnyKey,
        management_key_message: None,
        handler: |call| Box::pin(usage::generation(call)),
    },
    Route {
        path: api_path::GENERATIONS,
        methods: &[Method::GET],
        caller: Caller::AnyKey,
        management_key_message: None,
        handler: |call| Box::pin(usage::recent_generations(call)),
    },
    Route {
        path: api_path::ACTIVITY,
        methods: &[Method::GET],
        caller: Caller::Manager,
        management_key_message: None,
        handler: |call| Box::pin(usage::activity(call)),
    },
    Route {
        path: api_path::APPS,
        methods: &[Method::GET],
        caller: Caller::AnyKey,
        management_key_message: None,
        handler: |call| Box::pin(usage::apps(call)),
    },
    Route {
        path: api_path::KEYS,
        methods: &[Method::GET],
        caller: Caller::Manager,
        management_key_message: None,
        handler: |call| Box::pin(keys::list_keys(call)),
    },
    Route {
        path: api_path::KEYS,
        methods: &[Method::POST],
        caller: Caller::Manager,
        management_key_message: None,
        handler: |call| Box::pin(keys::create_key(call)),
    },
    Route {
        path: api_path::KEYS_HASH,
        methods: &[Method::GET],
        caller: Caller::Manager,
        management_key_message: None,
        handler: |call| Box::pin(keys::get_key(call)),
    },
    Route {
        path: api_path::KEYS_HASH,
        methods: &[Method::PATCH],
        caller: Caller::Manager,
        management_key_message: None,
        handler: |call| Box::pin(keys::update_key(call)),
    },
    Route {
        path: api_path::KEYS_HASH,
        methods: &[Method::DELETE],
        caller: Caller::Manager,
        management_key_message: None,
        handler: |call| Box::pin(keys::delete_key(call)),
    },
    Route {
        path: api_path::KEYS_HASH_LEAKED,
        methods: &[Method::POST],
        caller: Caller::Manager,
        management_key_message: None,
        handler: |call| Box::pin(keys::report_leaked(call)),
    },
    Route {
        path: api_path::KEYS_HASH_ROTATE,
        methods: &[Method::POST],
        caller: Caller::Manager,
        management_key_message: None,
        handler: |call| Box::pin(keys::rotate_key(call)),
    },
    #[cfg(feature = "oauth")]
    Route {
        path: api_path::AUTH_KEYS_CODE,
        methods: &[Method::POST],
        caller: Caller::Manager,
        management_key_message: None,
        handler: |call| Box::pin(keys::approve_app(call)),
    },
    Route {
        path: api_path::ACCOUNTS,
        methods: &[Method::GET],
        caller: Caller::Manager,
        management_key_message: None,
        handler: |call| Box::pin(accounts::list_accounts(call)),
    },
    Route {
        path: api_path::ACCOUNTS,
        methods: &[Method::POST],
        caller: Caller::Operator {
            what: "create accounts",
        },
        management_key_message: None,
        handler: |call| Box::pin(accounts::create_account(call)),
    },
    Route {
        path: api_path::ACCOUNTS_ID,
        methods: &[Method::GET],
        caller: Caller::AccountManager,
        management_key_message: None,
        handler: |call| Box::pin(accounts::get_account(call)),
    },
    Route {
        path: api_path::ACCOUNTS_ID_CREDITS,
        methods: &[Method::POST],
        caller: Caller::Operator {
            what: "add credits to an account",
        },
        management_key_message: None,
        handler: |call| Box::pin(accounts::top_up(call)),
    },
    Route {
        path: api_path::ACCOUNTS_ID_BYOK,
        methods: &[Method::GET],
        caller: Caller::AccountKey,
        management_key_message: None,
        handler: |call| Box::pin(byok::list_provider_keys(call)),
    },
    Route {
        path: api_path::ACCOUNTS_ID_BYOK_PROVIDER,
        methods: &[Method::PUT],
        caller: Caller::AccountManager,
        management_key_message: Some(BYOK_NEEDS_MANAGEMENT_KEY),
        handler: |call| Box::pin(byok::set_provider_key(call)),
    },
    Route {
        path: api_path::ACCOUNTS_ID_BYOK_PROVIDER,
        methods: &[Method::DELETE],
        caller: Caller::AccountManager,
        management_key_message: Some(BYOK_NEEDS_MANAGEMENT_KEY),
        handler: |call| Box::pin(byok::delete_provider_key(call)),
    },
];

/// Setting or deleting a provider key decides who pays for the account's
/// requests; listing them is open to the account's keys.
const BYOK_NEEDS_MANAGEMENT_KEY: &str = "only a management key may set or delete an account's provider keys; ask the gateway's operator, or list them with GET /api/v1/accounts/{id}/byok";

/// What a handler gets: the request's parts, its checked caller and the
/// layer's configuration.
pub(crate) struct Call {
    pub(crate) config: Arc<KeyRoutesConfig>,
    /// The path's `{…}` segments, in order, as sent (normalized).
    pub(crate) params: Vec<String>,
    /// The path's `{id}`, read and allowed by [`Caller::AccountKey`] or
    /// [`Caller::AccountManager`]; `None` on other routes.
    pub(crate) account: Option<String>,
    pub(crate) query: Option<String>,
    pub(crate) principal: Principal,
    /// Every `Idempotency-Key` value the request carries.
    pub(crate) idempotency_keys: Vec<HeaderValue>,
    body: Option<Bytes>,
    pub(crate) now: DateTime<Utc>,
}

impl Call {
    /// The buffered body; a 500 naming BodyLimit when it is not there.
    pub(crate) fn body(&self) -> Result<&[u8], GatewayError> {
        self.body
            .as_deref()
            .ok_or_else(|| GatewayError::missing_layer("KeyRoutes", "BodyLimit"))
    }

    pub(crate) fn directory(&self) -> &KeyDirectory {
        &self.config.directory
    }

    /// The `index`th `{…}` segment of the path.
    pub(crate) fn param(&self, index: usize) -> &str {
        &self.params[index]
    }

    /// The path's account, checked by the route's [`Caller`].
    pub(crate) fn path_account(&self) -> &str {
        self.account
            .as_deref()
            .expect("the route's caller class reads the path's account")
    }
}

/// A request to one of the table's paths, before the dispatcher checks it.
pub(crate) struct Request {
    pub(crate) method: Method,
    pub(crate) query: Option<String>,
    pub(crate) principal: Option<Principal>,
    pub(crate) idempotency_keys: Vec<HeaderValue>,
    pub(crate) body: Option<Bytes>,
}

/// A path of the table, with its entries and parameters.
pub(crate) struct Matched {
    entries: Vec<&'static Route>,
    params: Vec<String>,
}

/// The table's entries for `path` (read the way every route check in the
/// crate reads paths: percent-decoded, dot segments applied; fixed
/// segments in any case); `None` when no route has this path.
pub(crate) fn match_path(path: &str) -> Option<Matched> {
    let segments = normalized_segments(path);
    let mut matched: Option<Matched> = None;
    for route in ROUTES {
        if let Some(params) = pattern_params(route.path, &segments) {
            match &mut matched {
                Some(matched) => matched.entries.push(route),
                None => {
                    matched = Some(Matched {
                        entries: vec![route],
                        params: params.into_iter().map(str::to_owned).collect(),
                    })
                }
            }
        }
    }
    matched
}

/// Answers one request to a path of the table: the method, then the
/// caller against the entry's class (the management rate counted between
/// "is it a management key" and the rest of the check, so a call refused
/// for another account counts too), then the handler.
pub(crate) async fn dispatch(
    config: Arc<KeyRoutesConfig>,
    matched: Matched,
    mut request: Request,
) -> Result<Answer, GatewayError> {
    // HEAD is GET without the body; the server drops the body.
    if request.method == Method::HEAD {
        request.method = Method::GET;
    }
    let Some(route) = matched
        .entries
        .iter()
        .find(|route| route.methods.contains(&request.method))
    else {
        return Err(method_not_allowed(&matched.entries));
    };
    let Some(principal) = request.principal else {
        return Err(GatewayError::missing_layer("KeyRoutes", "BearerAuth"));
    };
    let account = admit(&config, route, &matched.params, &principal).await?;
    let now = config.directory.now();
    let call = Call {
        config: Arc::clone(&config),
        params: matched.params,
        account,
        query: request.query,
        principal,
        idempotency_keys: request.idempotency_keys,
        body: request.body,
        now,
    };
    (route.handler)(call).await
}

/// 405 naming the methods of the path's entries, `HEAD` after `GET`.
fn method_not_allowed(entries: &[&'static Route]) -> GatewayError {
    let mut allow: Vec<&str> = Vec::new();
    for route in entries {
        for method in route.methods {
            allow.push(method.as_str());
            if *method == Method::GET {
                allow.push("HEAD");
            }
        }
    }
    let allow = allow.join(", ");
    GatewayError::new(
        ErrorKind::MethodNotAllowed,
        format!("this endpoint answers {allow} only"),
    )
    .with_header(
        ALLOW,
        HeaderValue::from_str(&allow).expect("method names are valid header text"),
    )
}

/// Checks `principal` against the route's [`Caller`]; the path's account
/// when the class reads one.
async fn admit(
    config: &KeyRoutesConfig,
    route: &Route,
    params: &[String],
    principal: &Principal,
) -> Result<Option<String>, GatewayError> {
    if route.caller.needs_management_key() && !principal.management {
        let message = match route.management_key_message {
            Some(message) => Cow::Owned(message.replace("{id}", &params[0])),
            None => Cow::Borrowed(
                "this endpoint needs a management key; the key used is a normal API key",
            ),
        };
        return Err(GatewayError::new(ErrorKind::Forbidden, message)
            .with_metadata("reason", "management_key_required"));
    }
    // Before any other store call: a flooding account costs one counter step.
    if let Some(rate) = &config.management_rate {
        rate.admit(principal).await?;
    }
    match route.caller {
        Caller::AnyKey | Caller::Manager => Ok(None),
        Caller::Operator { .. } if principal.operator => Ok(None),
        Caller::Operator { what } => Err(operator_only(what)),
        Caller::AccountKey => {
            let account = input::path_account_id(&params[0])?;
            if principal.operator || principal.account_id == account {
                Ok(Some(account))
            } else {
                Err(GatewayError::new(
                    ErrorKind::Forbidden,
                    "a key can list only its own account's provider keys; use a key of that account or a management key",
                )
                .with_metadata("reason", "other_account"))
            }
        }
        Caller::AccountManager => {
            let account = input::path_account_id(&params[0])?;
            if principal.operator || (principal.management && principal.account_id == account) {
                Ok(Some(account))
            } else {
                Err(other_account(principal))
            }
        }
    }
}

/// 403: a management key of one account naming another.
pub(crate) fn other_account(principal: &Principal) -> GatewayError {
    GatewayError::new(
        ErrorKind::Forbidden,
        format!(
            "this management key manages the account {} only",
            principal.account_id
        ),
    )
    .with_metadata("reason", "other_account")
}

/// 403: what only the operator's management key may do.
pub(crate) fn operator_only(what: &str) -> GatewayError {
    GatewayError::new(
        ErrorKind::Forbidden,
        format!("only the operator's management key can {what}; an account's management key manages that account's keys"),
    )
    .with_metadata("reason", "operator_only")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The route `path` names, as its table path and parameters.
    fn route_of(path: &str) -> Option<(&'static str, Vec<String>)> {
        match_path(path).map(|matched| (matched.entries[0].path, matched.params))
    }

    #[test]
    fn routes_match_every_spelling_of_their_path() {
        let hash = "ab".repeat(32);
        let route = |path: &'static str, params: &[&str]| {
            Some((path, params.iter().map(|param| param.to_string()).collect()))
        };
        for (path, expected) in [
            ("/api/v1/key", route("/api/v1/key", &[])),
            ("/api/v1/key/", route("/api/v1/key", &[])),
            ("/API/v1/Key", route("/api/v1/key", &[])),
            ("/api/v1/credits", route("/api/v1/credits", &[])),
            ("/user/balance", route("/user/balance", &[])),
            ("/api/v1/Activity/", route("/api/v1/activity", &[])),
            ("//api/./v1/keys", route("/api/v1/keys", &[])),
            ("/api/v1/%6beys", route("/api/v1/keys", &[])),
            #[cfg(feature = "oauth")]
            (
                "/API/v1/auth/Keys/code/",
                route("/api/v1/auth/keys/code", &[]),
            ),
            ("/api/v1/auth/keys", None),
            (
                &format!("/api/v1/keys/{hash}"),
                route("/api/v1/keys/{hash}", &[&hash]),
            ),
            (
                "/api/v1/accounts/acme/credits",
                route("/api/v1/accounts/{id}/credits", &["acme"]),
            ),
            ("/api/v1/x/../keys", route("/api/v1/keys", &[])),
            (
                "/api/v1/accounts/Team-A/byok",
                route("/api/v1/accounts/{id}/byok", &["Team-A"]),
            ),
            (
                "/API/v1/accounts/acme/BYOK/OpenAI/",
                route("/api/v1/accounts/{id}/byok/{provider}", &["acme", "OpenAI"]),
            ),
            ("/api/v1/accounts/acme/byok/openai/x", None),
            ("/api/v1/keys/a/b", None),
            ("/api/v1/chat/completions", None),
            ("/api/v2/key", None),
            ("/", None),
        ] {
            assert_eq!(route_of(path), expected, "{path}");
        }
    }

    /// Two entries answering one path and method would leave the second
    /// unreachable, its caller class never checked.
    #[test]
    fn no_two_entries_answer_the_same_path_and_method() {
        fn overlap(one: &str, other: &str) -> bool {
            let one: Vec<&str> = one.split('/').filter(|part| !part.is_empty()).collect();
            let other: Vec<&str> = other.split('/').filter(|part| !part.is_empty()).collect();
            let is_param = |part: &str| part.starts_with('{');
            one.len() == other.len()
                && one
                    .iter()
                    .zip(&other)
                    .all(|(a, b)| is_param(a) || is_param(b) || a.eq_ignore_ascii_case(b))
        }
        for (at, route) in ROUTES.iter().enumerate() {
            assert!(!route.methods.is_empty(), "{route:?}");
            assert!(
                !route.methods.contains(&Method::HEAD),
                "HEAD is GET's: {route:?}"
            );
            for other in &ROUTES[at + 1..] {
                if overlap(route.path, other.path) {
                    assert!(
                        route
                            .methods
                            .iter()
                            .all(|method| !other.methods.contains(method)),
                        "{route:?} and {other:?} answer the same path and method"
                    );
                }
            }
        }
        for route in ROUTES {
            // `admit` reads the path's account as its first parameter.
            let reads_account = matches!(route.caller, Caller::AccountKey | Caller::AccountManager)
                || route.management_key_message.is_some();
            assert!(
                !reads_account
                    || route.path.split('/').find(|part| part.starts_with('{')) == Some("{id}"),
                "{route:?} reads the account from its first parameter, which is not {{id}}"
            );
            // KeyRoutes passes a parsed chat request on unmatched.
            assert!(
                !(route.methods.contains(&Method::POST)
                    && route.path.ends_with("chat/completions")),
                "{route:?} would be skipped as a chat request"
            );
        }
        // The check itself tells overlapping paths apart.
        assert!(overlap("/api/v1/keys/{hash}", "/API/v1/keys/abc"));
        assert!(!overlap(
            "/api/v1/keys/{hash}",
            "/api/v1/keys/{hash}/leaked"
        ));
    }

    /// BearerAuth lets management keys through to exactly the table's
    /// paths: a route it did not know would be closed to them, a path it
    /// knew that the table lost would be open to them and answered by the
    /// service below.
    #[test]
    fn bearer_auth_opens_to_management_keys_exactly_the_tables_paths() {
        let table: std::collections::BTreeSet<&str> =
            ROUTES.iter().map(|route| route.path).collect();
        let bearer: std::collections::BTreeSet<&str> =
            crate::routing::API_PATHS.iter().copied().collect();
        assert_eq!(table, bearer);
    }

    proptest! {
        #[test]
        fn any_path_routes_as_its_normal_form_does(path in "(/|[a-zA-Z0-9.%]{0,6}){0,8}") {
            let normal = format!("/{}", normalized_segments(&path).join("/"));
            prop_assert_eq!(route_of(&path), route_of(&normal));
        }

        #[test]
        fn no_path_panics_the_router(path in "\\PC{0,60}") {
            let _ = route_of(&path);
        }
    }
}
