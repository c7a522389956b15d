//! The usage routes ([`crate::usage`] keeps the records and the
//! ranking): one generation record, an account's newest, and the app
//! ranking.

use serde_json::{json, Value};

use super::answers::{ok, refuse};
use super::routes::Call;
use crate::answer::Answer;
use crate::auth::Principal;
use crate::error::{ErrorKind, GatewayError};
use crate::usage::{
    by_host, parse_generation_id, ranking_json, readable_by, usage_query, PUBLIC_SCOPE,
};

/// How many of its account's newest records an inference key's own are
/// looked for among in `GET /api/v1/generations`.
pub(crate) const INFERENCE_KEY_SEARCH_DEPTH: usize = 1_000;

/// The account whose records or apps are asked for: any for the operator
/// (who must name one for records), the key's own for every other key.
fn account_asked(
    principal: &Principal,
    asked: Option<String>,
) -> Result<Option<String>, GatewayError> {
    match asked {
        Some(account) if account == PUBLIC_SCOPE => Err(GatewayError::new(
            ErrorKind::InvalidParameter,
            "account=* names the whole gateway, which only GET /api/v1/apps ranks; name one account",
        )
        .with_metadata("param", "account")),
        Some(account) if principal.operator || account == principal.account_id => Ok(Some(account)),
        Some(_) => Err(GatewayError::new(
            ErrorKind::Forbidden,
            format!("this key reads the account {} only", principal.account_id),
        )
        .with_metadata("reason", "other_account")),
        None if principal.operator => Ok(None),
        None => Ok(Some(principal.account_id.clone())),
    }
}

fn not_found() -> GatewayError {
    GatewayError::new(
        ErrorKind::NotFound,
        "no generation with this id is visible to this key: it was made by another key, \
         is older than the gateway keeps records, or has not been settled yet (retry in a moment)",
    )
}

/// `GET /api/v1/generation?id=`: the record, to the key that made the
/// request or a management key of its account (the operator's names the
/// account with `account`); 404 to any other.
pub(crate) async fn generation(call: Call) -> Result<Answer, GatewayError> {
    let principal = &call.principal;
    let query = usage_query(call.query.as_deref())?;
    let Some(id) = query.id.as_deref() else {
        return Err(GatewayError::new(
            ErrorKind::InvalidRequest,
            "name the generation with ?id=, the X-Generation-Id of its response",
        )
        .with_metadata("param", "id"));
    };
    let reservation = parse_generation_id(id).ok_or_else(|| {
        GatewayError::new(
            ErrorKind::InvalidRequest,
            "the query parameter `id` must be a generation id: gen- and 32 hex digits, as X-Generation-Id gives it",
        )
        .with_metadata("param", "id")
    })?;
    let Some(account) = account_asked(principal, query.account)? else {
        return Err(not_found());
    };
    let Some(bytes) = call
        .directory()
        .store()
        .generation(&account, reservation, call.now)
        .await
        .map_err(refuse)?
    else {
        return Err(not_found());
    };
    let record: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let key_hash = principal.key_hash.to_hex();
    if !readable_by(&record, &account, &key_hash, principal.management) {
        return Err(not_found());
    }
    Ok(ok(json!({ "data": record })))
}

/// `GET /api/v1/generations?limit=&account=`: the account's newest
/// records (only its own for an inference key).
pub(crate) async fn recent_generations(call: Call) -> Result<Answer, GatewayError> {
    let principal = &call.principal;
    let query = usage_query(call.query.as_deref())?;
    let Some(account) = account_asked(principal, query.account)? else {
        return Err(GatewayError::new(
            ErrorKind::InvalidRequest,
            "the operator's key names the account with ?account=",
        )
        .with_metadata("param", "account"));
    };
    let key_hash = principal.key_hash.to_hex();
    // An inference key sees only its own: looked for among the account's
    // newest, deeper than asked, since other keys' come between.
    let depth = if principal.management {
        query.limit
    } else {
        INFERENCE_KEY_SEARCH_DEPTH
    };
    let records: Vec<Value> = call
        .directory()
        .store()
        .recent_generations(&account, depth, call.now)
        .await
        .map_err(refuse)?
        .into_iter()
        .filter_map(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .filter(|record| readable_by(record, &account, &key_hash, principal.management))
        .take(query.limit)
        .collect();
    Ok(ok(json!({ "data": records })))
}

/// `GET /api/v1/apps?period=&account=`: apps by tokens in the current
/// UTC period, in one account (a key's own by default; any for the
/// operator) or in the whole gateway (`account=*`; the operator's by
/// default). The whole gateway's is the operator's alone, unless
/// `public_ranking`: then any key reads it, by host only.
pub(crate) async fn apps(call: Call) -> Result<Answer, GatewayError> {
    let principal = &call.principal;
    let public_ranking = call.config.public_ranking;
    let now = call.now;
    let query = usage_query(call.query.as_deref())?;
    let whole_gateway = match &query.account {
        Some(asked) => asked == PUBLIC_SCOPE,
        None => principal.operator,
    };
    let (scope, hosts_only) = if whole_gateway {
        if !principal.operator && !public_ranking {
            return Err(GatewayError::new(
                ErrorKind::Forbidden,
                format!(
                    "the gateway-wide app ranking is the operator's on this gateway; read your account's with GET /api/v1/apps (or account={})",
                    principal.account_id
                ),
            )
            .with_metadata("reason", "operator_only"));
        }
        // Other tenants' apps reach a tenant by host only: a path or a
        // title may say what a tenant is working on.
        (PUBLIC_SCOPE.to_owned(), !principal.operator)
    } else {
        let account = account_asked(principal, query.account)?
            .unwrap_or_else(|| principal.account_id.clone());
        (account, false)
    };
    if let Some(ranking) = &call.config.app_ranking {
        // This instance's latest counts first, so a client sees its own
        // requests; others' arrive within their flush interval.
        if let Err(error) = ranking.flush().await {
            tracing::warn!(%error, "app ranking: counts not written before a read");
        }
    }
    let mut rows = call
        .directory()
        .store()
        .app_usage(&scope, query.period, now)
        .await
        .map_err(refuse)?;
    if hosts_only {
        rows = by_host(rows);
    }
    Ok(ok(json!({ "data": ranking_json(rows, query.period, now) })))
}
