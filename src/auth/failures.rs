//! [`AuthFailureLimit`]: how many failed authentications one client
//! address may make in a window before its refusals turn from 401 into 429.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use crate::client_addr::address_group;
use crate::clock::{Clock, SystemClock};
use crate::error::{ErrorKind, GatewayError};

/// The limit on failed authentications per client address.
///
/// The defaults (20 in 10 minutes) are far above what a person mistyping a
/// key meets and far below what a script guessing keys sends in its first
/// hundred tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthFailureLimit {
    /// Failed authentications one address may make per window; the next
    /// ones are answered 429 with `Retry-After` until the window ends.
    pub max_failures: u32,
    /// The window, in seconds, from the address's first failure.
    pub window_seconds: u64,
    /// Most addresses tracked at once, so that many addresses cannot grow
    /// the table without bound; past it the oldest windows are forgotten.
    pub max_tracked_addresses: usize,
}

impl Default for AuthFailureLimit {
    fn default() -> Self {
        AuthFailureLimit {
            max_failures: 20,
            window_seconds: 600,
            max_tracked_addresses: 65_536,
        }
    }
}

impl AuthFailureLimit {
    /// Refuses a limit that would never let a key in, or never end.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_failures == 0 {
            return Err("auth_failures.max_failures must be at least 1".into());
        }
        if !(1..=86_400).contains(&self.window_seconds) {
            return Err("auth_failures.window_seconds must be 1 to 86400".into());
        }
        if self.max_tracked_addresses < SHARDS {
            return Err(format!(
                "auth_failures.max_tracked_addresses must be at least {SHARDS}"
            ));
        }
        Ok(())
    }
}

/// Independent locks, so concurrent failures from many addresses do not
/// queue on one.
const SHARDS: usize = 16;

/// Counts failed authentications per client address, in this process.
///
/// Kept in memory rather than in the store: an unauthenticated flood must
/// not turn into store traffic. Each gateway instance therefore counts its
/// own failures; behind a load balancer spreading one client over `n`
/// instances, the client meets the limit after at most `n` times the count.
/// IPv6 addresses count by their /64, which one host usually holds whole.
///
/// Cheap to clone: the table is shared.
#[derive(Clone, Debug)]
pub struct AuthFailures {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: AuthFailureLimit,
    clock: Arc<dyn Clock>,
    shards: Vec<Mutex<HashMap<AddressKey, Window>>>,
}

/// An IPv4 address, or an IPv6 /64; `None`: requests without an address.
type AddressKey = Option<u128>;

#[derive(Clone, Copy, Debug)]
struct Window {
    started_micros: i64,
    failures: u32,
}

impl AuthFailures {
    /// Counts under `limit` with the system clock.
    pub fn new(limit: AuthFailureLimit) -> Result<Self, String> {
        Self::with_clock(limit, Arc::new(SystemClock))
    }

    /// Counts under `limit` with `clock` (a manual one in tests).
    pub fn with_clock(limit: AuthFailureLimit, clock: Arc<dyn Clock>) -> Result<Self, String> {
        limit.validate()?;
        Ok(Self::with_checked_limit(limit, clock))
    }

    /// [`with_clock`](Self::with_clock) with a limit checked already (the
    /// proxy's `GatewayPlan` checks it once, at load).
    pub(crate) fn with_checked_limit(limit: AuthFailureLimit, clock: Arc<dyn Clock>) -> Self {
        debug_assert!(limit.validate().is_ok(), "limit not checked");
        AuthFailures {
            inner: Arc::new(Inner {
                limit,
                clock,
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            }),
        }
    }

    /// The limit counted against.
    pub fn limit(&self) -> AuthFailureLimit {
        self.inner.limit
    }

