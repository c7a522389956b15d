//! The endpoints KeyRoutes answers, as async functions from a parsed
//! request to a JSON response.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures_util::future::{try_join, try_join_all};
use http::header::{HeaderName, HeaderValue, ALLOW};
use http::{Method, StatusCode};
use serde_json::{json, Map, Value};

use super::byok::{ByokEntry, ByokError};
use super::credits::{decimal_string, nanos_to_json};
use super::directory::{KeyDirectory, LeakOutcome};
use super::input;
use super::layer::{ByokProviders, KeyRoutesConfig};
use super::record::{AccountRecord, KeyRecord, LeakReport, DEFAULT_ACCOUNT};
use crate::answer::Answer;
use crate::auth::{KeyHash, Principal};
use crate::body::{lowercase_segments, normalized_segments};
use crate::error::{ErrorKind, GatewayError};
use crate::store::{AccountBalance, FailurePolicy, KeyUsage, StoreError, TopUpOutcome};
use crate::usage::handlers as usage;

/// An endpoint of KeyRoutes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `GET /api/v1/key`
    KeyStatus,
    /// `GET /api/v1/credits`
    Credits,
    /// `GET /user/balance`
    UserBalance,
    /// `GET` and `POST /api/v1/keys`
    Keys,
    /// `GET`, `PATCH` and `DELETE /api/v1/keys/{hash}`
    Key(String),
    /// `POST /api/v1/keys/{hash}/leaked`
    KeyLeaked(String),
    /// `POST /api/v1/auth/keys/code`: a management key approves an app
    /// ([`crate::oauth`]).
    AuthCode,
    /// `GET` and `POST /api/v1/accounts`
    Accounts,
    /// `GET /api/v1/accounts/{id}`
    Account(String),
    /// `POST /api/v1/accounts/{id}/credits`
    AccountCredits(String),
    /// `GET /api/v1/accounts/{id}/byok`
    ByokKeys(String),
    /// `PUT` and `DELETE /api/v1/accounts/{id}/byok/{provider}`: account,
    /// provider; management keys only.
    ByokKey(String, String),
    /// `GET /api/v1/generation?id=`
    Generation,
    /// `GET /api/v1/generations`
    Generations,
    /// `GET /api/v1/apps`
    Apps,
}

impl Route {
    /// The route `path` names, read the way every route check in the crate
    /// reads paths (percent-decoded, dot segments applied); fixed segments
    /// in any case.
    pub(crate) fn of(path: &str) -> Option<Route> {
        let segments = normalized_segments(path);
        let lower = lowercase_segments(&segments);
        let lower: Vec<&str> = lower.iter().map(AsRef::as_ref).collect();
        match lower.as_slice() {
            ["api", "v1", "key"] => Some(Route::KeyStatus),
            ["api", "v1", "generation"] => Some(Route::Generation),
            ["api", "v1", "generations"] => Some(Route::Generations),
            ["api", "v1", "apps"] => Some(Route::Apps),
            ["api", "v1", "credits"] => Some(Route::Credits),
            ["user", "balance"] => Some(Route::UserBalance),
            ["api", "v1", "keys"] => Some(Route::Keys),
            ["api", "v1", "keys", _] => Some(Route::Key(segments[3].to_string())),
            ["api", "v1", "keys", _, "leaked"] => Some(Route::KeyLeaked(segments[3].to_string())),
            ["api", "v1", "auth", "keys", "code"] => Some(Route::AuthCode),
            ["api", "v1", "accounts"] => Some(Route::Accounts),
            ["api", "v1", "accounts", _] => Some(Route::Account(segments[3].to_string())),
            ["api", "v1", "accounts", _, "credits"] => {
                Some(Route::AccountCredits(segments[3].to_string()))
            }
            ["api", "v1", "accounts", _, "byok"] => Some(Route::ByokKeys(segments[3].to_string())),
            ["api", "v1", "accounts", _, "byok", _] => Some(Route::ByokKey(
                segments[3].to_string(),
                segments[5].to_string(),
            )),
            _ => None,
        }
    }

    fn methods(&self) -> &'static [Method] {
        match self {
            Route::KeyStatus
            | Route::Credits
            | Route::UserBalance
            | Route::Generation
            | Route::Generations
            | Route::Apps => &[Method::GET],
            Route::Keys | Route::Accounts => &[Method::GET, Method::POST],
            Route::Account(_) => &[Method::GET],
            Route::Key(_) => &[Method::GET, Method::PATCH, Method::DELETE],
            Route::AccountCredits(_) | Route::KeyLeaked(_) => &[Method::POST],
            Route::AuthCode => &[Method::POST],
            Route::ByokKeys(_) => &[Method::GET],
            Route::ByokKey(..) => &[Method::PUT, Method::DELETE],
        }
    }

    /// Routes for a management key only. Setting or deleting a provider
    /// key is one of them: it decides who pays for the account's requests.
    /// Listing them is open to the keys of that account too (checked once
    /// the id is read).
    fn needs_management_key(&self) -> bool {
        matches!(
            self,
            Route::Keys
                | Route::Key(_)
                | Route::KeyLeaked(_)
                | Route::AuthCode
                | Route::Accounts
                | Route::Account(_)
                | Route::AccountCredits(_)
                | Route::ByokKey(..)
        )
    }

    /// The 403 for a normal key on a management route.
    fn management_key_required(&self) -> GatewayError {
        let message = match self {
            Route::ByokKey(account, _) => format!(
                "only a management key may set or delete an account's provider keys; ask the gateway's operator, or list them with GET /api/v1/accounts/{account}/byok"
            ),
            _ => "this endpoint needs a management key; the key used is a normal API key".to_owned(),
        };
        GatewayError::new(ErrorKind::Forbidden, message)
            .with_metadata("reason", "management_key_required")
    }
}

