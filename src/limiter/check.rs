//! [`Limiter`]: one counter check of a layer, with the layer's failure
//! policy and the memo of counters known to be full (see the
//! [module docs](super)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};

use crate::clock::Clock;
use crate::error::GatewayError;
use crate::store::SharedStore;
use crate::store::{AdmitRequest, Check, CheckOutcome, FailurePolicy, Limit, PurchaseTier};

/// How many full counters the memo holds before it sheds expired ones.
const MAX_REMEMBERED: usize = 10_000;

/// What a limit check decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every check admitted and was counted; one outcome per check.
    Admitted(Vec<CheckOutcome>),
    /// The check at `index` refused (of several, the one with the longest
    /// wait); nothing was counted.
    Rejected {
        index: usize,
        outcome: CheckOutcome,
        retry_after: Duration,
    },
    /// The store failed and the policy admits unchecked.
    Unchecked,
    /// Every check fit, but the request was refused by another part of its
    /// admission (a credit hold), so nothing was counted.
    NotCounted(Vec<CheckOutcome>),
}

/// Counter checks for one layer. Clones share the memo.
#[derive(Clone)]
pub(crate) struct Limiter {
    // `keys::SharedStore`, spelled out: the limiter sits below `keys`.
    pub(crate) store: SharedStore,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) policy: FailurePolicy,
    pub(crate) layer: &'static str,
    pub(crate) remember_full_counters: bool,
    full: Arc<Mutex<HashMap<(String, String), Full>>>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("layer", &self.layer)
            .field("clock", &self.clock)
            .field("policy", &self.policy)
            .field("remember_full_counters", &self.remember_full_counters)
            .finish_non_exhaustive()
    }
}

/// A counter the store reported full, and until when.
#[derive(Clone, Copy, Debug)]
struct Full {
    limit: Limit,
    until: DateTime<Utc>,
    /// When the counter is empty again, as the store reported.
    empty_at: DateTime<Utc>,
    outcome: CheckOutcome,
}

impl Limiter {
    /// A limiter for `layer` on `store`: system clock, fail open, full
    /// counters remembered.
    pub(crate) fn new(store: SharedStore, layer: &'static str) -> Self {
        Limiter {
            store,
            clock: Arc::new(crate::clock::SystemClock),
            policy: FailurePolicy::FailOpen,
            layer,
            remember_full_counters: true,
            full: Arc::default(),
        }
    }

