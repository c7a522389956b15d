//! The usage routes' outside input on arbitrary bytes: the app headers
//! (`HTTP-Referer`, `X-Gateway-Title`, `X-Title`), the query string (an
//! `account` is one id or `*`), the activity's query (a `date` within the
//! window) and the generation id. Never a panic; a
//! refusal is a 400 (a query value out of range: 422); what is accepted
//! keeps its bounds and never keeps a URL's query or a local address.
#![no_main]

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use modelgate::keys::is_valid_account_id;
use modelgate::usage::{
    activity_query, activity_window_start, app_from_headers, parse_generation_id, usage_query,
    GENERATIONS_SCAN_DEPTH, LEGACY_TITLE_HEADER, MAX_RECENT_GENERATIONS, MAX_REFERER_BYTES,
    MAX_TITLE_CHARS, PUBLIC_SCOPE, REFERER_HEADER, TITLE_HEADER,
};

fuzz_target!(|data: &[u8]| {
    // Three fields, split at the first two NUL bytes.
    let mut parts = data.splitn(3, |byte| *byte == 0);
    let referer = parts.next().unwrap_or_default();
    let title = parts.next().unwrap_or_default();
    let rest = parts.next().unwrap_or_default();

    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(referer) {
        headers.insert(REFERER_HEADER, value);
    }
    if let Ok(value) = HeaderValue::from_bytes(title) {
        let name = if rest.first() == Some(&b'x') {
            LEGACY_TITLE_HEADER
        } else {
            TITLE_HEADER
        };
        headers.insert(name, value);
    }
    match app_from_headers(&headers) {
        Ok(Some(app)) => {
            assert!(!app.id.is_empty() && !app.id.contains('\u{1f}'));
            assert!(app.id.len() <= MAX_REFERER_BYTES + 6 + MAX_TITLE_CHARS * 4);
            if let Some(url) = &app.url {
                assert!(url.starts_with("http://") || url.starts_with("https://"));
                assert!(!url.contains('?') && !url.contains('#'));
            }
            if let Some(title) = &app.title {
                assert!(!title.is_empty() && title.chars().count() <= MAX_TITLE_CHARS);
                assert!(!title.chars().any(char::is_control));
            }
            // An app without an address is named by its title.
            assert!(app.url.is_some() || app.id.starts_with("title:"));
        }
        Ok(None) => {}
        Err(error) => assert_eq!(error.status().as_u16(), 400),
    }

    let query = String::from_utf8_lossy(rest);
    match usage_query(Some(&query)) {
        Ok(parsed) => {
            assert!((1..=MAX_RECENT_GENERATIONS).contains(&parsed.limit));
            assert!(parsed.offset + parsed.limit <= GENERATIONS_SCAN_DEPTH);
            assert!(parsed
                .key
                .iter()
                .all(|key| key.len() == 64 && key.bytes().all(|byte| byte.is_ascii_hexdigit())));
            assert!(parsed
                .model
                .iter()
                .all(|model| !model.is_empty() && !model.chars().any(char::is_control)));
            if let (Some(from), Some(to)) = (parsed.from, parsed.to) {
                assert!(from < to);
            }
            // An account is one id, or `*` (the whole gateway), never a list.
            assert!(parsed
                .account
                .iter()
                .all(|account| account == PUBLIC_SCOPE || is_valid_account_id(account)));
            if let Some(id) = parsed.id {
                if let Some(reservation) = parse_generation_id(&id) {
                    assert_eq!(reservation.len(), 32);
                    assert_eq!(format!("gen-{reservation}"), id);
                }
            }
        }
        // A repeated parameter is 400; a value out of range or of the
        // wrong type 422, as a body's field.
        Err(error) => assert!(matches!(error.status().as_u16(), 400 | 422), "{error:?}"),
    }

    // The activity's query, on a fixed today: a date is in the window,
    // an account one id (never `*`).
    let today = chrono::NaiveDate::from_ymd_opt(2026, 11, 26).unwrap();
    match activity_query(Some(&query), today) {
        Ok(parsed) => {
            assert!(parsed
                .date
                .iter()
                .all(|date| activity_window_start(today) <= *date && *date <= today));
            assert!(parsed
                .account
                .iter()
                .all(|account| is_valid_account_id(account)));
        }
        Err(error) => assert!(matches!(error.status().as_u16(), 400 | 422), "{error:?}"),
    }
});