/// 422: an `Idempotency-Key` sent again with another amount. Nothing was
/// credited; the key stays bound to its first amount until forgotten.
fn idempotency_key_reused(account: &str, first_amount_nanos: i64) -> GatewayError {
    GatewayError::new(
        ErrorKind::InvalidParameter,
        format!(
            "this Idempotency-Key was already used for a top-up of {} credits to the account {account}; nothing was credited. A retry must send the same amount; a new purchase needs a new key",
            decimal_string(first_amount_nanos, 0)
        ),
    )
    .with_metadata("param", input::IDEMPOTENCY_KEY_HEADER)
    .with_metadata("reason", "idempotency_key_reused")
}

/// What a handler needs from the request.
pub(crate) struct Call {
    pub(crate) route: Route,
    pub(crate) method: Method,
    pub(crate) query: Option<String>,
    pub(crate) principal: Option<Principal>,
    /// Every `Idempotency-Key` value the request carries.
    pub(crate) idempotency_keys: Vec<HeaderValue>,
    pub(crate) body: Option<Bytes>,
}

/// A JSON answer: status, body and extra headers.
impl Answer {
    fn ok(body: Value) -> Self {
        Answer {
            status: StatusCode::OK,
            body,
            headers: Vec::new(),
        }
    }
}

/// Answers one call to a KeyRoutes endpoint.
pub(crate) async fn handle(
    config: &KeyRoutesConfig,
    mut call: Call,
) -> Result<Answer, GatewayError> {
    // HEAD is GET without the body; the server drops the body.
    if call.method == Method::HEAD {
        call.method = Method::GET;
    }
    let allowed = call.route.methods();
    if !allowed.contains(&call.method) {
        let mut allow = allowed.iter().map(Method::as_str).collect::<Vec<_>>();
        if allowed.contains(&Method::GET) {
            allow.insert(1, "HEAD");
        }
        let allow = allow.join(", ");
        return Err(GatewayError::new(
            ErrorKind::MethodNotAllowed,
            format!("this endpoint answers {allow} only"),
        )
        .with_header(
            ALLOW,
            HeaderValue::from_str(&allow).expect("method names are valid header text"),
        ));
    }
    let Some(principal) = call.principal else {
        return Err(GatewayError::missing_layer("KeyRoutes", "BearerAuth"));
    };
    if call.route.needs_management_key() && !principal.management {
        return Err(call.route.management_key_required());
    }
    // Before any other store call: a flooding account costs one counter step.
    if let Some(rate) = &config.management_rate {
        rate.admit(&principal).await?;
    }
    let body = || {
        call.body
            .as_deref()
            .ok_or_else(|| GatewayError::missing_layer("KeyRoutes", "BodyLimit"))
    };
    let directory = &config.directory;
    let refuse = |error: StoreError| FailurePolicy::refusal("KeyRoutes", &error);
    let now = directory.now();
    match (&call.route, &call.method) {
        (Route::KeyStatus, _) => key_status(config, &principal, now).await,
        (Route::Generation, _) => {
            usage::generation(directory.store(), &principal, call.query.as_deref(), now).await
        }
        (Route::Generations, _) => {
            usage::recent_generations(directory.store(), &principal, call.query.as_deref(), now)
                .await
        }
        (Route::Apps, _) => {
            usage::apps(
                directory.store(),
                config.app_ranking.as_ref(),
                config.public_ranking,
                &principal,
                call.query.as_deref(),
                now,
            )
            .await
        }
        (Route::AuthCode, _) => {
            crate::oauth::issue_code(directory, config.approval_rules, &principal, body()?).await
        }
        (Route::Credits, _) => {
            let balance = directory
                .store()
                .account_balance(&principal.account_id)
                .await
                .map_err(refuse)?;
            Ok(Answer::ok(json!({"data": {
                "total_credits": nanos_to_json(balance.purchased_nanos),
                "total_usage": nanos_to_json(balance.purchased_nanos.saturating_sub(balance.balance_nanos)),
            }})))
        }
        (Route::UserBalance, _) => {
            let balance = directory
                .store()
                .account_balance(&principal.account_id)
                .await
                .map_err(refuse)?;
            let total = decimal_string(balance.balance_nanos, 2);
            Ok(Answer::ok(json!({
                "is_available": balance.balance_nanos > 0,
                "balance_infos": [{
                    "currency": "CREDITS",
                    "total_balance": total,
                    "granted_balance": decimal_string(0, 2),
                    "topped_up_balance": total,
                }],
            })))
        }
        (Route::Keys, &Method::POST) => {
            let mut new = match input::new_key(body()?, now) {
                // Only the operator names the account of a management key;
                // anyone else asking for one is told it is not theirs to make.
                Err(error)
                    if !principal.operator
                        && error.metadata().get("reason")
                            == Some(&Value::from("account_required")) =>
                {
                    return Err(operator_only("create management keys"));
                }
                parsed => parsed?,
            };
            if !principal.operator {
                if new.management {
                    return Err(operator_only("create management keys"));
                }
                if new.account != DEFAULT_ACCOUNT && new.account != principal.account_id {
                    return Err(other_account(&principal));
                }
                // An account's management key makes keys for its account.
                new.account = principal.account_id.clone();
            } else if new.account != DEFAULT_ACCOUNT
                && !directory
                    .account_exists(&new.account)
                    .await
                    .map_err(refuse)?
            {
                // Accounts are made by POST /api/v1/accounts only: a
                // mistyped id must not make a new free-tier account.
                return Err(unknown_account(&new.account));
            }
            let (key, record) = directory.create_key(new).await.map_err(refuse)?;
            Ok(Answer {
                status: StatusCode::CREATED,
                body: json!({
                    "key": key.expose(),
                    "data": key_json(&record, &KeyUsage::default(), false),
                }),
                // The plaintext is shown once; every answer is `no-store`.
                headers: Vec::new(),
            })
        }
        (Route::Keys, _) => {
            let mut query = input::list_query(call.query.as_deref())?;
            if !principal.operator {
                if query
                    .account
                    .as_ref()
                    .is_some_and(|account| *account != principal.account_id)
                {
                    return Err(other_account(&principal));
                }
                query.account = Some(principal.account_id.clone());
            }
            let records = directory
                .list(
                    query.offset,
                    query.include_disabled,
                    query.account.as_deref(),
                    input::KEYS_PER_PAGE,
                )
                .await
                .map_err(refuse)?;
            let usages = try_join_all(records.iter().map(|record| {
                directory
                    .store()
                    .key_usage(&record.account, &record.hash, now)
            }))
            .await
            .map_err(refuse)?;
            let data: Vec<Value> = records
                .iter()
                .zip(&usages)
                .map(|(record, usage)| key_json(record, usage, is_current(&principal, record)))
                .collect();
            Ok(Answer::ok(json!({ "data": data })))
        }
        (Route::KeyLeaked(hash), _) => {
            let hash = path_hash(hash)?;
            let (url, source) = input::leak_report(body()?)?;
            refuse_own_key(&principal, &hash, "report itself leaked")?;
            readable_key(directory, &principal, &hash)
                .await
                .map_err(refuse)??;
            let report = LeakReport {
                reported_at: now,
                reported_by: "operator".to_owned(),
                url,
                source,
            };
            let outcome = super::leak::report_leak(
                directory,
                &config.leak_notifier,
                &hash,
                &report,
                super::leak::MODELGATE_TOKEN_TYPE,
            )
            .await
            .map_err(refuse)?;
            let LeakOutcome::Revoked { record, .. } = outcome else {
                return Err(no_such_key());
            };
            let usage = directory
                .store()
                .key_usage(&record.account, &record.hash, now)
                .await
                .map_err(refuse)?;
            let current = is_current(&principal, &record);
            Ok(Answer::ok(
                json!({ "data": key_json(&record, &usage, current) }),
            ))
        }
        (Route::Key(hash), method) => {
            let hash = path_hash(hash)?;
            let checked = readable_key(directory, &principal, &hash)
                .await
                .map_err(refuse)??;
            let update = match *method {
                Method::PATCH => Some(input::key_update(body()?)?),
                _ => None,
            };
            if *method == Method::DELETE {
                refuse_own_key(&principal, &hash, "delete itself")?;
            }
            if update
                .as_ref()
                .is_some_and(|update| update.disabled == Some(true))
            {
                refuse_own_key(&principal, &hash, "disable itself")?;
            }
            if update
                .as_ref()
                .is_some_and(|update| update.disabled == Some(false))
            {
                refuse_enabling_a_leaked_key(directory, &hash, checked.as_ref())
                    .await
                    .map_err(refuse)??;
            }
            let record = match (method, update) {
                (&Method::DELETE, _) => {
                    return if directory.delete(&hash).await.map_err(refuse)? {
                        Ok(Answer::ok(json!({"deleted": true})))
                    } else {
                        Err(no_such_key())
                    };
                }
                (_, Some(update)) => directory.update(&hash, &update).await.map_err(refuse)?,
                _ => match checked {
                    Some(record) => Some(record),
                    None => directory
                        .get(&hash)
                        .await
                        .map_err(refuse)?
                        .map(|versioned| versioned.value),
                },
            };
            let record = record.ok_or_else(no_such_key)?;
            let usage = directory
                .store()
                .key_usage(&record.account, &record.hash, now)
                .await
                .map_err(refuse)?;
            let current = is_current(&principal, &record);
            Ok(Answer::ok(
                json!({ "data": key_json(&record, &usage, current) }),
            ))
        }
        (Route::Accounts, &Method::POST) => {
            if !principal.operator {
                return Err(operator_only("create accounts"));
            }
            let new = input::new_account(body()?)?;
            let id = new.id.clone();
            let Some(account) = directory.create_account(new).await.map_err(refuse)? else {
                return Err(GatewayError::new(
                    ErrorKind::InvalidParameter,
                    format!(
                        "the account {id} exists already; read it with GET /api/v1/accounts/{id}"
                    ),
                )
                .with_metadata("param", "id")
                .with_metadata("reason", "account_exists"));
            };
            let balance = directory
                .store()
                .account_balance(&account.id)
                .await
                .map_err(refuse)?;
            Ok(Answer {
                status: StatusCode::CREATED,
                body: json!({ "data": account_json(&account, &balance) }),
                headers: Vec::new(),
            })
        }
        (Route::Accounts, _) => {
            let accounts = if principal.operator {
                let query = input::list_query(call.query.as_deref())?;
                directory
                    .accounts(query.offset, input::KEYS_PER_PAGE)
                    .await
                    .map_err(refuse)?
            } else {
                directory
                    .account(&principal.account_id)
                    .await
                    .map_err(refuse)?
                    .into_iter()
                    .collect()
            };
            let balances = try_join_all(
                accounts
                    .iter()
                    .map(|account| directory.store().account_balance(&account.id)),
            )
            .await
            .map_err(refuse)?;
            let data: Vec<Value> = accounts
                .iter()
                .zip(&balances)
                .map(|(account, balance)| account_json(account, balance))
                .collect();
            Ok(Answer::ok(json!({ "data": data })))
        }
        (Route::Account(account), _) => {
            let account = managed_account(&principal, account)?;
            let record = directory
                .account(&account)
                .await
                .map_err(refuse)?
                .ok_or_else(|| no_such_account(&account))?;
            let (balance, free) = free_model_requests(config, &account, now).await?;
            let mut data = account_json(&record, &balance);
            if let Value::Object(fields) = &mut data {
                fields.extend(free);
            }
            Ok(Answer::ok(json!({ "data": data })))
        }
        (Route::AccountCredits(account), _) => {
            if !principal.operator {
                return Err(operator_only("add credits to an account"));
            }
            let account = input::path_account_id(account)?;
            let amount_nanos = input::purchase_nanos(body()?)?;
            let idempotency_key =
                input::idempotency_key(call.idempotency_keys.iter().map(HeaderValue::as_bytes))?;
            let account = existing_account(directory, account).await?;
            let (balance, repeated) = match idempotency_key {
                None => (
                    directory
                        .top_up(&account, amount_nanos)
                        .await
                        .map_err(refuse)?,
                    false,
                ),
                Some(key) => match directory
                    .top_up_once(&account, amount_nanos, &key)
                    .await
                    .map_err(refuse)?
                {
                    TopUpOutcome::Credited(balance) => (balance, false),
                    TopUpOutcome::Repeated(balance) => (balance, true),
                    TopUpOutcome::KeyReused { first_amount_nanos } => {
                        return Err(idempotency_key_reused(&account, first_amount_nanos));
                    }
                },
            };
            let answer = Answer::ok(json!({"data": {
                "account": account,
                "total_credits": nanos_to_json(balance.purchased_nanos),
                "total_usage": nanos_to_json(balance.purchased_nanos.saturating_sub(balance.balance_nanos)),
                "balance": nanos_to_json(balance.balance_nanos),
            }}));
            // The first answer again, marked as a replay (as payment APIs do).
            Ok(if repeated {
                answer.with_header(
                    HeaderName::from_static("idempotent-replayed"),
                    HeaderValue::from_static("true"),
                )
            } else {
                answer
            })
        }
        (Route::ByokKeys(account), _) => {
            let account = existing_account(directory, own_account(&principal, account)?).await?;
            let entries = config.byok.list(&account).await.map_err(refuse)?;
            let data: Vec<Value> = entries.iter().map(byok_json).collect();
            Ok(Answer::ok(json!({ "data": data })))
        }
        (Route::ByokKey(account, provider), method) => {
            let account =
                existing_account(directory, managed_account(&principal, account)?).await?;
            let provider = input::path_provider(provider)?;
            if *method == Method::DELETE {
                return if config
                    .byok
                    .delete(&account, &provider)
                    .await
                    .map_err(refuse)?
                {
                    Ok(Answer::ok(json!({"deleted": true})))
                } else {
                    Err(GatewayError::new(
                        ErrorKind::NotFound,
                        format!(
                            "the account {account} has no key for the provider {provider}; list its keys with GET /api/v1/accounts/{account}/byok"
                        ),
                    ))
                };
            }
            accepts_byok_key(&config.byok_providers, &provider)?;
            let api_key = input::byok_key(body()?)?;
            let entry = config
                .byok
                .set(&account, &provider, &api_key)
                .await
                .map_err(|error| match error {
                    ByokError::Store(error) => refuse(error),
                    ByokError::TooManyKeys => {
                        GatewayError::new(ErrorKind::InvalidRequest, error.to_string())
                            .with_metadata("param", "provider")
                    }
                    ByokError::InvalidKey(problem) => {
                        GatewayError::new(ErrorKind::InvalidParameter, format!("`key` {problem}"))
                            .with_metadata("param", "key")
                    }
                    // The path was checked above; kept exact all the same.
                    other => GatewayError::new(ErrorKind::InvalidRequest, other.to_string()),
                })?;
            // The key itself is never answered, only its hint.
            Ok(Answer::ok(json!({ "data": byok_json(&entry) })))
        }
    }
}

