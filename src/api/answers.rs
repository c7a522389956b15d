//! What the handlers share: the JSON answer, the store's refusal, time
//! stamps and the account checks.

use chrono::{DateTime, Utc};
use http::StatusCode;
use serde_json::Value;

use crate::answer::Answer;
use crate::error::{ErrorKind, GatewayError};
use crate::keys::{DEFAULT_ACCOUNT, KeyDirectory};
use crate::store::{FailurePolicy, StoreError};

/// 200 with `body`.
pub(crate) fn ok(body: Value) -> Answer {
    Answer {
        status: StatusCode::OK,
        body,
        headers: Vec::new(),
        raw: None,
    }
}

/// 201 with `body`. Every answer is `no-store`, so a plaintext key or code
/// shown once stays out of caches.
pub(crate) fn created(body: Value) -> Answer {
    Answer {
        status: StatusCode::CREATED,
        body,
        headers: Vec::new(),
        raw: None,
    }
}

/// The answer to a store that failed: the API fails closed (503).
pub(crate) fn refuse(error: StoreError) -> GatewayError {
    FailurePolicy::refusal("KeyRoutes", &error)
}

/// An instant as the API shows it (RFC 3339, milliseconds), or `null`.
pub(crate) fn timestamp(instant: Option<DateTime<Utc>>) -> Value {
    instant.map_or(Value::Null, |instant| {
        Value::from(instant.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    })
}

/// `account` (a path's) when it exists: no route but `POST
/// /api/v1/accounts` makes an account, so a mistyped id in a path is 404
/// rather than credits or provider keys kept for nobody. `default` always
/// exists.
pub(crate) async fn existing_account(
    directory: &KeyDirectory,
    account: String,
) -> Result<String, GatewayError> {
    let exists =
        account == DEFAULT_ACCOUNT || directory.account_exists(&account).await.map_err(refuse)?;
    if exists {
        Ok(account)
    } else {
        Err(no_such_account(&account))
    }
}

/// 404: an account's path naming an account that does not exist.
pub(crate) fn no_such_account(account: &str) -> GatewayError {
    GatewayError::new(
        ErrorKind::NotFound,
        format!("there is no account {account}; create it first with POST /api/v1/accounts"),
    )
    .with_metadata("reason", "unknown_account")
}
