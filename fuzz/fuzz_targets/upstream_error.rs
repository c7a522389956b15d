//! ErrorMapper's rewrite of an upstream error body: never panics, keeps the
//! status, and its output always is a canonical body that it would pass
//! through unchanged.
#![no_main]

use http::StatusCode;
use libfuzzer_sys::fuzz_target;
use modelgate::error_mapper::canonical_upstream_error;

fuzz_target!(|input: (u16, &[u8])| {
    let (status, body) = input;
    let Ok(status) = StatusCode::from_u16(400 + status % 200) else {
        return;
    };
    if let Some(error) = canonical_upstream_error(status, body, 200) {
        assert_eq!(error.status(), status);
        let rendered = error.to_json().to_string();
        assert!(canonical_upstream_error(status, rendered.as_bytes(), 200).is_none());
    }
});