/// Whether a key for `provider` (lower case) would be sent in place of the
/// gateway's credential: one that never is, or is sent beside it, would
/// only turn the account's requests into unpaid BYOK usage.
fn accepts_byok_key(providers: &ByokProviders, provider: &str) -> Result<(), GatewayError> {
    match providers {
        ByokProviders::Any => Ok(()),
        ByokProviders::Configured { byok, .. } if byok.contains(provider) => Ok(()),
        ByokProviders::Configured { byok, others } if others.contains(provider) => {
            let what_to_do = if byok.is_empty() {
                "this gateway takes no provider keys".to_owned()
            } else {
                let names = byok.iter().map(String::as_str).collect::<Vec<_>>();
                format!("it takes keys for: {}", names.join(", "))
            };
            Err(GatewayError::new(
                ErrorKind::InvalidParameter,
                format!(
                    "the provider {provider} is reached with the gateway's own credential and does not take an account's key, so nothing was stored; {what_to_do}. The operator can allow it with \"byok\": true in the provider's section of the config, where its credential is its api_key"
                ),
            )
            .with_metadata("param", "provider")
            .with_metadata("reason", "byok_not_allowed"))
        }
        ByokProviders::Configured { byok, .. } => {
            let what_to_do = if byok.is_empty() {
                "this gateway takes no provider keys".to_owned()
            } else {
                let names = byok.iter().map(String::as_str).collect::<Vec<_>>();
                format!("set a key for one of the providers that take one: {}", names.join(", "))
            };
            Err(GatewayError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "the provider {provider} is not configured on this gateway, so its key would never be sent; {what_to_do}"
                ),
            )
            .with_metadata("param", "provider")
            .with_metadata("reason", "unknown_provider"))
        }
        ByokProviders::SingleUpstream => Err(GatewayError::new(
            ErrorKind::InvalidRequest,
            format!(
                "this gateway sends every request to its one upstream with its own upstream key, so a provider key for {provider} would never be sent; to let accounts bring their own keys, the operator must add a `providers` section to the gateway's config naming the provider {provider}"
            ),
        )
        .with_metadata("param", "provider")
        .with_metadata("reason", "byok_needs_providers")),
    }
}

