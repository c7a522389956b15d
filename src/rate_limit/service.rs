use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::layer::GlobalRateLimitConfig;
use super::rules::{RateRule, RuleCheck};
use crate::context::RequestContext;
use crate::error::{GatewayError, LimitSource, retry_after_seconds};
use crate::keys::{KeyHash, KeyRateLimit};
use crate::limiter::headers::{
    RateHeaders, X_RATELIMIT_POLICY, policy_value, tightest, with_rate_limit_headers,
};
use crate::limiter::{Admission, Decision, Finish, PlannedChecks};
use crate::limiter::{AdmissionFuture, Verdict};
use crate::response_body::ResponseBody;
use crate::routing::is_model_call;
use crate::store::{Check, CheckOutcome};

/// This layer's name in metrics and logs.
const LAYER: &str = "GlobalRateLimit";

/// Limits the request rate of each account, across every key and every
/// gateway instance sharing the store: an account-wide rule, per-model
/// rules and the key's own `rate_limit`, all checked and counted as one
/// atomic step (a refused request counts nowhere). A model outside the
/// key's `allowed_models` is refused 403 `model_not_allowed` before any
/// of them.
///
/// Admitted responses carry `X-RateLimit-Limit`, `-Remaining` and `-Reset`
/// of the tightest rule; refusals are 429 with those, `Retry-After` and
/// `metadata.limit_source` (`account_rate`, `model_rate` or `key`). Needs
/// [`BearerAuth`](crate::auth::BearerAuth) before it (the account) and
/// reads the parsed [`ChatRequest`](crate::body::ChatRequest) for the model,
/// both from the request's [`RequestContext`](crate::context::RequestContext). See the [module docs](super).
#[derive(Clone, Debug)]
pub struct GlobalRateLimit<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<GlobalRateLimitConfig>,
}

impl<S, B, ResBody> Service<Request<B>> for GlobalRateLimit<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = AdmissionFuture<S, B>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Refused requests never need the inner service; it is asked for
        // readiness once the request is admitted.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let context = RequestContext::of(&request);
        let Some(principal) = context.and_then(|context| context.principal.as_ref()) else {
            return AdmissionFuture::rejected(
                LAYER,
                GatewayError::missing_layer("GlobalRateLimit", "BearerAuth"),
            );
        };
        let call = context.and_then(RequestContext::model_call);
        if call.is_none() && is_model_call(request.method(), request.uri().path()) {
            // Without the parsed request the model rules cannot be applied.
            return AdmissionFuture::rejected(
                LAYER,
                GatewayError::missing_layer("GlobalRateLimit", "BodyLimit"),
            );
        }
        if self
            .config
            .counts
            .is_some_and(|served| !served(request.method(), request.uri().path()))
        {
            // Answered 404 below: refused, so it costs no rate.
            return AdmissionFuture::admitted(LAYER, request, self.inner.clone());
        }
        let model = call.map(|call| call.model_id);
        if let Some(Err(error)) = model.map(|model| principal.check_model(model)) {
            return AdmissionFuture::rejected(LAYER, error);
        }
        let mut rule_checks = self.config.rules.checks_for(&principal.account_id, model);
        if let Some(rate) = principal.rate_limit {
            rule_checks.push(key_rate_check(&principal.key_hash, rate));
        }
        let account = principal.account_id.clone();
        if rule_checks.is_empty() {
            return AdmissionFuture::admitted(LAYER, request, self.inner.clone());
        }
        let checks: Vec<Check> = rule_checks.iter().map(|rule| rule.check.clone()).collect();
        let limiter = self.config.limiter.clone();
        let rule_checks = Arc::new(rule_checks);
        let finish: Finish = Arc::new(move |verdict| finish(&rule_checks, verdict));
        if self.config.deferred {
            // A counter known full refuses now, with no store step at all.
            if let Some(verdict) = limiter.known_full(&account, &checks, None, limiter.now())
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
                    tier: None,
                    finish,
                });
            return AdmissionFuture::admitted(LAYER, request, self.inner.clone());
        }
        let decision: Decision = Box::pin(async move {
            let verdict = limiter.check(&account, &checks, None).await?;
            finish(verdict)
        });
        AdmissionFuture::deciding(LAYER, decision, request, self.inner.clone())
    }
}

