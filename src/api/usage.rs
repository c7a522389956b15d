//! The usage routes ([`crate::usage`] keeps the records and the
//! ranking): one generation record, an account's newest, its activity
//! per day and model, and the app ranking.

use chrono::DateTime;
use serde_json::{Value, json};

use super::answers::{ok, refuse};
use super::routes::Call;
use crate::answer::Answer;
use crate::auth::Principal;
use crate::error::{ErrorKind, GatewayError};
use crate::json_input::{bad_request, invalid_parameter};
use crate::store::GenerationsPage;
use crate::usage::{
    GENERATIONS_SCAN_DEPTH, PUBLIC_SCOPE, UsageQuery, activity_query, activity_rows, by_host,
    complete_from, parse_generation_id, ranking_json, readable_by, record_day, usage_query,
};

/// The account whose records or apps are asked for: any for the operator
/// (who must name one for records), the key's own for every other key.
fn account_asked(
    principal: &Principal,
    asked: Option<String>,
) -> Result<Option<String>, GatewayError> {
    match asked {
        Some(account) if account == PUBLIC_SCOPE => Err(invalid_parameter(
            "account",
            "account=* names the whole gateway, which only GET /api/v1/apps ranks; name one account",
        )),
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
        return Err(bad_request(
            "id",
            "name the generation with ?id=, the X-Generation-Id of its response",
        ));
    };
    let reservation = parse_generation_id(id).ok_or_else(|| {
        bad_request("id", "the query parameter `id` must be a generation id: gen- and 32 hex digits, as X-Generation-Id gives it")
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

/// `GET /api/v1/generations?limit=&offset=&key=&model=&from=&to=&format=&account=`:
/// the account's records, newest first (only its own for an inference key),
/// a page at a time, read by the store's index (per account, per key);
/// filtered by model or time among its newest [`GENERATIONS_SCAN_DEPTH`];
/// as JSON with the `next_offset` of the next page, or as CSV.
pub(crate) async fn recent_generations(call: Call) -> Result<Answer, GatewayError> {
    let principal = &call.principal;
    let mut query = usage_query(call.query.as_deref())?;
    let Some(account) = account_asked(principal, query.account.take())? else {
        return Err(bad_request(
            "account",
            "the operator's key names the account with ?account=",
        ));
    };
    let key_hash = principal.key_hash.to_hex();
    // Read by index: an inference key's own records only (a `key` naming
    // another then matches none), a management key's account's, or the
    // key's it names. The page and one record more, which says whether
    // another page follows; a filter by what only the records say looks
    // among the newest, deeper than asked.
    let key = if principal.management {
        query.key.as_deref()
    } else {
        Some(key_hash.as_str())
    };
    let wanted = query.limit + 1;
    let mut records = Vec::with_capacity(wanted);
    if query.scans() {
        let mut passed = 0;
        scan_generations(&call, &account, key, GENERATIONS_SCAN_DEPTH, |record| {
            if readable_by(&record, &account, &key_hash, principal.management)
                && matches_filters(&record, &query)
            {
                if passed < query.offset {
                    passed += 1;
                } else {
                    records.push(record);
                }
            }
            records.len() < wanted
        })
        .await?;
    } else {
        let page = GenerationsPage {
            key,
            skip: query.offset,
            limit: wanted,
        };
        records = call
            .directory()
            .store()
            .generations_page(&account, page, call.now)
            .await
            .map_err(refuse)?
            .into_iter()
            .filter_map(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
            .filter(|record| readable_by(record, &account, &key_hash, principal.management))
            .filter(|record| matches_filters(record, &query))
            .collect();
    }
    let more = records.len() > query.limit;
    records.truncate(query.limit);
    if query.csv {
        return csv_export(&records);
    }
    let next_offset = more.then(|| query.offset + records.len());
    Ok(ok(json!({ "data": records, "next_offset": next_offset })))
}

/// `GET /api/v1/activity?date=&account=`: the account's requests, tokens
/// and spend per UTC day and model over the last 30 days and today,
/// summed from its newest [`GENERATIONS_SCAN_DEPTH`] records. The route
/// is for management keys (as OpenRouter's); the operator's names the
/// account.
pub(crate) async fn activity(call: Call) -> Result<Answer, GatewayError> {
    let principal = &call.principal;
    let today = call.now.date_naive();
    let query = activity_query(call.query.as_deref(), today)?;
    let Some(account) = account_asked(principal, query.account)? else {
        return Err(bad_request(
            "account",
            "the operator's key names the account with ?account=",
        ));
    };
    let mut records = Vec::new();
    let read = scan_generations(&call, &account, None, GENERATIONS_SCAN_DEPTH, |record| {
        if record["user_id"].as_str() == Some(account.as_str()) {
            records.push(record);
        }
        true
    })
    .await?;
    let scan_cut = read >= GENERATIONS_SCAN_DEPTH;
    // A scan cut short leaves its oldest days short: they are left out,
    // and the answer says from which day it is whole.
    let complete_from = scan_cut.then(|| complete_from(&records)).flatten();
    if let Some(from) = complete_from {
        records.retain(|record| record_day(record).is_some_and(|day| day >= from));
    }
    let mut answer = json!({ "data": activity_rows(&records, today, query.date) });
    if let Some(from) = complete_from {
        answer["complete_from"] = Value::from(from.to_string());
    }
    Ok(ok(answer))
}

/// Records a scan reads from the store at a time: each read is short, so
/// that other tenants' calls on the same store (SQLite's one thread, a
/// Redis shard) pass between them.
const SCAN_CHUNK: usize = 100;

/// Reads `account`'s newest records (`key`'s when named), up to `depth`,
/// in chunks of [`SCAN_CHUNK`], giving each parsed record to `visit` until
/// it answers `false`. Returns how many records were read. Records written
/// meanwhile move the later chunks: a scan may see a record twice or miss
/// one at a chunk's edge, which a page of a live account may anyway.
async fn scan_generations(
    call: &Call,
    account: &str,
    key: Option<&str>,
    depth: usize,
    mut visit: impl FnMut(Value) -> bool,
) -> Result<usize, GatewayError> {
    let store = call.directory().store();
    let mut read = 0;
    while read < depth {
        let page = GenerationsPage {
            key,
            skip: read,
            limit: SCAN_CHUNK.min(depth - read),
        };
        let chunk = store
            .generations_page(account, page, call.now)
            .await
            .map_err(refuse)?;
        let full = chunk.len() == page.limit;
        read += chunk.len();
        for bytes in chunk {
            let Ok(record) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            if !visit(record) {
                return Ok(read);
            }
        }
        if !full {
            break;
        }
    }
    Ok(read)
}

/// Whether `record` passes the query's `key`, `model`, `from` and `to`.
fn matches_filters(record: &Value, query: &UsageQuery) -> bool {
    if query
        .key
        .as_ref()
        .is_some_and(|key| record["key_hash"].as_str() != Some(key.as_str()))
    {
        return false;
    }
    if query
        .model
        .as_ref()
        .is_some_and(|model| record["model"].as_str() != Some(model.as_str()))
    {
        return false;
    }
    if query.from.is_none() && query.to.is_none() {
        return true;
    }
    let Some(created_at) = record["created_at"]
        .as_str()
        .and_then(|text| DateTime::parse_from_rfc3339(text).ok())
    else {
        return false;
    };
    query.from.is_none_or(|from| created_at >= from) && query.to.is_none_or(|to| created_at < to)
}

/// The page as CSV, when the crate is built with the `csv` feature.
#[cfg(feature = "csv")]
fn csv_export(records: &[Value]) -> Result<Answer, GatewayError> {
    super::csv_export::answer(records)
}

/// Without the `csv` feature the service has no CSV export.
#[cfg(not(feature = "csv"))]
fn csv_export(_records: &[Value]) -> Result<Answer, GatewayError> {
    Err(bad_request(
        "format",
        "this service does not export CSV; leave out `format` for JSON",
    ))
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
