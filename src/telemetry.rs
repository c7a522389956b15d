//! What the gateway reports about itself: metrics through the [`metrics`]
//! facade, and the request's trace context.
//!
//! The layers record metrics only through the facade, so they cost nothing
//! until the host installs a recorder (the proxy example installs a
//! Prometheus one and serves it on its admin listener). Labels are from
//! small, fixed sets (a route class, a layer, a reason, a served model),
//! never a key, an account or a path as sent.
//!
//! The handles of the metrics every request touches are looked up in the
//! recorder once per label set, on first use, and kept: a recorder lookup
//! clones the metric's key each time (the Prometheus one does). So install
//! the recorder before the first request is served.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `modelgate_requests_total` | counter | `route`, `model`, `status` |
//! | `modelgate_request_duration_seconds` | histogram | `route` |
//! | `modelgate_requests_in_flight` | gauge | — |
//! | `modelgate_requests_shed_total` | counter | — |
//! | `modelgate_layer_decisions_total` | counter | `layer`, `decision`, `reason` |
//! | `modelgate_store_failure_decisions_total` | counter | `layer`, `decision` (`fail_open`, `fail_closed`) |
//! | `modelgate_store_call_duration_seconds` | histogram | `operation`, `outcome` |
//! | `modelgate_store_errors_total` | counter | `operation` |
//! | `modelgate_store_circuit_opens_total` | counter | — |
//! | `modelgate_store_circuit_refusals_total` | counter | `operation` |
//! | `modelgate_upstream_duration_seconds` | histogram | `outcome` |
//! | `modelgate_upstream_retries_total` | counter | — |
//! | `modelgate_fallbacks_total` | counter | `from`, `to` |
//! | `modelgate_charged_nanocredits_total` | counter | `byok` |
//! | `modelgate_cost_over_hold_nanocredits_total` | counter | — |
//! | `modelgate_settlements_unrecorded_total` | counter | `hold` (`lapses`, `none`) |
//! | `modelgate_notices_total` | counter | `channel` (`email`, `webhook`), `outcome` (`sent`, `retried`, `failed`, `dropped`) |
//! | `modelgate_alerts_total` | counter | `outcome` (`claimed`, `claimed_elsewhere`, `check_dropped`, `check_failed`) |
//!
//! ```
//! use http::HeaderValue;
//! use modelgate::telemetry::TraceContext;
//!
//! let incoming = HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
//! let context = TraceContext::continue_or_start(Some(&incoming));
//! // The same trace, and the gateway as the new parent.
//! assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
//! assert!(context.traceparent().to_str().unwrap().starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
//! assert_ne!(context.traceparent(), incoming);
//! ```

#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub mod otel;

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::{LazyLock, RwLock};

use http::HeaderValue;

use crate::error::GatewayError;

/// Requests by route class, served model and status.
pub const REQUESTS_TOTAL: &str = "modelgate_requests_total";
/// Time to the response's head, by route class.
pub const REQUEST_DURATION_SECONDS: &str = "modelgate_request_duration_seconds";
/// Requests being answered now.
pub const REQUESTS_IN_FLIGHT: &str = "modelgate_requests_in_flight";
/// Requests answered 503 at once because the in-flight bound was reached.
pub const REQUESTS_SHED_TOTAL: &str = "modelgate_requests_shed_total";
/// Each layer's decisions: `admitted`, or `rejected` with its reason.
pub const LAYER_DECISIONS_TOTAL: &str = "modelgate_layer_decisions_total";
/// Decisions a layer took because its store failed.
pub const STORE_FAILURE_DECISIONS_TOTAL: &str = "modelgate_store_failure_decisions_total";
/// Store calls (Redis, SQLite) by operation.
pub const STORE_CALL_DURATION_SECONDS: &str = "modelgate_store_call_duration_seconds";
/// Store calls that failed, by operation.
pub const STORE_ERRORS_TOTAL: &str = "modelgate_store_errors_total";
/// Times a store's circuit breaker opened: after its consecutive failures,
/// and again after each failed probe.
pub const STORE_CIRCUIT_OPENS_TOTAL: &str = "modelgate_store_circuit_opens_total";
/// Store calls refused at once, not sent, because the store's circuit
/// breaker is open (not counted in the two metrics above).
pub const STORE_CIRCUIT_REFUSALS_TOTAL: &str = "modelgate_store_circuit_refusals_total";
/// Time to the upstream's response head.
pub const UPSTREAM_DURATION_SECONDS: &str = "modelgate_upstream_duration_seconds";
/// Upstream attempts retried.
pub const UPSTREAM_RETRIES_TOTAL: &str = "modelgate_upstream_retries_total";
/// Requests moved on to a fallback model.
pub const FALLBACKS_TOTAL: &str = "modelgate_fallbacks_total";
/// Credits charged, in nano-credits.
pub const CHARGED_NANOCREDITS_TOTAL: &str = "modelgate_charged_nanocredits_total";
/// What upstreams charged beyond the bound a request was held for (an
/// upstream that ignored `max_tokens`), in nano-credits: charged in full,
/// and counted here because no limit could stop it.
pub const COST_OVER_HOLD_NANOCREDITS_TOTAL: &str = "modelgate_cost_over_hold_nanocredits_total";
/// Settlements the store did not take within their retry window, or before
/// a stopping gateway's deadline, by `hold`: `lapses` (the request's hold
/// lapses and is charged in full, unless an attempt landed: nothing to
/// book) or `none` (admitted without a hold while the store failed open:
/// to book by hand, from the log line that gives its figures).
pub const SETTLEMENTS_UNRECORDED_TOTAL: &str = "modelgate_settlements_unrecorded_total";
/// Leaked-key notices ([`notify`](crate::notify)) by channel and outcome:
/// `sent`, `retried` (an attempt failed, another follows), `failed` (given
/// up: to be sent by hand) or `dropped` (never queued).
pub const NOTICES_TOTAL: &str = "modelgate_notices_total";
/// Alert checks ([`alerts`](crate::alerts)) by outcome: a crossing
/// `claimed` here (its notice sent) or `claimed_elsewhere` (by another
/// instance: not sent here), a check dropped from a full queue
/// (`check_dropped`) or failed by the store (`check_failed`).
pub const ALERTS_TOTAL: &str = "modelgate_alerts_total";

