//! The management API's inputs: JSON bodies and query strings, read
//! strictly. A malformed body is 400; a field of the wrong type or out of
//! range is 422; both name the field in the message and in
//! `metadata.param`.
//!
//! Public so a service that offers its own management surface parses the
//! same way, and so the fuzz target reaches them.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::byok::{ByokError, check_api_key, provider_id};
use super::credits::{AmountError, nanos_from_json};
use super::record::{
    DEFAULT_ACCOUNT, KeyRateLimit, KeyUpdate, MAX_ALLOWED_MODELS, MAX_KEY_NAME_CHARS, NewAccount,
    NewKey, OPERATOR_ACCOUNT, is_valid_account_id,
};
use crate::clock::Period;
use crate::error::{ErrorKind, GatewayError};
use crate::json_input::{Fields, bad_request, invalid, missing};
use crate::model_id::check_pattern;
use crate::store::{MAX_IDEMPOTENCY_KEY_BYTES, is_valid_idempotency_key};

/// Keys listed per page.
pub const KEYS_PER_PAGE: usize = 100;
/// The largest list offset accepted.
pub const MAX_LIST_OFFSET: usize = 1_000_000;

/// The body of `POST /api/v1/keys`; `now` bounds `expires_at`.
pub fn new_key(body: &[u8], now: DateTime<Utc>) -> Result<NewKey, GatewayError> {
    let mut fields = Fields::parse(
        body,
        &[
            "name",
            "account",
            "limit",
            "limit_reset",
            "include_byok_in_limit",
            "expires_at",
            "management",
            "allowed_models",
            "rate_limit",
        ],
    )?;
    let name = fields
        .take("name")
        .ok_or_else(|| missing("name", "every key needs a name"))?;
    let mut new = NewKey::named(key_name(name)?);
    let account = fields.take("account").filter(|account| !account.is_null());
    if let Some(management) = fields.take("management") {
        new.management = boolean("management", management)?;
    }
    // The API makes a management key for one account only; the operator's
    // own key comes from outside it.
    if new.management {
        if account.is_none() {
            return Err(invalid(
                "account",
                "is required with `management`: a management key manages one account",
            )
            .with_metadata("reason", "account_required"));
        }
        new.scoped_to_account = true;
    }
    if let Some(account) = account {
        new.account = account_id(account)?;
    }
    if let Some(limit) = fields.take("limit") {
        new.limit_nanos = limit_nanos(limit)?;
    }
    if let Some(reset) = fields.take("limit_reset") {
        new.limit_reset = limit_reset(reset)?;
    }
    if let Some(include) = fields.take("include_byok_in_limit") {
        new.include_byok_in_limit = boolean("include_byok_in_limit", include)?;
    }
    if let Some(expires_at) = fields.take("expires_at") {
        new.expires_at = expiry(expires_at, now)?;
    }
    if let Some(models) = fields.take("allowed_models") {
        new.allowed_models = allowed_models(models)?;
    }
    if let Some(rate) = fields.take("rate_limit") {
        new.rate_limit = key_rate_limit(rate)?;
    }
    if new.management
        && let Some(field) = calling_field(new.allowed_models.is_some(), new.rate_limit.is_some())
    {
        return Err(not_for_management_keys(field));
    }
    Ok(new)
}

/// The first of a key's model-calling settings that is set, by its name.
pub(crate) fn calling_field(allowed_models: bool, rate_limit: bool) -> Option<&'static str> {
    if allowed_models {
        Some("allowed_models")
    } else if rate_limit {
        Some("rate_limit")
    } else {
        None
    }
}

/// 422: a setting of model calls on a key that calls no models.
pub(crate) fn not_for_management_keys(field: &str) -> GatewayError {
    invalid(
        field,
        "applies to keys that call models; a management key calls none",
    )
}

/// Most requests of a key's own `rate_limit`: each request of its window
/// is kept, so the window's log stays small.
pub const MAX_KEY_RATE_REQUESTS: u64 = 10_000;
/// Longest window of a key's own `rate_limit`: a day.
pub const MAX_KEY_RATE_WINDOW_SECONDS: u64 = 86_400;

/// `allowed_models`: a non-empty list of model ids or provider prefixes,
/// or `null` for every model.
pub(crate) fn allowed_models(value: Value) -> Result<Option<Vec<String>>, GatewayError> {
    const EXPECTED: &str = "must be a list of model ids (\"openai/gpt-4o\") or provider prefixes (\"anthropic/\"), or null for every model";
    let items = match value {
        Value::Null => return Ok(None),
        Value::Array(items) => items,
        _ => return Err(invalid("allowed_models", EXPECTED)),
    };
    if items.is_empty() {
        return Err(invalid(
            "allowed_models",
            "must name at least one model or provider; null allows every model",
        ));
    }
    if items.len() > MAX_ALLOWED_MODELS {
        return Err(invalid(
            "allowed_models",
            &format!("must name at most {MAX_ALLOWED_MODELS} models or providers"),
        ));
    }
    let mut models: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        let Value::String(pattern) = item else {
            return Err(invalid("allowed_models", EXPECTED));
        };
        check_pattern(&pattern)
            .map_err(|problem| invalid("allowed_models", &format!("entry {problem}")))?;
        // Entries match exactly, case included: only an exact repeat is one.
        if !models.contains(&pattern) {
            models.push(pattern);
        }
    }
    Ok(Some(models))
}

