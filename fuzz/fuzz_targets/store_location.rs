//! `StoreLocation` from arbitrary text (the proxy's `--store`): never
//! panics, and what it accepts prints back as exactly the text it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::store::StoreLocation;

fuzz_target!(|text: &str| {
    if let Ok(location) = text.parse::<StoreLocation>() {
        assert_eq!(location.to_string(), text);
    }
});
