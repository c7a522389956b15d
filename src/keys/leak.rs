//! Reporting a leaked key: revoked and disabled at once, its owner told.

use super::directory::LeakOutcome;
use super::layer::KeyRoutesConfig;
use super::record::LeakReport;
use crate::auth::KeyHash;
use crate::store::StoreError;

/// Revokes and disables the key `hash` ([`KeyDirectory::report_leak`](super::KeyDirectory::report_leak)).
pub(crate) async fn report_leak(
    config: &KeyRoutesConfig,
    hash: &KeyHash,
    report: &LeakReport,
) -> Result<LeakOutcome, StoreError> {
    config.directory.report_leak(hash, report).await
}
