//! App usage in memory: per scope, the current day's, week's and month's.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::store::{MemoryStore, get_or_default, lock};
use crate::clock::Period;
use crate::store::StoreError;
use crate::store::apps::{AppUsage, AppUsageStore, MAX_APP_USAGE_ROWS, validate_app_usage};
use crate::store::rules::ledger::period_starts_micros;

/// One scope's app usage in one period (day, week or month).
#[derive(Debug, Default)]
pub(super) struct AppPeriod {
    start_micros: i64,
    /// (app, model) -> (requests, tokens).
    rows: HashMap<(Box<str>, Box<str>), (u64, u64)>,
    details: HashMap<Box<str>, Box<str>>,
}

#[async_trait]
impl AppUsageStore for MemoryStore {
    async fn add_app_usage(
        &self,
        scope: &str,
        rows: &[AppUsage],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        validate_app_usage(rows)?;
        let starts = period_starts_micros(now);
        let mut scopes = lock(&self.app_usage);
        let periods = get_or_default(&mut scopes, scope);
        for (period, start_micros) in periods.iter_mut().zip(starts) {
            // Periods only roll forward; a write stamped in one that has
            // already rolled over counts nowhere.
            if start_micros > period.start_micros {
                *period = AppPeriod {
                    start_micros,
                    ..AppPeriod::default()
                };
            } else if start_micros < period.start_micros {
                continue;
            }
            for row in rows {
                let key = (Box::from(row.app.as_str()), Box::from(row.model.as_str()));
                if period.rows.len() >= MAX_APP_USAGE_ROWS && !period.rows.contains_key(&key) {
                    continue;
                }
                let counts = period.rows.entry(key).or_default();
                counts.0 = counts.0.saturating_add(row.requests);
                counts.1 = counts.1.saturating_add(row.tokens);
                period
                    .details
                    .insert(row.app.as_str().into(), row.details.as_str().into());
            }
        }
        Ok(())
    }

    async fn app_usage(
        &self,
        scope: &str,
        period: Period,
        now: DateTime<Utc>,
    ) -> Result<Vec<AppUsage>, StoreError> {
        let index = match period {
            Period::Day => 0,
            Period::Week => 1,
            Period::Month => 2,
        };
        let start_micros = period_starts_micros(now)[index];
        let scopes = lock(&self.app_usage);
        let Some(counted) = scopes
            .get(scope)
            .map(|periods| &periods[index])
            .filter(|counted| counted.start_micros == start_micros)
        else {
            return Ok(Vec::new());
        };
        Ok(counted
            .rows
            .iter()
            .map(|((app, model), (requests, tokens))| AppUsage {
                app: app.to_string(),
                details: counted
                    .details
                    .get(app)
                    .map(|details| details.to_string())
                    .unwrap_or_default(),
                model: model.to_string(),
                requests: *requests,
                tokens: *tokens,
            })
            .collect())
    }
}