/// `rate_limit`: `{"requests": n, "window_seconds": s}`, or `null` for none.
pub(crate) fn key_rate_limit(value: Value) -> Result<Option<KeyRateLimit>, GatewayError> {
    if value.is_null() {
        return Ok(None);
    }
    let rate: KeyRateLimit = serde_json::from_value(value).map_err(|_| {
        invalid(
            "rate_limit",
            "must be {\"requests\": n, \"window_seconds\": s} with whole numbers, or null for none",
        )
    })?;
    if !(1..=MAX_KEY_RATE_REQUESTS).contains(&rate.requests) {
        return Err(invalid(
            "rate_limit",
            &format!("requests must be 1 to {MAX_KEY_RATE_REQUESTS}"),
        ));
    }
    if !(1..=MAX_KEY_RATE_WINDOW_SECONDS).contains(&rate.window_seconds) {
        return Err(invalid(
            "rate_limit",
            &format!("window_seconds must be 1 to {MAX_KEY_RATE_WINDOW_SECONDS} (a day)"),
        ));
    }
    Ok(Some(rate))
}

/// The body of `PATCH /api/v1/keys/{hash}`; `now` bounds `expires_at`
/// (`null` clears it).
pub fn key_update(body: &[u8], now: DateTime<Utc>) -> Result<KeyUpdate, GatewayError> {
    let mut fields = Fields::parse(
        body,
        &[
            "name",
            "disabled",
            "limit",
            "limit_reset",
            "include_byok_in_limit",
            "expires_at",
            "allowed_models",
            "rate_limit",
        ],
    )?;
    Ok(KeyUpdate {
        name: fields.take("name").map(key_name).transpose()?,
        disabled: fields
            .take("disabled")
            .map(|value| boolean("disabled", value))
            .transpose()?,
        limit_nanos: fields.take("limit").map(limit_nanos).transpose()?,
        limit_reset: fields.take("limit_reset").map(limit_reset).transpose()?,
        include_byok_in_limit: fields
            .take("include_byok_in_limit")
            .map(|value| boolean("include_byok_in_limit", value))
            .transpose()?,
        expires_at: fields
            .take("expires_at")
            .map(|value| expiry(value, now))
            .transpose()?,
        allowed_models: fields
            .take("allowed_models")
            .map(allowed_models)
            .transpose()?,
        rate_limit: fields.take("rate_limit").map(key_rate_limit).transpose()?,
    })
}

/// How long a rotated key keeps working when the rotation names no
/// `grace_seconds`: an hour, for the clients using it to move over.
pub const DEFAULT_ROTATION_GRACE_SECONDS: u64 = 3600;
/// The longest grace a rotation may give the old key: 30 days.
pub const MAX_ROTATION_GRACE_SECONDS: u64 = 30 * 86_400;

/// The body of `POST /api/v1/keys/{hash}/rotate`: `{grace_seconds?}`, how
/// long the old key keeps working (an empty body: the default hour).
pub fn rotation_grace(body: &[u8]) -> Result<std::time::Duration, GatewayError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(std::time::Duration::from_secs(
            DEFAULT_ROTATION_GRACE_SECONDS,
        ));
    }
    let mut fields = Fields::parse(body, &["grace_seconds"])?;
    let seconds = match fields.take("grace_seconds") {
        None => DEFAULT_ROTATION_GRACE_SECONDS,
        Some(value) => value
            .as_u64()
            .filter(|seconds| *seconds <= MAX_ROTATION_GRACE_SECONDS)
            .ok_or_else(|| {
                invalid(
                    "grace_seconds",
                    &format!("must be a whole number of seconds from 0 to {MAX_ROTATION_GRACE_SECONDS} (30 days)"),
                )
            })?,
    };
    Ok(std::time::Duration::from_secs(seconds))
}

/// The longest `url` a leak report keeps, in bytes.
pub const MAX_LEAK_URL_BYTES: usize = 2048;
/// The longest `source` a leak report keeps, in bytes.
pub const MAX_LEAK_SOURCE_BYTES: usize = 64;

/// The body of `POST /api/v1/keys/{hash}/leaked`: where the key was found
/// (`url`) and what kind of place (`source`), both optional; an empty body
/// says neither.
pub fn leak_report(body: &[u8]) -> Result<(Option<String>, Option<String>), GatewayError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((None, None));
    }
    let mut fields = Fields::parse(body, &["url", "source"])?;
    let mut text = |field: &'static str, max_bytes: usize| {
        fields
            .take(field)
            .map(|value| leak_text(field, value, max_bytes))
            .transpose()
            .map(Option::flatten)
    };
    Ok((
        text("url", MAX_LEAK_URL_BYTES)?,
        text("source", MAX_LEAK_SOURCE_BYTES)?,
    ))
}

/// A leak report's text field: a string of visible characters or null.
fn leak_text(
    field: &'static str,
    value: Value,
    max_bytes: usize,
) -> Result<Option<String>, GatewayError> {
    match value {
        Value::Null => Ok(None),
        Value::String(text) if text.len() > max_bytes => Err(invalid(
            field,
            &format!("must be at most {max_bytes} bytes"),
        )),
        Value::String(text) if text.chars().any(char::is_control) => {
            Err(invalid(field, "must not contain control characters"))
        }
        Value::String(text) => Ok(Some(text)),
        _ => Err(invalid(field, "must be a string or null")),
    }
}

