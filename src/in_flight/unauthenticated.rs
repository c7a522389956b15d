//! [`UnauthenticatedLimits`] and [`UnauthenticatedPlaces`]: the bounds on
//! the endpoints that read a body before anyone is authenticated (the
//! OAuth code exchange, secret-scanning alerts, the webhook routes).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[cfg(any(feature = "flows", feature = "leaks", feature = "oauth"))]
use crate::body::BodyPace;
use crate::client_addr::address_group;
use crate::error::{ErrorKind, GatewayError};

/// The bounds of an endpoint that reads a body before authentication.
///
/// Such an endpoint never takes one of the gateway's
/// [`max_in_flight`](super::InFlightLimitLayer) places (those are taken
/// after authentication, so a flood of open bodies cannot shut good keys
/// out); it has its own small bound instead, a bound per client address,
/// and a least rate its body must arrive at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UnauthenticatedLimits {
    /// Requests one such endpoint works on at once; past it, 503
    /// `overloaded` with `Retry-After: 1`. Default 64.
    pub max_in_flight: usize,
    /// Requests one client address (IPv6 by its /64) may have in flight
    /// on one such endpoint; past it, 429 `too_many_in_flight` with
    /// `Retry-After: 1`. Default 4.
    pub max_in_flight_per_address: usize,
    /// The least rate, in bytes a second, a body must arrive at once the
    /// grace has passed: a body of `n` bytes must be in within
    /// `body_grace_ms + n / min_body_bytes_per_second`. Slower: 408,
    /// counted as a failed authentication of the address. Default 4096.
    pub min_body_bytes_per_second: u64,
    /// The time, in ms, a body may take before the rate counts. Default
    /// 1000: a 4 KiB body has 2 s.
    pub body_grace_ms: u64,
    /// Store reads BearerAuth makes at once for keys this instance has not
    /// found live (unknown keys, guesses, keys not yet cached); past it,
    /// 503 `overloaded` with `Retry-After: 1`. Keys found live are never
    /// refused by it. Default (`None`): the gateway's `max_in_flight`.
    pub max_concurrent_key_lookups: Option<usize>,
}

impl Default for UnauthenticatedLimits {
    fn default() -> Self {
        UnauthenticatedLimits {
            max_in_flight: 64,
            max_in_flight_per_address: 4,
            min_body_bytes_per_second: 4096,
            body_grace_ms: 1000,
            max_concurrent_key_lookups: None,
        }
    }
}

impl UnauthenticatedLimits {
    /// Refuses bounds that would never let a request in, or a rate that
    /// would let a body trickle for ever.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_in_flight == 0 {
            return Err("unauthenticated.max_in_flight must be at least 1".into());
        }
        if self.max_in_flight_per_address == 0 {
            return Err("unauthenticated.max_in_flight_per_address must be at least 1".into());
        }
        if self.min_body_bytes_per_second < 64 {
            return Err("unauthenticated.min_body_bytes_per_second must be at least 64".into());
        }
        if self.max_concurrent_key_lookups == Some(0) {
            return Err("unauthenticated.max_concurrent_key_lookups must be at least 1".into());
        }
        if self.body_grace_ms > 60_000 {
            return Err("unauthenticated.body_grace_ms must be at most 60000".into());
        }
        Ok(())
    }

    /// The pace a body must keep.
    #[cfg(any(feature = "flows", feature = "leaks", feature = "oauth"))]
    pub(crate) fn body_pace(&self) -> BodyPace {
        BodyPace {
            min_bytes_per_second: self.min_body_bytes_per_second,
            grace: Duration::from_millis(self.body_grace_ms),
        }
    }
}

/// The places of one unauthenticated endpoint: at most
/// [`max_in_flight`](UnauthenticatedLimits::max_in_flight) requests, and
/// [`max_in_flight_per_address`](UnauthenticatedLimits::max_in_flight_per_address)
/// from one address. Taking a place is one try, never a wait.
///
/// Cheap to clone: clones share the places.
#[derive(Clone, Debug)]
pub struct UnauthenticatedPlaces {
    inner: Arc<Places>,
}

