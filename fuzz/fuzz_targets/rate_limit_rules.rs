//! `RateLimitRules::from_json` on arbitrary text: never panics, and rules
//! it accepts make valid counter checks for any model.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::ModelId;
use modelgate::rate_limit::RateLimitRules;

fuzz_target!(|text: &str| {
    if let Ok(rules) = RateLimitRules::from_json(text) {
        rules.validate().unwrap();
        // Every accepted rule converts into a limit a counter store takes.
        for rule in rules
            .account
            .iter()
            .chain(rules.models.iter().map(|rule| &rule.limit))
        {
            let _ = rule.limit();
        }
        let model = ModelId::parse("openai/gpt-4o:free").unwrap();
        for rule in &rules.models {
            let _ = rule.covers(&model);
        }
    }
});
