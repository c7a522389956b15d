//! Reporting a leaked key: revoked and disabled at once, its owner told.

use super::directory::{KeyDirectory, LeakOutcome};
use super::record::LeakReport;
use crate::auth::KeyHash;
use crate::notify::{LeakNotice, Notifier};
use crate::store::StoreError;

/// The token type a report made through the API names.
pub(crate) const MODELGATE_TOKEN_TYPE: &str = "modelgate_api_key";

/// How much of a key's hash a notice shows: enough to tell keys apart,
/// nothing that helps find the key.
const HASH_PREFIX_CHARS: usize = 12;

/// Revokes and disables the key `hash`
/// ([`KeyDirectory::report_leak`]); on its first report, tells its owner
/// through `notifier` in the background (never waited for).
pub(crate) async fn report_leak(
    directory: &KeyDirectory,
    notifier: &Notifier,
    hash: &KeyHash,
    report: &LeakReport,
    token_type: &str,
) -> Result<LeakOutcome, StoreError> {
    let outcome = directory.report_leak(hash, report).await?;
    if let LeakOutcome::Revoked {
        record,
        first: true,
    } = &outcome
    {
        // Without the owner's address the webhook is still sent.
        let email = match directory.account(&record.account).await {
            Ok(account) => account.and_then(|account| account.email),
            Err(error) => {
                tracing::warn!(
                    %error,
                    account = %record.account,
                    "the leaked key's account could not be read; its owner is not e-mailed"
                );
                None
            }
        };
        notifier.leak_detected(LeakNotice {
            account: record.account.clone(),
            email,
            key_name: record.name.clone(),
            key_hash_prefix: record.hash.chars().take(HASH_PREFIX_CHARS).collect(),
            token_type: token_type.to_owned(),
            url: report.url.clone(),
            source: report.source.clone(),
            reported_at: report.reported_at,
            reported_by: report.reported_by.clone(),
        });
    }
    Ok(outcome)
}
