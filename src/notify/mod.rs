//! Notices about leaked API keys and alerts (a low balance, a key near its
//! limit): an e-mail to the account's owner and a signed webhook to the
//! operator, sent and retried in the background.
//!
//! Alerts ([`Notifier::alert`] with an [`AlertNotice`], decided by
//! [`alerts`](crate::alerts)) go the same way as leak notices, with the
//! same retries, bounds and metric; their webhook's `type` is
//! [`BALANCE_BELOW_EVENT`] or [`KEY_LIMIT_PERCENT_EVENT`] and its `id`
//! the crossing's own, the same from every instance.
//!
//! When a modelgate key is found leaked (GitHub secret scanning reports it,
//! or an operator does), the gateway disables it and calls
//! [`Notifier::leak_detected`] with a [`LeakNotice`]. That call returns at
//! once: the sends run in a task on the current tokio runtime, so a slow
//! mail server never holds up the caller.
//!
//! **Channels**, each optional, each sent and retried on its own:
//!
//! - **E-mail** ([`EmailSettings`]): a plain-text message to
//!   [`LeakNotice::email`] through an SMTP server (`smtps://`, STARTTLS with
//!   `?tls=required`, or plain SMTP to a relay on this machine). It names
//!   the key (its name and hash prefix, never the key), the account, where
//!   and when the leak was found and who reported it, says the key is
//!   refused from now on, and tells the owner what to do: delete it on the
//!   key settings page, create a new one, and keep keys in environment
//!   variables, never in a repository or a browser. A notice without an
//!   address sends no e-mail (logged at `info`); an address that does not
//!   parse is logged at `warn` and not sent to.
//! - **Webhook** ([`WebhookSettings`]): `POST` of
//!   `{"type": "key.leaked", "id": "<delivery id>", "data": <LeakNotice>}`
//!   with `Content-Type: application/json`, `X-Modelgate-Timestamp` (Unix
//!   seconds) and `X-Modelgate-Signature: sha256=<hex>`, the HMAC-SHA256
//!   of `"<timestamp>.<body>"` under the webhook's secret
//!   ([`webhook_signature`], [`verify_webhook_signature`]). The `data` is
//!   the whole notice, the owner's address included: the webhook belongs
//!   to the operator, who may have to reach the owner another way. The
//!   `id` is the same on every retry of one notice, so a receiver can drop
//!   a repeat; the timestamp is each attempt's own, so a receiver can
//!   refuse old ones (five minutes is a fair bound). A 2xx answer is
//!   delivery; any other status, no answer within [`ATTEMPT_TIMEOUT`] or a
//!   failed connection is a failure.
//!
//! **Retries.** After a failed attempt a channel waits the next of the
//! retry waits ([`DEFAULT_RETRY_WAITS`]: 1 s, 5 s, 30 s, 2 min, 10 min;
//! [`Notifier::with_retry_waits`]) and tries again; each failure is logged
//! at `warn` with the channel, the account, the key (`key`: the first 8
//! hex digits of its hash, as in the access log) and the error. An SMTP server's permanent refusal (5xx) is not retried. After
//! the last attempt the notice is logged at `error` with everything needed
//! to tell the owner by hand. Never logged: the key (the notice does not
//! carry it), the SMTP password, the webhook's secret or its URL's path.
//!
//! **Bounds.** At most [`MAX_SENDS_IN_FLIGHT`] attempts run at once, across
//! channels and notices; at most [`DEFAULT_MAX_PENDING_NOTICES`] notices
//! wait for delivery or a retry ([`Notifier::with_max_pending_notices`]).
//! Past that, a notice is dropped, logged at `error` in full and counted
//! as `dropped`. Metric: `modelgate_notices_total` by `channel` (`email`,
//! `webhook`) and `outcome` (`sent`, `retried`, `failed`, `dropped`); see
//! [`telemetry`](crate::telemetry).
//!
//! The parts: `notifier.rs` keeps the queue, the retries and the bounds;
//! `email.rs` writes the message and sends it with lettre over SMTP
//! (rustls on ring, the webpki roots); `webhook.rs` signs the `POST` and
//! sends it with hyper.
//!
//! [`Notifier::idle`] resolves once nothing is pending: for tests, and for
//! a graceful shutdown that should let the last notices go out.
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use modelgate::notify::{verify_webhook_signature, webhook_signature, EmailSettings, LeakNotice, Notifier, WebhookSettings};
//! use modelgate::secrets::Secret;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Settings are checked when they are made, and never print a secret.
//! let email = EmailSettings::new("smtps://keys:app-password@smtp.example.com", "modelgate <keys@example.com>").unwrap();
//! assert!(!format!("{email:?}").contains("app-password"));
//! let secret = Secret::new("a-webhook-secret-of-32-bytes-len".into());
//! let webhook = WebhookSettings::new("https://ops.example.com/hooks/modelgate", secret.clone()).unwrap();
//! assert!(WebhookSettings::new("ftp://ops.example.com/", secret.clone()).is_err());
//! let _notifier = Notifier::new(Some(email), Some(webhook));
//!
//! // A notifier without channels sends nothing: for tests, or no config.
//! let notifier = Notifier::disabled();
//! notifier.leak_detected(LeakNotice {
//!     account: "acct_42".into(),
//!     email: Some("owner@example.com".into()),
//!     key_name: "ci deploys".into(),
//!     key_hash_prefix: "3f9a0c1b2d4e".into(),
//!     token_type: "modelgate_api_key".into(),
//!     url: Some("https://github.com/octo/app/blob/main/.env".into()),
//!     source: Some("content".into()),
//!     reported_at: Utc.with_ymd_and_hms(2025, 3, 1, 12, 0, 0).unwrap(),
//!     reported_by: "secret_scanning".into(),
//! });
//! notifier.idle().await;
//!
//! // What a webhook's receiver checks.
//! let body = br#"{"type":"key.leaked"}"#;
//! let signature = webhook_signature(&secret, 1_740_830_400, body);
//! assert!(signature.starts_with("sha256="));
//! assert!(verify_webhook_signature(&secret, 1_740_830_400, body, &signature));
//! assert!(!verify_webhook_signature(&secret, 1_740_830_401, body, &signature));
//! # }
//! ```

mod alert;
mod email;
mod error;
mod leak;
mod notifier;
mod webhook;

pub use alert::{Alert, AlertNotice, BALANCE_BELOW_EVENT, KEY_LIMIT_PERCENT_EVENT};
pub use email::EmailSettings;
pub use error::NotifyConfigError;
pub use leak::LeakNotice;
pub use notifier::{
    ATTEMPT_TIMEOUT, DEFAULT_MAX_PENDING_NOTICES, DEFAULT_RETRY_WAITS, MAX_SENDS_IN_FLIGHT,
    Notifier,
};
pub use webhook::{
    EVENT_TYPE, SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookSettings, verify_webhook_signature,
    webhook_signature,
};