/// The account id of a path, when `principal` manages that account: the
/// operator's key, or that account's management key.
fn managed_account(principal: &Principal, account: &str) -> Result<String, GatewayError> {
    let account = input::path_account_id(account)?;
    if principal.operator || (principal.management && principal.account_id == account) {
        Ok(account)
    } else {
        Err(other_account(principal))
    }
}

/// 403: a management key of one account naming another.
fn other_account(principal: &Principal) -> GatewayError {
    GatewayError::new(
        ErrorKind::Forbidden,
        format!(
            "this management key manages the account {} only",
            principal.account_id
        ),
    )
    .with_metadata("reason", "other_account")
}

/// 422: a key for an account that does not exist. Accounts are made by
/// `POST /api/v1/accounts`; only `default` exists without it.
pub(crate) fn unknown_account(account: &str) -> GatewayError {
    GatewayError::new(
        ErrorKind::InvalidParameter,
        format!("there is no account {account}; create it first with POST /api/v1/accounts"),
    )
    .with_metadata("param", "account")
    .with_metadata("reason", "unknown_account")
}

/// `account` (a path's) when it exists: no route but `POST
/// /api/v1/accounts` makes an account, so a mistyped id in a path is 404
/// rather than credits or provider keys kept for nobody. `default` always
/// exists.
async fn existing_account(
    directory: &KeyDirectory,
    account: String,
) -> Result<String, GatewayError> {
    let exists = account == DEFAULT_ACCOUNT
        || directory
            .account_exists(&account)
            .await
            .map_err(|error| FailurePolicy::refusal("KeyRoutes", &error))?;
    if exists {
        Ok(account)
    } else {
        Err(no_such_account(&account))
    }
}

