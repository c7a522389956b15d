//! `parse_bearer` on arbitrary bytes: never panics, and whatever it accepts
//! is a non-empty key with no whitespace or control bytes, borrowed from the
//! end of the input; the key functions then take it without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::auth::{looks_like_key, parse_bearer, ApiKey, KeyHash, MAX_AUTHORIZATION_BYTES};

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
        }
        Err(error) => assert!(!error.to_string().is_empty()),
    }
    // The key parser on its own, with whatever text the fuzzer finds.
    if let Ok(text) = std::str::from_utf8(value) {
        assert_eq!(ApiKey::parse(text).is_ok(), looks_like_key(text));
    }
});
