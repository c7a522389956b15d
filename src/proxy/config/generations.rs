//! `generations`: how long generation records are kept, and who reads
//! the app ranking.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use crate::usage::{AppRanking, Generations};

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
    /// The settings: the config was checked when read
    /// ([`GatewayConfig::validate`](super::GatewayConfig::validate)).
    pub(crate) fn settings(&self, ranking: AppRanking) -> Generations {
        let mut generations = Generations::new().app_ranking(ranking);
        if let Some(days) = self.retention_days {
            generations = generations.retention(Duration::from_secs(days * 86_400));
        }
        if let Some(most) = self.max_per_account {
            generations = generations.max_per_account(most);
        }
        generations
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }
}
