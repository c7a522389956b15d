//! `email`: the SMTP server leak notices and alerts go out through.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::ConfigError;
use super::secret_fields::{check_reference, read_secret};
use crate::notify::EmailSettings;
use crate::secrets::{Redacted, SecretProviders, SecretSpec, secret_ref_from_json};

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

impl EmailSection {
    /// The SMTP URL when it is written here, else the secrets provider it
    /// is read from; the sender.
    pub(super) fn check(&self, secrets: &SecretProviders) -> Result<(), ConfigError> {
        match &self.smtp {
            SmtpServer::Url(url) => EmailSettings::new(url.expose(), &self.from)
                .map(drop)
                .map_err(|error| ConfigError::at("email", error)),
            SmtpServer::Secret(reference) => {
                check_reference("email.smtp", reference, secrets)?;
                EmailSettings::check_sender(&self.from)
                    .map(drop)
                    .map_err(|error| ConfigError::at("email", error))
            }
        }
    }

    /// The settings, the SMTP URL read now when it is a secret.
    pub(super) fn settings(&self, secrets: &SecretProviders) -> Result<EmailSettings, ConfigError> {
        let url = match &self.smtp {
            SmtpServer::Url(url) => url.expose().clone(),
            SmtpServer::Secret(reference) => read_secret("email.smtp", reference, secrets)?
                .expose()
                .to_owned(),
        };
        EmailSettings::new(&url, &self.from)
            .map_err(|error| ConfigError::new(format!("email: {error}")))
    }
}