/// 404: an account's path naming an account that does not exist.
fn no_such_account(account: &str) -> GatewayError {
    GatewayError::new(
        ErrorKind::NotFound,
        format!("there is no account {account}; create it first with POST /api/v1/accounts"),
    )
    .with_metadata("reason", "unknown_account")
}

/// 409 when the key `hash` is the calling key itself: a key that disabled,
/// deleted or reported itself would lock out whoever uses it (the
/// operator's, everyone). `what` is the refused action, as in "a key cannot
/// {what}".
fn refuse_own_key(principal: &Principal, hash: &KeyHash, what: &str) -> Result<(), GatewayError> {
    if principal.key_hash != *hash {
        return Ok(());
    }
    let rotate = if principal.operator {
        "To replace the operator's key, make a new one with `proxy keygen`, set it as MODELGATE_ADMIN_KEY and restart, then disable or delete this one with the new key; if the key is lost or leaked, run `proxy reset-operator-key`"
    } else {
        "To rotate it, create a new key, switch to it, then disable or delete this one with the new key"
    };
    Err(GatewayError::new(
        ErrorKind::Conflict,
        format!("a key cannot {what}: it is the key this request was made with. {rotate}."),
    )
    .with_metadata("reason", "own_key"))
}

/// Whether `record` is the key `principal` called with.
fn is_current(principal: &Principal, record: &KeyRecord) -> bool {
    KeyHash::from_hex(&record.hash).is_some_and(|hash| hash == principal.key_hash)
}

