use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use http::{Request, Response};
use tower_service::Service;

use super::layer::FreeModelQuotaConfig;
use crate::clock::Period;
use crate::context::RequestContext;
use crate::error::{GatewayError, LimitSource, retry_after_seconds};
use crate::keys::credits::nanos_to_json;
use crate::limiter::Verdict;
use crate::limiter::headers::{RateHeaders, tightest, with_rate_limit_headers};
use crate::limiter::{Admission, AdmissionFuture, Decision, Finish, PlannedChecks};
use crate::response_body::ResponseBody;
use crate::routing::is_model_call;
use crate::store::{CheckOutcome, PurchaseTier};

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

/// This layer's name in metrics and logs.
const LAYER: &str = "FreeModelQuota";

/// Holds `:free` model variants to their quota, per account across all its
/// keys and all free models: requests in any rolling minute, and per UTC
/// day a limit that rises once the account has bought enough credits. Both
/// are checked and counted as one atomic step.
///
/// Refusals are 429 with `limit_source` `free_per_minute` or `free_per_day`,
/// a message saying which limit was hit, when it resets and (on the low
/// daily tier) that buying credits raises it, and a `Retry-After` that
/// reaches the reset. Other models pass untouched. Needs
/// [`BearerAuth`](crate::auth::BearerAuth) and
/// [`BodyLimit`](crate::body::BodyLimit) before it. See the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct FreeModelQuota<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<FreeModelQuotaConfig>,
}

impl<S, B, ResBody> Service<Request<B>> for FreeModelQuota<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = AdmissionFuture<S, B>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Refused requests never need the inner service.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let context = RequestContext::of(&request);
        let Some(call) = context.and_then(RequestContext::model_call) else {
            if is_model_call(request.method(), request.uri().path()) {
                return AdmissionFuture::rejected(
                    LAYER,
                    GatewayError::missing_layer("FreeModelQuota", "BodyLimit"),
                );
            }
            return AdmissionFuture::admitted(LAYER, request, inner);
        };
        if !call.model_id.is_free() {
            return AdmissionFuture::admitted(LAYER, request, inner);
        }
        let Some(principal) = context.and_then(|context| context.principal.as_ref()) else {
            return AdmissionFuture::rejected(
                LAYER,
                GatewayError::missing_layer("FreeModelQuota", "BearerAuth"),
            );
        };
        let account = principal.account_id.clone();
        let config = Arc::clone(&self.config);
        let limiter = config.limiter.clone();
        let rules = config.rules;
        // The daily limit rises once the account has bought enough: the
        // store reads its purchased total in the same step.
        // The daily check at its low tier's capacity; the tier raises it.
        let checks = vec![rules.minute_check(1), rules.daily_check(i64::MIN, 1)];
        let tier = PurchaseTier {
            check_index: 1,
            threshold_nanos: rules.purchase_threshold_nanos,
            raised_capacity: rules.requests_per_day_after_purchase,
        };
        let finish: Finish = Arc::new(move |verdict| finish(&config, verdict));
        if self.config.deferred {
            // A counter known full refuses now, with no store step at all.
            if let Some(verdict) =
                limiter.known_full(&account, &checks, Some(tier.check_index), limiter.now())
                && let Err(error) = finish(verdict)
            {
                return AdmissionFuture::rejected(LAYER, error);
            }
            let mut request = request;
            RequestContext::of_mut(&mut request)
                .plan
                .parts
                .push(PlannedChecks {
                    limiter,
                    checks,
                    tier: Some(tier),
                    finish,
                });
            return AdmissionFuture::admitted(LAYER, request, inner);
        }
        let decision: Decision = Box::pin(async move {
            let verdict = limiter.check(&account, &checks, Some(tier)).await?;
            finish(verdict)
        });
        AdmissionFuture::deciding(LAYER, decision, request, inner)
    }
}

/// The quota's verdict as the request's refusal or its snapshot and headers.
fn finish(config: &FreeModelQuotaConfig, verdict: Verdict) -> Result<Admission, GatewayError> {
    let rules = &config.rules;
    match verdict {
        Verdict::Unchecked | Verdict::NotCounted(_) => Ok(Admission::default()),
        Verdict::Admitted(outcomes) => {
            let mut admission: Admission = Admission {
                response_headers: tightest(&outcomes).map(RateHeaders::of).unwrap_or_default(),
                ..Admission::default()
            };
            admission.additions.insert(FreeQuotaSnapshot {
                minute: outcomes[0],
                day: outcomes[1],
            });
            Ok(admission)
        }
        Verdict::Rejected {
            index,
            outcome,
            retry_after,
        } => {
            let error = if index == 0 {
                per_minute(rules.requests_per_minute, retry_after)
            } else {
                // The capacity in force says which tier the account is on.
                let raised = outcome.limit == rules.requests_per_day_after_purchase
                    && outcome.limit != rules.requests_per_day;
                per_day(config, raised, retry_after, config.limiter.now())
            };
            Err(with_rate_limit_headers(error, &outcome))
        }
    }
}

fn per_minute(limit: u64, retry_after: Duration) -> GatewayError {
    GatewayError::rate_limited(
        LimitSource::FreePerMinute,
        format!(
            "free models allow {limit} requests per minute per account, across all its keys and free models; retry in {} s",
            retry_after_seconds(retry_after)
        ),
        retry_after,
    )
    .with_metadata("limit", limit)
}

fn per_day(
    config: &FreeModelQuotaConfig,
    raised: bool,
    retry_after: Duration,
    now: DateTime<Utc>,
) -> GatewayError {
    let rules = &config.rules;
    let limit = if raised {
        rules.requests_per_day_after_purchase
    } else {
        rules.requests_per_day
    };
    let resets_at = Period::Day.end_of(now);
    let reset = resets_at.to_rfc3339_opts(SecondsFormat::Secs, true);
    let seconds = retry_after_seconds(retry_after);
    let message = if raised {
        format!(
            "free models allow {limit} requests per UTC day and this account has used them; the quota resets at {reset} (in {seconds} s)"
        )
    } else {
        format!(
            "free models allow {limit} requests per UTC day to accounts that have bought less than {} credits, and this account has used them; the quota resets at {reset} (in {seconds} s). Buying {} credits in total raises it to {} a day",
            nanos_to_json(rules.purchase_threshold_nanos),
            nanos_to_json(rules.purchase_threshold_nanos),
            rules.requests_per_day_after_purchase,
        )
    };
    GatewayError::rate_limited(LimitSource::FreePerDay, message, retry_after)
        .with_metadata("limit", limit)
        .with_metadata("resets_at", reset)
}

#[cfg(test)]
mod tests {
    use crate::clock::{Clock, ManualClock};
    use crate::context::RequestContext;
    use crate::free_quota::{FreeModelQuotaLayer, FreeQuotaRules};
    use crate::keys::SharedStore;
    use crate::store::MemoryStore;
    use bytes::Bytes;
    use chrono::{TimeZone, Utc};
    use http::{Request, Response};
    use http_body_util::Full;
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tower::{ServiceBuilder, ServiceExt, service_fn};

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