/// The most label sets a [`HandleCache`] keeps; past it, handles are
/// looked up each time (labels are from small sets: a full cache means a
/// bug, not a reason to grow without bound).
const MAX_CACHED_HANDLES: usize = 4096;

/// Metric handles by their label values, looked up in the recorder once
/// (and other values made once per key from a small set, such as a rate
/// limit's policy header).
pub(crate) struct HandleCache<K, H> {
    // Looked up several times per request; the keys are small label sets.
    handles: LazyLock<RwLock<foldhash::HashMap<K, H>>>,
}

impl<K: Hash + Eq, H: Clone> HandleCache<K, H> {
    pub(crate) const fn new() -> Self {
        HandleCache {
            handles: LazyLock::new(|| RwLock::new(foldhash::HashMap::default())),
        }
    }

    /// The handle kept for `key`, or the one `register` makes (then kept).
    pub(crate) fn get<Q>(&self, key: &Q, register: impl FnOnce() -> (K, H)) -> H
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(handle) = self
            .handles
            .read()
            .ok()
            .and_then(|handles| handles.get(key).cloned())
        {
            return handle;
        }
        let (key, handle) = register();
        if let Ok(mut handles) = self.handles.write()
            && handles.len() < MAX_CACHED_HANDLES
        {
            handles.entry(key).or_insert_with(|| handle.clone());
        }
        handle
    }
}

static ADMITTED: HandleCache<&'static str, metrics::Counter> = HandleCache::new();

/// Records a layer's decision: `None` admitted, `Some` the refusal.
pub(crate) fn layer_decision(layer: &'static str, refusal: Option<&GatewayError>) {
    match refusal {
        None => {
            tracing::debug!(layer, decision = "admitted");
            ADMITTED
                .get(&layer, || {
                    let counter = metrics::counter!(LAYER_DECISIONS_TOTAL, "layer" => layer, "decision" => "admitted", "reason" => "");
                    (layer, counter)
                })
                .increment(1);
        }
        Some(error) => {
            let reason = refusal_reason(error);
            tracing::debug!(layer, decision = "rejected", reason = %reason, status = error.status().as_u16());
            metrics::counter!(LAYER_DECISIONS_TOTAL, "layer" => layer, "decision" => "rejected", "reason" => reason)
                .increment(1);
        }
    }
}

/// The error's type, and its limit source or reason when it has one
/// (`rate_limit_error:model_rate`, `authentication_error:unknown_key`).
fn refusal_reason(error: &GatewayError) -> String {
    let detail = ["limit_source", "reason", "layer"]
        .iter()
        .find_map(|name| error.metadata().get(*name).and_then(|value| value.as_str()));
    match detail {
        Some(detail) => format!("{}:{detail}", error.kind().type_str()),
        None => error.kind().type_str().to_owned(),
    }
}

