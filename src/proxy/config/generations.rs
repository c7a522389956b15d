//! `generations`: how long generation records are kept, and who reads
//! the app ranking.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use crate::usage::Generations;

/// `generations` in [`GatewayConfig`](super::GatewayConfig): how long each chat request's record
/// is kept in the store.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenerationsSection {
    /// Days a record is kept: 1 to 3650. Absent: 30.
    pub retention_days: Option<u64>,
    /// The most records an account keeps (the oldest go first): at least
    /// 1. Absent: 100,000 (about 50 MB of Redis memory per account).
    pub max_per_account: Option<u64>,
    /// Whether every key may read the gateway-wide app ranking
    /// (`GET /api/v1/apps?account=*`), each app shown by host only (no
    /// path, no title). Absent: `false`, it is the operator's alone.
    pub public_ranking: bool,
}

impl GenerationsSection {
    /// The settings CreditGuard records with (the app ranking is the
    /// gateway's, added as it is built).
    pub(super) fn generations(&self) -> Result<Generations, ConfigError> {
        if let Some(days) = self
            .retention_days
            .filter(|days| !(1..=3650).contains(days))
        {
            return Err(ConfigError::new(format!(
                "generations.retention_days must be from 1 to 3650, not {days}"
            )));
        }
        if self.max_per_account == Some(0) {
            return Err(ConfigError::new(
                "generations.max_per_account must be at least 1",
            ));
        }
        let mut generations = Generations::new();
        if let Some(days) = self.retention_days {
            generations = generations.retention(Duration::from_secs(days * 86_400));
        }
        if let Some(most) = self.max_per_account {
            generations = generations.max_per_account(most);
        }
        Ok(generations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::GatewayConfig;

    #[test]
    fn generations_settings_are_checked_at_load() {
        let settings = |json: &str| {
            GatewayConfig::from_json(json)
                .unwrap()
                .generations
                .generations()
                .unwrap()
        };
        let kept = settings(r#"{"generations": {"retention_days": 7, "max_per_account": 10}}"#);
        assert_eq!(kept.retention, Duration::from_secs(7 * 86_400));
        assert_eq!(kept.max_per_account, 10);
        let default = settings("{}");
        assert_eq!(default.retention, crate::usage::DEFAULT_RETENTION);
        for (json, words) in [
            (
                r#"{"generations": {"retention_days": 0}}"#,
                "config: generations.retention_days must be from 1 to 3650, not 0",
            ),
            (
                r#"{"generations": {"retention_days": 3651}}"#,
                "config: generations.retention_days must be from 1 to 3650, not 3651",
            ),
            (
                r#"{"generations": {"max_per_account": 0}}"#,
                "config: generations.max_per_account must be at least 1",
            ),
        ] {
            let error = GatewayConfig::from_json(json).unwrap_err().to_string();
            assert_eq!(error, words, "{json}");
        }
        assert!(GatewayConfig::from_json(r#"{"generations": {"days": 1}}"#).is_err());
    }
}