/// 403: what only the operator's management key may do.
fn operator_only(what: &str) -> GatewayError {
    GatewayError::new(
        ErrorKind::Forbidden,
        format!("only the operator's management key can {what}; an account's management key manages that account's keys"),
    )
    .with_metadata("reason", "operator_only")
}

/// An account as the API shows it, with its balance.
fn account_json(account: &AccountRecord, balance: &AccountBalance) -> Value {
    json!({
        "id": account.id,
        "name": account.name,
        "email": account.email,
        "created_at": timestamp(Some(account.created_at)),
        "balance": nanos_to_json(balance.balance_nanos),
        "total_credits": nanos_to_json(balance.purchased_nanos),
        "total_usage": nanos_to_json(balance.purchased_nanos.saturating_sub(balance.balance_nanos)),
    })
}

/// The account's balance, and its free tier and free-model requests today:
/// `is_free_tier` and `free_model_daily_requests` `{used, limit, remaining}`.
async fn free_model_requests(
    config: &KeyRoutesConfig,
    account: &str,
    now: DateTime<Utc>,
) -> Result<(AccountBalance, Map<String, Value>), GatewayError> {
    let store = config.directory.store();
    // Reading the daily counter does not depend on its limit: both reads
    // go out together.
    let peek = [config.free_quota.daily_check(0, 0)];
    let (balance, free) = try_join(
        store.account_balance(account),
        store.check_and_add(account, &peek, now),
    )
    .await
    .map_err(|error| FailurePolicy::refusal("KeyRoutes", &error))?;
    let daily_limit = config
        .free_quota
        .requests_per_day_for(balance.purchased_nanos);
    let used = free.outcomes.first().map_or(0, |outcome| outcome.used);
    let mut fields = Map::new();
    fields.insert(
        "is_free_tier".into(),
        Value::from(balance.purchased_nanos == 0),
    );
    fields.insert(
        "free_model_daily_requests".into(),
        json!({
            "used": used,
            "limit": daily_limit,
            "remaining": daily_limit.saturating_sub(used),
        }),
    );
    Ok((balance, fields))
}

/// The account id of a BYOK path, when `principal` may read its keys:
/// the operator's key, or a key of that same account.
fn own_account(principal: &Principal, account: &str) -> Result<String, GatewayError> {
    let account = input::path_account_id(account)?;
    if principal.operator || principal.account_id == account {
        Ok(account)
    } else {
        Err(GatewayError::new(
            ErrorKind::Forbidden,
            "a key can list only its own account's provider keys; use a key of that account or a management key",
        )
        .with_metadata("reason", "other_account"))
    }
}

/// A provider key as the API shows it: its hint, never the key.
fn byok_json(entry: &ByokEntry) -> Value {
    json!({
        "provider": entry.provider,
        "hint": entry.hint,
        "created_at": timestamp(Some(entry.created_at)),
        "updated_at": timestamp(Some(entry.updated_at)),
    })
}

/// `GET /api/v1/key`: the calling key's limit, usage and free-model quota.
async fn key_status(
    config: &KeyRoutesConfig,
    principal: &Principal,
    now: DateTime<Utc>,
) -> Result<Answer, GatewayError> {
    let account = principal.account_id.as_str();
    // The key's usage and the account's figures go out together.
    let (usage, (_, free)) = try_join(
        async {
            config
                .directory
                .store()
                .key_usage(account, &principal.key_hash.to_hex(), now)
                .await
                .map_err(|error| FailurePolicy::refusal("KeyRoutes", &error))
        },
        free_model_requests(config, account, now),
    )
    .await?;
    let mut data = Map::new();
    data.insert("label".into(), Value::from(principal.label.clone()));
    data.insert("account".into(), Value::from(account));
    data.insert("management".into(), Value::from(principal.management));
    data.insert("operator".into(), Value::from(principal.operator));
    limit_and_usage(
        &mut data,
        principal.key_limit.map(|limit| limit.limit_nanos),
        principal.key_limit.and_then(|limit| limit.reset),
        principal.include_byok_in_limit,
        &usage,
    );
    data.extend(free);
    Ok(Answer::ok(json!({ "data": data })))
}

