//! `ModelNames` built from arbitrary settings, then resolving arbitrary
//! text: never panics; a setting is taken or refused with its reason; an
//! id resolves to a valid model id or a 400; an id with a `/` always
//! resolves to itself or to `ModelId::parse`'s refusal.
//!
//! The input is lines: each but the last a setting (`default <provider>`
//! or `<name> <target>`), the last the model id asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::{ModelId, ModelNames};

fuzz_target!(|text: &str| {
    let mut lines: Vec<&str> = text.split('\n').collect();
    let asked = lines.pop().unwrap_or_default();
    let mut names = ModelNames::new();
    for line in lines {
        let (name, target) = line.split_once(' ').unwrap_or((line, ""));
        let set = match name {
            "default" => names.clone().default_provider(target),
            _ => names.clone().alias(name, target),
        };
        match set {
            Ok(set) => names = set,
            Err(error) => assert!(!error.to_string().is_empty()),
        }
    }
    match names.resolve(asked) {
        Ok(id) => {
            assert_eq!(ModelId::parse(id.as_str()).unwrap(), id);
            if asked.contains('/') || names.is_empty() {
                assert_eq!(id.as_str(), asked);
            }
        }
        Err(error) => {
            assert_eq!(error.status().as_u16(), 400);
            if asked.contains('/') || names.is_empty() {
                assert_eq!(
                    error.message(),
                    ModelId::parse(asked).unwrap_err().message()
                );
            }
        }
    }
});