    /// Counts one failed authentication from `address`: `None` while the
    /// address is within its limit (answer the 401), or how long until its
    /// window ends once past it (answer 429).
    pub fn record_failure(&self, address: Option<IpAddr>) -> Option<Duration> {
        let now = crate::clock::unix_micros(self.inner.clock.now());
        // At most a day (validated): no overflow.
        let window_micros = self.inner.limit.window_seconds as i64 * 1_000_000;
        let key = address_key(address);
        let mut shard = self.shard(key);
        let per_shard = self.inner.limit.max_tracked_addresses / SHARDS;
        if !shard.contains_key(&key) && shard.len() >= per_shard {
            shard.retain(|_, window| now - window.started_micros < window_micros);
            if shard.len() >= per_shard {
                // Forget the oldest window: a flood of fresh addresses then
                // meets the limit later, never a table without bound.
                if let Some(oldest) = shard
                    .iter()
                    .min_by_key(|(_, window)| window.started_micros)
                    .map(|(key, _)| *key)
                {
                    shard.remove(&oldest);
                }
            }
        }
        let window = shard.entry(key).or_insert(Window {
            started_micros: now,
            failures: 0,
        });
        if now - window.started_micros >= window_micros || now < window.started_micros {
            *window = Window {
                started_micros: now,
                failures: 0,
            };
        }
        window.failures = window.failures.saturating_add(1);
        (window.failures > self.inner.limit.max_failures).then(|| {
            let left = window.started_micros + window_micros - now;
            Duration::from_micros(u64::try_from(left).unwrap_or(0))
        })
    }

    /// How long until `address`'s window ends when it is past its limit
    /// now, without counting anything: a request from a blocked address
    /// is refused before it costs a store read.
    pub fn blocked(&self, address: Option<IpAddr>) -> Option<Duration> {
        let now = crate::clock::unix_micros(self.inner.clock.now());
        let window_micros = self.inner.limit.window_seconds as i64 * 1_000_000;
        let key = address_key(address);
        let shard = self.shard(key);
        let window = shard.get(&key)?;
        let live = now >= window.started_micros && now - window.started_micros < window_micros;
        (live && window.failures > self.inner.limit.max_failures).then(|| {
            let left = window.started_micros + window_micros - now;
            Duration::from_micros(u64::try_from(left).unwrap_or(0))
        })
    }

