//! The key routes: the calling key's status, and the management of keys
//! (list, create, read, change, delete, report leaked, approve an app).

use futures_util::future::{try_join, try_join_all};
use serde_json::{Map, Value, json};

use super::accounts::free_model_requests;
use super::answers::{created, ok, refuse, timestamp};
use super::routes::{Call, operator_only, other_account};
use crate::answer::Answer;
use crate::auth::{KeyHash, Principal};
use crate::error::{ErrorKind, GatewayError};
use crate::json_input::{bad_request, invalid_parameter};
use crate::keys::credits::nanos_to_json;
use crate::keys::input::{self, unknown_account};
use crate::keys::{
    DEFAULT_ACCOUNT, KeyDirectory, KeyRecord, LeakOutcome, LeakReport, MODELGATE_TOKEN_TYPE,
    RotateOutcome, report_leak,
};
use crate::store::{KeyUsage, StoreError};

/// `GET /api/v1/key`: the calling key's limit, usage and free-model quota.
pub(crate) async fn key_status(call: Call) -> Result<Answer, GatewayError> {
    let principal = &call.principal;
    let account = principal.account_id.as_str();
    // The key's usage and the account's figures go out together.
    let (usage, (_, free)) = try_join(
        async {
            call.directory()
                .store()
                .key_usage(account, &principal.key_hash.to_hex(), call.now)
                .await
                .map_err(refuse)
        },
        free_model_requests(&call.config, account, call.now),
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
    Ok(ok(json!({ "data": data })))
}

/// `POST /api/v1/keys`: a new key, its plaintext shown once.
pub(crate) async fn create_key(call: Call) -> Result<Answer, GatewayError> {
    let principal = &call.principal;
    let directory = call.directory();
    let mut new = match input::new_key(call.body()?, call.now) {
        // Only the operator names the account of a management key;
        // anyone else asking for one is told it is not theirs to make.
        Err(error)
            if !principal.operator
                && error.metadata().get("reason") == Some(&Value::from("account_required")) =>
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
            return Err(other_account(principal));
        }
        // An account's management key makes keys for its account.
        new.account = principal.account_id.clone();
    } else if new.account != DEFAULT_ACCOUNT
        && !directory
            .account_exists(&new.account)
            .await
            .map_err(refuse)?
    {
        // Accounts are made by POST /api/v1/accounts only: a mistyped id
        // must not make a new free-tier account.
        return Err(unknown_account(&new.account));
    }
    let (key, record) = directory.create_key(new).await.map_err(refuse)?;
    Ok(created(json!({
        "key": key.expose(),
        "data": key_json(&record, &KeyUsage::default(), false),
    })))
}

