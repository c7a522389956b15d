use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use http::{Request, Response};
use tower_service::Service;

use super::layer::FreeModelQuotaConfig;
use super::FreeQuotaSnapshot;
use crate::clock::Period;
use crate::context::RequestContext;
use crate::error::{retry_after_seconds, GatewayError, LimitSource};
use crate::keys::credits::nanos_to_json;
use crate::limiter::headers::{rate_limit_headers, tightest, with_rate_limit_headers};
use crate::limiter::Verdict;
use crate::limiter::{Admission, AdmissionFuture, Decision, Finish, PlannedChecks};
use crate::response_body::ResponseBody;
use crate::routing::is_chat_completions_call;
use crate::store::PurchaseTier;

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
        let Some(chat) = context.and_then(|context| context.chat.as_ref()) else {
            if is_chat_completions_call(request.method(), request.uri().path()) {
                return AdmissionFuture::rejected(
                    LAYER,
                    GatewayError::missing_layer("FreeModelQuota", "BodyLimit"),
                );
            }
            return AdmissionFuture::admitted(LAYER, request, inner);
        };
        if !chat.model_id.is_free() {
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
            {
                if let Err(error) = finish(verdict) {
                    return AdmissionFuture::rejected(LAYER, error);
                }
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
                response_headers: tightest(&outcomes)
                    .map(rate_limit_headers)
                    .unwrap_or_default(),
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
