//! The gateway's whole configuration on arbitrary text: never a panic; an
//! error always says where (`config: <path>…`); what is accepted builds a
//! Debug text that shows no inline secret; and a config accepted once is
//! accepted by its own check again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::proxy::GatewayConfig;
use modelgate::secrets::SecretSpec;

fuzz_target!(|text: &str| {
    match GatewayConfig::from_json(text) {
        Ok(config) => {
            config
                .validate()
                .expect("what from_json accepts, validate accepts");
            let shown = format!("{config:?}");
            for route in config
                .webhooks()
                .into_iter()
                .flat_map(|webhooks| &webhooks.routes)
            {
                if let SecretSpec::Inline(_) = &route.secret {
                    assert!(shown.contains("Inline(Secret(…))"));
                }
            }
        }
        Err(error) => assert!(error.to_string().starts_with("config: ")),
    }
});