/// The body of `POST /api/v1/accounts/{id}/credits`: a positive amount.
pub fn purchase_nanos(body: &[u8]) -> Result<i64, GatewayError> {
    let mut fields = Fields::parse(body, &["amount"])?;
    let amount = fields
        .take("amount")
        .ok_or_else(|| missing("amount", "name the credits bought"))?;
    match nanos_from_json(&amount) {
        Ok(0) => Err(invalid("amount", "must be more than zero")),
        Ok(nanos) => Ok(nanos),
        Err(error) => Err(invalid("amount", &error.describe())),
    }
}

/// The start of the idempotency keys the service's own grants
/// ([`KeyDirectory::grant_once`](super::KeyDirectory::grant_once)) use,
/// refused in the header so no client's top-up shares one.
pub(crate) const RESERVED_IDEMPOTENCY_PREFIX: &str = "modelgate:";

/// The request header that makes a top-up idempotent.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// The `Idempotency-Key` header of `POST /api/v1/accounts/{id}/credits`,
/// given every value the request carries: none is `None` (the top-up is
/// not idempotent); one must be 1 to 255 visible ASCII characters
/// ([`is_valid_idempotency_key`]); anything else is 400 naming the header.
pub fn idempotency_key<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<String>, GatewayError> {
    let mut values = values.into_iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let refused = || {
        bad_request(
            IDEMPOTENCY_KEY_HEADER,
            format!(
                "the {IDEMPOTENCY_KEY_HEADER} header must be sent once, as 1 to {MAX_IDEMPOTENCY_KEY_BYTES} visible ASCII characters (a UUID is a good choice)"
            ),
        )
    };
    if values.next().is_some() {
        return Err(refused());
    }
    match std::str::from_utf8(value) {
        Ok(key) if key.starts_with(RESERVED_IDEMPOTENCY_PREFIX) => Err(bad_request(
            IDEMPOTENCY_KEY_HEADER,
            format!(
                "an {IDEMPOTENCY_KEY_HEADER} may not start with `{RESERVED_IDEMPOTENCY_PREFIX}`, which the service's own grants use; send another key (a UUID is a good choice)"
            ),
        )),
        Ok(key) if is_valid_idempotency_key(key) => Ok(Some(key.to_owned())),
        _ => Err(refused()),
    }
}

/// An account id from a path segment.
pub fn path_account_id(id: &str) -> Result<String, GatewayError> {
    if is_valid_account_id(id) {
        Ok(id.to_owned())
    } else {
        Err(bad_request(
            "account",
            "the account id in the path must be 1 to 64 characters of A-Z a-z 0-9 . _ -",
        ))
    }
}

/// The body of `PUT /api/v1/accounts/{id}/byok/{provider}`: `{"key": "…"}`,
/// a provider key of 8 to 4096 visible ASCII characters. No refusal
/// repeats the key.
pub fn byok_key(body: &[u8]) -> Result<String, GatewayError> {
    let mut fields = Fields::parse(body, &["key"])?;
    let key = fields
        .take("key")
        .ok_or_else(|| missing("key", "send the provider's API key as a string"))?;
    let Value::String(key) = key else {
        return Err(invalid("key", "must be a string"));
    };
    match check_api_key(&key) {
        Ok(()) => Ok(key),
        Err(ByokError::InvalidKey(problem)) => Err(invalid("key", problem)),
        Err(other) => Err(invalid("key", &other.to_string())),
    }
}

/// A provider name from a path segment, lower-cased.
pub fn path_provider(name: &str) -> Result<String, GatewayError> {
    provider_id(name).map_err(|_| {
        bad_request(
            "provider",
            "the provider in the path must be 1 to 64 characters of a-z 0-9 _ -, as in a model id such as openai/gpt-4o",
        )
    })
}

/// `GET /api/v1/keys` query: `offset`, `include_disabled` and `account`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Keys to skip, of those the list would show.
    pub offset: usize,
    /// Whether disabled keys are listed too.
    pub include_disabled: bool,
    /// Only this account's keys.
    pub account: Option<String>,
}

/// The body of `POST /api/v1/accounts`: `{"id", "name", "email"}`; `name`
/// and `email` optional.
pub fn new_account(body: &[u8]) -> Result<NewAccount, GatewayError> {
    let mut fields = Fields::parse(body, &["id", "name", "email"])?;
    let id = fields.take("id").ok_or_else(|| {
        missing(
            "id",
            "name the account: 1 to 64 characters of A-Z a-z 0-9 . _ -",
        )
    })?;
    let id = match id {
        Value::String(id) if is_valid_account_id(&id) => id,
        Value::String(id) if id == OPERATOR_ACCOUNT => return Err(reserved_account("id")),
        _ => {
            return Err(invalid(
                "id",
                "must be 1 to 64 characters of A-Z a-z 0-9 . _ -",
            ));
        }
    };
    let name = match fields.take("name") {
        None | Some(Value::Null) => String::new(),
        Some(name) => key_name(name)?,
    };
    let email = match fields.take("email") {
        None | Some(Value::Null) => None,
        Some(Value::String(email)) => Some(email_address(&email)?),
        Some(_) => return Err(invalid("email", "must be a string")),
    };
    Ok(NewAccount { id, name, email })
}

