//! GitHub secret-scanning alerts on arbitrary bytes: `parse_alert` never
//! panics, and an alert it accepts has 1 to 1000 tokens within their bounds
//! and reads the same written out again; `ScanningKeys::from_json` never
//! panics and what it accepts has keys with distinct identifiers;
//! `ScanningKeys::verify` never panics, accepts only a known identifier and
//! never the same signature for another body.
//!
//! For `verify` the input is read as `identifier \n signature \n body`,
//! checked against GitHub's published key (the seed `github_sample` is
//! GitHub's documented signed request).
#![no_main]

use std::collections::HashSet;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use modelgate::leaks::{
    alert_answer, parse_alert, LeakLabel, ScanningKeys, SignatureError, MAX_SOURCE_BYTES,
    MAX_TOKENS_PER_ALERT, MAX_TOKEN_BYTES, MAX_TOKEN_TYPE_BYTES, MAX_URL_BYTES,
};

const KEY_ID: &str = "bcb53661c06b4728e59d897fb6165d5c9cda0fd9cdf9d09ead458168deb7518c";
const KEY_PEM: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYAGMWO8XgCamYKMJS6jc/qgvSlAd\nAjPuDPRcXU22YxgBrz+zoN19MzuRyW87qEt9/AmtoNP5GrobzUvQSyJFVw==\n-----END PUBLIC KEY-----\n";

static KEYS: LazyLock<ScanningKeys> = LazyLock::new(|| {
    let document = serde_json::json!({"public_keys": [
        {"key_identifier": KEY_ID, "key": KEY_PEM, "is_current": true},
    ]});
    ScanningKeys::from_json(document.to_string().as_bytes()).unwrap()
});

fuzz_target!(|data: &[u8]| {
    if let Ok(tokens) = parse_alert(data) {
        assert!((1..=MAX_TOKENS_PER_ALERT).contains(&tokens.len()));
        for token in &tokens {
            assert!((1..=MAX_TOKEN_BYTES).contains(&token.token.len()));
            assert!((1..=MAX_TOKEN_TYPE_BYTES).contains(&token.token_type.len()));
            assert!(token
                .url
                .as_ref()
                .is_none_or(|url| url.len() <= MAX_URL_BYTES));
            assert!(token
                .source
                .as_ref()
                .is_none_or(|source| source.len() <= MAX_SOURCE_BYTES));
        }
        let again: Vec<serde_json::Value> = tokens
            .iter()
            .map(|token| {
                serde_json::json!({"token": token.token, "type": token.token_type, "url": token.url, "source": token.source})
            })
            .collect();
        assert_eq!(
            parse_alert(&serde_json::to_vec(&again).unwrap()).as_ref(),
            Ok(&tokens)
        );
        let labels = vec![LeakLabel::FalsePositive; tokens.len()];
        let answer: serde_json::Value =
            serde_json::from_slice(&alert_answer(&tokens, &labels)).unwrap();
        assert_eq!(answer.as_array().map(Vec::len), Some(tokens.len()));
    }

    if let Ok(keys) = ScanningKeys::from_json(data) {
        assert!(!keys.is_empty());
        let identifiers: HashSet<&str> = keys.identifiers().collect();
        assert_eq!(identifiers.len(), keys.len());
        for identifier in &identifiers {
            assert!(!identifier.is_empty() && identifier.bytes().all(|b| b.is_ascii_graphic()));
            let _ = keys.verify(identifier, "MEQCIB==", data);
        }
    }

    let mut parts = data.splitn(3, |byte| *byte == b'\n');
    let identifier = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let signature = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let body = parts.next().unwrap_or_default();
    match KEYS.verify(&identifier, &signature, body) {
        Ok(()) => {
            assert_eq!(identifier, KEY_ID);
            let mut other = body.to_vec();
            other.push(b' ');
            assert_eq!(
                KEYS.verify(&identifier, &signature, &other),
                Err(SignatureError::Mismatch)
            );
        }
        Err(SignatureError::UnknownIdentifier) => assert_ne!(identifier, KEY_ID),
        Err(_) => assert_eq!(identifier, KEY_ID),
    }
});
