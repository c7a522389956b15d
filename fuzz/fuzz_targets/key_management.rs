//! The key management API's input parsers (bodies, the query, path
//! segments, the Idempotency-Key header) on arbitrary bytes: never panic,
//! refuse only with 400 or 422, and what they accept keeps its bounds.
#![no_main]

use chrono::{TimeZone, Utc};
use libfuzzer_sys::fuzz_target;
use modelgate::keys::byok::{hint, MAX_BYOK_KEY_BYTES, MAX_PROVIDER_CHARS, MIN_BYOK_KEY_BYTES};
use modelgate::keys::{
    input, is_valid_account_id, MAX_ALLOWED_MODELS, MAX_CREDITS, MAX_KEY_NAME_CHARS,
    OPERATOR_ACCOUNT,
};
use modelgate::store::{is_valid_idempotency_key, MAX_IDEMPOTENCY_KEY_BYTES, NANOS_PER_CREDIT};

fuzz_target!(|body: &[u8]| {
    let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    let refused = |status: u16| assert!(matches!(status, 400 | 422), "{status}");
    match input::new_key(body, now) {
        Ok(new) => {
            assert!(!new.name.is_empty() && new.name.chars().count() <= MAX_KEY_NAME_CHARS);
            assert_eq!(new.name.trim(), new.name);
            assert!(is_valid_account_id(&new.account));
            // No key is made on the operator's account through the API.
            assert_ne!(new.account, OPERATOR_ACCOUNT);
            // The API makes a management key for one account only.
            assert_eq!(new.management, new.scoped_to_account);
            assert!(new
                .limit_nanos
                .is_none_or(|nanos| (0..=MAX_CREDITS * NANOS_PER_CREDIT).contains(&nanos)));
            assert!(new.expires_at.is_none_or(|expires_at| expires_at > now));
            // A model list names 1 to 100 patterns, once each; a rate keeps
            // its bounds; neither is on a management key.
            assert!(new.allowed_models.as_ref().is_none_or(|models| {
                (1..=MAX_ALLOWED_MODELS).contains(&models.len())
                    && models.iter().all(|pattern| pattern.contains('/'))
                    && models
                        .iter()
                        .enumerate()
                        .all(|(index, pattern)| !models[..index].contains(pattern))
            }));
            assert!(new.rate_limit.is_none_or(|rate| {
                (1..=input::MAX_KEY_RATE_REQUESTS).contains(&rate.requests)
                    && (1..=input::MAX_KEY_RATE_WINDOW_SECONDS).contains(&rate.window_seconds)
            }));
            assert!(!new.management || (new.allowed_models.is_none() && new.rate_limit.is_none()));
        }
        Err(error) => refused(error.status().as_u16()),
    }
    match input::new_account(body) {
        Ok(account) => {
            assert!(is_valid_account_id(&account.id));
            assert_ne!(account.id, OPERATOR_ACCOUNT);
            assert!(account.name.chars().count() <= MAX_KEY_NAME_CHARS);
            assert!(account.email.is_none_or(|email| {
                email.len() <= input::MAX_EMAIL_BYTES && email.contains('@')
            }));
        }
        Err(error) => refused(error.status().as_u16()),
    }
    match input::key_update(body, now) {
        Ok(update) => {
            assert!(update.name.is_none_or(|name| !name.is_empty()));
            assert!(update
                .expires_at
                .is_none_or(|expiry| expiry.is_none_or(|expires_at| expires_at > now)));
        }
        Err(error) => refused(error.status().as_u16()),
    }
    match input::rotation_grace(body) {
        Ok(grace) => assert!(grace.as_secs() <= input::MAX_ROTATION_GRACE_SECONDS),
        Err(error) => refused(error.status().as_u16()),
    }
    match input::purchase_nanos(body) {
        Ok(nanos) => assert!(nanos > 0 && nanos <= MAX_CREDITS * NANOS_PER_CREDIT),
        Err(error) => refused(error.status().as_u16()),
    }
    match input::leak_report(body) {
        Ok((url, source)) => {
            assert!(url.is_none_or(|url| url.len() <= input::MAX_LEAK_URL_BYTES));
            assert!(source.is_none_or(|source| source.len() <= input::MAX_LEAK_SOURCE_BYTES));
        }
        Err(error) => refused(error.status().as_u16()),
    }
    if let Err(error) = input::list_query(Some(&String::from_utf8_lossy(body))) {
        refused(error.status().as_u16());
    }
    match input::byok_key(body) {
        Ok(key) => {
            assert!((MIN_BYOK_KEY_BYTES..=MAX_BYOK_KEY_BYTES).contains(&key.len()));
            assert!(key.bytes().all(|byte| byte.is_ascii_graphic()));
            let hint = hint(&key);
            assert!(!hint.contains(key.as_str()));
            assert!(hint.chars().filter(|c| *c != '…').count() <= 7);
        }
        Err(error) => refused(error.status().as_u16()),
    }
    // The Idempotency-Key header: one value, or the input split at NUL
    // bytes into several (refused: the header must come once).
    match input::idempotency_key([body]) {
        Ok(key) => {
            let key = key.expect("one value given");
            assert!(is_valid_idempotency_key(&key) && key.len() <= MAX_IDEMPOTENCY_KEY_BYTES);
            assert_eq!(key.as_bytes(), body);
        }
        Err(error) => assert_eq!(error.status().as_u16(), 400),
    }
    let values: Vec<&[u8]> = body.split(|byte| *byte == 0).collect();
    match input::idempotency_key(values.iter().copied()) {
        Ok(key) => assert!(values.len() == 1 && key.is_some()),
        Err(error) => assert_eq!(error.status().as_u16(), 400),
    }
    match input::path_provider(&String::from_utf8_lossy(body)) {
        Ok(provider) => assert!(
            provider.len() <= MAX_PROVIDER_CHARS && provider == provider.to_ascii_lowercase()
        ),
        Err(error) => refused(error.status().as_u16()),
    }
});