/// A key as the management API shows it; `current` when it is the key the
/// request was made with (a settings page keeps it from disabling itself).
fn key_json(record: &KeyRecord, usage: &KeyUsage, current: bool) -> Value {
    let mut data = Map::new();
    data.insert("hash".into(), Value::from(record.hash.clone()));
    data.insert("name".into(), Value::from(record.name.clone()));
    data.insert("label".into(), Value::from(record.name.clone()));
    data.insert("account".into(), Value::from(record.account.clone()));
    data.insert("management".into(), Value::from(record.management));
    data.insert("operator".into(), Value::from(record.is_operator()));
    data.insert("disabled".into(), Value::from(record.disabled));
    data.insert("current".into(), Value::from(current));
    limit_and_usage(
        &mut data,
        record.limit_nanos,
        record.limit_reset,
        record.include_byok_in_limit,
        usage,
    );
    data.insert("created_at".into(), timestamp(Some(record.created_at)));
    data.insert("updated_at".into(), timestamp(record.updated_at));
    data.insert("expires_at".into(), timestamp(record.expires_at));
    data.insert("last_used_at".into(), timestamp(record.last_used_at));
    data.insert(
        "leak".into(),
        record.leak.as_ref().map_or(Value::Null, |leak| {
            json!({
                "reported_at": timestamp(Some(leak.reported_at)),
                "reported_by": leak.reported_by,
                "url": leak.url,
                "source": leak.source,
            })
        }),
    );
    Value::Object(data)
}

/// The limit fields and the twelve usage figures, in credits.
fn limit_and_usage(
    data: &mut Map<String, Value>,
    limit_nanos: Option<i64>,
    limit_reset: Option<crate::clock::Period>,
    include_byok: bool,
    usage: &KeyUsage,
) {
    let counted = usage.in_period(limit_reset, include_byok);
    data.insert(
        "limit".into(),
        limit_nanos.map_or(Value::Null, nanos_to_json),
    );
    data.insert(
        "limit_reset".into(),
        limit_reset.map_or(Value::Null, |period| Value::from(period.as_str())),
    );
    data.insert(
        "limit_remaining".into(),
        limit_nanos.map_or(Value::Null, |limit| {
            nanos_to_json(limit.saturating_sub(counted).max(0))
        }),
    );
    data.insert("include_byok_in_limit".into(), Value::from(include_byok));
    for (name, nanos) in [
        ("usage", usage.total_nanos),
        ("usage_daily", usage.day_nanos),
        ("usage_weekly", usage.week_nanos),
        ("usage_monthly", usage.month_nanos),
        ("byok_usage", usage.byok_total_nanos),
        ("byok_usage_daily", usage.byok_day_nanos),
        ("byok_usage_weekly", usage.byok_week_nanos),
        ("byok_usage_monthly", usage.byok_month_nanos),
    ] {
        data.insert(name.into(), nanos_to_json(nanos));
    }
}

