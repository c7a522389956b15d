//! [`Generations`]: CreditGuard's setting of what it records of each chat
//! request, how long, and how many per account.

use std::time::Duration;

use super::AppRanking;

/// How long generation records are kept by default.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 86_400);
/// How many generation records an account keeps at most, by default.
pub const DEFAULT_MAX_PER_ACCOUNT: u64 = 100_000;

/// What CreditGuard records of each chat request: see the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct Generations {
    pub(crate) retention: Duration,
    pub(crate) max_per_account: u64,
    pub(crate) ranking: Option<AppRanking>,
}

impl Default for Generations {
    fn default() -> Self {
        Generations::new()
    }
}

impl Generations {
    /// Records kept [`DEFAULT_RETENTION`], at most
    /// [`DEFAULT_MAX_PER_ACCOUNT`] per account; no app ranking.
    pub fn new() -> Self {
        Generations {
            retention: DEFAULT_RETENTION,
            max_per_account: DEFAULT_MAX_PER_ACCOUNT,
            ranking: None,
        }
    }

    /// How long a record is kept: above zero, at most
    /// [`MAX_RECORD_RETENTION`](crate::store::MAX_RECORD_RETENTION)
    /// (longer is cut to it, zero made one second).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention =
            retention.clamp(Duration::from_secs(1), crate::store::MAX_RECORD_RETENTION);
        self
    }

    /// The most records an account keeps (at least one): past it, the
    /// oldest go first.
    pub fn max_per_account(mut self, max_per_account: u64) -> Self {
        self.max_per_account = max_per_account.max(1);
        self
    }

    /// Counts each request's app in `ranking`.
    pub fn app_ranking(mut self, ranking: AppRanking) -> Self {
        self.ranking = Some(ranking);
        self
    }
}