    /// Addresses tracked now (expired windows included until swept).
    pub fn tracked_addresses(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| shard.lock().map(|shard| shard.len()).unwrap_or(0))
            .sum()
    }

    /// `rejection` as answered: a 401 counts against the client's address,
    /// and past its limit becomes the 429. Other refusals (403, a store's
    /// 503) are not failed authentications.
    pub(crate) fn counted(
        failures: Option<&AuthFailures>,
        client: Option<IpAddr>,
        rejection: GatewayError,
    ) -> GatewayError {
        match failures {
            Some(failures) if rejection.kind() == ErrorKind::Authentication => {
                match failures.record_failure(client) {
                    Some(retry_after) => failures.refusal(retry_after),
                    None => rejection,
                }
            }
            _ => rejection,
        }
    }

    /// The 429 for an address past its limit.
    pub(crate) fn refusal(&self, retry_after: Duration) -> GatewayError {
        let limit = self.inner.limit;
        GatewayError::new(
            ErrorKind::RateLimited,
            format!(
                "too many requests with a missing or wrong API key from this address ({} in {} s); \
                 check the key and retry after the Retry-After seconds",
                limit.max_failures, limit.window_seconds
            ),
        )
        .with_metadata("reason", "auth_failures")
        .with_retry_after(retry_after.max(Duration::from_secs(1)))
    }

    fn shard(&self, key: AddressKey) -> std::sync::MutexGuard<'_, HashMap<AddressKey, Window>> {
        let index = key.map_or(0, |key| {
            let folded = (key ^ (key >> 64)) as u64;
            (folded.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize
        }) % SHARDS;
        // A panic elsewhere while holding the lock leaves counts that are
        // still counts.
        self.inner.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn address_key(address: Option<IpAddr>) -> AddressKey {
    address_group(address)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use chrono::TimeZone;

    fn start() -> chrono::DateTime<chrono::Utc> {
        chrono::Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
    }

    fn limiter(max_failures: u32, window_seconds: u64) -> (AuthFailures, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(start()));
        let limit = AuthFailureLimit {
            max_failures,
            window_seconds,
            ..AuthFailureLimit::default()
        };
        (
            AuthFailures::with_clock(limit, clock.clone()).unwrap(),
            clock,
        )
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn the_count_is_exact_and_the_window_ends() {
        let (failures, clock) = limiter(3, 60);
        for _ in 0..3 {
            assert_eq!(failures.record_failure(ip("192.0.2.1")), None);
        }
        clock.advance(Duration::from_secs(20));
        assert_eq!(
            failures.record_failure(ip("192.0.2.1")),
            Some(Duration::from_secs(40))
        );
        // Another address is untouched.
        assert_eq!(failures.record_failure(ip("192.0.2.2")), None);
        clock.advance(Duration::from_secs(40));
        assert_eq!(failures.record_failure(ip("192.0.2.1")), None);
    }

    #[test]
    fn blocked_reads_without_counting() {
        let (failures, clock) = limiter(2, 60);
        for _ in 0..2 {
            failures.record_failure(ip("192.0.2.1"));
        }
        // At the limit, not past it: the next failure is the first 429.
        for _ in 0..5 {
            assert_eq!(failures.blocked(ip("192.0.2.1")), None);
        }
        assert!(failures.record_failure(ip("192.0.2.1")).is_some());
        clock.advance(Duration::from_secs(15));
        assert_eq!(
            failures.blocked(ip("192.0.2.1")),
            Some(Duration::from_secs(45))
        );
        assert_eq!(failures.blocked(ip("192.0.2.2")), None);
        clock.advance(Duration::from_secs(45));
        assert_eq!(failures.blocked(ip("192.0.2.1")), None);
    }

    #[test]
    fn an_ipv6_host_counts_by_its_64_and_mapped_ipv4_as_ipv4() {
        let (failures, _) = limiter(1, 60);
        assert_eq!(failures.record_failure(ip("2001:db8:1:2::1")), None);
        assert!(failures.record_failure(ip("2001:db8:1:2::ffff")).is_some());
        assert_eq!(failures.record_failure(ip("2001:db8:1:3::1")), None);
        assert_eq!(failures.record_failure(ip("203.0.113.5")), None);
        assert!(failures.record_failure(ip("::ffff:203.0.113.5")).is_some());
        // Without an address, all such requests share one count.
        assert_eq!(failures.record_failure(None), None);
        assert!(failures.record_failure(None).is_some());
    }

    #[test]
    fn the_table_never_grows_past_its_bound() {
        let clock = Arc::new(ManualClock::new(start()));
        let limit = AuthFailureLimit {
            max_failures: 1,
            window_seconds: 600,
            max_tracked_addresses: 64,
        };
        let failures = AuthFailures::with_clock(limit, clock).unwrap();
        for n in 0..10_000u32 {
            failures.record_failure(Some(IpAddr::from(n.to_be_bytes())));
        }
        assert!(
            failures.tracked_addresses() <= 64,
            "{}",
            failures.tracked_addresses()
        );
    }

    #[test]
    fn limits_that_cannot_work_are_refused() {
        for (limit, words) in [
            (
                AuthFailureLimit {
                    max_failures: 0,
                    ..AuthFailureLimit::default()
                },
                "max_failures",
            ),
            (
                AuthFailureLimit {
                    window_seconds: 0,
                    ..AuthFailureLimit::default()
                },
                "window_seconds",
            ),
            (
                AuthFailureLimit {
                    max_tracked_addresses: 1,
                    ..AuthFailureLimit::default()
                },
                "max_tracked_addresses",
            ),
        ] {
            let error = AuthFailures::new(limit).unwrap_err();
            assert!(error.contains(words), "{error}");
        }
        let parsed: AuthFailureLimit = serde_json::from_str(r#"{"max_failures": 5}"#).unwrap();
        assert_eq!(parsed.window_seconds, 600);
        assert!(serde_json::from_str::<AuthFailureLimit>(r#"{"max": 5}"#).is_err());
    }
}