/// Longest e-mail address accepted (RFC 5321's path limit).
pub const MAX_EMAIL_BYTES: usize = 254;

/// An address mail can be sent to: `local@domain`, printable ASCII without
/// spaces, a dot in the domain. Deliverability is the mail server's call.
fn email_address(text: &str) -> Result<String, GatewayError> {
    let text = text.trim();
    let well_formed = text.len() <= MAX_EMAIL_BYTES
        && text.bytes().all(|byte| byte.is_ascii_graphic())
        && text.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty()
                && !domain.is_empty()
                && !domain.contains('@')
                && domain.contains('.')
                && !domain.starts_with('.')
                && !domain.ends_with('.')
                && !domain.contains("..")
        });
    if well_formed {
        Ok(text.to_owned())
    } else {
        Err(invalid(
            "email",
            &format!(
                "must be an e-mail address such as ops@example.com, at most {MAX_EMAIL_BYTES} characters"
            ),
        ))
    }
}

/// Reads the query string of `GET /api/v1/keys`; unknown parameters are ignored.
pub fn list_query(query: Option<&str>) -> Result<ListQuery, GatewayError> {
    let mut list = ListQuery::default();
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match name.as_ref() {
            "offset" => {
                list.offset = value
                    .parse::<usize>()
                    .ok()
                    .filter(|offset| *offset <= MAX_LIST_OFFSET)
                    .ok_or_else(|| {
                        invalid(
                            "offset",
                            &format!("must be a whole number from 0 to {MAX_LIST_OFFSET}"),
                        )
                    })?;
            }
            "account" => {
                if !is_valid_account_id(&value) {
                    return Err(invalid(
                        "account",
                        "must be 1 to 64 characters of A-Z a-z 0-9 . _ -",
                    ));
                }
                list.account = Some(value.into_owned());
            }
            "include_disabled" => {
                list.include_disabled = match value.as_ref() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(invalid("include_disabled", "must be true or false")),
                };
            }
            // Clients add their own parameters (cache busters and the like).
            _ => {}
        }
    }
    Ok(list)
}

