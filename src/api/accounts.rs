//! The account routes: the calling key's credits and balance, and the
//! management of accounts (list, create, read, top up).

use chrono::{DateTime, Utc};
use futures_util::future::{try_join, try_join_all};
use http::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use super::answers::{created, existing_account, no_such_account, ok, refuse, timestamp};
use super::layer::KeyRoutesConfig;
use super::routes::Call;
use crate::answer::Answer;
use crate::error::GatewayError;
use crate::json_input::invalid_parameter;
use crate::keys::credits::{decimal_string, nanos_to_json};
use crate::keys::{AccountRecord, input};
use crate::store::{AccountBalance, TopUpOutcome};

/// `GET /api/v1/credits`: the calling key's account's credits and usage.
pub(crate) async fn credits(call: Call) -> Result<Answer, GatewayError> {
    let balance = callers_balance(&call).await?;
    Ok(ok(json!({"data": {
        "total_credits": nanos_to_json(balance.purchased_nanos),
        "total_usage": nanos_to_json(balance.purchased_nanos.saturating_sub(balance.balance_nanos)),
    }})))
}

/// `GET /user/balance`: the calling key's account's balance, as
/// DeepSeek-style clients read it.
pub(crate) async fn user_balance(call: Call) -> Result<Answer, GatewayError> {
    let balance = callers_balance(&call).await?;
    let total = decimal_string(balance.balance_nanos, 2);
    Ok(ok(json!({
        "is_available": balance.balance_nanos > 0,
        "balance_infos": [{
            "currency": "CREDITS",
            "total_balance": total,
            "granted_balance": decimal_string(0, 2),
            "topped_up_balance": total,
        }],
    })))
}

/// The balance of the calling key's account.
async fn callers_balance(call: &Call) -> Result<AccountBalance, GatewayError> {
    call.directory()
        .store()
        .account_balance(&call.principal.account_id)
        .await
        .map_err(refuse)
}

/// `POST /api/v1/accounts`: a new account; 422 `account_exists`.
pub(crate) async fn create_account(call: Call) -> Result<Answer, GatewayError> {
    let directory = call.directory();
    let new = input::new_account(call.body()?)?;
    let id = new.id.clone();
    let Some(account) = directory.create_account(new).await.map_err(refuse)? else {
        return Err(invalid_parameter(
            "id",
            format!("the account {id} exists already; read it with GET /api/v1/accounts/{id}"),
        )
        .with_metadata("reason", "account_exists"));
    };
    let balance = directory
        .store()
        .account_balance(&account.id)
        .await
        .map_err(refuse)?;
    Ok(created(json!({ "data": account_json(&account, &balance) })))
}

/// `GET /api/v1/accounts?offset=`: every account for the operator, its own
/// for an account's management key.
pub(crate) async fn list_accounts(call: Call) -> Result<Answer, GatewayError> {
    let directory = call.directory();
    let accounts = if call.principal.operator {
        let query = input::list_query(call.query.as_deref())?;
        directory
            .accounts(query.offset, input::KEYS_PER_PAGE)
            .await
            .map_err(refuse)?
    } else {
        directory
            .account(&call.principal.account_id)
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
    Ok(ok(json!({ "data": data })))
}

/// `GET /api/v1/accounts/{id}`: the account, its balance and free tier.
pub(crate) async fn get_account(call: Call) -> Result<Answer, GatewayError> {
    let account = call.path_account();
    let record = call
        .directory()
        .account(account)
        .await
        .map_err(refuse)?
        .ok_or_else(|| no_such_account(account))?;
    let (balance, free) = free_model_requests(&call.config, account, call.now).await?;
    let mut data = account_json(&record, &balance);
    if let Value::Object(fields) = &mut data {
        fields.extend(free);
    }
    Ok(ok(json!({ "data": data })))
}

/// `POST /api/v1/accounts/{id}/credits` `{amount}`: a top-up, once per
/// `Idempotency-Key` when one is sent.
pub(crate) async fn top_up(call: Call) -> Result<Answer, GatewayError> {
    let directory = call.directory();
    let account = input::path_account_id(call.param(0))?;
    let amount_nanos = input::purchase_nanos(call.body()?)?;
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
    let answer = ok(json!({"data": {
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

/// 422: an `Idempotency-Key` sent again with another amount. Nothing was
/// credited; the key stays bound to its first amount until forgotten.
fn idempotency_key_reused(account: &str, first_amount_nanos: i64) -> GatewayError {
    invalid_parameter(input::IDEMPOTENCY_KEY_HEADER, format!(
            "this Idempotency-Key was already used for a top-up of {} credits to the account {account}; nothing was credited. A retry must send the same amount; a new purchase needs a new key",
            decimal_string(first_amount_nanos, 0)
        ))
    .with_metadata("reason", "idempotency_key_reused")
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
pub(crate) async fn free_model_requests(
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
    .map_err(refuse)?;
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