fn timestamp(instant: Option<DateTime<Utc>>) -> Value {
    instant.map_or(Value::Null, |instant| {
        Value::from(instant.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    })
}

fn path_hash(text: &str) -> Result<KeyHash, GatewayError> {
    KeyHash::from_hex(&text.to_ascii_lowercase()).ok_or_else(|| {
        GatewayError::new(
            ErrorKind::InvalidRequest,
            "the key hash in the path must be 64 hexadecimal characters, as the management API lists it",
        )
        .with_metadata("param", "hash")
    })
}

/// An account's management key reads the key first: another account's key,
/// and an operator's key (which belongs to no account), is answered as no
/// key at all (a key never changes account, so the check holds for a write
/// that follows). The operator reads nothing here: `Ok(Ok(None))`.
async fn readable_key(
    directory: &KeyDirectory,
    principal: &Principal,
    hash: &KeyHash,
) -> Result<Result<Option<KeyRecord>, GatewayError>, StoreError> {
    if principal.operator {
        return Ok(Ok(None));
    }
    Ok(match directory.get(hash).await? {
        Some(record) if record.value.belongs_to(&principal.account_id) => Ok(Some(record.value)),
        _ => Err(no_such_key()),
    })
}

/// 422 for enabling a key reported leaked: it stays disabled for good (the
/// record's update keeps it so even when this check races a report).
async fn refuse_enabling_a_leaked_key(
    directory: &KeyDirectory,
    hash: &KeyHash,
    read: Option<&KeyRecord>,
) -> Result<Result<(), GatewayError>, StoreError> {
    let leaked = match read {
        Some(record) => record.leak.is_some(),
        None => directory
            .get(hash)
            .await?
            .is_some_and(|record| record.value.leak.is_some()),
    };
    Ok(if leaked {
        Err(GatewayError::new(
            ErrorKind::InvalidParameter,
            "this key was reported leaked and stays disabled; delete it and create a new key",
        )
        .with_metadata("param", "disabled")
        .with_metadata("reason", "leaked_key"))
    } else {
        Ok(())
    })
}

fn no_such_key() -> GatewayError {
    GatewayError::new(
        ErrorKind::NotFound,
        "no key has this hash; list the keys with GET /api/v1/keys",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn routes_match_every_spelling_of_their_path() {
        let hash = "ab".repeat(32);
        for (path, route) in [
            ("/api/v1/key", Some(Route::KeyStatus)),
            ("/api/v1/key/", Some(Route::KeyStatus)),
            ("/API/v1/Key", Some(Route::KeyStatus)),
            ("/api/v1/credits", Some(Route::Credits)),
            ("/user/balance", Some(Route::UserBalance)),
            ("//api/./v1/keys", Some(Route::Keys)),
            ("/api/v1/%6beys", Some(Route::Keys)),
            ("/API/v1/auth/Keys/code/", Some(Route::AuthCode)),
            ("/api/v1/auth/keys", None),
            (
                &format!("/api/v1/keys/{hash}"),
                Some(Route::Key(hash.clone())),
            ),
            (
                "/api/v1/accounts/acme/credits",
                Some(Route::AccountCredits("acme".into())),
            ),
            ("/api/v1/x/../keys", Some(Route::Keys)),
            (
                "/api/v1/accounts/Team-A/byok",
                Some(Route::ByokKeys("Team-A".into())),
            ),
            (
                "/API/v1/accounts/acme/BYOK/OpenAI/",
                Some(Route::ByokKey("acme".into(), "OpenAI".into())),
            ),
            ("/api/v1/accounts/acme/byok/openai/x", None),
            ("/api/v1/keys/a/b", None),
            ("/api/v1/chat/completions", None),
            ("/api/v2/key", None),
            ("/", None),
        ] {
            assert_eq!(Route::of(path), route, "{path}");
        }
    }

    #[test]
    fn only_management_keys_set_or_delete_provider_keys() {
        let byok = Route::ByokKey("acme".into(), "openai".into());
        assert!(byok.needs_management_key());
        assert!(!Route::ByokKeys("acme".into()).needs_management_key());
        let error = byok.management_key_required();
        assert_eq!(error.status(), 403);
        assert_eq!(error.metadata()["reason"], "management_key_required");
        assert!(
            error
                .message()
                .contains("only a management key may set or delete")
                && error.message().contains("GET /api/v1/accounts/acme/byok"),
            "{}",
            error.message()
        );
    }

    #[test]
    fn a_provider_key_is_accepted_only_where_it_would_be_sent() {
        assert!(accepts_byok_key(&ByokProviders::Any, "anyone").is_ok());
        let configured = ByokProviders::Configured {
            byok: ["beta".to_owned(), "alpha".to_owned()].into(),
            others: ["delta".to_owned()].into(),
        };
        assert!(accepts_byok_key(&configured, "alpha").is_ok());
        assert!(configured.accepts("Alpha") && !configured.accepts("delta"));
        let error = accepts_byok_key(&configured, "gamma").unwrap_err();
        assert_eq!(error.status(), 400);
        assert_eq!(error.metadata()["param"], "provider");
        assert_eq!(error.metadata()["reason"], "unknown_provider");
        assert!(
            error
                .message()
                .contains("gamma is not configured on this gateway")
                && error.message().ends_with("take one: alpha, beta"),
            "{}",
            error.message()
        );
        // Configured, but its credential is the gateway's: refused, 422.
        let error = accepts_byok_key(&configured, "delta").unwrap_err();
        assert_eq!(error.status(), 422);
        assert_eq!(error.metadata()["param"], "provider");
        assert_eq!(error.metadata()["reason"], "byok_not_allowed");
        assert!(
            error
                .message()
                .contains("delta is reached with the gateway's own credential")
                && error.message().contains("nothing was stored")
                && error.message().contains("it takes keys for: alpha, beta")
                && error.message().contains("\"byok\": true"),
            "{}",
            error.message()
        );
        let none = ByokProviders::Configured {
            byok: Default::default(),
            others: ["alpha".to_owned()].into(),
        };
        let error = accepts_byok_key(&none, "alpha").unwrap_err();
        assert!(error.message().contains("takes no provider keys"));
        assert_eq!(error.metadata()["reason"], "byok_not_allowed");
        let error = accepts_byok_key(&none, "beta").unwrap_err();
        assert!(error.message().contains("takes no provider keys"));
        assert_eq!(error.metadata()["reason"], "unknown_provider");
        assert!(!ByokProviders::SingleUpstream.accepts("openai"));
        assert!(ByokProviders::Any.accepts("openai"));
        let error = accepts_byok_key(&ByokProviders::SingleUpstream, "openai").unwrap_err();
        assert_eq!(error.status(), 400);
        assert_eq!(error.metadata()["reason"], "byok_needs_providers");
        assert!(
            error.message().contains("its own upstream key")
                && error.message().contains("`providers` section")
                && error.message().contains("openai"),
            "{}",
            error.message()
        );
    }

    proptest! {
        #[test]
        fn any_path_routes_as_its_normal_form_does(path in "(/|[a-zA-Z0-9.%]{0,6}){0,8}") {
            let normal = format!("/{}", normalized_segments(&path).join("/"));
            prop_assert_eq!(Route::of(&path), Route::of(&normal));
        }

        #[test]
        fn no_path_panics_the_router(path in "\\PC{0,60}") {
            let _ = Route::of(&path);
        }
    }
}
