//! `POST /api/v1/auth/keys/code`: a management key approves an app, and
//! gets the code the consent page hands the app. Answered by
//! the JSON API's `KeyRoutes`, behind BearerAuth.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use super::code::{
    Approval, AuthCodes, DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT, IssueError, app_key_name,
};
use super::input::code_request;
use super::pkce::PlainPkce;
use crate::answer::Answer;
use crate::auth::Principal;
use crate::error::{ErrorKind, GatewayError};
use crate::json_input::invalid;
use crate::keys::KeyDirectory;
use crate::keys::input::unknown_account;
use crate::store::FailurePolicy;

/// Where the consent page is served.
pub const CONSENT_PATH: &str = "/auth";

/// What the operator decides about approvals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ApprovalRules {
    /// Whether `plain` PKCE challenges are taken.
    pub(crate) plain: PlainPkce,
    /// The most codes of one account waiting for their exchange.
    pub(crate) max_pending_codes_per_account: u64,
}

impl Default for ApprovalRules {
    fn default() -> Self {
        ApprovalRules {
            plain: PlainPkce::Refused,
            max_pending_codes_per_account: DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT,
        }
    }
}

/// Answers one approval: 201 `{"data": {"id": <code>, "created_at",
/// "expires_at"}}`. The caller checked that `principal` is a management
/// key.
pub(crate) async fn issue_code(
    directory: &KeyDirectory,
    rules: ApprovalRules,
    principal: &Principal,
    body: &[u8],
) -> Result<Answer, GatewayError> {
    let request = code_request(body, directory.now(), rules.plain)?;
    let account = approved_account(principal, request.account.as_deref())?;
    let refuse = |error| FailurePolicy::refusal("KeyRoutes", &error);
    // The operator may name any account, but only one that exists: a
    // mistyped id must not make an empty account with an app key in it.
    if principal.operator && !directory.account_exists(&account).await.map_err(refuse)? {
        return Err(unknown_account(&account));
    }
    let approval = Approval {
        key_name: app_key_name(request.key_label.as_deref(), request.callback_url.host()),
        account,
        limit_nanos: request.limit_nanos,
        limit_reset: request.limit_reset,
        key_expires_at: request.expires_at,
        callback_url: request.callback_url.as_str().to_owned(),
        code_challenge: request.code_challenge,
        code_challenge_method: request.code_challenge_method,
    };
    let issued = AuthCodes::new(directory.clone())
        .max_pending_per_account(rules.max_pending_codes_per_account)
        .issue(approval)
        .await
        .map_err(|error| match error {
            IssueError::TooManyPending => GatewayError::new(
                ErrorKind::ServiceUnavailable,
                "too many authorization codes are waiting for their exchange on this gateway; try again in a minute",
            )
            .with_metadata("reason", "too_many_pending_codes")
            .with_retry_after(Duration::from_secs(60)),
            IssueError::TooManyPendingForAccount { most, retry_after } => GatewayError::new(
                ErrorKind::RateLimited,
                format!(
                    "this account has {most} authorization codes waiting for their exchange, as many as it may; a place frees when an app exchanges its code or a code expires (10 minutes after it was made)"
                ),
            )
            .with_metadata("reason", "too_many_pending_codes_for_account")
            .with_retry_after(retry_after),
            IssueError::Store(error) => refuse(error),
        })?;
    let timestamp = |instant: chrono::DateTime<chrono::Utc>| {
        instant.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    Ok(Answer {
        status: StatusCode::CREATED,
        body: json!({"data": {
            "id": issued.code.expose(),
            "created_at": timestamp(issued.created_at),
            "expires_at": timestamp(issued.expires_at),
        }}),
        // The code is a secret until exchanged: like every answer of the
        // key routes, this one is `no-store`.
        headers: Vec::new(),
        raw: None,
    })
}

/// The account the app's key will belong to: the operator's key must name
/// it; an account's management key approves for its own account only.
fn approved_account(principal: &Principal, named: Option<&str>) -> Result<String, GatewayError> {
    match (principal.operator, named) {
        (true, Some(account)) => Ok(account.to_owned()),
        (true, None) => Err(invalid(
            "account",
            "is required with the operator's key: name the account whose key the app will get",
        )
        .with_metadata("reason", "account_required")),
        (false, Some(account)) if account != principal.account_id => Err(GatewayError::new(
            ErrorKind::Forbidden,
            format!(
                "this management key manages the account {} only",
                principal.account_id
            ),
        )
        .with_metadata("reason", "other_account")),
        (false, _) => Ok(principal.account_id.clone()),
    }
}