/// Counts a request [`InFlightLimit`](crate::in_flight::InFlightLimit)
/// answered 503 because the bound's worth were in flight.
pub(crate) fn request_shed() {
    static SHED: HandleCache<(), metrics::Counter> = HandleCache::new();
    SHED.get(&(), || ((), metrics::counter!(REQUESTS_SHED_TOTAL)))
        .increment(1);
}

/// Records WebhookSecret's decision: `None` admitted, or the refusal's code.
#[cfg(feature = "flows")]
pub(crate) fn webhook_decision(code: Option<&str>) {
    let (decision, reason) = match code {
        None => ("admitted", String::new()),
        Some(code) => ("rejected", code.to_owned()),
    };
    tracing::debug!(layer = "WebhookSecret", decision, reason = %reason);
    metrics::counter!(LAYER_DECISIONS_TOTAL, "layer" => "WebhookSecret", "decision" => decision, "reason" => reason)
        .increment(1);
}

/// Records a decision a layer took because its store failed.
pub(crate) fn store_failure_decision(layer: &'static str, decision: &'static str) {
    metrics::counter!(STORE_FAILURE_DECISIONS_TOTAL, "layer" => layer, "decision" => decision)
        .increment(1);
}

/// Records one store call.
#[cfg(any(feature = "redis", feature = "sqlite"))]
pub(crate) fn store_call(operation: &'static str, elapsed: std::time::Duration, succeeded: bool) {
    let outcome = if succeeded { "ok" } else { "error" };
    static DURATIONS: HandleCache<(&'static str, bool), metrics::Histogram> = HandleCache::new();
    DURATIONS
        .get(&(operation, succeeded), || {
            let histogram = metrics::histogram!(
                STORE_CALL_DURATION_SECONDS,
                "operation" => operation,
                "outcome" => outcome
            );
            ((operation, succeeded), histogram)
        })
        .record(elapsed.as_secs_f64());
    if !succeeded {
        metrics::counter!(STORE_ERRORS_TOTAL, "operation" => operation).increment(1);
    }
}

/// Counts a store circuit breaker opening.
#[cfg(feature = "redis")]
pub(crate) fn store_circuit_opened() {
    metrics::counter!(STORE_CIRCUIT_OPENS_TOTAL).increment(1);
}

/// Counts a store call refused by an open circuit breaker: while it is
/// open every request takes this path, so the handles are kept.
#[cfg(feature = "redis")]
pub(crate) fn store_circuit_refusal(operation: &'static str) {
    static REFUSALS: HandleCache<&'static str, metrics::Counter> = HandleCache::new();
    REFUSALS
        .get(&operation, || {
            let counter = metrics::counter!(STORE_CIRCUIT_REFUSALS_TOTAL, "operation" => operation);
            (operation, counter)
        })
        .increment(1);
}

/// Counts a leaked-key notice's outcome on one channel. Notices are rare,
/// so the handle is not kept.
#[cfg(feature = "notify")]
pub(crate) fn notice_outcome(channel: &'static str, outcome: &'static str) {
    metrics::counter!(NOTICES_TOTAL, "channel" => channel, "outcome" => outcome).increment(1);
}

/// Counts an alert check's outcome. Rare (a crossing, a full queue, a
/// store failure), so the handle is not kept.
#[cfg(feature = "notify")]
pub(crate) fn alert_outcome(outcome: &'static str) {
    metrics::counter!(ALERTS_TOTAL, "outcome" => outcome).increment(1);
}

/// The W3C trace context a request carries upstream: the client's trace
/// continued (a new parent id: the gateway's hop), or a new trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    /// `00-{trace id}-{parent id}-{flags}`: the trace id is read back out
    /// of it, so a request builds one value.
    traceparent: HeaderValue,
}

/// Where the trace id sits in a version-00 `traceparent`.
const TRACE_ID: std::ops::Range<usize> = 3..35;

impl TraceContext {
    /// Continues a valid `traceparent` (version 00, non-zero ids), or
    /// starts a new sampled trace.
    pub fn continue_or_start(incoming: Option<&HeaderValue>) -> Self {
        let random: [u8; 24] = crate::random::bytes();
        let mut trace_id = [0u8; 32];
        let mut flags = *b"01";
        match incoming
            .and_then(|value| value.to_str().ok())
            .and_then(parse_traceparent)
        {
            Some((continued, continued_flags)) => {
                trace_id.copy_from_slice(continued.as_bytes());
                flags.copy_from_slice(continued_flags.as_bytes());
            }
            None => hex::encode_to_slice(&random[..16], &mut trace_id).expect("32 digits"),
        }
        let mut parent_id = [0u8; 16];
        hex::encode_to_slice(&random[16..], &mut parent_id).expect("16 digits");
        let mut text = [0u8; 55];
        text[..3].copy_from_slice(b"00-");
        text[TRACE_ID].copy_from_slice(&trace_id);
        text[35] = b'-';
        text[36..52].copy_from_slice(&parent_id);
        text[52] = b'-';
        text[53..].copy_from_slice(&flags);
        TraceContext {
            traceparent: HeaderValue::from_bytes(&text).expect("hex and dashes"),
        }
    }

