//! [`NotifyConfigError`]: why the settings of a notice channel were
//! refused.

/// Why notice settings were refused: the setting and the reason, never a
/// password or a secret.
#[derive(Debug, thiserror::Error)]
#[error("notify {0}: {1}")]
pub struct NotifyConfigError(&'static str, String);

impl NotifyConfigError {
    pub(super) fn new(setting: &'static str, reason: impl Into<String>) -> Self {
        NotifyConfigError(setting, reason.into())
    }

    /// The setting refused: `smtp_url`, `from`, `webhook_url` or
    /// `webhook_secret`.
    pub fn setting(&self) -> &'static str {
        self.0
    }
}
