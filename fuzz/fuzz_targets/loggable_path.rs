//! `loggable_path` on arbitrary paths: never panics, always logs an
//! absolute path, and never a run of 16 hex digits or more (a key hash,
//! whole or in part beyond its 8-digit prefix).
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::proxy::loggable_path;

fuzz_target!(|path: &str| {
    let logged = loggable_path(path);
    assert!(logged.starts_with('/'), "{path:?} logged as {logged:?}");
    let mut run = 0;
    for byte in logged.bytes() {
        run = if byte.is_ascii_hexdigit() { run + 1 } else { 0 };
        assert!(run < 16, "{path:?} logged as {logged:?}");
    }
});