#[derive(Debug)]
struct Places {
    endpoint: &'static str,
    limits: UnauthenticatedLimits,
    permits: Arc<Semaphore>,
    // Only addresses holding a place have an entry, so the table holds at
    // most `max_in_flight` of them.
    per_address: Mutex<HashMap<Option<u128>, usize>>,
}

/// A place held: given back when dropped.
#[derive(Debug)]
pub struct UnauthenticatedPlace {
    places: Arc<Places>,
    address: Option<u128>,
    _permit: OwnedSemaphorePermit,
}

impl UnauthenticatedPlaces {
    /// The places of `endpoint` (named in refusals, such as `the OAuth code
    /// exchange`) under `limits`.
    pub fn new(endpoint: &'static str, limits: UnauthenticatedLimits) -> Self {
        let max_in_flight = limits.max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
        UnauthenticatedPlaces {
            inner: Arc::new(Places {
                endpoint,
                limits,
                permits: Arc::new(Semaphore::new(max_in_flight)),
                per_address: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The bounds.
    pub fn limits(&self) -> UnauthenticatedLimits {
        self.inner.limits
    }

    /// The body of `request`, at most `max_bytes` within `timeout` and at
    /// this endpoint's pace (read while holding a place).
    #[cfg(any(feature = "leaks", feature = "oauth"))]
    pub(crate) async fn read_body<B>(
        &self,
        request: http::Request<B>,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<bytes::Bytes, crate::body::ReadError>
    where
        B: http_body::Body,
        B::Error: Into<tower::BoxError>,
    {
        let pace = self.inner.limits.body_pace();
        crate::body::read_bounded(request, max_bytes, timeout, Some(pace)).await
    }

    /// The 408 `slow_body` for `what` (such as `the alert's body`), which
    /// did not arrive within `timeout` at this endpoint's pace.
    #[cfg(any(feature = "leaks", feature = "oauth"))]
    pub(crate) fn slow_body(&self, what: &str, timeout: Duration) -> GatewayError {
        GatewayError::new(
            ErrorKind::RequestTimeout,
            format!(
                "{what} did not arrive in time: send it whole within {} s, {}",
                timeout.as_secs_f64(),
                self.inner.limits.body_pace().describe()
            ),
        )
        .with_metadata("reason", "slow_body")
    }

    /// Requests holding a place now.
    pub fn in_flight(&self) -> usize {
        self.inner
            .limits
            .max_in_flight
            .clamp(1, Semaphore::MAX_PERMITS)
            - self.inner.permits.available_permits()
    }

    /// A place for a request from `address`, or the refusal: 429 when the
    /// address holds its share, 503 when the endpoint is full.
    pub fn enter(&self, address: Option<IpAddr>) -> Result<UnauthenticatedPlace, GatewayError> {
        let group = address_group(address);
        let limits = self.inner.limits;
        {
            let mut per_address = self.inner.per_address();
            let held = per_address.entry(group).or_insert(0);
            if *held >= limits.max_in_flight_per_address {
                return Err(GatewayError::new(
                    ErrorKind::RateLimited,
                    format!(
                        "this address already has {} requests in flight on {}; wait for one to finish",
                        limits.max_in_flight_per_address, self.inner.endpoint
                    ),
                )
                .with_metadata("reason", "too_many_in_flight")
                .with_retry_after(Duration::from_secs(1)));
            }
            *held += 1;
        }
        match Arc::clone(&self.inner.permits).try_acquire_owned() {
            Ok(permit) => Ok(UnauthenticatedPlace {
                places: Arc::clone(&self.inner),
                address: group,
                _permit: permit,
            }),
            Err(_) => {
                self.inner.leave(group);
                crate::telemetry::request_shed();
                Err(GatewayError::new(
                    ErrorKind::ServiceUnavailable,
                    format!(
                        "{} is overloaded: {} requests are already in flight; retry in a moment",
                        self.inner.endpoint, limits.max_in_flight
                    ),
                )
                .with_metadata("reason", "overloaded")
                .with_retry_after(Duration::from_secs(1)))
            }
        }
    }
}

impl Places {
    fn per_address(&self) -> std::sync::MutexGuard<'_, HashMap<Option<u128>, usize>> {
        // Counts are changed whole; a panic elsewhere leaves them counts.
        self.per_address
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn leave(&self, group: Option<u128>) {
        let mut per_address = self.per_address();
        if let Some(held) = per_address.get_mut(&group) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                per_address.remove(&group);
            }
        }
    }
}

impl Drop for UnauthenticatedPlace {
    fn drop(&mut self) {
        self.places.leave(self.address);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    fn places(max_in_flight: usize, per_address: usize) -> UnauthenticatedPlaces {
        UnauthenticatedPlaces::new(
            "the test endpoint",
            UnauthenticatedLimits {
                max_in_flight,
                max_in_flight_per_address: per_address,
                ..UnauthenticatedLimits::default()
            },
        )
    }

    #[test]
    fn an_address_gets_its_share_and_the_endpoint_its_bound() {
        let places = places(3, 2);
        let first = places.enter(ip("192.0.2.1")).unwrap();
        let _second = places.enter(ip("192.0.2.1")).unwrap();
        let refused = places.enter(ip("192.0.2.1")).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::RateLimited);
        // Another host of the same IPv6 /64 shares its share; another /64 not.
        let _v6 = places.enter(ip("2001:db8:0:1::1")).unwrap();
        let full = places.enter(ip("2001:db8:0:2::1")).unwrap_err();
        assert_eq!(full.kind(), ErrorKind::ServiceUnavailable);
        assert_eq!(places.in_flight(), 3);
        drop(first);
        assert_eq!(places.in_flight(), 2);
        let _again = places.enter(ip("192.0.2.1")).unwrap();
        // A refusal at the endpoint's bound gave back the address's count.
        assert_eq!(places.inner.per_address().len(), 2);
    }

    #[test]
    fn the_address_table_holds_only_addresses_in_flight() {
        let places = places(4, 1);
        for n in 0..1000u32 {
            let _place = places.enter(Some(IpAddr::from(n.to_be_bytes()))).unwrap();
        }
        assert!(places.inner.per_address().is_empty());
        assert_eq!(places.in_flight(), 0);
    }

    #[test]
    fn limits_that_cannot_work_are_refused() {
        for (limits, words) in [
            (
                UnauthenticatedLimits {
                    max_in_flight: 0,
                    ..UnauthenticatedLimits::default()
                },
                "max_in_flight",
            ),
            (
                UnauthenticatedLimits {
                    max_in_flight_per_address: 0,
                    ..UnauthenticatedLimits::default()
                },
                "max_in_flight_per_address",
            ),
            (
                UnauthenticatedLimits {
                    min_body_bytes_per_second: 1,
                    ..UnauthenticatedLimits::default()
                },
                "min_body_bytes_per_second",
            ),
            (
                UnauthenticatedLimits {
                    body_grace_ms: 3_600_000,
                    ..UnauthenticatedLimits::default()
                },
                "body_grace_ms",
            ),
            (
                UnauthenticatedLimits {
                    max_concurrent_key_lookups: Some(0),
                    ..UnauthenticatedLimits::default()
                },
                "max_concurrent_key_lookups",
            ),
        ] {
            let error = limits.validate().unwrap_err();
            assert!(error.contains(words), "{error}");
        }
        assert!(UnauthenticatedLimits::default().validate().is_ok());
        let parsed: UnauthenticatedLimits =
            serde_json::from_str(r#"{"max_in_flight_per_address": 2}"#).unwrap();
        assert_eq!(parsed.max_in_flight, 64);
        assert!(serde_json::from_str::<UnauthenticatedLimits>(r#"{"max": 5}"#).is_err());
    }
}