/// The rate rules' verdict as the request's refusal or its headers.
fn finish(rule_checks: &[RuleCheck], verdict: Verdict) -> Result<Admission, GatewayError> {
    match verdict {
        Verdict::Unchecked | Verdict::NotCounted(_) => Ok(Admission::default()),
        Verdict::Admitted(outcomes) => {
            let mut response_headers = tightest(&outcomes).map(RateHeaders::of).unwrap_or_default();
            // The rule of the tightest outcome (the first of the least
            // remaining, as `tightest` picks it).
            let tightest_index = outcomes
                .iter()
                .enumerate()
                .min_by_key(|(_, outcome)| outcome.remaining)
                .map(|(index, _)| index);
            if let Some(policy) = tightest_index
                .and_then(|index| rule_checks.get(index))
                .and_then(|rule| policy_value(&rule.rule.limit()))
            {
                response_headers = response_headers.with_policy(policy);
            }
            Ok(Admission {
                response_headers,
                ..Admission::default()
            })
        }
        Verdict::Rejected {
            index,
            outcome,
            retry_after,
        } => Err(refusal(&rule_checks[index], &outcome, retry_after)),
    }
}

/// The key's own rate as a check on a counter of its own, within the
/// account's scope so that it is decided in the same atomic step as the
/// account's rules.
fn key_rate_check(key: &KeyHash, rate: KeyRateLimit) -> RuleCheck {
    let rule = RateRule::Rolling {
        requests: rate.requests,
        window_seconds: rate.window_seconds,
    };
    RuleCheck {
        check: Check::new(
            rule.counter_name(&["rate:key:", &key.to_hex(), ":"]),
            rule.limit(),
            1,
        ),
        source: LimitSource::Key,
        rule,
        matches: None,
    }
}

fn refusal(
    rule: &RuleCheck,
    outcome: &CheckOutcome,
    retry_after: std::time::Duration,
) -> GatewayError {
    let seconds = retry_after_seconds(retry_after);
    let message = match (&rule.source, &rule.matches) {
        (LimitSource::ModelRate, Some(matches)) => format!(
            "the rate limit for {matches} is reached: {}; retry in {seconds} s with backoff, or spread the load over other models",
            rule.rule
        ),
        (LimitSource::Key, _) => format!(
            "this key's rate limit is reached: {}; retry in {seconds} s with backoff",
            rule.rule
        ),
        _ => format!(
            "the account's rate limit is reached: {}, shared by all its keys; retry in {seconds} s with backoff",
            rule.rule
        ),
    };
    let mut error = GatewayError::rate_limited(rule.source, message, retry_after);
    if let Some(matches) = &rule.matches {
        error = error.with_metadata("model_rule", matches.clone());
    }
    if let Some(policy) = policy_value(&rule.rule.limit()) {
        error = error.with_header(X_RATELIMIT_POLICY.clone(), policy);
    }
    with_rate_limit_headers(error, outcome)
}

