//! App usage: requests and tokens per calling app and model in the current
//! UTC day, week and month, for the app ranking.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::StoreError;
use crate::clock::Period;

/// The most (app, model) rows a scope keeps per period: past it, usage of
/// a new row is not counted (rows already counted go on counting), so a
/// flood of invented apps cannot grow the store without bound.
pub const MAX_APP_USAGE_ROWS: usize = 10_000;

/// The longest app id, model name or details an [`AppUsage`] may carry, in
/// bytes.
pub const MAX_APP_USAGE_FIELD_BYTES: usize = 4_096;

/// What separates an app from its model in a stored field name: a control
/// character no app id, model or details contains.
pub(crate) const FIELD_SEPARATOR: char = '\u{1f}';

/// One app's use of one model: what [`AppUsageStore::add_app_usage`] adds
/// and [`AppUsageStore::app_usage`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppUsage {
    /// The app's id (what the ranking groups by).
    pub app: String,
    /// What is shown of the app (JSON in practice): the latest written
    /// for it wins.
    pub details: String,
    /// The model.
    pub model: String,
    /// Requests.
    pub requests: u64,
    /// Tokens, prompt and completion.
    pub tokens: u64,
}

/// Counts of app usage per scope (a ranking: the whole gateway, or one
/// account) in the UTC day, week and month containing the instant given.
#[async_trait]
pub trait AppUsageStore: Send + Sync + 'static {
    /// Adds each row's requests and tokens to its (app, model) in the
    /// current day, week and month of `scope`, as one atomic step; a new
    /// row past [`MAX_APP_USAGE_ROWS`] in a period is left out there.
    /// Periods only roll forward: the previous period's counts are dropped
    /// when the first write of the next one arrives.
    async fn add_app_usage(
        &self,
        scope: &str,
        rows: &[AppUsage],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Every row of `scope` in the `period` containing `now`, in no order.
    async fn app_usage(
        &self,
        scope: &str,
        period: Period,
        now: DateTime<Utc>,
    ) -> Result<Vec<AppUsage>, StoreError>;
}

/// Rows with fields within [`MAX_APP_USAGE_FIELD_BYTES`] and counts a Lua
/// number holds exactly.
pub(crate) fn validate_app_usage(rows: &[AppUsage]) -> Result<(), StoreError> {
    if rows.iter().all(is_valid_app_usage) {
        Ok(())
    } else {
        Err(StoreError::invalid(
            "add_app_usage",
            "an app usage row needs an app id, fields of at most 4096 bytes without U+001F, and counts up to 2^53",
        ))
    }
}

/// Whether `row` is one [`AppUsageStore::add_app_usage`] takes.
pub fn is_valid_app_usage(row: &AppUsage) -> bool {
    ![&row.app, &row.model, &row.details]
        .iter()
        .any(|field| field.len() > MAX_APP_USAGE_FIELD_BYTES || field.contains(FIELD_SEPARATOR))
        && !row.app.is_empty()
        && row.requests <= super::MAX_EXACT
        && row.tokens <= super::MAX_EXACT
}