    /// The trace id (32 hex digits).
    pub fn trace_id(&self) -> &str {
        self.traceparent
            .to_str()
            .ok()
            .and_then(|text| text.get(TRACE_ID))
            .expect("built from hex and dashes")
    }

    /// The `traceparent` to send upstream.
    pub fn traceparent(&self) -> HeaderValue {
        self.traceparent.clone()
    }
}

/// `(trace id, flags)` of a valid version-00 `traceparent`.
fn parse_traceparent(text: &str) -> Option<(&str, &str)> {
    let mut parts = text.trim().split('-');
    let (version, trace_id, parent_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |part: &str, len: usize| {
        part.len() == len
            && part
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    };
    let valid = parts.next().is_none()
        && version == "00"
        && hex(trace_id, 32)
        && hex(parent_id, 16)
        && hex(flags, 2)
        && trace_id.bytes().any(|byte| byte != b'0')
        && parent_id.bytes().any(|byte| byte != b'0');
    valid.then_some((trace_id, flags))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn a_handle_is_registered_once_per_label_set_and_the_cache_is_bounded() {
        let cache: HandleCache<usize, usize> = HandleCache::new();
        let mut registered = 0;
        for _ in 0..3 {
            for key in 0..10 {
                let handle = cache.get(&key, || {
                    registered += 1;
                    (key, key * 2)
                });
                assert_eq!(handle, key * 2);
            }
        }
        assert_eq!(registered, 10, "each label set is looked up once");

        for key in 10..MAX_CACHED_HANDLES + 5 {
            cache.get(&key, || (key, key));
        }
        // Past the bound a handle is still given, just not kept.
        let beyond = MAX_CACHED_HANDLES + 100;
        let mut looked_up = 0;
        for _ in 0..2 {
            let handle = cache.get(&beyond, || {
                looked_up += 1;
                (beyond, 7)
            });
            assert_eq!(handle, 7);
        }
        assert_eq!(looked_up, 2);
        assert_eq!(cache.handles.read().unwrap().len(), MAX_CACHED_HANDLES);
    }

    #[test]
    fn invalid_trace_contexts_start_a_new_trace() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            let context = TraceContext::continue_or_start(Some(&HeaderValue::from_static(bad)));
            assert_ne!(
                context.trace_id(),
                "4bf92f3577b34da6a3ce929d0e0e4736",
                "{bad}"
            );
            assert_eq!(
                parse_traceparent(context.traceparent().to_str().unwrap())
                    .unwrap()
                    .0,
                context.trace_id()
            );
        }
        let fresh = TraceContext::continue_or_start(None);
        assert!(fresh.traceparent().to_str().unwrap().ends_with("-01"));
    }

    #[test]
    fn a_continued_trace_keeps_its_id_and_flags_under_a_new_parent() {
        let incoming =
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        let context = TraceContext::continue_or_start(Some(&incoming));
        let text = context.traceparent().to_str().unwrap().to_owned();
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(text.ends_with("-00"), "{text}");
        assert_ne!(&text[36..52], "00f067aa0ba902b7");
        assert_eq!(parse_traceparent(&text), Some((context.trace_id(), "00")));
        // Two requests of one trace are two hops.
        let again = TraceContext::continue_or_start(Some(&incoming));
        assert_ne!(again.traceparent(), context.traceparent());
    }

    #[test]
    fn reasons_name_the_type_and_the_limit() {
        use crate::error::{ErrorKind, LimitSource};
        let limited =
            GatewayError::rate_limited(LimitSource::ModelRate, "slow down", Duration::from_secs(1));
        assert_eq!(refusal_reason(&limited), "rate_limit_error:model_rate");
        let plain = GatewayError::new(ErrorKind::InvalidRequest, "bad");
        assert_eq!(refusal_reason(&plain), "invalid_request_error");
    }

    proptest! {
        #[test]
        fn any_traceparent_text_gives_a_valid_one(text in "\\PC{0,80}") {
            if let Ok(value) = HeaderValue::from_str(&text) {
                let context = TraceContext::continue_or_start(Some(&value));
                let out = context.traceparent();
                prop_assert!(parse_traceparent(out.to_str().unwrap()).is_some());
            }
        }
    }
}
