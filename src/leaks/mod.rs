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
//! [`LeakAlertsLayer`] puts them to work: it answers `POST /api/v1/leaks`
//! before any key is asked for (alerts are signed, not keyed). It checks
//! the signature headers before reading the body and the signature before
//! parsing it; a missing or bad signature is 401 (counted against the
//! client's address with [`LeakAlertsLayer::failure_limit`]), a malformed
//! alert 400, and neither changes anything. Each token's format and
//! checksum are checked before any store lookup. Every live key among them
//! is revoked in the ledger, so no instance admits it again whatever its
//! key cache holds, then disabled for good with the report kept
//! ([`KeyRecord::leak`](crate::keys::KeyRecord::leak)); its owner is told
//! once through the layer's [`Notifier`](crate::notify::Notifier), in the
//! background. A store that cannot answer is 503, and the scanner sends
//! the alert again: a report is idempotent.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::Request;
//! use http_body_util::{BodyExt, Full};
//! use modelgate::keys::{KeyDirectory, SharedStore};
//! use modelgate::leaks::{LeakAlertsLayer, ScanningKeys};
//! use modelgate::store::MemoryStore;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let keys = ScanningKeys::from_json(br#"{"public_keys": [{
//!     "key_identifier": "bcb53661c06b4728e59d897fb6165d5c9cda0fd9cdf9d09ead458168deb7518c",
//!     "key": "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYAGMWO8XgCamYKMJS6jc/qgvSlAd\nAjPuDPRcXU22YxgBrz+zoN19MzuRyW87qEt9/AmtoNP5GrobzUvQSyJFVw==\n-----END PUBLIC KEY-----\n",
//!     "is_current": true}]}"#).unwrap();
//! let gateway = ServiceBuilder::new()
//!     .layer(LeakAlertsLayer::new(KeyDirectory::new(store), keys))
//!     .service(service_fn(|_: Request<Full<Bytes>>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
//!     }));
//!
//! let alert = Request::post("/api/v1/leaks")
//!     .header("github-public-key-identifier", "bcb53661c06b4728e59d897fb6165d5c9cda0fd9cdf9d09ead458168deb7518c")
//!     .header("github-public-key-signature", "MEQCIQDaMKqrGnE27S0kgMrEK0eYBmyG0LeZismAEz/BgZyt7AIfXt9fErtRS4XaeSt/AO1RtBY66YcAdjxji410VQV4xg==")
//!     .body(Full::new(Bytes::from_static(br#"[{"source":"commit","token":"some_token","type":"some_type","url":"https://example.com/base-repo-url/"}]"#)))
//!     .unwrap();
//! let response = gateway.oneshot(alert).await.unwrap();
//! assert_eq!(response.status(), 200);
//! let body = response.into_body().collect().await.unwrap().to_bytes();
//! let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
//! // `some_token` is no modelgate key.
//! assert_eq!(answer[0]["label"], "false_positive");
//! # }
//! ```
//!
//! ```
//! use modelgate::leaks::{alert_answer, parse_alert, LeakLabel, ScanningKeys, SignatureError};
//!
//! // GitHub's published keys and its documented sample alert.
//! let keys = ScanningKeys::from_json(br#"{"public_keys": [{
//!     "key_identifier": "bcb53661c06b4728e59d897fb6165d5c9cda0fd9cdf9d09ead458168deb7518c",
//!     "key": "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYAGMWO8XgCamYKMJS6jc/qgvSlAd\nAjPuDPRcXU22YxgBrz+zoN19MzuRyW87qEt9/AmtoNP5GrobzUvQSyJFVw==\n-----END PUBLIC KEY-----\n",
//!     "is_current": true}]}"#).unwrap();
//! let identifier = "bcb53661c06b4728e59d897fb6165d5c9cda0fd9cdf9d09ead458168deb7518c";
//! let signature = "MEQCIQDaMKqrGnE27S0kgMrEK0eYBmyG0LeZismAEz/BgZyt7AIfXt9fErtRS4XaeSt/AO1RtBY66YcAdjxji410VQV4xg==";
//! let body = br#"[{"source":"commit","token":"some_token","type":"some_type","url":"https://example.com/base-repo-url/"}]"#;
//!
//! keys.verify(identifier, signature, body).unwrap();
//! // The signature covers the exact bytes: the same JSON spaced differently fails.
//! let respaced = br#"[{"source": "commit","token":"some_token","type":"some_type","url":"https://example.com/base-repo-url/"}]"#;
//! assert_eq!(keys.verify(identifier, signature, respaced), Err(SignatureError::Mismatch));
//!
//! let tokens = parse_alert(body).unwrap();
//! assert_eq!(tokens[0].token, "some_token");
//! assert_eq!(tokens[0].source.as_deref(), Some("commit"));
//!
//! let answer = alert_answer(&tokens, &[LeakLabel::FalsePositive]);
//! let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
//! assert_eq!(answer, serde_json::json!([{
//!     "token_hash": tokens[0].token_hash(),
//!     "token_type": "some_type",
//!     "label": "false_positive",
//! }]));
//!
//! let error = parse_alert(br#"[{"token": "x", "type": "t"}, {"token": 7, "type": "t"}]"#).unwrap_err();
//! assert_eq!(error.to_string(), "item 1: `token` must be a string, not a number");
//! ```

mod alert;
mod layer;
mod service;
mod signature;

pub use alert::{
    AlertError, LeakLabel, MAX_SOURCE_BYTES, MAX_TOKEN_BYTES, MAX_TOKEN_TYPE_BYTES,
    MAX_TOKENS_PER_ALERT, MAX_URL_BYTES, ReportedToken, alert_answer, parse_alert,
};
pub use layer::LeakAlertsLayer;
pub use service::LeakAlerts;
pub use signature::{
    GITHUB_KEY_IDENTIFIER, GITHUB_KEY_SIGNATURE, MAX_KEY_IDENTIFIER_CHARS, ScanningKeys,
    ScanningKeysError, SignatureError,
};