pub(crate) fn key_name(value: Value) -> Result<String, GatewayError> {
    let Value::String(name) = value else {
        return Err(invalid("name", "must be a string"));
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(invalid("name", "must not be empty"));
    }
    if name.chars().count() > MAX_KEY_NAME_CHARS {
        return Err(invalid(
            "name",
            &format!("must be at most {MAX_KEY_NAME_CHARS} characters"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid("name", "must not contain control characters"));
    }
    Ok(name.to_owned())
}

pub(crate) fn account_id(value: Value) -> Result<String, GatewayError> {
    match value {
        Value::Null => Ok(DEFAULT_ACCOUNT.to_owned()),
        Value::String(id) if is_valid_account_id(&id) => Ok(id),
        Value::String(id) if id == OPERATOR_ACCOUNT => Err(reserved_account("account")),
        _ => Err(invalid(
            "account",
            "must be 1 to 64 characters of A-Z a-z 0-9 . _ -",
        )),
    }
}

pub(crate) fn limit_nanos(value: Value) -> Result<Option<i64>, GatewayError> {
    if value.is_null() {
        return Ok(None);
    }
    nanos_from_json(&value)
        .map(Some)
        .map_err(|error: AmountError| {
            invalid(
                "limit",
                &format!("{} (or null for no limit)", error.describe()),
            )
        })
}

pub(crate) fn limit_reset(value: Value) -> Result<Option<Period>, GatewayError> {
    match value {
        Value::Null => Ok(None),
        Value::String(text) => match text.as_str() {
            "daily" => Ok(Some(Period::Day)),
            "weekly" => Ok(Some(Period::Week)),
            "monthly" => Ok(Some(Period::Month)),
            _ => Err(invalid(
                "limit_reset",
                "must be \"daily\", \"weekly\", \"monthly\" or null",
            )),
        },
        _ => Err(invalid(
            "limit_reset",
            "must be \"daily\", \"weekly\", \"monthly\" or null",
        )),
    }
}

fn boolean(field: &'static str, value: Value) -> Result<bool, GatewayError> {
    value
        .as_bool()
        .ok_or_else(|| invalid(field, "must be true or false"))
}

pub(crate) fn expiry(
    value: Value,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, GatewayError> {
    let text = match value {
        Value::Null => return Ok(None),
        Value::String(text) => text,
        _ => {
            return Err(invalid(
                "expires_at",
                "must be an RFC 3339 date-time such as 2027-01-31T23:59:59Z, or null",
            ));
        }
    };
    let expires_at = DateTime::parse_from_rfc3339(&text)
        .map_err(|_| {
            invalid(
                "expires_at",
                "must be an RFC 3339 date-time such as 2027-01-31T23:59:59Z, or null",
            )
        })?
        .with_timezone(&Utc);
    if expires_at <= now {
        return Err(invalid("expires_at", "must be in the future"));
    }
    Ok(Some(expires_at))
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

/// 422: the operator's account id, which no tenant account may take.
fn reserved_account(field: &str) -> GatewayError {
    invalid(
        field,
        &format!("{OPERATOR_ACCOUNT} is reserved for the operator's keys, which belong to no account; choose another id (1 to 64 characters of A-Z a-z 0-9 . _ -)"),
    )
    .with_metadata("reason", "reserved_account")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap()
    }

    fn refusal(result: Result<impl std::fmt::Debug, GatewayError>) -> (u16, String, String) {
        let error = result.unwrap_err();
        (
            error.status().as_u16(),
            error
                .metadata()
                .get("param")
                .and_then(|field| field.as_str())
                .unwrap_or_default()
                .to_owned(),
            error.message().to_owned(),
        )
    }

    #[test]
    fn a_full_new_key_reads_every_field() {
        let new = new_key(
            br#"{"name": " ci ", "account": "team-a", "limit": 2.5, "limit_reset": "weekly",
                 "include_byok_in_limit": true, "expires_at": "2027-01-01T00:00:00+01:00"}"#,
            now(),
        )
        .unwrap();
        assert_eq!(new.name, "ci");
        assert_eq!(new.account, "team-a");
        assert_eq!(new.limit_nanos, Some(2_500_000_000));
        assert_eq!(new.limit_reset, Some(Period::Week));
        assert!(new.include_byok_in_limit);
        assert!(!new.management);
        assert_eq!(
            new.expires_at,
            Some(Utc.with_ymd_and_hms(2026, 12, 31, 23, 0, 0).unwrap())
        );
        let minimal = new_key(br#"{"name": "x", "limit": null, "account": null}"#, now()).unwrap();
        assert_eq!(minimal, NewKey::named("x"));
    }

    #[test]
    fn a_management_key_is_made_for_one_account() {
        let new = new_key(
            br#"{"name": "acme admin", "account": "acme", "management": true}"#,
            now(),
        )
        .unwrap();
        assert!(new.management && new.scoped_to_account);
        assert_eq!(new.account, "acme");
        let error = refusal(new_key(
            br#"{"name": "a", "account": null, "management": true}"#,
            now(),
        ));
        assert_eq!((error.0, error.1.as_str()), (422, "account"));
        let plain = new_key(br#"{"name": "a", "management": false}"#, now()).unwrap();
        assert!(!plain.management && !plain.scoped_to_account);
    }

    #[test]
    fn new_accounts_are_read_strictly() {
        let account =
            new_account(br#"{"id": "acme", "name": "Acme Corp", "email": " ops@acme.example "}"#)
                .unwrap();
        assert_eq!(
            account,
            NewAccount {
                id: "acme".into(),
                name: "Acme Corp".into(),
                email: Some("ops@acme.example".into()),
            }
        );
        let bare = new_account(br#"{"id": "b"}"#).unwrap();
        assert_eq!((bare.name.as_str(), bare.email), ("", None));
        for (body, status, param) in [
            (&br#"{"name": "x"}"#[..], 400, "id"),
            (br#"{"id": "a b"}"#, 422, "id"),
            (br#"{"id": 7}"#, 422, "id"),
            (br#"{"id": "a", "name": ""}"#, 422, "name"),
            (br#"{"id": "a", "email": "nobody"}"#, 422, "email"),
            (br#"{"id": "a", "email": "a@b"}"#, 422, "email"),
            (br#"{"id": "a", "email": "a b@c.d"}"#, 422, "email"),
            (br#"{"id": "a", "email": "a@@c.d"}"#, 422, "email"),
            (br#"{"id": "a", "email": 5}"#, 422, "email"),
            (br#"{"id": "a", "owner": "x"}"#, 400, "owner"),
        ] {
            let (got_status, got_param, message) = refusal(new_account(body));
            assert_eq!(
                (got_status, got_param.as_str()),
                (status, param),
                "{message}"
            );
        }
    }

    #[test]
    fn no_account_or_key_takes_the_operators_account_id() {
        let account = new_account(br#"{"id": ":operator"}"#).unwrap_err();
        let key = new_key(br#"{"name": "k", "account": ":operator"}"#, now()).unwrap_err();
        for (error, param) in [(account, "id"), (key, "account")] {
            assert_eq!(error.status(), 422);
            assert_eq!(error.metadata()["param"], param);
            assert_eq!(error.metadata()["reason"], "reserved_account");
            assert!(error.message().contains("reserved"), "{}", error.message());
        }
    }

    proptest::proptest! {
        #[test]
        fn any_account_body_is_an_account_or_a_named_refusal(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Err(error) = new_account(&body) {
                proptest::prop_assert!(matches!(error.status().as_u16(), 400 | 422));
            }
        }

        #[test]
        fn a_valid_email_is_kept_as_sent(local in "[a-z0-9._+-]{1,30}", domain in "[a-z0-9-]{1,20}\\.[a-z]{2,6}") {
            let address = format!("{local}@{domain}");
            let body = serde_json::json!({"id": "a", "email": address}).to_string();
            proptest::prop_assert_eq!(new_account(body.as_bytes()).unwrap().email, Some(address));
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases: [(&[u8], u16, &str); 10] = [
            (b"", 400, ""),
            (b"[1]", 400, ""),
            (b"{\"name\": \"a\",}", 400, ""),
            (br#"{"limit": 1}"#, 400, "name"),
            (br#"{"name": "a", "management": true}"#, 422, "account"),
            (br#"{"name": "a\u0007"}"#, 422, "name"),
            (br#"{"name": "a", "limit": 1e300}"#, 422, "limit"),
            (br#"{"name": "a", "limit_reset": 1}"#, 422, "limit_reset"),
            (
                br#"{"name": "a", "expires_at": 20270101}"#,
                422,
                "expires_at",
            ),
            (br#"{"name": "a", "account": ""}"#, 422, "account"),
        ];
        for (body, status, field) in cases {
            let (got_status, got_field, message) = refusal(new_key(body, now()));
            assert_eq!(
                (got_status, got_field.as_str()),
                (status, field),
                "{}",
                String::from_utf8_lossy(body)
            );
            assert!(message.contains(field), "{message}");
        }
        let long = format!(r#"{{"name": "{}"}}"#, "n".repeat(MAX_KEY_NAME_CHARS + 1));
        assert_eq!(refusal(new_key(long.as_bytes(), now())).1, "name");
    }

    #[test]
    fn a_model_list_and_a_rate_are_read_strictly() {
        let new = new_key(
            br#"{"name": "a", "allowed_models": ["openai/gpt-4o", "anthropic/", "OpenAI/GPT-4o", "x/y:free", "openai/gpt-4o"],
                 "rate_limit": {"requests": 10, "window_seconds": 60}}"#,
            now(),
        )
        .unwrap();
        assert_eq!(
            new.allowed_models.as_deref(),
            Some(
                &[
                    "openai/gpt-4o".to_owned(),
                    "anthropic/".to_owned(),
                    "OpenAI/GPT-4o".to_owned(),
                    "x/y:free".to_owned()
                ][..]
            ),
            "an exact repeat is kept once; another case is another entry"
        );
        assert_eq!(
            new.rate_limit,
            Some(KeyRateLimit {
                requests: 10,
                window_seconds: 60
            })
        );
        let update = key_update(br#"{"allowed_models": null, "rate_limit": null}"#, now()).unwrap();
        assert_eq!(update.allowed_models, Some(None));
        assert_eq!(update.rate_limit, Some(None));
        let many = format!(
            r#"{{"name": "a", "allowed_models": [{}]}}"#,
            (0..=MAX_ALLOWED_MODELS)
                .map(|index| format!("\"p/m{index}\""))
                .collect::<Vec<_>>()
                .join(",")
        );
        let refused: [(&[u8], &str, &str); 12] = [
            (br#"{"name": "a", "allowed_models": []}"#, "allowed_models", "at least one"),
            (br#"{"name": "a", "allowed_models": "openai/"}"#, "allowed_models", "list"),
            (br#"{"name": "a", "allowed_models": [1]}"#, "allowed_models", "list"),
            (br#"{"name": "a", "allowed_models": ["gpt-4o"]}"#, "allowed_models", "neither"),
            (br#"{"name": "a", "allowed_models": ["/"]}"#, "allowed_models", "neither"),
            (br#"{"name": "a", "allowed_models": ["a/b c"]}"#, "allowed_models", "neither"),
            (br#"{"name": "a", "rate_limit": {"requests": 0, "window_seconds": 60}}"#, "rate_limit", "1 to 10000"),
            (br#"{"name": "a", "rate_limit": {"requests": 10001, "window_seconds": 60}}"#, "rate_limit", "1 to 10000"),
            (br#"{"name": "a", "rate_limit": {"requests": 1, "window_seconds": 86401}}"#, "rate_limit", "window_seconds"),
            (br#"{"name": "a", "rate_limit": {"requests": 1.5, "window_seconds": 60}}"#, "rate_limit", "whole numbers"),
            (br#"{"name": "a", "rate_limit": {"requests": 1, "window": 60}}"#, "rate_limit", "whole numbers"),
            (
                br#"{"name": "a", "account": "b", "management": true, "rate_limit": {"requests": 1, "window_seconds": 1}}"#,
                "rate_limit",
                "management key",
            ),
        ];
        for (body, field, words) in
            refused
                .iter()
                .copied()
                .chain([(many.as_bytes(), "allowed_models", "at most 100")])
        {
            let (status, param, message) = refusal(new_key(body, now()));
            assert_eq!((status, param.as_str()), (422, field), "{message}");
            assert!(message.contains(words), "{message}");
        }
    }

    #[test]
    fn an_update_tells_absent_from_null() {
        let update = key_update(br#"{"limit": null, "disabled": true}"#, now()).unwrap();
        assert_eq!(update.limit_nanos, Some(None));
        assert_eq!(update.limit_reset, None);
        assert_eq!(update.disabled, Some(true));
        assert_eq!(key_update(b"{}", now()).unwrap(), KeyUpdate::default());
        assert_eq!(
            refusal(key_update(br#"{"account": "b"}"#, now())).1,
            "account"
        );
        assert_eq!(refusal(key_update(br#"{"disabled": "no"}"#, now())).0, 422);
        // An expiry is set, moved or cleared; never put in the past.
        let later = key_update(br#"{"expires_at": "2099-01-01T00:00:00Z"}"#, now()).unwrap();
        assert_eq!(
            later.expires_at,
            Some(Some("2099-01-01T00:00:00Z".parse().unwrap()))
        );
        let cleared = key_update(br#"{"expires_at": null}"#, now()).unwrap();
        assert_eq!(cleared.expires_at, Some(None));
        assert_eq!(key_update(b"{}", now()).unwrap().expires_at, None);
        let past = refusal(key_update(
            br#"{"expires_at": "2001-01-01T00:00:00Z"}"#,
            now(),
        ));
        assert_eq!((past.0, past.1.as_str()), (422, "expires_at"));
        assert_eq!(
            refusal(key_update(br#"{"expires_at": 5}"#, now())).1,
            "expires_at"
        );
    }

    #[test]
    fn a_rotation_grace_is_whole_seconds_up_to_30_days() {
        use std::time::Duration;
        let default = Duration::from_secs(DEFAULT_ROTATION_GRACE_SECONDS);
        assert_eq!(rotation_grace(b"").unwrap(), default);
        assert_eq!(rotation_grace(b" {} ").unwrap(), default);
        assert_eq!(
            rotation_grace(br#"{"grace_seconds": 0}"#).unwrap(),
            Duration::ZERO
        );
        assert_eq!(
            rotation_grace(br#"{"grace_seconds": 2592000}"#).unwrap(),
            Duration::from_secs(MAX_ROTATION_GRACE_SECONDS)
        );
        for bad in [
            &br#"{"grace_seconds": 2592001}"#[..],
            br#"{"grace_seconds": -1}"#,
            br#"{"grace_seconds": 1.5}"#,
            br#"{"grace_seconds": "60"}"#,
            br#"{"grace_seconds": null}"#,
        ] {
            let (status, param, _) = refusal(rotation_grace(bad));
            assert_eq!((status, param.as_str()), (422, "grace_seconds"), "{bad:?}");
        }
        assert_eq!(
            refusal(rotation_grace(br#"{"grace": 5}"#)).0,
            400,
            "an unknown field"
        );
        assert_eq!(refusal(rotation_grace(b"[1]")).0, 400);
    }

    #[test]
    fn leak_reports_are_optional_text() {
        assert_eq!(leak_report(b"").unwrap(), (None, None));
        assert_eq!(
            leak_report(br#"{"url": "https://example.com/a", "source": "content"}"#).unwrap(),
            (
                Some("https://example.com/a".to_owned()),
                Some("content".to_owned())
            )
        );
        assert_eq!(leak_report(br#"{"url": null}"#).unwrap(), (None, None));
        let (status, param, _) = refusal(leak_report(br#"{"url": 5}"#));
        assert_eq!((status, param.as_str()), (422, "url"));
        let long = format!(r#"{{"source": "{}"}}"#, "a".repeat(65));
        let (status, param, message) = refusal(leak_report(long.as_bytes()));
        assert_eq!((status, param.as_str()), (422, "source"));
        assert!(message.contains("64 bytes"), "{message}");
        let (status, param, _) = refusal(leak_report(br#"{"url": "a\nb"}"#));
        assert_eq!((status, param.as_str()), (422, "url"));
        let (status, _, message) = refusal(leak_report(br#"{"token": "x"}"#));
        assert_eq!(status, 400);
        assert!(message.contains("unknown field"), "{message}");
    }

    #[test]
    fn purchases_must_be_positive_amounts() {
        assert_eq!(purchase_nanos(br#"{"amount": 10}"#), Ok(10_000_000_000));
        for body in [
            &br#"{"amount": 0}"#[..],
            br#"{"amount": -5}"#,
            br#"{"amount": "5"}"#,
        ] {
            assert_eq!(refusal(purchase_nanos(body)).1, "amount");
        }
        assert_eq!(refusal(purchase_nanos(b"{}")).0, 400);
    }

    #[test]
    fn list_queries_read_offset_and_include_disabled() {
        assert_eq!(list_query(None).unwrap(), ListQuery::default());
        assert_eq!(
            list_query(Some("offset=20&include_disabled=true&_=123&account=acme")).unwrap(),
            ListQuery {
                offset: 20,
                include_disabled: true,
                account: Some("acme".into()),
            }
        );
        for query in [
            "account=a%2Fb",
            "account=",
            "offset=-1",
            "offset=x",
            "offset=99999999999",
            "include_disabled=1",
        ] {
            assert_eq!(refusal(list_query(Some(query))).0, 422, "{query}");
        }
    }

    #[test]
    fn a_byok_key_is_read_strictly_and_never_repeated() {
        let secret = "sk-proj-SECRET-0123";
        let body = json!({"key": secret}).to_string();
        assert_eq!(byok_key(body.as_bytes()).unwrap(), secret);
        let cases: [(String, u16, &str); 9] = [
            (String::new(), 400, ""),
            ("[]".into(), 400, ""),
            ("{}".into(), 400, "key"),
            (json!({"key": secret, "note": "x"}).to_string(), 400, "note"),
            (json!({"key": 42}).to_string(), 422, "key"),
            (json!({"key": null}).to_string(), 422, "key"),
            (json!({"key": "sk-SECRET"[..6]}).to_string(), 422, "key"),
            (
                json!({"key": format!("{secret}\n")}).to_string(),
                422,
                "key",
            ),
            (json!({"key": format!("{secret}é")}).to_string(), 422, "key"),
        ];
        for (body, status, field) in cases {
            let (got_status, got_field, message) = refusal(byok_key(body.as_bytes()));
            assert_eq!((got_status, got_field.as_str()), (status, field), "{body}");
            assert!(message.contains(field), "{message}");
            assert!(!message.contains("SECRET"), "{message}");
        }
    }

    #[test]
    fn path_providers_are_lower_cased_or_refused_naming_provider() {
        assert_eq!(path_provider("OpenAI").unwrap(), "openai");
        for name in ["", "z.ai", "a b", &"p".repeat(65)] {
            let (status, field, _) = refusal(path_provider(name));
            assert_eq!((status, field.as_str()), (400, "provider"), "{name}");
        }
    }

    #[test]
    fn idempotency_keys_are_one_short_visible_ascii_value() {
        let key = |values: &[&[u8]]| idempotency_key(values.iter().copied());
        assert_eq!(key(&[]), Ok(None));
        assert_eq!(
            key(&[b"4f1c2a9e-7d3b-4c11-9a55-0e6f2b8d1c7a"]),
            Ok(Some("4f1c2a9e-7d3b-4c11-9a55-0e6f2b8d1c7a".to_owned()))
        );
        let longest = "~".repeat(255);
        assert_eq!(key(&[longest.as_bytes()]), Ok(Some(longest.clone())));
        // The service's own grants' keys are not a client's to send.
        let reserved = key(&[b"modelgate:grant:initial-grant"]).unwrap_err();
        assert!(
            reserved
                .message()
                .contains("may not start with `modelgate:`")
        );
        let too_long = "k".repeat(256);
        let cases: [&[&[u8]]; 8] = [
            &[b""],
            &[too_long.as_bytes()],
            &[b"a b"],
            &[b"tab\t"],
            &[b"caf\xc3\xa9"],
            &[b"\x7f"],
            &[b"one", b"two"],
            &[b"same", b"same"],
        ];
        for values in cases {
            let (status, field, message) = refusal(key(values));
            assert_eq!(
                (status, field.as_str()),
                (400, "Idempotency-Key"),
                "{values:?}"
            );
            assert!(message.contains("Idempotency-Key"), "{message}");
        }
    }

    proptest! {
        #[test]
        fn an_idempotency_key_is_accepted_exactly_when_valid(value in proptest::collection::vec(any::<u8>(), 0..300)) {
            let valid = !value.is_empty()
                && value.len() <= 255
                && value.iter().all(|byte| (b'!'..=b'~').contains(byte));
            match idempotency_key([value.as_slice()]) {
                Ok(key) => {
                    prop_assert!(valid);
                    prop_assert_eq!(key.as_deref().map(str::as_bytes), Some(value.as_slice()));
                }
                Err(error) => {
                    prop_assert!(!valid);
                    prop_assert_eq!(error.status().as_u16(), 400);
                }
            }
        }

        #[test]
        fn no_body_panics_any_parser(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = new_key(&body, now());
            let _ = key_update(&body, now());
            let _ = purchase_nanos(&body);
            let _ = byok_key(&body);
            if let Err(error) = leak_report(&body) {
                prop_assert!(error.status().is_client_error(), "{}", error);
            }
            let _ = list_query(Some(&String::from_utf8_lossy(&body)));
        }

        #[test]
        fn every_refusal_is_a_4xx(body in "\\{(\"(name|limit|limit_reset|account|expires_at|allowed_models|rate_limit|x)\": (null|1|-1|\"[a-z/ ]{0,6}\"|true|\\[\\]|\\[\"[a-z:/]{0,6}\"\\]|\\{\"requests\": -?[0-9]{1,6}, \"window_seconds\": -?[0-9]{1,6}\\}), ?){0,4}\\}") {
            for result in [new_key(body.as_bytes(), now()).map(|_| ()), key_update(body.as_bytes(), now()).map(|_| ())] {
                if let Err(error) = result {
                    prop_assert!(error.status().is_client_error(), "{}", error);
                }
            }
        }

        /// Any seconds within the bound are taken as they are; past it,
        /// or any other body, a 4xx.
        #[test]
        fn a_rotation_grace_is_taken_or_refused(seconds in any::<i64>(), body in "\\PC{0,40}") {
            let json = format!(r#"{{"grace_seconds": {seconds}}}"#);
            match rotation_grace(json.as_bytes()) {
                Ok(grace) => prop_assert_eq!(grace.as_secs() as i64, seconds),
                Err(error) => {
                    prop_assert!(seconds < 0 || seconds as u64 > MAX_ROTATION_GRACE_SECONDS);
                    prop_assert_eq!(error.status().as_u16(), 422);
                }
            }
            if let Err(error) = rotation_grace(body.as_bytes()) {
                prop_assert!(error.status().is_client_error(), "{}", error);
            }
        }

        #[test]
        fn any_valid_name_round_trips(name in "[A-Za-z0-9][A-Za-z0-9 _.-]{0,40}[A-Za-z0-9]") {
            let body = serde_json::json!({"name": name}).to_string();
            prop_assert_eq!(new_key(body.as_bytes(), now()).unwrap().name, name);
        }
    }
}
