//! `parse_bearer` and `parse_api_key` on arbitrary bytes: never panic, and
//! whatever they accept is a non-empty key with no whitespace or control
//! bytes, borrowed from the input; the key functions then take it without
//! panicking. Split at its first NUL, the input is an `Authorization` and
//! an `x-api-key` header: `presented_key` takes a key only when each
//! header present gives it, the same. An accepted token is matched
//! against imported-key prefixes cut from itself and the fuzzer's bytes,
//! and every refusal's message in another product's words names that
//! product only.
#![no_main]

use libfuzzer_sys::fuzz_target;
use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use modelgate::auth::{
    looks_like_key, parse_api_key, parse_bearer, presented_key, ApiKey, HeaderError,
    ImportedKeys, KeyHash, MAX_AUTHORIZATION_BYTES, X_API_KEY,
};

/// Imported shapes: a prefix of the token matches it, any other prefix
/// only when the token starts with it, and `any_token` every token.
fn check_imported(token: &str, other: &[u8]) {
    assert!(ImportedKeys::any_token().matches(token));
    for cut in [0, 1, token.len() / 2, token.len()] {
        assert!(ImportedKeys::prefixes([&token[..cut]]).matches(token));
    }
    if let Ok(other) = std::str::from_utf8(other) {
        let shapes = ImportedKeys::prefixes([other]);
        assert_eq!(shapes.matches(token), token.starts_with(other));
        // Debug shows the prefixes, which are public, and nothing else: a
        // token can only appear in it as part of a prefix or of the fixed
        // words around them ("ImportedKeys" holds "mporte").
        let debug = format!("{shapes:?}");
        let expected = format!("ImportedKeys {{ prefixes: Some([{other:?}]), verifier: None }}");
        assert_eq!(debug, expected);
    }
}

fuzz_target!(|value: &[u8]| {
    match parse_bearer(value) {
        Ok(token) => {
            assert!(!token.is_empty());
            assert!(token.bytes().all(|byte| byte.is_ascii_graphic()));
            assert!(value.len() <= MAX_AUTHORIZATION_BYTES);
            // `Bearer` in some case, one space, the token: and the very bytes.
            assert_eq!(value.len(), "Bearer ".len() + token.len());
            assert!(value[..6].eq_ignore_ascii_case(b"bearer") && value[6] == b' ');
            assert_eq!(token.as_ptr(), value[7..].as_ptr());

            let parsed = ApiKey::parse(token);
            assert_eq!(parsed.is_ok(), looks_like_key(token));
            let hash = KeyHash::of(token);
            if let Ok(key) = parsed {
                assert_eq!(key.expose(), token);
                assert!(key.hash() == hash);
                assert!(!format!("{key:?}").contains(&token[ApiKey::PREFIX.len()..]));
            }
            assert!(KeyHash::from_hex(&hash.to_hex()) == Some(hash));
            check_imported(token, &value[..value.len().min(12)]);
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            let words = error.message_for("Acme");
            assert!(!words.contains("modelgate"), "{words}");
        }
    }
    // The key parser on its own, with whatever text the fuzzer finds.
    if let Ok(text) = std::str::from_utf8(value) {
        assert_eq!(ApiKey::parse(text).is_ok(), looks_like_key(text));
    }
    if let Ok(key) = parse_api_key(value) {
        assert_eq!(key.as_bytes(), value);
        assert!(key.bytes().all(|byte| byte.is_ascii_graphic()));
        assert!(value.len() <= MAX_AUTHORIZATION_BYTES);
    }
    if let Some(split) = value.iter().position(|&byte| byte == 0) {
        let (authorization, api_key) = (&value[..split], &value[split + 1..]);
        let mut headers = HeaderMap::new();
        // An empty part stands for a header left out.
        for (name, part) in [(AUTHORIZATION, authorization), (X_API_KEY, api_key)] {
            if !part.is_empty() {
                match HeaderValue::from_bytes(part) {
                    Ok(header) => {
                        headers.insert(name, header);
                    }
                    Err(_) => return,
                }
            }
        }
        let bearer = (!authorization.is_empty()).then(|| parse_bearer(authorization));
        let alone = (!api_key.is_empty()).then(|| parse_api_key(api_key));
        match presented_key(&headers) {
            Ok(key) => {
                assert!(bearer.is_some() || alone.is_some());
                if let Some(bearer) = bearer {
                    assert_eq!(bearer, Ok(key));
                }
                if let Some(alone) = alone {
                    assert_eq!(alone, Ok(key));
                }
            }
            Err(HeaderError::ConflictingKeys) => {
                let (Some(Ok(bearer)), Some(Ok(alone))) = (bearer, alone) else {
                    panic!("conflicting without two keys");
                };
                assert_ne!(bearer, alone);
            }
            Err(error) => assert!(!error.to_string().is_empty()),
        }
    }
});
