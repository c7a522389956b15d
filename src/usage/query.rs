//! The query strings of the usage routes. Unknown parameters are ignored
//! (clients add their own, such as cache busters); a parameter given twice
//! is a 400 and a value out of range or of the wrong type a 422
//! `invalid_parameter`, each naming it in `metadata.param`.

use chrono::{DateTime, Utc};

use crate::clock::Period;
use crate::error::GatewayError;
use crate::json_input::{bad_request, invalid_parameter};
use crate::keys::is_valid_account_id;
use crate::usage::PUBLIC_SCOPE;

/// Records a `GET /api/v1/generations` answers by default, and at most.
pub const DEFAULT_RECENT_GENERATIONS: usize = 20;
/// See [`DEFAULT_RECENT_GENERATIONS`].
pub const MAX_RECENT_GENERATIONS: usize = 100;
/// How far back `GET /api/v1/generations` pages and filters: among the
/// account's newest this many records (`offset` + `limit` at most this).
pub const GENERATIONS_SCAN_DEPTH: usize = 10_000;
/// The longest `model` a generations filter takes.
pub const MAX_MODEL_FILTER_CHARS: usize = 256;

/// What a usage route's query string asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageQuery {
    /// `id`: a generation id (as given; checked by the route).
    pub id: Option<String>,
    /// `period`: `day` (the default), `week` or `month`.
    pub period: Period,
    /// `limit`: how many records, 1 to [`MAX_RECENT_GENERATIONS`].
    pub limit: usize,
    /// `account`: whose records or apps; the operator's key may name any
    /// account, other keys only their own. `*` ([`PUBLIC_SCOPE`]) names the
    /// whole gateway, which only the app ranking reads. Absent: the key's
    /// own account (the whole gateway for the operator's app ranking).
    pub account: Option<String>,
    /// `offset`: how many of the matching records, newest first, to skip.
    pub offset: usize,
    /// `key`: only the records of the key with this hash (64 hex digits).
    pub key: Option<String>,
    /// `model`: only the records of this model, as the record names it.
    pub model: Option<String>,
    /// `from`: only records created at or after this instant.
    pub from: Option<DateTime<Utc>>,
    /// `to`: only records created before this instant.
    pub to: Option<DateTime<Utc>>,
    /// `format=csv`: the records as CSV rather than JSON.
    pub csv: bool,
}

impl UsageQuery {
    /// Whether a filter narrows the records by what only the records say
    /// (`model`, `from`, `to`), which no index answers: those are found
    /// among the newest [`GENERATIONS_SCAN_DEPTH`] (of the key's, when one
    /// is named).
    pub fn scans(&self) -> bool {
        self.model.is_some() || self.from.is_some() || self.to.is_some()
    }
}

impl Default for UsageQuery {
    fn default() -> Self {
        UsageQuery {
            id: None,
            period: Period::Day,
            limit: DEFAULT_RECENT_GENERATIONS,
            account: None,
            offset: 0,
            key: None,
            model: None,
            from: None,
            to: None,
            csv: false,
        }
    }
}

/// Reads a usage route's query string.
pub fn usage_query(query: Option<&str>) -> Result<UsageQuery, GatewayError> {
    let mut parsed = UsageQuery::default();
    let mut seen: Vec<&'static str> = Vec::new();
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let name: &'static str = match name.as_ref() {
            "id" => "id",
            "period" => "period",
            "limit" => "limit",
            "account" => "account",
            "offset" => "offset",
            "key" => "key",
            "model" => "model",
            "from" => "from",
            "to" => "to",
            "format" => "format",
            _ => continue,
        };
        given_once(&mut seen, name)?;
        match name {
            "id" => {
                if value.is_empty() || value.len() > 64 {
                    return Err(bad(name, "must be a generation id such as gen-0123…"));
                }
                parsed.id = Some(value.into_owned());
            }
            "period" => {
                parsed.period = match value.as_ref() {
                    "day" => Period::Day,
                    "week" => Period::Week,
                    "month" => Period::Month,
                    _ => return Err(bad(name, "must be day, week or month")),
                };
            }
            "limit" => {
                parsed.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|limit| (1..=MAX_RECENT_GENERATIONS).contains(limit))
                    .ok_or_else(|| bad(name, "must be a whole number from 1 to 100"))?;
            }
            "offset" => {
                parsed.offset = value
                    .parse::<usize>()
                    .ok()
                    .filter(|offset| *offset < GENERATIONS_SCAN_DEPTH)
                    .ok_or_else(|| bad(name, "must be a whole number from 0 to 9999"))?;
            }
            "key" => {
                let hash = value.to_ascii_lowercase();
                if hash.len() != 64 || !hash.bytes().all(|byte| byte.is_ascii_hexdigit()) {
                    return Err(bad(
                        name,
                        "must be a key's hash: 64 hex digits, as the key list shows",
                    ));
                }
                parsed.key = Some(hash);
            }
            "model" => {
                if value.is_empty()
                    || value.chars().count() > MAX_MODEL_FILTER_CHARS
                    || value.chars().any(char::is_control)
                {
                    return Err(bad(name, "must be a model id such as openai/gpt-4o"));
                }
                parsed.model = Some(value.into_owned());
            }
            "from" | "to" => {
                let instant = DateTime::parse_from_rfc3339(&value)
                    .map_err(|_| {
                        bad(
                            name,
                            "must be an RFC 3339 date-time such as 2026-11-01T00:00:00Z",
                        )
                    })?
                    .with_timezone(&Utc);
                if name == "from" {
                    parsed.from = Some(instant);
                } else {
                    parsed.to = Some(instant);
                }
            }
            "format" => {
                parsed.csv = match value.as_ref() {
                    "json" => false,
                    "csv" => true,
                    _ => return Err(bad(name, "must be json or csv")),
                };
            }
            _ => {
                if value != PUBLIC_SCOPE && !is_valid_account_id(&value) {
                    return Err(bad(
                        name,
                        "must be 1 to 64 characters of A-Z a-z 0-9 . _ -, or * for the whole gateway",
                    ));
                }
                parsed.account = Some(value.into_owned());
            }
        }
    }
    if parsed.offset + parsed.limit > GENERATIONS_SCAN_DEPTH {
        return Err(bad(
            "offset",
            "with limit must stay within the newest 10000 records: narrow the records with key, model, from or to",
        ));
    }
    if let (Some(from), Some(to)) = (parsed.from, parsed.to)
        && from >= to
    {
        return Err(bad("to", "must be later than from"));
    }
    Ok(parsed)
}

