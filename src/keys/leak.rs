//! Reporting a leaked key: revoked and disabled at once, its owner told.

use super::directory::{KeyDirectory, LeakOutcome};
use super::key::KeyHash;
use super::record::LeakReport;
use crate::store::StoreError;

/// The token type a report made through the API names.
pub(crate) const MODELGATE_TOKEN_TYPE: &str = "modelgate_api_key";

/// Who is told of a leaked key: the notices' sender.
#[cfg(feature = "notify")]
pub(crate) type LeakNotifier = crate::notify::Notifier;

/// Who is told of a leaked key: nobody, in a build without notices.
#[cfg(not(feature = "notify"))]
#[derive(Clone, Debug)]
pub(crate) struct LeakNotifier;

#[cfg(not(feature = "notify"))]
impl LeakNotifier {
    /// Tells nobody.
    pub(crate) fn disabled() -> Self {
        LeakNotifier
    }
}

/// Revokes and disables the key `hash`
/// ([`KeyDirectory::report_leak`]); on its first report, tells its owner
/// through `notifier` in the background (never waited for).
pub(crate) async fn report_leak(
    directory: &KeyDirectory,
    notifier: &LeakNotifier,
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
        tell_owner(directory, notifier, record, report, token_type).await;
    }
    Ok(outcome)
}

/// How much of a key's hash a notice shows: enough to tell keys apart,
/// nothing that helps find the key.
#[cfg(feature = "notify")]
const HASH_PREFIX_CHARS: usize = 12;

/// Sends the notice of a key's first leak report, in the background.
#[cfg(feature = "notify")]
async fn tell_owner(
    directory: &KeyDirectory,
    notifier: &LeakNotifier,
    record: &super::KeyRecord,
    report: &LeakReport,
    token_type: &str,
) {
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
        notifier.leak_detected(crate::notify::LeakNotice {
            account: record.account.clone(),
            email,
            key_name: record.name.clone(),
            key_hash_prefix: record.hash.to_hex()[..HASH_PREFIX_CHARS].to_owned(),
            token_type: token_type.to_owned(),
            url: report.url.clone(),
            source: report.source.clone(),
            reported_at: report.reported_at,
            reported_by: report.reported_by.clone(),
        });
    }
}

/// Tells nobody: a build without notices.
#[cfg(not(feature = "notify"))]
async fn tell_owner(
    _: &KeyDirectory,
    _: &LeakNotifier,
    _: &super::KeyRecord,
    _: &LeakReport,
    _: &str,
) {
}
