//! GitHub secret-scanning alerts: when GitHub finds something shaped like
//! a modelgate key in a public place, it posts the tokens it found to the
//! gateway, signed, and expects an answer saying which were real keys.
//!
//! - [`ScanningKeys`] holds GitHub's secret-scanning public keys, copied
//!   into configuration from
//!   <https://api.github.com/meta/public_keys/secret_scanning> (never
//!   fetched). [`ScanningKeys::verify`] checks the alert's
//!   `Github-Public-Key-Signature` header (ECDSA P-256 / SHA-256 over the
//!   raw body) with the key its `Github-Public-Key-Identifier` header
//!   names; check it before reading the body as an alert.
//! - [`parse_alert`] reads the body: a JSON array of 1 to
//!   [`MAX_TOKENS_PER_ALERT`] [`ReportedToken`]s, each field's type and
//!   size checked, a field given twice refused. Errors name the item and
//!   the field and never repeat a token.
//! - [`alert_answer`] writes the answer: one entry per token with its
//!   SHA-256, its type and a [`LeakLabel`], so the answer repeats no
//!   secret either.
//!
//! These are pure functions, with no store and no I/O. Nothing here
//! panics on any input.
//!
//! ```
//! use modelgate::leaks::{alert_answer, parse_alert, LeakLabel};
//!
//! let body = br#"[{"source":"commit","token":"some_token","type":"some_type","url":"https://example.com/base-repo-url/"}]"#;
//! let tokens = parse_alert(body).unwrap();
//! assert_eq!(tokens[0].token, "some_token");
//!
//! let answer = alert_answer(&tokens, &[LeakLabel::FalsePositive]);
//! let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
//! assert_eq!(answer[0]["label"], "false_positive");
//! ```

mod alert;

pub use alert::{
    alert_answer, parse_alert, AlertError, LeakLabel, ReportedToken, MAX_SOURCE_BYTES,
    MAX_TOKENS_PER_ALERT, MAX_TOKEN_BYTES, MAX_TOKEN_TYPE_BYTES, MAX_URL_BYTES,
};
