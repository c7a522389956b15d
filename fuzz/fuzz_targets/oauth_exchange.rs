//! The OAuth routes' inputs on arbitrary bytes: the exchange body, the
//! approval body, the callback URL, the code and the PKCE checks never
//! panic; refusals are 400 (the exchange) or 400 and 422 (the approval,
//! read with `plain` refused and allowed: only allowed gives a plain code);
//! what they accept keeps its bounds: a callback URL is `https://` or
//! loopback `http://` and reads the same parsed again, a challenge is well
//! formed for its method, a verifier is 43 to 128 unreserved characters,
//! and only a well-formed verifier ever matches.
//!
//! The input is also read as `callback_url \n challenge \n verifier`.
#![no_main]

use chrono::{TimeZone, Utc};
use libfuzzer_sys::fuzz_target;
use modelgate::keys::{MAX_CREDITS, MAX_KEY_NAME_CHARS};
use modelgate::oauth::input::{
    code_request, exchange_request, MAX_CALLBACK_URL_BYTES, MAX_CODE_BYTES,
};
use modelgate::oauth::{
    is_valid_challenge, is_valid_verifier, s256_challenge, verifier_matches, AuthCode, CallbackUrl,
    ChallengeMethod, PlainPkce,
};
use modelgate::store::NANOS_PER_CREDIT;

const METHODS: [ChallengeMethod; 2] = [ChallengeMethod::S256, ChallengeMethod::Plain];

fn check_callback(url: &CallbackUrl) {
    let text = url.as_str();
    assert!(text.len() <= MAX_CALLBACK_URL_BYTES, "{text}");
    assert!(!text.contains('#'));
    let loopback = ["http://localhost", "http://127.0.0.1", "http://[::1]"];
    assert!(
        text.starts_with("https://") || loopback.iter().any(|prefix| text.starts_with(prefix)),
        "{text}"
    );
    assert!(!url.host().is_empty());
    assert!(url.origin().starts_with("http"));
    assert_eq!(CallbackUrl::parse(text).as_ref(), Ok(url), "{text}");
}

fuzz_target!(|data: &[u8]| {
    let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();

    match exchange_request(data) {
        Ok(request) => {
            assert!(request.code.len() <= MAX_CODE_BYTES);
            assert!(is_valid_verifier(&request.code_verifier));
            // Neither secret is ever printed.
            let debug = format!("{request:?}");
            assert!(!debug.contains(&request.code_verifier));
            if let Some(code) = AuthCode::parse(&request.code) {
                assert_eq!(code.expose(), request.code);
                assert_eq!(code.expose().len(), AuthCode::LEN);
                assert_eq!(code.hash_hex().len(), 64);
            }
            let challenge = s256_challenge(&request.code_verifier);
            assert!(verifier_matches(
                ChallengeMethod::S256,
                &challenge,
                &request.code_verifier
            ));
            assert!(verifier_matches(
                ChallengeMethod::Plain,
                &request.code_verifier,
                &request.code_verifier
            ));
        }
        Err(error) => assert_eq!(error.status().as_u16(), 400, "{}", error.message()),
    }

    for plain in [PlainPkce::Refused, PlainPkce::Allowed] {
        match code_request(data, now, plain) {
            Ok(request) => {
                check_callback(&request.callback_url);
                assert!(is_valid_challenge(
                    request.code_challenge_method,
                    &request.code_challenge
                ));
                // `plain` only where the operator allows it.
                assert!(
                    plain == PlainPkce::Allowed
                        || request.code_challenge_method == ChallengeMethod::S256
                );
                assert!(request
                    .limit_nanos
                    .is_none_or(|nanos| (0..=MAX_CREDITS * NANOS_PER_CREDIT).contains(&nanos)));
                assert!(request.expires_at.is_none_or(|expires_at| expires_at > now));
                assert!(request.key_label.is_none_or(|label| {
                    !label.is_empty() && label.chars().count() <= MAX_KEY_NAME_CHARS
                }));
            }
            Err(error) => assert!(
                matches!(error.status().as_u16(), 400 | 422),
                "{}: {}",
                error.status(),
                error.message()
            ),
        }
    }

    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let (callback, challenge, verifier) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    );
    if let Ok(url) = CallbackUrl::parse(callback) {
        check_callback(&url);
    }
    if let Some(code) = AuthCode::parse(callback) {
        assert_eq!(AuthCode::parse(code.expose()), Some(code.clone()));
    }
    for method in METHODS {
        if verifier_matches(method, challenge, verifier) {
            assert!(is_valid_challenge(method, challenge));
            assert!(is_valid_verifier(verifier));
        }
    }
});