/// `GET /api/v1/keys?offset=&include_disabled=&account=`: a page of keys,
/// an account's management key's own account's only.
pub(crate) async fn list_keys(call: Call) -> Result<Answer, GatewayError> {
    let principal = &call.principal;
    let directory = call.directory();
    let mut query = input::list_query(call.query.as_deref())?;
    if !principal.operator {
        if query
            .account
            .as_ref()
            .is_some_and(|account| *account != principal.account_id)
        {
            return Err(other_account(principal));
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
    let usages = try_join_all(records.iter().map(|record| async move {
        directory
            .store()
            .key_usage(&record.account, &record.hash.to_hex(), call.now)
            .await
    }))
    .await
    .map_err(refuse)?;
    let data: Vec<Value> = records
        .iter()
        .zip(&usages)
        .map(|(record, usage)| key_json(record, usage, is_current(principal, record)))
        .collect();
    Ok(ok(json!({ "data": data })))
}

/// `GET /api/v1/keys/{hash}`.
pub(crate) async fn get_key(call: Call) -> Result<Answer, GatewayError> {
    let hash = path_hash(call.param(0))?;
    let checked = readable_key(call.directory(), &call.principal, &hash)
        .await
        .map_err(refuse)??;
    let record = key_record(&call, &hash, checked).await?;
    key_answer(&call, Some(record)).await
}

/// The record of `hash`: `checked` when [`readable_key`] read it already
/// (a key of the caller's account), else read now (the operator's call);
/// 404 when there is none.
async fn key_record(
    call: &Call,
    hash: &KeyHash,
    checked: Option<KeyRecord>,
) -> Result<KeyRecord, GatewayError> {
    match checked {
        Some(record) => Ok(record),
        None => Ok(call
            .directory()
            .get(hash)
            .await
            .map_err(refuse)?
            .ok_or_else(no_such_key)?
            .value),
    }
}

/// `PATCH /api/v1/keys/{hash}`: a key that is not the calling one may be
/// disabled; one reported leaked is never enabled again.
pub(crate) async fn update_key(call: Call) -> Result<Answer, GatewayError> {
    let hash = path_hash(call.param(0))?;
    let directory = call.directory();
    let checked = readable_key(directory, &call.principal, &hash)
        .await
        .map_err(refuse)??;
    let update = input::key_update(call.body()?, call.now)?;
    if update.expires_at.is_some() {
        refuse_expiry_change(&call, &hash, checked.clone()).await?;
    }
    let sets_calling = input::calling_field(
        matches!(update.allowed_models, Some(Some(_))),
        matches!(update.rate_limit, Some(Some(_))),
    );
    if let Some(field) = sets_calling
        && key_record(&call, &hash, checked.clone()).await?.management
    {
        return Err(input::not_for_management_keys(field));
    }
    match update.disabled {
        Some(true) => refuse_own_key(&call.principal, &hash, "disable itself")?,
        Some(false) => {
            refuse_enabling_a_leaked_key(directory, &hash, checked.as_ref())
                .await
                .map_err(refuse)??;
            // The operator's disable is the operator's to lift (the
            // record's update keeps it so even when this check races one).
            if checked
                .as_ref()
                .is_some_and(|record| record.disabled_by_operator)
            {
                return Err(operator_only("enable a key the operator disabled"));
            }
        }
        None => {}
    }
    let record = directory
        .update_as(&hash, &update, call.principal.operator)
        .await
        .map_err(refuse)?;
    key_answer(&call, record).await
}

/// Refuses a change of `hash`'s expiry: by the key itself (it could lock
/// itself out), of a rotated key (its expiry is the end of its grace), or
/// of a management key by anyone but the operator (who set it).
async fn refuse_expiry_change(
    call: &Call,
    hash: &KeyHash,
    checked: Option<KeyRecord>,
) -> Result<(), GatewayError> {
    refuse_own_key(&call.principal, hash, "change its own expiry")?;
    let record = key_record(call, hash, checked).await?;
    if record.rotated_to.is_some() {
        return Err(invalid_parameter(
            "expires_at",
            "this key was rotated: it stops when its grace ends, and its expiry cannot change",
        )
        .with_metadata("reason", "rotated_key"));
    }
    if record.management && !call.principal.operator {
        return Err(operator_only("change a management key's expiry"));
    }
    Ok(())
}

/// Why `record` gets no successor: it is leaked, disabled or expired.
fn not_rotatable(record: &KeyRecord) -> GatewayError {
    let (reason, message) = if record.leak.is_some() {
        (
            "leaked_key",
            "this key was reported leaked and is disabled for good: create a new key and delete this one",
        )
    } else if record.disabled {
        (
            "disabled_key",
            "this key is disabled: enable it first, or create a new key",
        )
    } else {
        (
            "expired_key",
            "this key has expired: its successor would be expired too; create a new key",
        )
    };
    GatewayError::new(ErrorKind::InvalidParameter, message).with_metadata("reason", reason)
}

/// `POST /api/v1/keys/{hash}/rotate {grace_seconds?}`: 201 with a new key
/// of the same name, account, kind, limit, reset and expiry (shown once;
/// never wider than the old one's), the old one working for the grace.
/// A management key is rotated by the operator alone.
pub(crate) async fn rotate_key(call: Call) -> Result<Answer, GatewayError> {
    let hash = path_hash(call.param(0))?;
    let directory = call.directory();
    let grace = input::rotation_grace(call.body()?)?;
    let checked = readable_key(directory, &call.principal, &hash)
        .await
        .map_err(refuse)??;
    let record = key_record(&call, &hash, checked).await?;
    // The operator's key lives in MODELGATE_ADMIN_KEY, which a rotation
    // here would leave naming a key that stops.
    if record.is_operator() {
        return Err(GatewayError::new(
            ErrorKind::InvalidParameter,
            "the operator's key is not rotated here: make a new one with `proxy keygen`, set it as MODELGATE_ADMIN_KEY and restart, then delete this one with the new key",
        )
        .with_metadata("reason", "operator_key"));
    }
    // A management key's successor is a new management key, which only
    // the operator makes: else a manager could keep its own alive past a
    // disable or an expiry, or take over another manager's.
    if record.management && !call.principal.operator {
        return Err(operator_only("rotate a management key"));
    }
    match directory.rotate_key(&hash, grace).await.map_err(refuse)? {
        RotateOutcome::Rotated {
            key,
            record,
            previous,
        } => Ok(created(json!({
            "key": key.expose(),
            "data": key_json(&record, &KeyUsage::default(), false),
            "rotated": {
                "hash": previous.hash.to_hex(),
                "expires_at": timestamp(previous.expires_at),
            },
        }))),
        RotateOutcome::AlreadyRotated(_) => Err(GatewayError::new(
            ErrorKind::Conflict,
            "this key was rotated already: rotate the key that replaced it",
        )
        .with_metadata("reason", "already_rotated")),
        RotateOutcome::NotRotatable(record) => Err(not_rotatable(&record)),
        RotateOutcome::NoSuchKey => Err(no_such_key()),
    }
}

/// `DELETE /api/v1/keys/{hash}`: `{"deleted": true}`; not the calling key.
pub(crate) async fn delete_key(call: Call) -> Result<Answer, GatewayError> {
    let hash = path_hash(call.param(0))?;
    let directory = call.directory();
    readable_key(directory, &call.principal, &hash)
        .await
        .map_err(refuse)??;
    refuse_own_key(&call.principal, &hash, "delete itself")?;
    if directory.delete(&hash).await.map_err(refuse)? {
        Ok(ok(json!({"deleted": true})))
    } else {
        Err(no_such_key())
    }
}

/// `POST /api/v1/keys/{hash}/leaked`: the key revoked and disabled for
/// good, its owner told.
pub(crate) async fn report_leaked(call: Call) -> Result<Answer, GatewayError> {
    let hash = path_hash(call.param(0))?;
    let directory = call.directory();
    let (url, source) = input::leak_report(call.body()?)?;
    refuse_own_key(&call.principal, &hash, "report itself leaked")?;
    readable_key(directory, &call.principal, &hash)
        .await
        .map_err(refuse)??;
    let reported_by = if call.principal.operator {
        "operator".to_owned()
    } else {
        // The account's management key that reported it, by its hash
        // prefix, as the logs name keys.
        format!("manager:{}", &call.principal.key_hash.to_hex()[..8])
    };
    let report = LeakReport {
        reported_at: call.now,
        reported_by,
        url,
        source,
    };
    let outcome = report_leak(
        directory,
        &call.config.leak_notifier,
        &hash,
        &report,
        MODELGATE_TOKEN_TYPE,
    )
    .await
    .map_err(refuse)?;
    let LeakOutcome::Revoked { record, .. } = outcome else {
        return Err(no_such_key());
    };
    key_answer(&call, Some(*record)).await
}

/// `POST /api/v1/auth/keys/code`: a management key approves an app
/// ([`crate::oauth`]).
#[cfg(feature = "oauth")]
pub(crate) async fn approve_app(call: Call) -> Result<Answer, GatewayError> {
    crate::oauth::issue_code(
        call.directory(),
        call.config.approval_rules,
        &call.principal,
        call.body()?,
    )
    .await
}

/// `{"data": {…}}` of `record` with its usage, or 404.
async fn key_answer(call: &Call, record: Option<KeyRecord>) -> Result<Answer, GatewayError> {
    let record = record.ok_or_else(no_such_key)?;
    let usage = call
        .directory()
        .store()
        .key_usage(&record.account, &record.hash.to_hex(), call.now)
        .await
        .map_err(refuse)?;
    let current = is_current(&call.principal, &record);
    Ok(ok(json!({ "data": key_json(&record, &usage, current) })))
}

/// A key as the management API shows it; `current` when it is the key the
/// request was made with (a settings page keeps it from disabling itself).
fn key_json(record: &KeyRecord, usage: &KeyUsage, current: bool) -> Value {
    let mut data = Map::new();
    data.insert("hash".into(), Value::from(record.hash.to_hex()));
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
    data.insert(
        "hint".into(),
        record
            .hint
            .as_ref()
            .map_or(Value::Null, |hint| Value::from(hint.as_str())),
    );
    data.insert(
        "rotated_to".into(),
        record
            .rotated_to
            .as_ref()
            .map_or(Value::Null, |hash| Value::from(hash.to_hex())),
    );
    data.insert(
        "allowed_models".into(),
        record
            .allowed_models
            .as_ref()
            .map_or(Value::Null, |models| Value::from(models.clone())),
    );
    data.insert(
        "rate_limit".into(),
        record.rate_limit.map_or(
            Value::Null,
            |rate| json!({"requests": rate.requests, "window_seconds": rate.window_seconds}),
        ),
    );
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

fn path_hash(text: &str) -> Result<KeyHash, GatewayError> {
    KeyHash::from_hex(&text.to_ascii_lowercase()).ok_or_else(|| {
        bad_request("hash", "the key hash in the path must be 64 hexadecimal characters, as the management API lists it")
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
        Err(invalid_parameter(
            "disabled",
            "this key was reported leaked and stays disabled; delete it and create a new key",
        )
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

/// 409 when the key `hash` is the calling key itself: a key that disabled,
/// deleted or reported itself would lock out whoever uses it (the
/// operator's, everyone). `what` is the refused action, as in "a key cannot
/// {what}".
fn refuse_own_key(principal: &Principal, hash: &KeyHash, what: &str) -> Result<(), GatewayError> {
    if principal.key_hash != *hash {
        return Ok(());
    }
    let rotate = if principal.operator {
        "To replace the operator's key, make a new one with `proxy keygen`, set it as MODELGATE_ADMIN_KEY and restart, then disable or delete this one with the new key; if the key is lost or leaked, run `proxy reset-operator-key`".to_owned()
    } else {
        // Only the operator rotates a management key (every key that
        // calls these routes is one).
        "To replace it, ask the gateway's operator to rotate it: its successor works at once, and this key for the grace, time to switch to the new one".to_owned()
    };
    Err(GatewayError::new(
        ErrorKind::Conflict,
        format!("a key cannot {what}: it is the key this request was made with. {rotate}."),
    )
    .with_metadata("reason", "own_key"))
}

/// Whether `record` is the key `principal` called with.
fn is_current(principal: &Principal, record: &KeyRecord) -> bool {
    record.hash == principal.key_hash
}
