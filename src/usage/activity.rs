//! An account's activity, as OpenRouter's `GET /api/v1/activity`: per UTC
//! day and model, the requests, tokens and spend of its generation
//! records over the last [`ACTIVITY_DAYS`] days and today.
//!
//! It is summed from the same records `GET /api/v1/generations` pages
//! through, among the account's newest
//! [`GENERATIONS_SCAN_DEPTH`](super::GENERATIONS_SCAN_DEPTH): for an
//! account with more in the window, the days the scan did not read whole
//! are left out and the answer says from which day it is whole
//! ([`complete_from`]); a day older than the records' retention (30 days
//! by default) is partly gone.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, NaiveDate, Utc};
use serde_json::{Value, json};

use super::query::{bad, given_once};
use crate::error::GatewayError;
use crate::keys::credits::{nanos_from_json, nanos_to_json};
use crate::keys::is_valid_account_id;

/// How many whole UTC days before today the activity covers (today too).
pub const ACTIVITY_DAYS: i64 = 30;

/// What `GET /api/v1/activity`'s query string asks for. Unknown
/// parameters are ignored, as on the other usage routes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActivityQuery {
    /// `date`: only this UTC day (`YYYY-MM-DD`), within the window.
    pub date: Option<NaiveDate>,
    /// `account`: whose activity; the operator's key must name one, any
    /// other management key reads only its own.
    pub account: Option<String>,
}

/// The first day of the window that ends with `today`.
pub fn activity_window_start(today: NaiveDate) -> NaiveDate {
    today - Duration::days(ACTIVITY_DAYS)
}

/// Reads `GET /api/v1/activity`'s query string, `today` being the current
/// UTC day: a parameter given twice is a 400, a bad value a 422, each
/// naming it in `metadata.param`.
pub fn activity_query(
    query: Option<&str>,
    today: NaiveDate,
) -> Result<ActivityQuery, GatewayError> {
    let mut parsed = ActivityQuery::default();
    let mut seen: Vec<&'static str> = Vec::new();
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let name: &'static str = match name.as_ref() {
            "date" => "date",
            "account" => "account",
            _ => continue,
        };
        given_once(&mut seen, name)?;
        if name == "account" {
            if !is_valid_account_id(&value) {
                return Err(bad(name, "must be 1 to 64 characters of A-Z a-z 0-9 . _ -"));
            }
            parsed.account = Some(value.into_owned());
            continue;
        }
        let start = activity_window_start(today);
        let date = strict_date(&value).ok_or_else(|| {
            bad(
                name,
                "must be a UTC date written YYYY-MM-DD, such as 2026-11-01",
            )
        })?;
        if date < start || date > today {
            return Err(bad(
                name,
                &format!(
                    "must be a day of the last {ACTIVITY_DAYS} days or today: from {start} to {today}"
                ),
            ));
        }
        parsed.date = Some(date);
    }
    Ok(parsed)
}

/// `YYYY-MM-DD` and nothing else: chrono alone would take `2026-1-5` or a
/// sign.
fn strict_date(text: &str) -> Option<NaiveDate> {
    let bytes = text.as_bytes();
    let shaped = bytes.len() == 10
        && bytes.iter().enumerate().all(|(at, byte)| match at {
            4 | 7 => *byte == b'-',
            _ => byte.is_ascii_digit(),
        });
    shaped
        .then(|| NaiveDate::parse_from_str(text, "%Y-%m-%d").ok())
        .flatten()
}

/// One day and model's sums.
#[derive(Debug, Default)]
struct Sums {
    provider_name: String,
    requests: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    /// Of `prompt_tokens`, read from the upstream's cache.
    cached_tokens: u64,
    /// Of `completion_tokens`, reasoning.
    reasoning_tokens: u64,
    usage_nanos: i64,
    byok_usage_nanos: i64,
    /// Of `requests`, those charged their whole hold (usage never known).
    hold_charged_requests: u64,
    /// Their cost, within `usage_nanos` and `byok_usage_nanos`.
    hold_charged_nanos: i64,
}

/// The activity row of a record that names no model: a lapse's record an
/// older version wrote, or one whose hold named none.
pub const UNKNOWN_MODEL: &str = "unknown";

