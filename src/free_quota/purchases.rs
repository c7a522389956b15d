//! What each account has bought in total, as the free quota needs it: the
//! daily limit depends on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::store::{LedgerStore, StoreError};

/// How many accounts the cache holds before it sheds stale ones.
const MAX_CACHED_ACCOUNTS: usize = 100_000;

/// A purchased total (nano-credits) and when it was read.
type Seen = (i64, DateTime<Utc>);

/// Purchased totals by account. A total only ever rises, so an account
/// seen at or over the threshold stays there for good; one below it is
/// read again after `ttl`, which bounds how long a top-up takes to raise
/// the daily limit on an instance that did not take the top-up. A stale
/// total can only make the quota tighter, never looser.
#[derive(Clone, Debug)]
pub(crate) struct Purchases {
    ttl: Duration,
    seen: Arc<Mutex<HashMap<String, Seen>>>,
}

impl Purchases {
    pub(crate) fn new(ttl: Duration) -> Self {
        Purchases {
            ttl,
            seen: Arc::default(),
        }
    }

    pub(crate) fn with_ttl(&self, ttl: Duration) -> Self {
        Purchases::new(ttl)
    }

    /// The purchased total of `account`, from the cache when it can be
    /// trusted, else from `store`.
    pub(crate) async fn purchased_nanos(
        &self,
        store: &dyn LedgerStore,
        account: &str,
        threshold_nanos: i64,
        now: DateTime<Utc>,
    ) -> Result<i64, StoreError> {
        if let Some(&(purchased, read_at)) = self.lock().get(account) {
            let fresh = (now - read_at).to_std().is_ok_and(|age| age < self.ttl);
            if purchased >= threshold_nanos || fresh {
                return Ok(purchased);
            }
        }
        let purchased = store.account_balance(account).await?.purchased_nanos;
        let mut seen = self.lock();
        if seen.len() >= MAX_CACHED_ACCOUNTS {
            seen.retain(|_, (purchased, _)| *purchased >= threshold_nanos);
            if seen.len() >= MAX_CACHED_ACCOUNTS {
                seen.clear();
            }
        }
        seen.insert(account.to_owned(), (purchased, now));
        Ok(purchased)
    }

    /// The last total read for `account`, however old.
    pub(crate) fn last_known(&self, account: &str) -> Option<i64> {
        self.lock().get(account).map(|(purchased, _)| *purchased)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
