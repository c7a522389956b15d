//! [`FreeModelQuota`]: the quota of free model variants (ids ending in
//! `:free`), from seed 000: at most 20 requests in any rolling minute, and
//! per UTC day 50 requests, or 1000 once the account has bought at least
//! 10 credits in all. The numbers are [`FreeQuotaRules`], all configurable.
//!
//! The quota belongs to the account: all its keys and all free models
//! share both counters, checked and counted in one atomic store step (a
//! refused request counts in neither). The day resets at UTC midnight. A
//! refusal is 429 with `limit_source` `free_per_minute` or `free_per_day`;
//! its message says which limit was hit, when it resets and, on the
//! 50-a-day tier, that buying 10 credits raises it to 1000; its
//! `Retry-After` reaches the reset, so clients do not retry in vain.
//! Admitted free requests carry a [`FreeQuotaSnapshot`] in their
//! extensions and `X-RateLimit-*` headers on their response.
//!
//! When the store fails the layer admits unchecked (logged and counted)
//! unless set to fail closed.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::auth::BearerAuthLayer;
//! use modelgate::body::BodyLimitLayer;
//! use modelgate::free_quota::{FreeModelQuotaLayer, FreeQuotaRules};
//! use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
//! use modelgate::store::MemoryStore;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let directory = KeyDirectory::new(store.clone());
//! let (key, _) = directory.create_key(NewKey::named("app")).await.unwrap();
//! let rules = FreeQuotaRules { requests_per_minute: 1, ..FreeQuotaRules::default() };
//! let gateway = ServiceBuilder::new()
//!     .layer(BearerAuthLayer::new(directory))
//!     .layer(BodyLimitLayer::new())
//!     .layer(FreeModelQuotaLayer::new(store).rules(rules).unwrap())
//!     .service(service_fn(|_: Request<Full<Bytes>>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
//!     }));
//! let chat = |model: &str| {
//!     let body = format!(r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "Hi"}}]}}"#);
//!     let request = Request::post("/api/v1/chat/completions")
//!         .header("authorization", format!("Bearer {}", key.expose()))
//!         .header("content-type", "application/json")
//!         .body(Full::new(Bytes::from(body)))
//!         .unwrap();
//!     gateway.clone().oneshot(request)
//! };
//! assert_eq!(chat("meta-llama/llama-3-8b:free").await.unwrap().status(), 200);
//! let refused = chat("google/gemma-2-9b:free").await.unwrap();
//! assert_eq!(refused.status(), 429);
//! let body = refused.into_body().collect().await.unwrap().to_bytes();
//! assert!(String::from_utf8_lossy(&body).contains("free_per_minute"));
//! // Paid models are not this layer's business.
//! assert_eq!(chat("openai/gpt-4o").await.unwrap().status(), 200);
//! # }
//! ```

mod layer;
mod service;

/// [`FreeModelQuota`]'s response future: the quota check, then the inner
/// service.
pub use crate::limiter::AdmissionFuture as ResponseFuture;
pub use layer::FreeModelQuotaLayer;

pub use service::FreeModelQuota;

use std::time::Duration;

use crate::clock::Period;
use crate::store::{Check, CheckOutcome, Limit, NANOS_PER_CREDIT};

/// The counter of free-model requests in the current UTC day, per account.
pub(crate) const DAILY_COUNTER: &str = "free:day";
/// The counter of free-model requests in any minute, per account.
pub(crate) const MINUTE_COUNTER: &str = "free:minute";

/// The quota's counters after an admitted free request, in the request's
/// extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeQuotaSnapshot {
    /// The rolling minute.
    pub minute: CheckOutcome,
    /// The UTC day.
    pub day: CheckOutcome,
}

impl FreeQuotaSnapshot {
    /// Requests left under the tighter of the two limits.
    pub fn remaining(&self) -> u64 {
        self.minute.remaining.min(self.day.remaining)
    }
}

/// The limits of free model variants, per account. In JSON config every
/// field is optional and defaults to the seed's number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FreeQuotaRules {
    /// Requests in any rolling minute.
    pub requests_per_minute: u64,
    /// Requests per UTC day while less than the threshold was purchased.
    pub requests_per_day: u64,
    /// Requests per UTC day once the threshold was purchased.
    pub requests_per_day_after_purchase: u64,
    /// Credits (in nano-credits) an account must have bought, in total, for
    /// the higher daily limit.
    pub purchase_threshold_nanos: i64,
}

