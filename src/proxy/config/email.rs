//! `email`: the SMTP server leak notices and alerts go out through.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::secrets::{secret_ref_from_json, Redacted, SecretSpec};

/// `email` in [`GatewayConfig`](super::GatewayConfig).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailSection {
    /// The SMTP server as a URL (`smtp://host:25`, `smtp://host:587?tls=required`,
    /// `smtps://user:pass@host`): text when it holds no password, else
    /// `{"env": "VAR"}`, `{"file": "/path"}` or a SecretRef holding it.
    pub smtp: SmtpServer,
    /// The sender, such as `modelgate <keys@example.com>`.
    pub from: String,
}

/// `email.smtp` in [`GatewayConfig`](super::GatewayConfig): the SMTP server's URL, written in
/// the config or read from a secret at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SmtpServer {
    /// Written as text (it may still hold a user name): never printed.
    Url(Redacted<String>),
    /// `{"env": "VAR"}`, `{"file": "/path"}` or a SecretRef holding it.
    Secret(SecretSpec),
}

impl<'de> Deserialize<'de> for SmtpServer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(url) => Ok(SmtpServer::Url(Redacted(url))),
            reference => secret_ref_from_json(&reference)
                .map(SmtpServer::Secret)
                .map_err(|problem| {
                    serde::de::Error::custom(format!(
                        "expected an smtp:// or smtps:// URL, or where to read it: {problem}"
                    ))
                }),
        }
    }
}