/// For a scan that stopped at its depth before the window's start: the
/// first day it read whole, the day after its oldest record's. Days before
/// it would be short, so the answer leaves them out and says so
/// (`complete_from`) rather than show them wrong.
pub fn complete_from<'a>(records: impl IntoIterator<Item = &'a Value>) -> Option<NaiveDate> {
    records.into_iter().filter_map(record_day).min()?.succ_opt()
}

/// The UTC day a record was made, from its `created_at`.
pub fn record_day(record: &Value) -> Option<NaiveDate> {
    record["created_at"]
        .as_str()
        .and_then(|text| DateTime::parse_from_rfc3339(text).ok())
        .map(|instant| instant.with_timezone(&Utc).date_naive())
}

/// The activity rows of `records` (generation records as stored) whose
/// UTC day is within the window ending `today` (only `date`, when given),
/// ordered by day, then model. `usage` is what was taken from the balance,
/// `byok_usage_inference` what went through the account's own provider
/// keys, both in credits summed exactly in nano-credits. Every record
/// counts, a charged hold's too ([`charged_hold`]: a lapsed or unanswered
/// request): those are also counted apart, in `hold_charged_requests` and
/// `hold_charged_usage`, and one naming no model (an older lapse's) counts
/// under [`UNKNOWN_MODEL`]. A record whose time or cost cannot be read (none the
/// gateway writes) is left out.
pub fn activity_rows<'a>(
    records: impl IntoIterator<Item = &'a Value>,
    today: NaiveDate,
    date: Option<NaiveDate>,
) -> Vec<Value> {
    let start = activity_window_start(today);
    let mut sums: BTreeMap<(NaiveDate, String), Sums> = BTreeMap::new();
    for record in records {
        let Some(day) = record_day(record) else {
            continue;
        };
        if day < start || day > today || date.is_some_and(|date| date != day) {
            continue;
        }
        let Ok(cost_nanos) = nanos_from_json(&record["total_cost"]) else {
            continue;
        };
        // A lapse's record names the model asked for, but an older one
        // none: its charge counts all the same.
        let model = record["model"]
            .as_str()
            .or_else(|| record["requested_model"].as_str())
            .unwrap_or(UNKNOWN_MODEL);
        // One row per model however clients spell it (ids ignore case).
        let row = sums.entry((day, model.to_ascii_lowercase())).or_default();
        if row.provider_name.is_empty() {
            row.provider_name = record["provider_name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        }
        row.requests += 1;
        row.prompt_tokens = row
            .prompt_tokens
            .saturating_add(record["tokens_prompt"].as_u64().unwrap_or(0));
        row.completion_tokens = row
            .completion_tokens
            .saturating_add(record["tokens_completion"].as_u64().unwrap_or(0));
        row.cached_tokens = row
            .cached_tokens
            .saturating_add(record["native_tokens_cached"].as_u64().unwrap_or(0));
        row.reasoning_tokens = row
            .reasoning_tokens
            .saturating_add(record["native_tokens_reasoning"].as_u64().unwrap_or(0));
        if record["is_byok"].as_bool() == Some(true) {
            row.byok_usage_nanos = row.byok_usage_nanos.saturating_add(cost_nanos);
        } else {
            row.usage_nanos = row.usage_nanos.saturating_add(cost_nanos);
        }
        if charged_hold(record) {
            row.hold_charged_requests += 1;
            row.hold_charged_nanos = row.hold_charged_nanos.saturating_add(cost_nanos);
        }
    }
    sums.into_iter()
        .map(|((day, model), row)| {
            json!({
                "date": day.format("%Y-%m-%d").to_string(),
                "model": model,
                "provider_name": row.provider_name,
                "requests": row.requests,
                "prompt_tokens": row.prompt_tokens,
                "completion_tokens": row.completion_tokens,
                "cached_tokens": row.cached_tokens,
                "reasoning_tokens": row.reasoning_tokens,
                "usage": nanos_to_json(row.usage_nanos),
                "byok_usage_inference": nanos_to_json(row.byok_usage_nanos),
                "hold_charged_requests": row.hold_charged_requests,
                "hold_charged_usage": nanos_to_json(row.hold_charged_nanos),
            })
        })
        .collect()
}

/// Whether `record` is of a request charged its whole hold because its
/// usage can never be known: its `cost_basis` is `lapsed` (its instance
/// stopped renewing it) or `unanswered` (the upstream took it and never
/// answered), or it says `"lapsed": true`.
pub fn charged_hold(record: &Value) -> bool {
    record["lapsed"].as_bool() == Some(true)
        || matches!(
            record["cost_basis"].as_str(),
            Some(LAPSED_BASIS | UNANSWERED_BASIS)
        )
}

/// The `cost_basis` of a lapsed hold's record.
pub const LAPSED_BASIS: &str = "lapsed";
/// The `cost_basis` of a request the upstream took and never answered.
pub const UNANSWERED_BASIS: &str = "unanswered";
/// The `cost_basis` of a request whose usage came after its client's error.
pub const LATE_ANSWER_BASIS: &str = "late_answer";

/// Why a record's cost is what it is, in words, for the cost bases a
/// person would not guess (`None` for the others): the CSV's `cost_note`
/// and the settings page say it.
pub fn cost_note(record: &Value) -> Option<&'static str> {
    match record["cost_basis"].as_str() {
        Some(UNANSWERED_BASIS) => Some(
            "charged its whole hold: the upstream took the request but never answered, so its usage is unknown",
        ),
        Some(LATE_ANSWER_BASIS) => Some(
            "charged the usage the upstream reported after the gateway had answered the client with an error",
        ),
        _ if charged_hold(record) => Some(
            "charged its whole hold: the hold lapsed (the gateway instance serving the request stopped, or could not record its cost in time), so its usage is unknown; a late settlement replaces this charge",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn today() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, 26).unwrap()
    }

    #[test]
    fn the_query_reads_a_date_in_the_window_and_an_account() {
        assert_eq!(
            activity_query(None, today()).unwrap(),
            ActivityQuery::default()
        );
        let query = activity_query(Some("date=2026-10-27&account=acme&_=1"), today()).unwrap();
        assert_eq!(query.date, NaiveDate::from_ymd_opt(2026, 10, 27));
        assert_eq!(query.account.as_deref(), Some("acme"));
        let today_only = activity_query(Some("date=2026-11-26"), today()).unwrap();
        assert_eq!(today_only.date, Some(today()));
    }

    #[test]
    fn bad_values_are_422s_and_a_repeated_parameter_a_400_each_naming_it() {
        for (query, param, status) in [
            ("date=", "date", 422),
            ("date=2026-1-05", "date", 422),
            ("date=2026-11-5", "date", 422),
            ("date=+2026-11-05", "date", 422),
            ("date=2026-11-05T00:00:00Z", "date", 422),
            ("date=2026-02-30", "date", 422),
            ("date=2026/11/05", "date", 422),
            ("date=yesterday", "date", 422),
            // The window: thirty days back, not thirty-one; not tomorrow.
            ("date=2026-10-26", "date", 422),
            ("date=2026-11-27", "date", 422),
            ("account=", "account", 422),
            ("account=*", "account", 422),
            ("account=a%20b", "account", 422),
            ("date=2026-11-26&date=2026-11-25", "date", 400),
            ("account=a&account=a", "account", 400),
        ] {
            let error = activity_query(Some(query), today()).unwrap_err();
            assert_eq!(error.status().as_u16(), status, "{query}");
            assert_eq!(error.metadata()["param"], param, "{query}");
            assert!(
                error.message().contains(param),
                "{query}: {}",
                error.message()
            );
        }
    }

    fn record(
        created_at: &str,
        model: &str,
        cost: f64,
        byok: bool,
        tokens: Option<(u64, u64)>,
    ) -> Value {
        json!({
            "created_at": created_at,
            "model": model,
            "provider_name": model.split('/').next().unwrap(),
            "total_cost": cost,
            "usage": cost,
            "is_byok": byok,
            "tokens_prompt": tokens.map(|tokens| tokens.0),
            "tokens_completion": tokens.map(|tokens| tokens.1),
        })
    }

    #[test]
    fn records_are_summed_per_utc_day_and_model_in_order() {
        let records = [
            record(
                "2026-11-26T23:59:59.999Z",
                "b/two",
                0.1,
                false,
                Some((3, 4)),
            ),
            record(
                "2026-11-26T00:00:00.000Z",
                "b/two",
                0.2,
                false,
                Some((1, 1)),
            ),
            record("2026-11-26T10:00:00.000Z", "a/one", 0.5, true, None),
            // 23:30 the day before in UTC, though 00:30 where it was sent.
            record(
                "2026-11-26T00:30:00+01:00",
                "a/one",
                1.0,
                false,
                Some((10, 0)),
            ),
            record(
                "2026-10-27T00:00:00.000Z",
                "a/one",
                2.0,
                false,
                Some((1, 2)),
            ),
            // Outside the window, or unreadable: left out.
            record("2026-10-26T23:59:59.999Z", "a/one", 9.0, false, None),
            record("2026-11-27T00:00:00.000Z", "a/one", 9.0, false, None),
            record("not a time", "a/one", 9.0, false, None),
            json!({"created_at": "2026-11-26T01:00:00Z", "model": "a/one", "total_cost": "1"}),
        ];
        let rows = activity_rows(&records, today(), None);
        let summary: Vec<(&str, &str, u64, u64, u64, String, String)> = rows
            .iter()
            .map(|row| {
                (
                    row["date"].as_str().unwrap(),
                    row["model"].as_str().unwrap(),
                    row["requests"].as_u64().unwrap(),
                    row["prompt_tokens"].as_u64().unwrap(),
                    row["completion_tokens"].as_u64().unwrap(),
                    row["usage"].to_string(),
                    row["byok_usage_inference"].to_string(),
                )
            })
            .collect();
        let owned = |date, model, requests, prompt, completion, usage: &str, byok: &str| {
            (
                date,
                model,
                requests,
                prompt,
                completion,
                usage.to_owned(),
                byok.to_owned(),
            )
        };
        assert_eq!(
            summary,
            [
                owned("2026-10-27", "a/one", 1, 1, 2, "2", "0"),
                owned("2026-11-25", "a/one", 1, 10, 0, "1", "0"),
                owned("2026-11-26", "a/one", 1, 0, 0, "0", "0.5"),
                // 0.1 + 0.2 summed in nanos: exactly 0.3.
                owned("2026-11-26", "b/two", 2, 4, 5, "0.3", "0"),
            ]
        );
        assert_eq!(rows[0]["provider_name"], "a");
        let one_day = activity_rows(&records, today(), NaiveDate::from_ymd_opt(2026, 11, 25));
        assert_eq!(one_day.len(), 1);
        assert_eq!(one_day[0]["date"], "2026-11-25");
        assert!(activity_rows(&Vec::<Value>::new(), today(), None).is_empty());
    }

    /// A lapse's record, as the store writes it (`store::lapse_record`) for
    /// a hold that named no model: no model, no tokens.
    fn lapse(created_at: &str, cost: f64, byok: bool) -> Value {
        let record = crate::store::lapse_record(
            "acme",
            "00ff",
            &format!("{:032x}", 7),
            nanos_from_json(&json!(cost)).unwrap(),
            byok,
            DateTime::parse_from_rfc3339(created_at)
                .unwrap()
                .with_timezone(&Utc),
            None,
        );
        serde_json::from_slice(&record).unwrap()
    }

    #[test]
    fn charged_holds_count_in_their_day_marked_apart() {
        let mut unanswered = record("2026-11-26T09:00:00Z", "a/one", 0.134, false, Some((5, 0)));
        unanswered["cost_basis"] = json!("unanswered");
        let mut late = record("2026-11-26T09:30:00Z", "a/one", 0.01, false, Some((5, 3)));
        late["cost_basis"] = json!("late_answer");
        let records = [
            lapse("2026-11-26T10:00:00Z", 0.134, false),
            lapse("2026-11-26T10:00:01Z", 0.134, false),
            lapse("2026-11-26T10:00:02Z", 0.134, true),
            unanswered,
            late,
        ];
        let rows = activity_rows(&records, today(), None);
        assert_eq!(rows.len(), 2, "{rows:?}");
        let one = &rows[0];
        assert_eq!(one["model"], "a/one");
        assert_eq!(one["requests"], 2);
        assert_eq!(one["hold_charged_requests"], 1);
        assert_eq!(one["hold_charged_usage"], json!(0.134));
        assert_eq!(one["usage"], json!(0.144));
        let unknown = &rows[1];
        assert_eq!(unknown["model"], UNKNOWN_MODEL);
        assert_eq!(unknown["requests"], 3);
        assert_eq!(unknown["hold_charged_requests"], 3);
        // 0.268 from the balance, 0.134 through the account's own key.
        assert_eq!(unknown["usage"], json!(0.268));
        assert_eq!(unknown["byok_usage_inference"], json!(0.134));
        assert_eq!(unknown["hold_charged_usage"], json!(0.402));
        // Each marked record says why in words; a plain one says nothing.
        assert!(cost_note(&records[0]).unwrap().contains("lapsed"));
        assert!(cost_note(&records[3]).unwrap().contains("never answered"));
        assert!(cost_note(&records[4]).unwrap().contains("after"));
        assert!(!charged_hold(&records[4]));
        assert_eq!(
            cost_note(&record("2026-11-26T10:00:00Z", "a/one", 1.0, false, None)),
            None
        );
    }

    #[test]
    fn a_scan_cut_short_is_whole_from_the_day_after_its_oldest_record() {
        let records = [
            record("2026-11-26T10:00:00Z", "a/one", 1.0, false, None),
            record("2026-11-20T23:59:59+02:00", "a/one", 1.0, false, None),
            record("not a time", "a/one", 1.0, false, None),
            record("2026-11-24T00:00:00Z", "a/one", 1.0, false, None),
        ];
        // The oldest is 2026-11-20 21:59:59 UTC: the 20th may be short.
        assert_eq!(
            complete_from(&records),
            NaiveDate::from_ymd_opt(2026, 11, 21)
        );
        assert_eq!(complete_from(&records[2..3]), None);
        assert_eq!(
            record_day(&records[1]),
            NaiveDate::from_ymd_opt(2026, 11, 20)
        );
    }

    proptest! {
        #[test]
        fn any_query_gives_an_answer_never_a_panic(query in ".{0,120}") {
            if let Ok(parsed) = activity_query(Some(&query), today()) {
                if let Some(date) = parsed.date {
                    prop_assert!(activity_window_start(today()) <= date && date <= today());
                }
                prop_assert!(parsed.account.iter().all(|account| is_valid_account_id(account)));
            }
        }

        /// Each row's figures are the sums of its records: requests add up
        /// to the records in the window, spend to their costs, exactly.
        #[test]
        fn the_rows_add_up_to_the_records(
            drawn in proptest::collection::vec((0i64..40, 0usize..3, 0i64..5_000_000, any::<bool>(), 0u64..1000), 0..60)
        ) {
            let models = ["a/one", "b/two", "c/three"];
            let records: Vec<Value> = drawn
                .iter()
                .map(|(days_ago, model, nanos, byok, tokens)| {
                    let day = today() - Duration::days(*days_ago);
                    record(
                        &format!("{day}T12:00:00Z"),
                        models[*model],
                        nanos_to_json(*nanos).as_f64().unwrap(),
                        *byok,
                        Some((*tokens, tokens / 2)),
                    )
                })
                .collect();
            let rows = activity_rows(&records, today(), None);
            let within: Vec<_> = drawn.iter().filter(|drawn| drawn.0 <= ACTIVITY_DAYS).collect();
            let requests: u64 = rows.iter().map(|row| row["requests"].as_u64().unwrap()).sum();
            prop_assert_eq!(requests, within.len() as u64);
            let nanos = |value: &Value| nanos_from_json(value).unwrap();
            let usage: i64 = rows.iter().map(|row| nanos(&row["usage"])).sum();
            let byok: i64 = rows.iter().map(|row| nanos(&row["byok_usage_inference"])).sum();
            prop_assert_eq!(usage, within.iter().filter(|drawn| !drawn.3).map(|drawn| drawn.2).sum::<i64>());
            prop_assert_eq!(byok, within.iter().filter(|drawn| drawn.3).map(|drawn| drawn.2).sum::<i64>());
            let prompt: u64 = rows.iter().map(|row| row["prompt_tokens"].as_u64().unwrap()).sum();
            prop_assert_eq!(prompt, within.iter().map(|drawn| drawn.4).sum::<u64>());
            // Ordered by day, then model, each pair once.
            let keys: Vec<(String, String)> = rows
                .iter()
                .map(|row| (row["date"].as_str().unwrap().to_owned(), row["model"].as_str().unwrap().to_owned()))
                .collect();
            prop_assert!(keys.windows(2).all(|pair| pair[0] < pair[1]));
        }
    }
}
