//! The rate of an account's calls to the API: every request an account's
//! keys make to [`KeyRoutes`](super::KeyRoutes) (a management key's to any
//! route, an inference key's to the usage routes it may read) counts in
//! one counter of that account, kept in the store (so the rate holds
//! across instances); past the rule, 429 `management_rate` with
//! `Retry-After`. An inference key is counted too: what a call costs the
//! store (a page of records read and parsed) follows the account that
//! asks, not every tenant sharing the store.
//! A call is counted before the route looks at it, so one the route then
//! refuses (a bad body, another account) counts too: this bounds the work
//! an account makes the store do, and a call the rate refuses counts
//! nothing.
//! The operator's key is not counted: it is the one that must still work
//! while a tenant floods the API.

use crate::auth::Principal;
use crate::error::{GatewayError, LimitSource};
use crate::keys::KeyDirectory;
use crate::limiter::{Limiter, Verdict};
use crate::rate_limit::RateRule;
use crate::store::{Check, FailurePolicy};

/// The default rate of one account's management calls: 600 a minute, in
/// bursts of at most 60 (a settings page loading makes a handful).
pub const DEFAULT_MANAGEMENT_RATE: RateRule = RateRule::Gcra {
    requests: 600,
    period_seconds: 60,
    burst: 60,
};

/// The counter's name in the account's scope.
const COUNTER: &str = "management";

/// One rule, checked per account in the store.
#[derive(Clone, Debug)]
pub(crate) struct ManagementRate {
    rule: RateRule,
    limiter: Limiter,
}

impl ManagementRate {
    /// `rule` per account, in `directory`'s store at its clock. Like every
    /// other step of the key routes, a failed store refuses (503).
    pub(crate) fn new(directory: &KeyDirectory, rule: RateRule) -> Self {
        let mut limiter = Limiter::new(directory.store().clone(), "KeyRoutes");
        limiter.clock = directory.clock().clone();
        limiter.policy = FailurePolicy::FailClosed;
        ManagementRate { rule, limiter }
    }

    /// Counts one call of `principal` unless it is the operator's key; the
    /// 429 when its account is past the rule (nothing counted).
    pub(crate) async fn admit(&self, principal: &Principal) -> Result<(), GatewayError> {
        if principal.operator {
            return Ok(());
        }
        let check = Check::new(COUNTER, self.rule.limit(), 1);
        match self
            .limiter
            .check(&principal.account_id, &[check], None)
            .await?
        {
            Verdict::Rejected { retry_after, .. } => Err(GatewayError::rate_limited(
                LimitSource::ManagementRate,
                format!(
                    "the account {} made more calls to the API than this gateway allows ({}); retry after the wait in Retry-After",
                    principal.account_id, self.rule
                ),
                retry_after,
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::KeyHash;
    use crate::clock::ManualClock;
    use crate::keys::SharedStore;
    use crate::store::MemoryStore;
    use chrono::{TimeZone, Utc};
    use std::sync::Arc;
    use std::time::Duration;

    fn manager(account: &str, operator: bool) -> Principal {
        Principal {
            key_hash: KeyHash::of(account),
            management: true,
            operator,
            ..Principal::for_tests(account)
        }
    }

    #[tokio::test]
    async fn an_account_past_its_rate_is_refused_alone_and_the_operator_never() {
        let clock = Arc::new(ManualClock::new(
            Utc.with_ymd_and_hms(2026, 11, 26, 12, 0, 0).unwrap(),
        ));
        let store: SharedStore = Arc::new(MemoryStore::new());
        let directory = KeyDirectory::builder(store).clock(clock.clone()).build();
        let rate = ManagementRate::new(
            &directory,
            RateRule::Gcra {
                requests: 3,
                period_seconds: 60,
                burst: 3,
            },
        );
        let acme = manager("acme", false);
        for _ in 0..3 {
            rate.admit(&acme).await.unwrap();
        }
        let refused = rate.admit(&acme).await.unwrap_err();
        assert_eq!(refused.status().as_u16(), 429);
        assert_eq!(refused.metadata()["limit_source"], "management_rate");
        assert_eq!(refused.retry_after(), Some(Duration::from_secs(20)));
        assert!(refused.message().contains("acme"), "{}", refused.message());
        // The account's inference keys share its count; another account
        // and the operator are not held up.
        let inference = Principal::for_tests("acme");
        assert!(!inference.management);
        assert!(rate.admit(&inference).await.is_err());
        rate.admit(&manager("globex", false)).await.unwrap();
        rate.admit(&Principal::for_tests("globex")).await.unwrap();
        for _ in 0..10 {
            rate.admit(&manager("default", true)).await.unwrap();
        }
        // One call's worth back after a third of the period.
        clock.advance(Duration::from_secs(20));
        rate.admit(&acme).await.unwrap();
        assert!(rate.admit(&acme).await.is_err());
    }
}
