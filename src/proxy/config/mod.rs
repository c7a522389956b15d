//! [`GatewayConfig`]: the gateway's JSON configuration, typed and checked
//! when it is read; [`GatewayPlan`]: the config made ready to build a
//! gateway from.
//!
//! [`GatewayConfig::from_json`] reads every section into its own type
//! (prices, secret references, the webhook routes, the SMTP server) and
//! checks each value, reading nothing outside the text. Errors name the
//! value's path and what is expected:
//!
//! ```
//! use modelgate::proxy::GatewayConfig;
//!
//! let error = GatewayConfig::from_json(
//!     r#"{"pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": -1, "completion_per_million": 10}}}}"#,
//! )
//! .unwrap_err();
//! assert!(error.to_string().starts_with(
//!     r#"config: pricing.models["openai/gpt-4o"].prompt_per_million must be a number of credits from 0 to 1000000"#
//! ));
//! ```
//!
//! [`GatewayPlan::new`] then makes the same checks, keeps each value as
//! its layer takes it, and reads what the config names outside itself (the
//! secrets, the public keys, a client per provider), so it fails only for
//! what is outside the text: a secret that cannot be read, a public-keys
//! file that is missing. Building a gateway from a plan cannot fail.
//!
//! One file per section holds its type, its checks and what it reads at
//! load. Every type here derives `Debug`; what may be a credential is a
//! [`Redacted`](crate::secrets::Redacted) or a
//! [`Secret`](crate::secrets::Secret), printed as neither, so a new field
//! is always shown and never leaks.

mod alerts;
mod body;
mod credit;
mod demo;
mod email;
mod error;
mod gateway_config;
mod generations;
mod leak_scanning;
mod model_names;
mod notify_webhook;
mod oauth;
mod plan;
mod plugins;
mod providers;
mod retry;
mod secret_fields;
mod sqlite;
mod upstream;

#[cfg(test)]
mod tests;

pub use alerts::AlertsSection;
pub use body::BodySection;
pub use credit::CreditSection;
pub use demo::{DEMO_PRICING, DEMO_RATE_LIMITS};
pub use email::{EmailSection, SmtpServer};
pub use error::ConfigError;
pub use gateway_config::{DEFAULT_SHUTDOWN_GRACE, GatewayConfig};
pub use generations::GenerationsSection;
pub use leak_scanning::LeakScanningSection;
pub use notify_webhook::NotifyWebhookSection;
pub use oauth::OAuthSection;
pub use plan::GatewayPlan;
pub use plugins::{PluginEntries, PluginsSection};
pub use providers::{ModelPrefix, ProviderSection};
pub use retry::RetrySection;
pub use sqlite::{SqliteSection, SqliteSynchronous};
pub use upstream::UpstreamSection;