#[cfg(test)]
mod tests {
    use crate::clock::{Clock, ManualClock};
    use crate::context::RequestContext;
    use crate::keys::SharedStore;
    use crate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
    use crate::store::MemoryStore;
    use bytes::Bytes;
    use chrono::{DateTime, TimeZone, Utc};
    use http::{Request, Response};
    use http_body_util::Full;
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    fn chat(model: &str) -> Request<Full<Bytes>> {
        let body =
            format!(r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "x"}}]}}"#);
        let mut request = Request::post("/api/v1/chat/completions")
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        request
            .extensions_mut()
            .insert(RequestContext::chat_for_tests("acct", body.as_bytes()));
        request
    }

    fn within(
        admitted: &[(DateTime<Utc>, bool)],
        now: DateTime<Utc>,
        seconds: i64,
        only_a: bool,
    ) -> usize {
        admitted
            .iter()
            .filter(|(at, is_a)| {
                *at > now - chrono::Duration::seconds(seconds) && (*is_a || !only_a)
            })
            .count()
    }

    #[tokio::test]
    async fn a_stack_without_the_layers_before_it_is_a_500_naming_them() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let rate = GlobalRateLimitLayer::new(store.clone(), RateLimitRules::default()).unwrap();
        let free = crate::free_quota::FreeModelQuotaLayer::new(store);
        let upstream = service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
        });
        let without = |remove_principal: bool| {
            let mut request = chat("a/b:free");
            let context = RequestContext::of_mut(&mut request);
            if remove_principal {
                context.principal = None;
            } else {
                context.chat = None;
            }
            request
        };
        let cases = [
            (
                ServiceBuilder::new()
                    .layer(rate.clone())
                    .service(upstream)
                    .boxed_clone(),
                without(true),
                "GlobalRateLimit needs BearerAuth",
            ),
            (
                ServiceBuilder::new()
                    .layer(rate)
                    .service(upstream)
                    .boxed_clone(),
                without(false),
                "GlobalRateLimit needs BodyLimit",
            ),
            (
                ServiceBuilder::new()
                    .layer(free.clone())
                    .service(upstream)
                    .boxed_clone(),
                without(false),
                "FreeModelQuota needs BodyLimit",
            ),
            (
                ServiceBuilder::new()
                    .layer(free)
                    .service(upstream)
                    .boxed_clone(),
                without(true),
                "FreeModelQuota needs BearerAuth",
            ),
        ];
        for (service, request, words) in cases {
            let response = service.oneshot(request).await.unwrap();
            assert_eq!(response.status(), 500, "{words}");
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap()
                .to_bytes();
            assert!(String::from_utf8_lossy(&body).contains(words), "{words}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The account rule and the model rule hold exactly, and a request
        /// one of them refuses counts in neither.
        #[test]
        fn admits_exactly_what_every_rule_allows(
            calls in proptest::collection::vec((0u64..4_000, any::<bool>()), 1..80),
            remember in any::<bool>(),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let clock = ManualClock::new(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
            let store: SharedStore = Arc::new(MemoryStore::new());
            let rules = RateLimitRules::from_json(
                r#"{"account": {"rolling": {"requests": 5, "window_seconds": 10}},
                    "models": [{"match": "a/", "limit": {"rolling": {"requests": 3, "window_seconds": 5}}}]}"#,
            ).unwrap();
            let service = ServiceBuilder::new()
                .layer(
                    GlobalRateLimitLayer::new(store, rules)
                        .unwrap()
                        .clock(Arc::new(clock.clone()))
                        .remember_full_counters(remember),
                )
                .service(service_fn(|_: Request<Full<Bytes>>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
                }));
            let mut admitted = Vec::new();
            for (gap_ms, is_a) in calls {
                clock.advance(Duration::from_millis(gap_ms));
                let now = clock.now();
                let expected = within(&admitted, now, 10, false) < 5
                    && (!is_a || within(&admitted, now, 5, true) < 3);
                let model = if is_a { "a/x" } else { "b/y" };
                let response = runtime.block_on(service.clone().oneshot(chat(model))).unwrap();
                prop_assert_eq!(response.status() == 200, expected, "{} at {}", model, now);
                if response.status() == 200 {
                    admitted.push((now, is_a));
                } else {
                    prop_assert_eq!(response.status(), 429);
                    prop_assert!(response.headers().contains_key("retry-after"));
                }
            }
        }
    }
}