    /// The time, to the µs: the stores count in µs, so an instant between
    /// two µs never outlives a wait the store reported.
    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.clock.now().trunc_subsecs(6)
    }

    /// Checks and counts `checks` in `scope` as one atomic step, with
    /// `tier` raising one check's capacity when the account has bought
    /// enough (read by the store in the same step).
    pub(crate) async fn check(
        &self,
        scope: &str,
        checks: &[Check],
        tier: Option<PurchaseTier>,
    ) -> Result<Verdict, GatewayError> {
        let now = self.now();
        let tiered = tier.map(|tier| tier.check_index);
        if let Some(verdict) = self.known_full(scope, checks, tiered, now) {
            return Ok(verdict);
        }
        let decided = match tier {
            None => self
                .store
                .check_and_add(scope, checks, now)
                .await
                .map(|decision| (decision.admitted, decision.outcomes)),
            Some(tier) => self
                .store
                .admit(
                    &AdmitRequest {
                        account: scope.to_owned(),
                        checks: checks.to_vec(),
                        purchase_tier: Some(tier),
                        hold: None,
                    },
                    now,
                )
                .await
                .map(|outcome| (outcome.admitted, outcome.checks)),
        };
        match decided {
            Ok((admitted, outcomes)) => {
                Ok(self.judge(scope, checks, tiered, admitted, outcomes, now))
            }
            Err(error) => self
                .policy
                .on_store_error(self.layer, &error)
                .map(|()| Verdict::Unchecked),
        }
    }

    /// The verdict on what the store decided for `checks` (their outcomes,
    /// and whether all of them were counted); a refusal's full counters
    /// are remembered, but for the `tiered` check's, whose capacity a
    /// purchase may raise at any moment.
    pub(crate) fn judge(
        &self,
        scope: &str,
        checks: &[Check],
        tiered: Option<usize>,
        admitted: bool,
        outcomes: Vec<CheckOutcome>,
        now: DateTime<Utc>,
    ) -> Verdict {
        if admitted {
            return Verdict::Admitted(outcomes);
        }
        let refusing = outcomes
            .iter()
            .enumerate()
            .filter(|(_, outcome)| !outcome.admitted)
            .max_by_key(|(_, outcome)| outcome.retry_after)
            .map(|(index, outcome)| (index, *outcome));
        let Some((index, outcome)) = refusing else {
            // Every check fit: something else refused (a credit hold), and
            // nothing was counted.
            return Verdict::NotCounted(outcomes);
        };
        self.remember(scope, checks, tiered, &outcomes, now);
        let retry_after = outcomes
            .iter()
            .filter(|outcome| !outcome.admitted)
            .map(|outcome| outcome.retry_after)
            .max()
            .unwrap_or_default();
        Verdict::Rejected {
            index,
            outcome,
            retry_after,
        }
    }

    /// A refusal without a round trip, when a counter of `checks` is known
    /// full: the store said so, under the same limit, and the wait it
    /// reported is not over. It only ever refuses what the store would.
    pub(crate) fn known_full(
        &self,
        scope: &str,
        checks: &[Check],
        tiered: Option<usize>,
        now: DateTime<Utc>,
    ) -> Option<Verdict> {
        if !self.remember_full_counters {
            return None;
        }
        let full = self
            .full
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        checks
            .iter()
            .enumerate()
            .filter(|(index, _)| Some(*index) != tiered)
            .filter_map(|(index, check)| {
                let known = full.get(&(scope.to_owned(), check.name.clone()))?;
                (known.limit == check.limit && now < known.until && check.amount > 0)
                    .then_some((index, known))
            })
            .max_by_key(|(_, known)| known.until)
            .map(|(index, known)| {
                let retry_after = (known.until - now).to_std().unwrap_or_default();
                Verdict::Rejected {
                    index,
                    outcome: CheckOutcome {
                        retry_after,
                        reset_after: (known.empty_at - now).to_std().unwrap_or_default(),
                        ..known.outcome
                    },
                    retry_after,
                }
            })
    }

    fn remember(
        &self,
        scope: &str,
        checks: &[Check],
        tiered: Option<usize>,
        outcomes: &[CheckOutcome],
        now: DateTime<Utc>,
    ) {
        if !self.remember_full_counters {
            return;
        }
        let mut full = self
            .full
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if full.len() >= MAX_REMEMBERED {
            full.retain(|_, known| now < known.until);
            if full.len() >= MAX_REMEMBERED {
                full.clear();
            }
        }
        for (index, (check, outcome)) in checks.iter().zip(outcomes).enumerate() {
            // Only a request of one unit is known to fail until then; a
            // larger amount waits longer, a smaller one is never asked.
            if outcome.admitted
                || outcome.retry_after.is_zero()
                || check.amount != 1
                || Some(index) == tiered
            {
                continue;
            }
            let (Ok(wait), Ok(until_empty)) = (
                chrono::Duration::from_std(outcome.retry_after),
                chrono::Duration::from_std(outcome.reset_after),
            ) else {
                continue;
            };
            full.insert(
                (scope.to_owned(), check.name.clone()),
                Full {
                    limit: check.limit,
                    until: now + wait,
                    empty_at: now + until_empty,
                    outcome: *outcome,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::MemoryStore;
    use chrono::TimeZone;

    fn limiter(clock: &ManualClock) -> Limiter {
        let mut limiter = Limiter::new(Arc::new(MemoryStore::new()), "test");
        limiter.clock = Arc::new(clock.clone());
        limiter
    }

    fn rolling(limit: u64) -> Check {
        Check::new(
            "c",
            Limit::Rolling {
                limit,
                window: Duration::from_secs(10),
            },
            1,
        )
    }

    #[tokio::test]
    async fn the_memo_refuses_only_under_the_same_limit_and_until_the_wait_ends() {
        let clock = ManualClock::new(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
        let limiter = limiter(&clock);
        assert!(matches!(
            limiter.check("a", &[rolling(1)], None).await.unwrap(),
            Verdict::Admitted(_)
        ));
        clock.advance(Duration::from_secs(4));
        let Verdict::Rejected { outcome, .. } =
            limiter.check("a", &[rolling(1)], None).await.unwrap()
        else {
            panic!("full");
        };
        assert_eq!(outcome.retry_after, Duration::from_secs(6));
        // From the memo: the wait and the reset count down with the clock.
        clock.advance(Duration::from_secs(2));
        let Verdict::Rejected {
            outcome,
            retry_after,
            ..
        } = limiter.check("a", &[rolling(1)], None).await.unwrap()
        else {
            panic!("still full");
        };
        assert_eq!(
            (retry_after, outcome.reset_after),
            (Duration::from_secs(4), Duration::from_secs(4))
        );
        // A raised limit is not answered from the memo: the store admits.
        assert!(matches!(
            limiter.check("a", &[rolling(2)], None).await.unwrap(),
            Verdict::Admitted(_)
        ));
        // Another scope is not affected.
        assert!(matches!(
            limiter.check("b", &[rolling(1)], None).await.unwrap(),
            Verdict::Admitted(_)
        ));
        // Once the wait is over the store is asked again.
        clock.advance(Duration::from_secs(4));
        assert!(matches!(
            limiter.check("a", &[rolling(2)], None).await.unwrap(),
            Verdict::Admitted(_)
        ));
    }

    #[tokio::test]
    async fn a_reading_check_is_never_refused_from_the_memo() {
        let clock = ManualClock::new(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
        let limiter = limiter(&clock);
        limiter.check("a", &[rolling(1)], None).await.unwrap();
        assert!(matches!(
            limiter.check("a", &[rolling(1)], None).await.unwrap(),
            Verdict::Rejected { .. }
        ));
        let peek = Check {
            amount: 0,
            ..rolling(1)
        };
        assert!(matches!(
            limiter.check("a", &[peek], None).await.unwrap(),
            Verdict::Admitted(_)
        ));
    }

    #[tokio::test]
    async fn the_memo_stays_bounded() {
        let clock = ManualClock::new(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
        let limiter = limiter(&clock);
        for scope in 0..(MAX_REMEMBERED + 10) {
            let scope = scope.to_string();
            limiter.check(&scope, &[rolling(1)], None).await.unwrap();
            limiter.check(&scope, &[rolling(1)], None).await.unwrap();
        }
        assert!(limiter.full.lock().unwrap().len() <= MAX_REMEMBERED);
    }
}
