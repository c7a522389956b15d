//! `ModelId::parse` on arbitrary text: never panics, refuses with 400, and
//! what it accepts splits back into exactly the text it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::ModelId;

fuzz_target!(|text: &str| {
    match ModelId::parse(text) {
        Ok(id) => {
            assert_eq!(id.as_str(), text);
            let rebuilt = match id.variant() {
                Some(variant) => format!("{}/{}:{variant}", id.provider(), id.model()),
                None => format!("{}/{}", id.provider(), id.model()),
            };
            assert_eq!(rebuilt, text);
            assert!(!text.chars().any(char::is_whitespace));
            assert!(text.len() <= ModelId::MAX_LEN);
        }
        Err(error) => assert_eq!(error.status().as_u16(), 400),
    }
});