impl Default for FreeQuotaRules {
    /// The seed's numbers: 20 a minute; 50 a day, 1000 after 10 credits bought.
    fn default() -> Self {
        FreeQuotaRules {
            requests_per_minute: 20,
            requests_per_day: 50,
            requests_per_day_after_purchase: 1000,
            purchase_threshold_nanos: 10 * NANOS_PER_CREDIT,
        }
    }
}

/// Why free-quota rules were refused.
#[derive(Debug, thiserror::Error)]
#[error("free quota rules: {0}")]
pub struct QuotaRulesError(&'static str);

impl FreeQuotaRules {
    /// Checks the numbers: every limit from 1 to 2^53 (what counters hold),
    /// the threshold not negative.
    pub fn validate(&self) -> Result<(), QuotaRulesError> {
        let limits = [
            self.requests_per_minute,
            self.requests_per_day,
            self.requests_per_day_after_purchase,
        ];
        if limits
            .iter()
            .any(|limit| *limit == 0 || *limit > crate::store::MAX_EXACT)
        {
            return Err(QuotaRulesError(
                "every limit must be from 1 to 2^53 requests",
            ));
        }
        if self.purchase_threshold_nanos < 0 {
            return Err(QuotaRulesError(
                "the purchase threshold must not be negative",
            ));
        }
        Ok(())
    }

    /// The daily limit of an account that bought `purchased_nanos` in total.
    pub fn requests_per_day_for(&self, purchased_nanos: i64) -> u64 {
        if purchased_nanos >= self.purchase_threshold_nanos {
            self.requests_per_day_after_purchase
        } else {
            self.requests_per_day
        }
    }

    /// The per-minute counter's check; `requests` 0 only reads it.
    pub fn minute_check(&self, requests: u64) -> Check {
        Check::new(
            MINUTE_COUNTER,
            Limit::Rolling {
                limit: self.requests_per_minute,
                window: Duration::from_secs(60),
            },
            requests,
        )
    }

    /// The daily counter's check; `requests` 0 only reads it.
    pub fn daily_check(&self, purchased_nanos: i64, requests: u64) -> Check {
        Check::new(
            DAILY_COUNTER,
            Limit::Calendar {
                limit: self.requests_per_day_for(purchased_nanos),
                period: Period::Day,
            },
            requests,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::context::RequestContext;
    use crate::keys::SharedStore;
    use crate::store::MemoryStore;
    use bytes::Bytes;
    use chrono::{TimeZone, Utc};
    use http::{Request, Response};
    use http_body_util::Full;
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    fn free_chat() -> Request<Full<Bytes>> {
        let body = br#"{"model": "a/b:free", "messages": [{"role": "user", "content": "x"}]}"#;
        let mut request = Request::post("/api/v1/chat/completions")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap();
        request
            .extensions_mut()
            .insert(RequestContext::chat_for_tests("acct", body));
        request
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Admitted exactly when fewer than the per-minute limit were
        /// admitted in the 60 s before, and fewer than the daily limit in
        /// the UTC day: never more, never fewer.
        #[test]
        fn admits_exactly_what_the_rolling_minute_and_the_day_allow(
            gaps_ms in proptest::collection::vec(0u64..45_000, 1..80),
            remember in any::<bool>(),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let start = Utc.with_ymd_and_hms(2026, 11, 18, 23, 50, 0).unwrap();
            let clock = ManualClock::new(start);
            let store: SharedStore = Arc::new(MemoryStore::new());
            let rules = FreeQuotaRules {
                requests_per_minute: 4,
                requests_per_day: 9,
                ..FreeQuotaRules::default()
            };
            let service = ServiceBuilder::new()
                .layer(
                    FreeModelQuotaLayer::new(store)
                        .rules(rules)
                        .unwrap()
                        .clock(Arc::new(clock.clone()))
                        .remember_full_counters(remember),
                )
                .service(service_fn(|_: Request<Full<Bytes>>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
                }));
            let mut admitted: Vec<chrono::DateTime<Utc>> = Vec::new();
            for gap in gaps_ms {
                clock.advance(Duration::from_millis(gap));
                let now = clock.now();
                let in_minute = admitted.iter().filter(|at| **at > now - chrono::Duration::seconds(60)).count() as u64;
                let today = admitted.iter().filter(|at| crate::clock::Period::Day.start_of(**at) == crate::clock::Period::Day.start_of(now)).count() as u64;
                let expected = in_minute < rules.requests_per_minute && today < rules.requests_per_day;
                let status = runtime.block_on(service.clone().oneshot(free_chat())).unwrap().status();
                prop_assert_eq!(status == 200, expected, "at {} with {} in the minute, {} today", now, in_minute, today);
                prop_assert!(status == 200 || status == 429);
                if status == 200 {
                    admitted.push(now);
                }
            }
        }
    }
}
