//! The counter check both limit layers make: one atomic `check_and_add`,
//! the layer's failure policy, and a memo of counters known to be full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::clock::Clock;
use crate::error::GatewayError;
use crate::keys::SharedStore;
use crate::store::{Check, CheckOutcome, FailurePolicy, Limit};

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
}

/// Counter checks for one layer. Clones share the memo.
#[derive(Clone)]
pub(crate) struct Limiter {
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

    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Checks and counts `checks` in `scope` as one atomic step.
    pub(crate) async fn check(
        &self,
        scope: &str,
        checks: &[Check],
    ) -> Result<Verdict, GatewayError> {
        let now = self.now();
        if let Some(verdict) = self.known_full(scope, checks, now) {
            return Ok(verdict);
        }
        let decision = match self.store.check_and_add(scope, checks, now).await {
            Ok(decision) => decision,
            Err(error) => {
                return self
                    .policy
                    .on_store_error(self.layer, &error)
                    .map(|()| Verdict::Unchecked)
            }
        };
        if decision.admitted {
            return Ok(Verdict::Admitted(decision.outcomes));
        }
        let (index, outcome) = decision
            .outcomes
            .iter()
            .enumerate()
            .filter(|(_, outcome)| !outcome.admitted)
            .max_by_key(|(_, outcome)| outcome.retry_after)
            .map(|(index, outcome)| (index, *outcome))
            .expect("a refused decision has a refusing check");
        self.remember(scope, checks, &decision.outcomes, now);
        Ok(Verdict::Rejected {
            index,
            outcome,
            retry_after: decision.retry_after(),
        })
    }

    /// A refusal without a round trip, when a counter of `checks` is known
    /// full: the store said so, under the same limit, and the wait it
    /// reported is not over. It only ever refuses what the store would.
    fn known_full(&self, scope: &str, checks: &[Check], now: DateTime<Utc>) -> Option<Verdict> {
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
        for (check, outcome) in checks.iter().zip(outcomes) {
            // Only a request of one unit is known to fail until then; a
            // larger amount waits longer, a smaller one is never asked.
            if outcome.admitted || outcome.retry_after.is_zero() || check.amount != 1 {
                continue;
            }
            let Ok(wait) = chrono::Duration::from_std(outcome.retry_after) else {
                continue;
            };
            full.insert(
                (scope.to_owned(), check.name.clone()),
                Full {
                    limit: check.limit,
                    until: now + wait,
                    outcome: *outcome,
                },
            );
        }
    }
}