/// Notes `name` as given; a 400 naming it when it was given already.
pub(super) fn given_once(
    seen: &mut Vec<&'static str>,
    name: &'static str,
) -> Result<(), GatewayError> {
    if seen.contains(&name) {
        return Err(bad_request(
            name,
            format!("the query parameter `{name}` may be given once"),
        ));
    }
    seen.push(name);
    Ok(())
}

/// 422: a value out of range or of the wrong type, as for a body's field.
pub(super) fn bad(param: &str, problem: &str) -> GatewayError {
    invalid_parameter(param, format!("the query parameter `{param}` {problem}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parameters_are_read_and_defaults_kept() {
        assert_eq!(usage_query(None).unwrap(), UsageQuery::default());
        let query = usage_query(Some("id=gen-1&period=month&limit=5&account=acme&_=123")).unwrap();
        assert_eq!(query.id.as_deref(), Some("gen-1"));
        assert_eq!(query.period, Period::Month);
        assert_eq!(query.limit, 5);
        assert_eq!(query.account.as_deref(), Some("acme"));
        let gateway = usage_query(Some("account=%2A")).unwrap();
        assert_eq!(gateway.account.as_deref(), Some(PUBLIC_SCOPE));
        let hash = "AB".repeat(32);
        let filtered = usage_query(Some(&format!(
            "offset=40&limit=20&key={hash}&model=openai%2Fgpt-4o&from=2026-11-01T00:00:00Z&to=2026-11-02T00:00:00%2B01:00&format=csv"
        )))
        .unwrap();
        assert_eq!(filtered.offset, 40);
        assert_eq!(
            filtered.key,
            Some("ab".repeat(32)),
            "hashes read in any case"
        );
        assert_eq!(filtered.model.as_deref(), Some("openai/gpt-4o"));
        assert_eq!(filtered.from, Some("2026-11-01T00:00:00Z".parse().unwrap()));
        assert_eq!(filtered.to, Some("2026-11-01T23:00:00Z".parse().unwrap()));
        assert!(filtered.csv && filtered.scans());
        assert!(!usage_query(Some("format=json")).unwrap().csv);
    }

    #[test]
    fn bad_values_are_422s_and_a_repeated_parameter_a_400_each_naming_it() {
        for (query, param, status) in [
            ("period=year", "period", 422),
            ("limit=0", "limit", 422),
            ("limit=101", "limit", 422),
            ("limit=x", "limit", 422),
            ("account=a%20b", "account", 422),
            ("account=**", "account", 422),
            ("id=", "id", 422),
            ("period=day&period=week", "period", 400),
            ("offset=-1", "offset", 422),
            ("offset=10000", "offset", 422),
            ("offset=9990&limit=20", "offset", 422),
            ("key=abc", "key", 422),
            ("key=", "key", 422),
            ("model=", "model", 422),
            ("model=a%0Ab", "model", 422),
            ("from=yesterday", "from", 422),
            ("to=2026-13-01T00:00:00Z", "to", 422),
            (
                "from=2026-11-02T00:00:00Z&to=2026-11-01T00:00:00Z",
                "to",
                422,
            ),
            ("format=xml", "format", 422),
            ("offset=1&offset=2", "offset", 400),
        ] {
            let error = usage_query(Some(query)).unwrap_err();
            assert_eq!(error.status().as_u16(), status, "{query}");
            assert_eq!(error.metadata()["param"], param, "{query}");
            assert!(
                error.message().contains(param),
                "{query}: {}",
                error.message()
            );
        }
    }

    proptest! {
        #[test]
        fn any_query_gives_an_answer_never_a_panic(query in ".{0,200}") {
            if let Ok(parsed) = usage_query(Some(&query)) {
                prop_assert!((1..=MAX_RECENT_GENERATIONS).contains(&parsed.limit));
                prop_assert!(parsed.offset + parsed.limit <= GENERATIONS_SCAN_DEPTH);
                prop_assert!(parsed.key.iter().all(|key| key.len() == 64));
                if let (Some(from), Some(to)) = (parsed.from, parsed.to) {
                    prop_assert!(from < to);
                }
                prop_assert!(parsed
                    .account
                    .iter()
                    .all(|account| account == PUBLIC_SCOPE || is_valid_account_id(account)));
            }
        }
    }
}
