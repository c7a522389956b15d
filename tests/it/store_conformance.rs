//! One conformance suite for every store backend: `MemoryStore`,
//! `SqliteStore` on a file of its own, `RedisStore` on a real `redis-server`,
//! and `RedisStore` on a real 3-node Redis Cluster.
//!
//! Each check below is a plain async function over `S: Store`; the macro at
//! the bottom runs each against every backend, with time from fixed instants
//! (the manual-clock style: the store never reads the system time).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use common::redis_server::{RedisCluster, RedisServer};
use modelgate::clock::Period;
use modelgate::store::{
    AccountBalance, AdmitRequest, AppUsage, Check, Expect, GenerationsPage, HoldRenewal,
    IDEMPOTENCY_KEY_TTL_HOURS, KeyLimit, KeyTerms, Limit, MAX_APP_USAGE_ROWS,
    MAX_IDEMPOTENCY_KEY_BYTES, MemoryStore, NANOS_PER_CREDIT, PurchaseTier, PutOptions, PutOutcome,
    RecordKeeping, RedisStore, RedisStoreConfig, ReserveOutcome, ReserveRequest, Settlement,
    SettlementRecord, SlotOutcome, Store, StoreError, StoreErrorKind, TimeSource, TopUpOutcome,
    Versioned, WriteOutcome,
};

/// Monday 2024-01-01 00:00:00 UTC: aligned to every fixed window used here.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap()
}

fn after(micros: i64) -> DateTime<Utc> {
    t0() + chrono::Duration::microseconds(micros)
}

const SECOND: i64 = 1_000_000;

fn fixed(limit: u64, window_secs: u64) -> Limit {
    Limit::FixedWindow {
        limit,
        window: Duration::from_secs(window_secs),
    }
}

fn rolling(limit: u64, window_secs: u64) -> Limit {
    Limit::Rolling {
        limit,
        window: Duration::from_secs(window_secs),
    }
}

async fn add<S: Store>(
    store: &S,
    scope: &str,
    name: &str,
    limit: Limit,
    amount: u64,
    now: DateTime<Utc>,
) -> modelgate::store::Decision {
    store
        .check_and_add(scope, &[Check::new(name, limit, amount)], now)
        .await
        .expect("store call")
}

async fn fixed_window_edges<S: Store>(store: Arc<S>) {
    let limit = fixed(3, 10);
    for expected_used in 1..=3 {
        let decision = add(&*store, "acct", "fw", limit, 1, after(SECOND)).await;
        assert!(decision.admitted);
        let outcome = decision.outcomes[0];
        assert_eq!(
            (outcome.used, outcome.remaining),
            (expected_used, 3 - expected_used)
        );
        assert_eq!(outcome.retry_after, Duration::ZERO);
        assert_eq!(outcome.reset_after, Duration::from_secs(9));
    }
    // The last microsecond of the window still counts against it.
    let rejected = add(&*store, "acct", "fw", limit, 1, after(10 * SECOND - 1)).await;
    assert!(!rejected.admitted);
    assert_eq!(rejected.rejected_by(), Some(0));
    assert_eq!(rejected.outcomes[0].used, 3);
    assert_eq!(rejected.outcomes[0].retry_after, Duration::from_micros(1));
    // The next window starts empty.
    let next = add(&*store, "acct", "fw", limit, 3, after(10 * SECOND)).await;
    assert!(next.admitted);
    assert_eq!(next.outcomes[0].used, 3);
    // An amount larger than the limit never fits.
    let too_big = add(&*store, "acct", "fw2", limit, 4, after(0)).await;
    assert!(!too_big.admitted);
    assert_eq!(too_big.outcomes[0].used, 0);
}

async fn rolling_window_bounds_every_interval<S: Store>(store: Arc<S>) {
    let limit = rolling(3, 60);
    for at in [0, 20, 40] {
        assert!(
            add(&*store, "acct", "roll", limit, 1, after(at * SECOND))
                .await
                .admitted
        );
    }
    // A fixed window would reset at 60 s; the rolling one rejects until the
    // first entry is a full window old.
    let rejected = add(&*store, "acct", "roll", limit, 1, after(60 * SECOND - 1)).await;
    assert!(!rejected.admitted);
    assert_eq!(rejected.outcomes[0].retry_after, Duration::from_micros(1));
    assert_eq!(
        rejected.outcomes[0].reset_after,
        Duration::from_micros(40_000_001)
    );
    // Two at once must wait for the second-oldest entry.
    let two = add(&*store, "acct", "roll", limit, 2, after(60 * SECOND)).await;
    assert!(!two.admitted);
    assert_eq!(two.outcomes[0].used, 2);
    assert_eq!(two.outcomes[0].retry_after, Duration::from_secs(20));
    let one = add(&*store, "acct", "roll", limit, 1, after(60 * SECOND)).await;
    assert!(one.admitted);
    assert_eq!((one.outcomes[0].used, one.outcomes[0].remaining), (3, 0));
    // Everything has aged out a window after the newest entry.
    let later = add(&*store, "acct", "roll", limit, 3, after(120 * SECOND)).await;
    assert!(later.admitted);
}

async fn gcra_rate_and_burst<S: Store>(store: Arc<S>) {
    // 10 per second sustained (one per 100 ms), bursts of 5.
    let limit = Limit::Gcra {
        rate: 10,
        period: Duration::from_secs(1),
        burst: 5,
    };
    for expected_remaining in (0..5).rev() {
        let decision = add(&*store, "acct", "gcra", limit, 1, t0()).await;
        assert!(decision.admitted);
        assert_eq!(decision.outcomes[0].remaining, expected_remaining);
    }
    let full = add(&*store, "acct", "gcra", limit, 1, t0()).await;
    assert!(!full.admitted);
    assert_eq!(full.outcomes[0].retry_after, Duration::from_millis(100));
    assert_eq!(full.outcomes[0].reset_after, Duration::from_millis(500));
    assert_eq!(full.outcomes[0].remaining, 0);
    let early = add(&*store, "acct", "gcra", limit, 1, after(99_999)).await;
    assert!(!early.admitted);
    assert_eq!(early.outcomes[0].retry_after, Duration::from_micros(1));
    let on_time = add(&*store, "acct", "gcra", limit, 1, after(100_000)).await;
    assert!(on_time.admitted);
    assert_eq!(on_time.outcomes[0].remaining, 0);
    // After the bucket drains completely the whole burst is available again.
    let rested = add(&*store, "acct", "gcra", limit, 5, after(SECOND)).await;
    assert!(rested.admitted);
}

async fn calendar_windows_reset_at_utc_boundaries<S: Store>(store: Arc<S>) {
    let cases = [
        // (period, last instant of a period, first instant of the next)
        (
            Period::Day,
            Utc.with_ymd_and_hms(2024, 2, 28, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(2024, 2, 29, 0, 0, 0).unwrap(),
        ),
        (
            Period::Week,
            Utc.with_ymd_and_hms(2024, 3, 3, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(2024, 3, 4, 0, 0, 0).unwrap(),
        ),
        (
            Period::Month,
            Utc.with_ymd_and_hms(2024, 2, 29, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(2024, 3, 1, 0, 0, 0).unwrap(),
        ),
        (
            Period::Month,
            Utc.with_ymd_and_hms(2024, 12, 31, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap(),
        ),
    ];
    for (index, (period, last, next)) in cases.into_iter().enumerate() {
        let name = format!("cal{index}");
        let limit = Limit::Calendar { limit: 2, period };
        assert!(add(&*store, "acct", &name, limit, 2, last).await.admitted);
        let rejected = add(&*store, "acct", &name, limit, 1, last).await;
        assert!(!rejected.admitted, "{period:?}");
        assert_eq!(rejected.outcomes[0].retry_after, Duration::from_secs(1));
        assert_eq!(rejected.outcomes[0].reset_after, Duration::from_secs(1));
        let fresh = add(&*store, "acct", &name, limit, 1, next).await;
        assert!(fresh.admitted, "{period:?}");
        assert_eq!(fresh.outcomes[0].used, 1);
    }
}

async fn multi_checks_are_all_or_nothing<S: Store>(store: Arc<S>) {
    let minute = Check::new("free:minute", rolling(2, 60), 1);
    let day = Check::new(
        "free:day",
        Limit::Calendar {
            limit: 3,
            period: Period::Day,
        },
        1,
    );
    let both = [minute.clone(), day.clone()];
    assert!(
        store
            .check_and_add("acct", &both, t0())
            .await
            .unwrap()
            .admitted
    );
    assert!(
        store
            .check_and_add("acct", &both, t0())
            .await
            .unwrap()
            .admitted
    );
    // Rejected by the minute: the day counter stays at 2.
    let by_minute = store
        .check_and_add("acct", &both, after(SECOND))
        .await
        .unwrap();
    assert_eq!(by_minute.rejected_by(), Some(0));
    assert!(by_minute.outcomes[1].admitted);
    assert_eq!(by_minute.outcomes[1].used, 2);
    assert_eq!(by_minute.retry_after(), Duration::from_secs(59));
    // A minute later: the third of the day fits.
    assert!(
        store
            .check_and_add("acct", &both, after(61 * SECOND))
            .await
            .unwrap()
            .admitted
    );
    // Rejected by the day: the minute counter keeps only the one entry.
    let by_day = store
        .check_and_add("acct", &both, after(62 * SECOND))
        .await
        .unwrap();
    assert_eq!(by_day.rejected_by(), Some(1));
    assert_eq!(by_day.outcomes[0].used, 1);
    assert_eq!(by_day.outcomes[1].used, 3);
    let peek = store
        .check_and_add(
            "acct",
            &[Check::new("free:minute", rolling(2, 60), 0)],
            after(62 * SECOND),
        )
        .await
        .unwrap();
    assert_eq!(peek.outcomes[0].used, 1);
}

async fn zero_amount_only_reads<S: Store>(store: Arc<S>) {
    for limit in [
        fixed(2, 10),
        rolling(2, 10),
        Limit::Gcra {
            rate: 1,
            period: Duration::from_secs(1),
            burst: 2,
        },
        Limit::Calendar {
            limit: 2,
            period: Period::Day,
        },
    ] {
        let name = format!("{limit:?}");
        assert!(add(&*store, "acct", &name, limit, 1, t0()).await.admitted);
        for _ in 0..3 {
            let peek = add(&*store, "acct", &name, limit, 0, t0()).await;
            assert!(peek.admitted);
            assert_eq!(
                (peek.outcomes[0].used, peek.outcomes[0].remaining),
                (1, 1),
                "{limit:?}"
            );
        }
    }
}

async fn invalid_checks_are_refused<S: Store>(store: Arc<S>) {
    let duplicate = [
        Check::new("a", fixed(1, 1), 1),
        Check::new("a", rolling(1, 1), 1),
    ];
    let error = store
        .check_and_add("acct", &duplicate, t0())
        .await
        .unwrap_err();
    assert!(
        matches!(error.kind(), StoreErrorKind::Invalid(_)),
        "{error}"
    );
    assert_eq!(error.operation(), "check_and_add");
    let zero_window = [Check::new(
        "z",
        Limit::Rolling {
            limit: 1,
            window: Duration::ZERO,
        },
        1,
    )];
    assert!(
        store
            .check_and_add("acct", &zero_window, t0())
            .await
            .is_err()
    );
    let zero_rate = [Check::new(
        "g",
        Limit::Gcra {
            rate: 0,
            period: Duration::from_secs(1),
            burst: 1,
        },
        1,
    )];
    assert!(store.check_and_add("acct", &zero_rate, t0()).await.is_err());
    let huge = [Check::new(
        "h",
        fixed(modelgate::store::MAX_EXACT + 1, 1),
        1,
    )];
    assert!(store.check_and_add("acct", &huge, t0()).await.is_err());
    let huge_amount = [Check::new(
        "a",
        fixed(1, 1),
        modelgate::store::MAX_EXACT + 1,
    )];
    assert!(
        store
            .check_and_add("acct", &huge_amount, t0())
            .await
            .is_err()
    );
    // Nothing was counted by the refused calls.
    assert_eq!(
        add(&*store, "acct", "a", fixed(1, 1), 0, t0())
            .await
            .outcomes[0]
            .used,
        0
    );
}

async fn scopes_and_names_never_collide<S: Store>(store: Arc<S>) {
    let limit = fixed(1, 60);
    // Pairs that would share a key if scope and name were joined naively.
    let pairs = [
        ("a}:x", "y"),
        ("a", "x}:y"),
        ("a:b", "c"),
        ("a", "b:c"),
        ("{a}", "b"),
        ("ü", "n"),
        ("", "x"),
    ];
    for (scope, name) in pairs {
        assert!(
            add(&*store, scope, name, limit, 1, t0()).await.admitted,
            "{scope:?} {name:?}"
        );
    }
    for (scope, name) in pairs {
        assert!(
            !add(&*store, scope, name, limit, 1, t0()).await.admitted,
            "{scope:?} {name:?}"
        );
    }
}

/// Runs `tasks` concurrent single checks of `amount` 1 and counts admissions.
async fn admitted_concurrently<S: Store>(
    store: &Arc<S>,
    scope: &str,
    checks: Vec<Check>,
    tasks: usize,
) -> usize {
    let admitted = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let store = Arc::clone(store);
            let admitted = Arc::clone(&admitted);
            let checks = checks.clone();
            let scope = scope.to_owned();
            tokio::spawn(async move {
                if store
                    .check_and_add(&scope, &checks, t0())
                    .await
                    .unwrap()
                    .admitted
                {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

async fn concurrent_callers_admit_exactly_the_limit<S: Store>(store: Arc<S>) {
    let limits = [
        fixed(20, 60),
        rolling(20, 60),
        Limit::Gcra {
            rate: 1,
            period: Duration::from_secs(60),
            burst: 20,
        },
        Limit::Calendar {
            limit: 20,
            period: Period::Day,
        },
    ];
    for limit in limits {
        let checks = vec![Check::new("c", limit, 1)];
        let admitted = admitted_concurrently(&store, &format!("{limit:?}"), checks, 500).await;
        assert_eq!(admitted, 20, "{limit:?}");
    }
    // Two counters at once: the tighter one decides, and the looser one
    // counts only the admitted requests.
    let checks = vec![
        Check::new("minute", rolling(20, 60), 1),
        Check::new(
            "day",
            Limit::Calendar {
                limit: 50,
                period: Period::Day,
            },
            1,
        ),
    ];
    assert_eq!(
        admitted_concurrently(&store, "multi", checks.clone(), 500).await,
        20
    );
    let day = store
        .check_and_add(
            "multi",
            &[Check::new(
                "day",
                Limit::Calendar {
                    limit: 50,
                    period: Period::Day,
                },
                0,
            )],
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(day.outcomes[0].used, 20);
}

async fn concurrent_callers_straddling_a_window_edge<S: Store>(store: Arc<S>) {
    // Callers whose clocks read either side of an edge race for the same
    // counter: each window still admits exactly its limit.
    let edge = 60 * SECOND;
    for limit in [
        fixed(20, 60),
        Limit::Calendar {
            limit: 20,
            period: Period::Day,
        },
    ] {
        let edge = match limit {
            Limit::Calendar { .. } => 24 * 3600 * SECOND,
            _ => edge,
        };
        let admitted = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..500)
            .map(|task| {
                let (store, admitted) = (Arc::clone(&store), Arc::clone(&admitted));
                tokio::spawn(async move {
                    let now = after(edge - 1 + task % 2);
                    let checks = [Check::new(format!("edge {limit:?}"), limit, 1)];
                    if store
                        .check_and_add("acct", &checks, now)
                        .await
                        .unwrap()
                        .admitted
                    {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.unwrap();
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 40, "{limit:?}");
        for now in [after(edge - 1), after(edge)] {
            let peek = add(&*store, "acct", &format!("edge {limit:?}"), limit, 0, now).await;
            assert_eq!(peek.outcomes[0].used, 20, "{limit:?} at {now}");
        }
    }
}

async fn a_clock_stepping_back_never_resets_a_newer_window<S: Store>(store: Arc<S>) {
    let edge = 60 * SECOND;
    for limit in [fixed(3, 60), rolling(3, 60)] {
        let name = format!("{limit:?}");
        assert!(
            add(&*store, "acct", &name, limit, 3, after(edge))
                .await
                .admitted
        );
        // A caller a microsecond behind.
        let behind = add(&*store, "acct", &name, limit, 1, after(edge - 1)).await;
        if let Limit::FixedWindow { .. } = limit {
            // Its own (earlier) window is empty.
            assert!(behind.admitted, "{limit:?}");
        } else {
            // The newer entries lie within a window of it.
            assert!(!behind.admitted, "{limit:?}");
        }
        let again = add(&*store, "acct", &name, limit, 1, after(edge)).await;
        assert!(!again.admitted, "{limit:?}");
        assert_eq!(again.outcomes[0].used, 3, "{limit:?}");
    }
    // A rolling entry stamped earlier than the newest still ages out on time.
    let limit = rolling(2, 10);
    assert!(
        add(&*store, "acct", "late", limit, 1, after(5 * SECOND))
            .await
            .admitted
    );
    assert!(
        add(&*store, "acct", "late", limit, 1, after(SECOND))
            .await
            .admitted
    );
    let at_eleven = add(&*store, "acct", "late", limit, 1, after(11 * SECOND)).await;
    assert!(
        at_eleven.admitted,
        "the entry stamped at 1 s has left the window"
    );
    assert_eq!(at_eleven.outcomes[0].used, 2);
}

const LEASE: Duration = Duration::from_secs(10);

/// Takes a slot of `name` in `acct`, for `LEASE`.
async fn acquire<S: Store>(
    store: &S,
    name: &str,
    holder: &str,
    limit: u64,
    now: DateTime<Utc>,
) -> SlotOutcome {
    store
        .acquire_slot("acct", name, holder, limit, LEASE, now)
        .await
        .expect("store call")
}

fn taken(held: u64, limit: u64) -> SlotOutcome {
    SlotOutcome {
        acquired: true,
        held,
        limit,
        retry_after: Duration::ZERO,
    }
}

fn refused(held: u64, limit: u64, retry_after: Duration) -> SlotOutcome {
    SlotOutcome {
        acquired: false,
        held,
        limit,
        retry_after,
    }
}

async fn slots_hold_their_limit_and_a_refusal_changes_nothing<S: Store>(store: Arc<S>) {
    assert_eq!(acquire(&*store, "s", "a", 2, t0()).await, taken(1, 2));
    assert_eq!(
        acquire(&*store, "s", "b", 2, after(SECOND)).await,
        taken(2, 2)
    );
    // Refused until the earliest lease (a's, from t0) ends.
    assert_eq!(
        acquire(&*store, "s", "c", 2, after(3 * SECOND)).await,
        refused(2, 2, Duration::from_secs(7))
    );
    assert_eq!(
        acquire(&*store, "s", "c", 2, after(3 * SECOND)).await,
        refused(2, 2, Duration::from_secs(7))
    );
    // c's refusals took nothing: once a's lease ends there is room for one.
    assert_eq!(
        acquire(&*store, "s", "d", 2, after(10 * SECOND)).await,
        taken(2, 2)
    );
    assert_eq!(
        acquire(&*store, "s", "c", 2, after(10 * SECOND)).await,
        refused(2, 2, Duration::from_secs(1))
    );
}

async fn releasing_a_slot_frees_it<S: Store>(store: Arc<S>) {
    assert!(acquire(&*store, "s", "a", 1, t0()).await.acquired);
    assert!(!acquire(&*store, "s", "b", 1, t0()).await.acquired);
    store.release_slot("acct", "s", "a").await.unwrap();
    assert_eq!(acquire(&*store, "s", "b", 1, t0()).await, taken(1, 1));
    // Giving back what is not held changes nothing and is no error: twice,
    // by a holder that never had it, and in a scope or name never used.
    store.release_slot("acct", "s", "a").await.unwrap();
    store.release_slot("acct", "s", "never").await.unwrap();
    store.release_slot("acct", "unused", "a").await.unwrap();
    store.release_slot("no-such-acct", "s", "b").await.unwrap();
    assert_eq!(
        acquire(&*store, "s", "c", 1, t0()).await,
        refused(1, 1, LEASE)
    );
    // The last slot given back leaves the set empty, and it fills again.
    store.release_slot("acct", "s", "b").await.unwrap();
    assert_eq!(acquire(&*store, "s", "c", 1, t0()).await, taken(1, 1));
}

async fn an_expired_lease_is_reclaimed<S: Store>(store: Arc<S>) {
    // A holder that crashed and never gave its slot back.
    assert!(acquire(&*store, "s", "crashed", 1, t0()).await.acquired);
    assert_eq!(
        acquire(&*store, "s", "b", 1, after(10 * SECOND - 1)).await,
        refused(1, 1, Duration::from_micros(1))
    );
    assert_eq!(
        acquire(&*store, "s", "b", 1, after(10 * SECOND)).await,
        taken(1, 1)
    );
    // The crashed holder giving back late does not free b's slot.
    store.release_slot("acct", "s", "crashed").await.unwrap();
    assert!(
        !acquire(&*store, "s", "c", 1, after(10 * SECOND))
            .await
            .acquired
    );
    // Leases of any length end: one of 1 ms and one of 2^53 µs.
    let short = Duration::from_millis(1);
    let long = Duration::from_micros(modelgate::store::MAX_EXACT);
    for (held, holder, lease) in [(1, "short", short), (2, "long", long)] {
        let outcome = store
            .acquire_slot("acct", "lengths", holder, 2, lease, t0())
            .await
            .unwrap();
        assert_eq!(outcome, taken(held, 2), "{holder}");
    }
    let next = store
        .acquire_slot("acct", "lengths", "next", 2, LEASE, after(1_000))
        .await
        .unwrap();
    assert_eq!(next, taken(2, 2));
}

async fn renewing_a_slot_counts_once<S: Store>(store: Arc<S>) {
    assert_eq!(acquire(&*store, "s", "a", 2, t0()).await, taken(1, 2));
    assert_eq!(acquire(&*store, "s", "a", 2, t0()).await, taken(1, 2));
    assert_eq!(acquire(&*store, "s", "b", 2, t0()).await, taken(2, 2));
    // Renewing when every slot is held still succeeds: it takes no new one.
    assert_eq!(
        acquire(&*store, "s", "a", 2, after(5 * SECOND)).await,
        taken(2, 2)
    );
    // a's lease now ends at 15 s; b's at 10 s.
    assert_eq!(
        acquire(&*store, "s", "c", 2, after(9 * SECOND)).await,
        refused(2, 2, Duration::from_secs(1))
    );
    assert_eq!(
        acquire(&*store, "s", "c", 2, after(12 * SECOND)).await,
        taken(2, 2)
    );
    assert_eq!(
        acquire(&*store, "s", "d", 2, after(12 * SECOND)).await,
        refused(2, 2, Duration::from_secs(3))
    );
    // A renewal may shorten a lease too: it always ends `lease` after `now`.
    let short = Duration::from_millis(1);
    let renewed = store
        .acquire_slot("acct", "s", "a", 2, short, after(12 * SECOND))
        .await
        .unwrap();
    assert_eq!(renewed, taken(2, 2));
    assert_eq!(
        acquire(&*store, "s", "d", 2, after(12 * SECOND + 1_000)).await,
        taken(2, 2)
    );
}

async fn slot_scopes_and_names_are_independent<S: Store>(store: Arc<S>) {
    // Pairs that would share a key if scope and name were joined naively.
    let pairs = [
        ("a}:x", "y"),
        ("a", "x}:y"),
        ("a:b", "c"),
        ("a", "b:c"),
        ("{a}", "b"),
        ("ü", "n"),
        ("", "x"),
        ("a", ""),
    ];
    for (scope, name) in pairs {
        let outcome = store
            .acquire_slot(scope, name, "h1", 1, LEASE, t0())
            .await
            .unwrap();
        assert_eq!(outcome, taken(1, 1), "{scope:?} {name:?}");
    }
    for (scope, name) in pairs {
        let outcome = store
            .acquire_slot(scope, name, "h2", 1, LEASE, t0())
            .await
            .unwrap();
        assert_eq!(outcome, refused(1, 1, LEASE), "{scope:?} {name:?}");
    }
    // Giving back one pair's slot frees that pair's alone.
    store.release_slot("a", "b:c", "h1").await.unwrap();
    for (scope, name) in pairs {
        let outcome = store
            .acquire_slot(scope, name, "h2", 1, LEASE, t0())
            .await
            .unwrap();
        assert_eq!(
            outcome.acquired,
            (scope, name) == ("a", "b:c"),
            "{scope:?} {name:?}"
        );
    }
    // A counter of the same name in the same scope is another thing.
    assert!(
        add(&*store, "a", "shared", fixed(1, 60), 1, t0())
            .await
            .admitted
    );
    let slot = store
        .acquire_slot("a", "shared", "h1", 1, LEASE, t0())
        .await
        .unwrap();
    assert_eq!(slot, taken(1, 1));
    let counter = add(&*store, "a", "shared", fixed(1, 60), 0, t0()).await;
    assert_eq!(counter.outcomes[0].used, 1);
}

async fn invalid_slot_arguments_are_refused<S: Store>(store: Arc<S>) {
    let max = modelgate::store::MAX_EXACT;
    let long_holder = "h".repeat(129);
    let cases: [(u64, Duration, &str); 7] = [
        (0, LEASE, "h"),
        (max + 1, LEASE, "h"),
        (1, Duration::ZERO, "h"),
        (1, Duration::from_micros(999), "h"),
        (1, Duration::from_micros(max + 1), "h"),
        (1, LEASE, ""),
        (1, LEASE, &long_holder),
    ];
    for (limit, lease, holder) in cases {
        let error = store
            .acquire_slot("acct", "s", holder, limit, lease, t0())
            .await
            .unwrap_err();
        assert!(
            matches!(error.kind(), StoreErrorKind::Invalid(_)),
            "{limit} {lease:?} {holder:?}: {error}"
        );
        assert_eq!(error.operation(), "acquire_slot");
    }
    // Nothing was taken by the refused calls; the bounds themselves are fine.
    let longest_holder = "h".repeat(128);
    assert_eq!(
        store
            .acquire_slot("acct", "s", &longest_holder, max, LEASE, t0())
            .await
            .unwrap(),
        taken(1, max)
    );
    assert_eq!(
        store
            .acquire_slot("acct", "s", "h", 2, Duration::from_millis(1), t0())
            .await
            .unwrap(),
        taken(2, 2)
    );
}

async fn concurrent_acquirers_get_exactly_the_limit<S: Store>(store: Arc<S>) {
    let handles: Vec<_> = (0..50)
        .map(|task| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let outcome = store
                    .acquire_slot("acct", "busy", &format!("h{task}"), 8, LEASE, t0())
                    .await
                    .unwrap();
                assert!(outcome.held <= 8, "{outcome:?}");
                outcome.acquired
            })
        })
        .collect();
    let mut acquired = 0;
    for handle in handles {
        acquired += usize::from(handle.await.unwrap());
    }
    assert_eq!(acquired, 8);
    assert_eq!(
        acquire(&*store, "busy", "late", 8, t0()).await,
        refused(8, 8, LEASE)
    );
}

fn credits(amount: i64) -> i64 {
    amount * NANOS_PER_CREDIT
}

fn reservation(id: &str, amount_nanos: i64, key_limit: Option<KeyLimit>) -> ReserveRequest {
    ReserveRequest {
        account: "acct".into(),
        key: "key-hash".into(),
        reservation_id: id.into(),
        amount_nanos,
        key_limit,
        min_amount_nanos: None,
        check_balance: true,
        covered_by_balance: false,
        lapse_record: None,
        counts_against_key_limit: true,
        ttl: Duration::from_secs(60),
    }
}

fn settlement(id: &str, cost_nanos: i64, byok: bool) -> Settlement {
    Settlement {
        account: "acct".into(),
        key: "key-hash".into(),
        reservation_id: id.into(),
        hold_granted: false,
        cost_nanos,
        byok,
        record: None,
    }
}

async fn ledger_rolls_periods_and_keeps_byok_apart<S: Store>(store: Arc<S>) {
    // Wednesday 2024-01-31 12:00: the last day of a month, mid-week.
    let wednesday = Utc.with_ymd_and_hms(2024, 1, 31, 12, 0, 0).unwrap();
    store
        .settle(&settlement("r1", 7, false), wednesday)
        .await
        .unwrap();
    store
        .settle(&settlement("r2", 5, true), wednesday)
        .await
        .unwrap();
    let usage = store
        .key_usage("acct", "key-hash", wednesday)
        .await
        .unwrap();
    assert_eq!(
        (
            usage.total_nanos,
            usage.day_nanos,
            usage.week_nanos,
            usage.month_nanos
        ),
        (7, 7, 7, 7)
    );
    assert_eq!(
        (
            usage.byok_total_nanos,
            usage.byok_day_nanos,
            usage.byok_week_nanos,
            usage.byok_month_nanos
        ),
        (5, 5, 5, 5)
    );
    // BYOK usage does not draw on the balance.
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        -7
    );
    // Thursday 2024-02-01: new day and month, same week.
    let thursday = Utc.with_ymd_and_hms(2024, 2, 1, 0, 0, 0).unwrap();
    let usage = store.key_usage("acct", "key-hash", thursday).await.unwrap();
    assert_eq!(
        (
            usage.total_nanos,
            usage.day_nanos,
            usage.week_nanos,
            usage.month_nanos
        ),
        (7, 0, 7, 0)
    );
    store
        .settle(&settlement("r3", 3, false), thursday)
        .await
        .unwrap();
    let usage = store.key_usage("acct", "key-hash", thursday).await.unwrap();
    assert_eq!(
        (
            usage.total_nanos,
            usage.day_nanos,
            usage.week_nanos,
            usage.month_nanos
        ),
        (10, 3, 10, 3)
    );
    assert_eq!(
        (
            usage.byok_total_nanos,
            usage.byok_day_nanos,
            usage.byok_week_nanos,
            usage.byok_month_nanos
        ),
        (5, 0, 5, 0)
    );
    // Monday 2024-02-05: new week.
    let monday = Utc.with_ymd_and_hms(2024, 2, 5, 0, 0, 0).unwrap();
    let usage = store.key_usage("acct", "key-hash", monday).await.unwrap();
    assert_eq!(
        (
            usage.total_nanos,
            usage.day_nanos,
            usage.week_nanos,
            usage.month_nanos
        ),
        (10, 0, 0, 3)
    );
    // Another key of the account is separate.
    assert_eq!(
        store.key_usage("acct", "other", monday).await.unwrap(),
        Default::default()
    );
}

async fn reservations_count_against_the_key_limit_and_expire<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(100)).await.unwrap();
    let limit = KeyLimit {
        limit_nanos: credits(3),
        reset: Some(Period::Day),
        include_byok: false,
    };
    for (index, id) in ["a", "b", "c"].into_iter().enumerate() {
        let outcome = store
            .reserve(&reservation(id, credits(1), Some(limit)), t0())
            .await
            .unwrap();
        assert_eq!(
            outcome,
            ReserveOutcome::Reserved {
                used_nanos: 0,
                reserved_nanos: credits(index as i64 + 1),
                held_nanos: credits(1),
            }
        );
    }
    let over = store
        .reserve(&reservation("d", credits(1), Some(limit)), t0())
        .await
        .unwrap();
    assert_eq!(
        over,
        ReserveOutcome::KeyLimitReached {
            used_nanos: credits(3),
            limit_nanos: credits(3),
            resets_at: Some(Utc.with_ymd_and_hms(2024, 1, 2, 0, 0, 0).unwrap()),
        }
    );
    // Settling for less than reserved frees the difference.
    store
        .settle(&settlement("a", credits(1) / 2, false), after(SECOND))
        .await
        .unwrap();
    let usage = store
        .key_usage("acct", "key-hash", after(SECOND))
        .await
        .unwrap();
    assert_eq!(
        (usage.day_nanos, usage.reserved_nanos),
        (credits(1) / 2, credits(2))
    );
    // 2.5 of 3 used or held: a request that could cost 1 might pass the
    // limit and is refused; one of 0.5 fits exactly.
    assert!(matches!(
        store
            .reserve(&reservation("d", credits(1), Some(limit)), after(SECOND))
            .await
            .unwrap(),
        ReserveOutcome::KeyLimitReached { .. }
    ));
    assert!(matches!(
        store
            .reserve(
                &reservation("d", credits(1) / 2, Some(limit)),
                after(SECOND)
            )
            .await
            .unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    // At the limit exactly, even a free request (amount 0) is refused.
    assert!(matches!(
        store
            .reserve(&reservation("free", 0, Some(limit)), after(SECOND))
            .await
            .unwrap(),
        ReserveOutcome::KeyLimitReached { .. }
    ));
    // Reservations never settled expire after their TTL.
    let expired = after(61 * SECOND + 1);
    assert_eq!(
        store
            .key_usage("acct", "key-hash", expired)
            .await
            .unwrap()
            .reserved_nanos,
        0
    );
    // Settling an expired reservation still records its cost.
    store
        .settle(&settlement("b", credits(1), false), expired)
        .await
        .unwrap();
    let usage = store.key_usage("acct", "key-hash", expired).await.unwrap();
    assert_eq!(usage.day_nanos, credits(1) + credits(1) / 2);
    // BYOK usage counts against the limit only when asked.
    store
        .settle(&settlement("x", credits(2), true), expired)
        .await
        .unwrap();
    let without_byok = KeyLimit {
        limit_nanos: credits(3),
        reset: Some(Period::Day),
        include_byok: false,
    };
    let with_byok = KeyLimit {
        include_byok: true,
        ..without_byok
    };
    assert!(matches!(
        store
            .reserve(&reservation("e", 1, Some(without_byok)), expired)
            .await
            .unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    store
        .settle(&settlement("e", 0, false), expired)
        .await
        .unwrap();
    assert!(matches!(
        store
            .reserve(&reservation("f", 1, Some(with_byok)), expired)
            .await
            .unwrap(),
        ReserveOutcome::KeyLimitReached { .. }
    ));
    // A limit without reset counts all-time usage (1.5 credits by now).
    let all_time = KeyLimit {
        limit_nanos: credits(1) + credits(1) / 2, // exactly the all-time usage
        reset: None,
        include_byok: false,
    };
    let tomorrow = Utc.with_ymd_and_hms(2024, 1, 2, 0, 0, 0).unwrap();
    assert!(matches!(
        store
            .reserve(&reservation("g", 1, Some(all_time)), tomorrow)
            .await
            .unwrap(),
        ReserveOutcome::KeyLimitReached {
            resets_at: None,
            ..
        }
    ));
    assert!(matches!(
        store
            .reserve(&reservation("h", 1, Some(without_byok)), tomorrow)
            .await
            .unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
}

async fn negative_balance_rejects_until_topped_up<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(1)).await.unwrap();
    assert!(matches!(
        store
            .reserve(&reservation("a", credits(2), None), t0())
            .await
            .unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    store
        .settle(&settlement("a", credits(2), false), t0())
        .await
        .unwrap();
    let balance = store.account_balance("acct").await.unwrap();
    assert_eq!(
        (balance.purchased_nanos, balance.balance_nanos),
        (credits(1), -credits(1))
    );
    assert_eq!(
        store
            .reserve(&reservation("b", 0, None), t0())
            .await
            .unwrap(),
        ReserveOutcome::BalanceNegative {
            balance_nanos: -credits(1)
        }
    );
    // A layer that does not check the balance is admitted.
    let unchecked = ReserveRequest {
        min_amount_nanos: None,
        check_balance: false,
        covered_by_balance: false,
        lapse_record: None,
        counts_against_key_limit: true,
        ..reservation("c", 0, None)
    };
    assert!(matches!(
        store.reserve(&unchecked, t0()).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    let topped = store.top_up("acct", credits(2)).await.unwrap();
    assert_eq!(
        (topped.purchased_nanos, topped.balance_nanos),
        (credits(3), credits(1))
    );
    assert!(matches!(
        store
            .reserve(&reservation("d", 0, None), t0())
            .await
            .unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    assert!(store.top_up("acct", -1).await.is_err());
    assert_eq!(
        store.account_balance("nobody").await.unwrap(),
        Default::default()
    );
}

async fn ledger_sums_are_exact_under_concurrency<S: Store>(store: Arc<S>) {
    // Odd nano-credit amounts, many at once: the sum must be exact.
    let costs: Vec<i64> = (0..200).map(|i| 1_000_000_007 * i + 13).collect();
    let handles: Vec<_> = costs
        .iter()
        .enumerate()
        .map(|(index, &cost)| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let id = format!("r{index}");
                store
                    .reserve(&reservation(&id, cost, None), t0())
                    .await
                    .unwrap();
                store
                    .settle(&settlement(&id, cost, index % 3 == 0), t0())
                    .await
                    .unwrap();
            })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    let own: i64 = costs
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, c)| c)
        .sum();
    let byok: i64 = costs
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 == 0)
        .map(|(_, c)| c)
        .sum();
    let usage = store.key_usage("acct", "key-hash", t0()).await.unwrap();
    assert_eq!(
        (
            usage.total_nanos,
            usage.month_nanos,
            usage.byok_total_nanos,
            usage.reserved_nanos
        ),
        (own, own, byok, 0)
    );
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        -own
    );
    // Values beyond 2^53 (where a double loses integers) stay exact.
    let huge = (1i64 << 60) + 1;
    assert_eq!(
        store.top_up("rich", huge).await.unwrap().purchased_nanos,
        huge
    );
    assert_eq!(
        store.top_up("rich", 2).await.unwrap().balance_nanos,
        huge + 2
    );
    // A purchase past i64::MAX is refused and changes nothing.
    let room = i64::MAX - (huge + 2);
    assert!(store.top_up("rich", room + 1).await.is_err());
    let unchanged = store.account_balance("rich").await.unwrap();
    assert_eq!(
        (unchanged.purchased_nanos, unchanged.balance_nanos),
        (huge + 2, huge + 2)
    );
    // With the balance spent below the purchased total, the purchased total
    // overflows first; still nothing changes.
    store
        .settle(
            &Settlement {
                account: "rich".into(),
                ..settlement("spend", huge, false)
            },
            t0(),
        )
        .await
        .unwrap();
    assert!(store.top_up("rich", room + 1).await.is_err());
    let unchanged = store.account_balance("rich").await.unwrap();
    assert_eq!(
        (unchanged.purchased_nanos, unchanged.balance_nanos),
        (huge + 2, 2)
    );
    assert_eq!(
        store.top_up("rich", room).await.unwrap().purchased_nanos,
        i64::MAX
    );
}

async fn a_settlement_retried_records_once<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(10)).await.unwrap();
    for _ in 0..3 {
        store
            .settle(&settlement("retried", credits(2), false), t0())
            .await
            .unwrap();
    }
    let usage = store.key_usage("acct", "key-hash", t0()).await.unwrap();
    assert_eq!(usage.total_nanos, credits(2));
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        credits(8)
    );
    // Another id is another request.
    store
        .settle(&settlement("next", credits(1), false), t0())
        .await
        .unwrap();
    assert_eq!(
        store
            .key_usage("acct", "key-hash", t0())
            .await
            .unwrap()
            .total_nanos,
        credits(3)
    );
    // Once SETTLEMENT_MEMORY has passed the id is forgotten (ids are random per request).
    let later = t0() + chrono::Duration::from_std(modelgate::store::SETTLEMENT_MEMORY).unwrap();
    store
        .settle(
            &settlement("retried", credits(1), false),
            later + chrono::Duration::seconds(1),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .key_usage("acct", "key-hash", later + chrono::Duration::seconds(1))
            .await
            .unwrap()
            .total_nanos,
        credits(4)
    );
}

async fn a_settled_id_is_remembered_longer_than_its_retries<S: Store>(store: Arc<S>) {
    // A hold of a whole day, settled at once: a retry at the end of its
    // retry window still records nothing twice, and past the marker's time
    // (ids are random per request; no retry comes that late) the id is
    // forgotten.
    store.top_up("acct", credits(10)).await.unwrap();
    let day = Duration::from_secs(86_400);
    let request = ReserveRequest {
        ttl: day,
        ..reservation("long", credits(3), None)
    };
    assert!(store.reserve(&request, t0()).await.unwrap().is_reserved());
    let at = |offset: Duration| t0() + chrono::Duration::from_std(offset).unwrap();
    let total = |when| {
        let store = store.clone();
        async move {
            store
                .key_usage("acct", "key-hash", when)
                .await
                .unwrap()
                .total_nanos
        }
    };
    store
        .settle(&settlement("long", credits(2), false), t0())
        .await
        .unwrap();
    let retried = at(modelgate::store::SETTLEMENT_RETRY_WINDOW);
    store
        .settle(&settlement("long", credits(2), false), retried)
        .await
        .unwrap();
    assert_eq!(total(retried).await, credits(2));
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        credits(8)
    );
    let forgotten = at(modelgate::store::SETTLEMENT_MEMORY + Duration::from_secs(1));
    store
        .settle(&settlement("long", credits(1), false), forgotten)
        .await
        .unwrap();
    assert_eq!(total(forgotten).await, credits(3));
}

fn granted(id: &str, cost_nanos: i64) -> Settlement {
    Settlement {
        hold_granted: true,
        ..settlement(id, cost_nanos, false)
    }
}

async fn account_totals<S: Store>(store: &S, when: DateTime<Utc>) -> (i64, i64, i64) {
    let usage = store.key_usage("acct", "key-hash", when).await.unwrap();
    let balance = store.account_balance("acct").await.unwrap().balance_nanos;
    (usage.total_nanos, usage.reserved_nanos, balance)
}

async fn a_settlement_is_recorded_once_hold_or_not<S: Store>(store: Arc<S>) {
    // Each settlement leaves a marker, written with its cost and kept
    // SETTLEMENT_MEMORY, longer than any retry of it comes: every copy
    // within that time records nothing more. One that finds neither its
    // hold nor a marker (a hold Redis lost with its data) is recorded all
    // the same: lost data costs a late charge, never a free request.
    store.top_up("acct", credits(10)).await.unwrap();
    let outcome = store
        .reserve(&paid_hold("g", credits(3), None), t0())
        .await
        .unwrap();
    assert!(outcome.is_reserved());
    assert_eq!(
        account_totals(&*store, t0()).await,
        (0, credits(3), credits(10))
    );
    // Many copies of one settlement at once: recorded once.
    let copies: Vec<_> = (0..32)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.settle(&granted("g", credits(2)), t0()).await })
        })
        .collect();
    for copy in copies {
        copy.await.unwrap().unwrap();
    }
    assert_eq!(
        account_totals(&*store, t0()).await,
        (credits(2), 0, credits(8))
    );
    let memory = modelgate::store::SETTLEMENT_MEMORY.as_secs() as i64;
    for later in [SECOND, 60 * SECOND, (memory - 1) * SECOND] {
        store
            .settle(&granted("g", credits(2)), after(later))
            .await
            .unwrap();
        assert_eq!(
            account_totals(&*store, after(later)).await,
            (credits(2), 0, credits(8))
        );
    }
    // No hold and no marker: a hold the store lost is charged, once.
    for _ in 0..2 {
        store
            .settle(&granted("lost-hold", credits(4)), t0())
            .await
            .unwrap();
    }
    assert_eq!(
        account_totals(&*store, t0()).await,
        (credits(6), 0, credits(4))
    );
    // The same, carried with an admission: nothing more.
    let outcome = store
        .admit_after_settling(
            &[granted("g", credits(2)), granted("lost-hold", credits(1))],
            &admission(vec![], Some(paid_hold("h", credits(4), None))),
            t0(),
        )
        .await
        .unwrap();
    assert!(outcome.admitted, "{outcome:?}");
    assert_eq!(
        account_totals(&*store, t0()).await,
        (credits(6), credits(4), credits(4))
    );
}

async fn a_lapsed_hold_is_charged_once_by_its_late_settlement<S: Store>(store: Arc<S>) {
    // A hold that reaches its expiry unsettled (its instance died, or lost
    // the store for longer than the hold) lapses: the first call that
    // finds it charges its held amount, once; its settlement, if one ever
    // comes, replaces that charge with the real cost, once.
    store.top_up("acct", credits(10)).await.unwrap();
    let on_other_key = |request: ReserveRequest| ReserveRequest {
        key: "other-key".into(),
        ..request
    };
    assert!(
        store
            .reserve(&paid_hold("seen-lapsing", credits(4), None), t0())
            .await
            .unwrap()
            .is_reserved()
    );
    // Nothing reads the other key until its settlement: its usage is
    // charged then, its balance by any call on the account.
    assert!(
        store
            .reserve(&on_other_key(paid_hold("slow", credits(4), None)), t0())
            .await
            .unwrap()
            .is_reserved()
    );
    let expired = after(61 * SECOND);
    for _ in 0..2 {
        assert_eq!(
            account_totals(&*store, expired).await,
            (credits(4), 0, credits(2))
        );
    }
    let late = after(3600 * SECOND);
    for _ in 0..2 {
        let slow = Settlement {
            key: "other-key".into(),
            ..granted("slow", credits(3))
        };
        store.settle(&slow, late).await.unwrap();
        store
            .settle(&granted("seen-lapsing", credits(1)), late)
            .await
            .unwrap();
    }
    assert_eq!(
        account_totals(&*store, late).await,
        (credits(1), 0, credits(6))
    );
    let other = store.key_usage("acct", "other-key", late).await.unwrap();
    assert_eq!((other.total_nanos, other.reserved_nanos), (credits(3), 0));
    // A lapsed id reserved again holds again; its settlement replaces the
    // lapse's charge and takes the new hold, once.
    assert!(
        store
            .reserve(&paid_hold("again", credits(1), None), late)
            .await
            .unwrap()
            .is_reserved()
    );
    let relapsed = late + chrono::Duration::seconds(61);
    assert_eq!(
        account_totals(&*store, relapsed).await,
        (credits(2), 0, credits(5))
    );
    assert!(
        store
            .reserve(&paid_hold("again", credits(2), None), relapsed)
            .await
            .unwrap()
            .is_reserved()
    );
    assert_eq!(account_totals(&*store, relapsed).await.1, credits(2));
    for _ in 0..2 {
        store
            .settle(&granted("again", credits(2)), relapsed)
            .await
            .unwrap();
    }
    assert_eq!(
        account_totals(&*store, relapsed).await,
        (credits(3), 0, credits(4))
    );
    // A refused re-reservation leaves a lapsed hold as it was.
    assert!(
        store
            .reserve(&paid_hold("kept", credits(1), None), relapsed)
            .await
            .unwrap()
            .is_reserved()
    );
    let kept_lapsed = relapsed + chrono::Duration::seconds(61);
    let over_limit = ReserveRequest {
        key_limit: Some(KeyLimit {
            limit_nanos: 0,
            reset: None,
            include_byok: false,
        }),
        ..paid_hold("kept", credits(1), None)
    };
    assert!(matches!(
        store.reserve(&over_limit, kept_lapsed).await.unwrap(),
        ReserveOutcome::KeyLimitReached { .. }
    ));
    store
        .settle(&granted("kept", credits(1)), kept_lapsed)
        .await
        .unwrap();
    assert_eq!(
        account_totals(&*store, kept_lapsed).await,
        (credits(4), 0, credits(3))
    );
    // A lapse's charge is known for LAPSED_HOLD_MEMORY from when a call
    // found it (or a renewal last asked for it): a settlement within that
    // replaces it. One after it finds neither hold, marker nor lapse and is
    // recorded as any such settlement is: the lapse's charge stands.
    let lapsed = chrono::Duration::from_std(modelgate::store::LAPSED_HOLD_MEMORY).unwrap();
    let start = kept_lapsed;
    store.top_up("acct", credits(10)).await.unwrap();
    let expiry = start + chrono::Duration::seconds(60);
    let mut charged = 0;
    for (id, seen, settled_at, expected) in [
        (
            "last-moment",
            true,
            lapsed - chrono::Duration::milliseconds(1),
            credits(1) / 2,
        ),
        ("forgotten", true, lapsed, credits(1) + credits(1) / 2),
        // Found lapsing by its own settlement: replaced at once.
        ("unseen", false, lapsed, credits(1) / 2),
    ] {
        let hold = Settlement {
            key: format!("key-{id}"),
            ..granted(id, credits(1) / 2)
        };
        assert!(
            store
                .reserve(
                    &ReserveRequest {
                        key: hold.key.clone(),
                        ..paid_hold(id, credits(1), None)
                    },
                    start
                )
                .await
                .unwrap()
                .is_reserved()
        );
        if seen {
            store.key_usage("acct", &hold.key, expiry).await.unwrap();
        }
        for _ in 0..2 {
            store.settle(&hold, expiry + settled_at).await.unwrap();
        }
        let usage = store
            .key_usage("acct", &hold.key, expiry + settled_at)
            .await
            .unwrap();
        assert_eq!(usage.total_nanos, expected, "{id}");
        charged += expected;
    }
    let balance = store.account_balance("acct").await.unwrap().balance_nanos;
    assert_eq!(balance, credits(13) - charged);
}

async fn a_cost_counts_in_the_periods_its_hold_was_admitted_in<S: Store>(store: Arc<S>) {
    // Sunday 2024-03-31, a minute before midnight: the next minute is a new
    // day, week and month. A request admitted then and charged after
    // midnight (lapsed, settled late over its lapse, or settled on time)
    // counts in the periods that held it, never in those that follow,
    // which another request may have filled to their limit meanwhile.
    let before_midnight = Utc.with_ymd_and_hms(2024, 3, 31, 23, 59, 0).unwrap();
    let at = |seconds: i64| before_midnight + chrono::Duration::seconds(seconds);
    store.top_up("acct", credits(10)).await.unwrap();
    let limits = [Period::Day, Period::Week, Period::Month].map(|period| KeyLimit {
        limit_nanos: credits(1),
        reset: Some(period),
        include_byok: false,
    });
    let hold = |id: &str, key: &str, amount_nanos: i64, limit: KeyLimit| ReserveRequest {
        key: key.into(),
        covered_by_balance: true,
        ..reservation(id, amount_nanos, Some(limit))
    };
    let settled = |id: &str, key: &str, cost_nanos: i64| Settlement {
        key: key.into(),
        ..granted(id, cost_nanos)
    };
    for (index, limit) in limits.into_iter().enumerate() {
        let key = format!("key-{index}");
        let (late, on_time, filler) = (
            format!("late-{index}"),
            format!("on-time-{index}"),
            format!("filler-{index}"),
        );
        for id in [&late, &on_time] {
            let outcome = store
                .reserve(&hold(id, &key, credits(1) / 4, limit), at(0))
                .await
                .unwrap();
            assert!(outcome.is_reserved(), "{id}: {outcome:?}");
        }
        // After midnight, on time: it counts before midnight.
        store
            .settle(&settled(&on_time, &key, credits(1) / 5), at(30))
            .await
            .unwrap();
        // The other hold lapses unsettled (its instance stopped), charged
        // before midnight too; the new period is free to be filled.
        let lapsed = store.key_usage("acct", &key, at(61)).await.unwrap();
        assert_eq!(
            (lapsed.total_nanos, lapsed.in_period(limit.reset, false)),
            (credits(1) / 5 + credits(1) / 4, 0),
            "{limit:?}"
        );
        let outcome = store
            .reserve(&hold(&filler, &key, credits(1), limit), at(62))
            .await
            .unwrap();
        assert!(outcome.is_reserved(), "{limit:?}: {outcome:?}");
        store
            .settle(&settled(&filler, &key, credits(1)), at(63))
            .await
            .unwrap();
        // The lapsed request's settlement comes at last and replaces its
        // lapse's charge, in the period that held it: the new one stays
        // at its limit, not past it.
        store
            .settle(&settled(&late, &key, credits(1) / 2), at(64))
            .await
            .unwrap();
        let usage = store.key_usage("acct", &key, at(65)).await.unwrap();
        assert_eq!(
            (usage.total_nanos, usage.in_period(limit.reset, false)),
            (credits(1) / 5 + credits(1) + credits(1) / 2, credits(1)),
            "{limit:?}"
        );
    }
}

async fn a_renewed_hold_lasts_as_long_as_its_request<S: Store>(store: Arc<S>) {
    // A stream far longer than the hold's lifetime: renewed every 20 s,
    // its hold keeps counting, so the balance is never promised twice.
    store.top_up("acct", credits(5)).await.unwrap();
    assert!(
        store
            .reserve(&paid_hold("long", credits(4), None), t0())
            .await
            .unwrap()
            .is_reserved()
    );
    let renewal = |id: &str| HoldRenewal {
        key: "key-hash".into(),
        reservation_id: id.into(),
    };
    let ttl = Duration::from_secs(60);
    for tick in 1..=30 {
        let now = after(tick * 20 * SECOND);
        let renewed = store
            .renew_holds("acct", &[renewal("long"), renewal("unknown")], ttl, now)
            .await
            .unwrap();
        assert_eq!(renewed, 1, "tick {tick}");
        assert!(matches!(
            store
                .reserve(&paid_hold(&format!("other-{tick}"), credits(2), None), now)
                .await
                .unwrap(),
            ReserveOutcome::BalanceInsufficient { .. }
        ));
    }
    // Ten minutes in, nothing charged, the hold still held.
    let end = after(600 * SECOND + 1);
    assert_eq!(
        account_totals(&*store, end).await,
        (0, credits(4), credits(5))
    );
    store
        .settle(&granted("long", credits(3)), end)
        .await
        .unwrap();
    assert_eq!(
        account_totals(&*store, end).await,
        (credits(3), 0, credits(2))
    );
    // Settled: nothing left to renew, and a renewal brings nothing back.
    assert_eq!(
        store
            .renew_holds("acct", &[renewal("long")], ttl, end)
            .await
            .unwrap(),
        0
    );
    // A hold renewed no more (its instance died) lapses a lifetime after
    // its last renewal, charged in full; a renewal then is too late.
    assert!(
        store
            .reserve(&paid_hold("orphan", credits(1), None), end)
            .await
            .unwrap()
            .is_reserved()
    );
    let renewed_at = end + chrono::Duration::seconds(20);
    store
        .renew_holds("acct", &[renewal("orphan")], ttl, renewed_at)
        .await
        .unwrap();
    let still = renewed_at + chrono::Duration::seconds(59);
    assert_eq!(
        account_totals(&*store, still).await,
        (credits(3), credits(1), credits(2))
    );
    let lapsed = renewed_at + chrono::Duration::seconds(60);
    assert_eq!(
        store
            .renew_holds("acct", &[renewal("orphan")], ttl, lapsed)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        account_totals(&*store, lapsed).await,
        (credits(4), 0, credits(1))
    );
    // A renewal never shortens a hold.
    assert!(
        store
            .reserve(&paid_hold("short", credits(1), None), lapsed)
            .await
            .unwrap()
            .is_reserved()
    );
    store
        .renew_holds("acct", &[renewal("short")], Duration::from_secs(1), lapsed)
        .await
        .unwrap();
    let soon = lapsed + chrono::Duration::seconds(30);
    assert_eq!(account_totals(&*store, soon).await.1, credits(1));
    // A hold that lapsed while its request went on (its instance cut off
    // from the store for longer than the hold) keeps its charge known for
    // as long as renewals ask for it: its settlement, two days on, still
    // replaces it.
    store.top_up("acct", credits(5)).await.unwrap();
    assert!(
        store
            .reserve(&paid_hold("cut-off", credits(1), None), soon)
            .await
            .unwrap()
            .is_reserved()
    );
    let cut_off_lapsed = soon + chrono::Duration::seconds(61);
    let (used, _, balance) = account_totals(&*store, cut_off_lapsed).await;
    for hours in [20, 40] {
        let renewed = store
            .renew_holds(
                "acct",
                &[renewal("cut-off")],
                ttl,
                cut_off_lapsed + chrono::Duration::hours(hours),
            )
            .await
            .unwrap();
        assert_eq!(renewed, 0);
    }
    let settled_at = cut_off_lapsed + chrono::Duration::hours(48);
    store
        .settle(&granted("cut-off", credits(1) / 4), settled_at)
        .await
        .unwrap();
    assert_eq!(
        account_totals(&*store, settled_at).await,
        (
            used - credits(1) + credits(1) / 4,
            0,
            balance + credits(1) - credits(1) / 4
        )
    );
    // Invalid lifetimes are refused.
    for bad in [Duration::ZERO, Duration::from_secs(366 * 86_400)] {
        assert!(
            store
                .renew_holds("acct", &[renewal("short")], bad, soon)
                .await
                .is_err()
        );
    }
}

async fn a_lapse_leaves_a_generation_record_its_settlement_replaces<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(10)).await.unwrap();
    let keeping = RecordKeeping {
        retention: Duration::from_secs(3600),
        max_per_account: 100,
        model: None,
    };
    let with_record = |id: &str, key: &str| ReserveRequest {
        key: key.into(),
        // The orphan's record names its model (one with a slash and a
        // colon, written as it is on every store).
        lapse_record: Some(RecordKeeping {
            model: (id == "orphan").then(|| "openai/gpt-4o:free".to_owned()),
            ..keeping.clone()
        }),
        ..paid_hold(id, credits(2), None)
    };
    let byok = ReserveRequest {
        covered_by_balance: false,
        ..with_record("byok-orphan", "key-b")
    };
    for request in [
        with_record("orphan", "key-a"),
        with_record("late", "key-a"),
        byok,
    ] {
        assert!(store.reserve(&request, t0()).await.unwrap().is_reserved());
    }
    // A hold without the setting leaves no record.
    assert!(
        store
            .reserve(&paid_hold("silent", credits(1), None), t0())
            .await
            .unwrap()
            .is_reserved()
    );
    let lapsed_at = after(61 * SECOND);
    store.key_usage("acct", "key-a", lapsed_at).await.unwrap();
    store.key_usage("acct", "key-b", lapsed_at).await.unwrap();
    store
        .key_usage("acct", "key-hash", lapsed_at)
        .await
        .unwrap();
    let record = |bytes: Option<bytes::Bytes>| -> serde_json::Value {
        serde_json::from_slice(&bytes.expect("a record")).unwrap()
    };
    let orphan = record(store.generation("acct", "orphan", lapsed_at).await.unwrap());
    assert_eq!(orphan["id"], "gen-orphan");
    assert_eq!(orphan["total_cost"], 2);
    assert_eq!(orphan["usage"], 2);
    assert_eq!(orphan["cost_basis"], "lapsed");
    assert_eq!(orphan["lapsed"], true);
    assert_eq!(orphan["is_byok"], false);
    assert_eq!(orphan["user_id"], "acct");
    assert_eq!(orphan["key_hash"], "key-a");
    assert_eq!(
        orphan["created_at"],
        lapsed_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    let byok = record(
        store
            .generation("acct", "byok-orphan", lapsed_at)
            .await
            .unwrap(),
    );
    assert_eq!(byok["is_byok"], true);
    assert!(
        store
            .generation("acct", "silent", lapsed_at)
            .await
            .unwrap()
            .is_none()
    );
    // Each backend writes the same record, to the byte.
    assert_eq!(
        store.generation("acct", "orphan", lapsed_at).await.unwrap(),
        Some(modelgate::store::lapse_record(
            "acct",
            "key-a",
            "orphan",
            credits(2),
            false,
            lapsed_at,
            Some("openai/gpt-4o:free"),
        ))
    );
    // The late settlement's own record replaces the lapse's.
    let late = with_record_of(
        Settlement {
            key: "key-a".into(),
            ..granted("late", credits(1))
        },
        r#"{"id":"gen-late","total_cost":1}"#,
    );
    store.settle(&late, lapsed_at).await.unwrap();
    assert_eq!(
        record(store.generation("acct", "late", lapsed_at).await.unwrap())["total_cost"],
        1
    );
    // Balance: 10 - 2 (orphan) - 1 (late, replaced) - 1 (silent).
    let balance = store.account_balance("acct").await.unwrap().balance_nanos;
    assert_eq!(balance, credits(6));
    let usage = store.key_usage("acct", "key-b", lapsed_at).await.unwrap();
    assert_eq!(usage.byok_total_nanos, credits(2));
}

fn with_record_of(settlement: Settlement, body: &str) -> Settlement {
    with_record(settlement, body, 3600, 100)
}

async fn a_key_s_own_terms_decide_its_admission<S: Store>(store: Arc<S>) {
    // Once the store keeps a key's terms, every admission decides by them
    // and by its own clock, whatever limit the request carries (an
    // instance's copy of the key, up to a second old).
    store.top_up("acct", credits(100)).await.unwrap();
    let terms = KeyTerms {
        limit: Some(KeyLimit {
            limit_nanos: credits(3),
            reset: Some(Period::Day),
            include_byok: false,
        }),
        expires_at: Some(after(3600 * SECOND)),
    };
    store
        .set_key_terms("acct", "key-hash", &terms)
        .await
        .unwrap();
    let stale = KeyLimit {
        limit_nanos: credits(10),
        reset: None,
        include_byok: false,
    };
    assert_eq!(
        store
            .reserve(&reservation("a", credits(4), Some(stale)), t0())
            .await
            .unwrap(),
        ReserveOutcome::KeyLimitReached {
            used_nanos: 0,
            limit_nanos: credits(3),
            resets_at: Some(Utc.with_ymd_and_hms(2024, 1, 2, 0, 0, 0).unwrap()),
        }
    );
    assert!(
        store
            .reserve(&reservation("b", credits(2), None), t0())
            .await
            .unwrap()
            .is_reserved()
    );
    assert!(matches!(
        store
            .reserve(&reservation("c", credits(2), None), t0())
            .await
            .unwrap(),
        ReserveOutcome::KeyLimitReached { .. }
    ));
    // BYOK usage the limit leaves out is not bounded by it.
    let uncounted = ReserveRequest {
        counts_against_key_limit: false,
        ..reservation("d", credits(2), None)
    };
    assert!(store.reserve(&uncounted, t0()).await.unwrap().is_reserved());
    // Past its expiry by the store's clock: refused, and nothing counted.
    let expiry = after(3600 * SECOND);
    let checks = vec![Check::new("rpm", rolling(10, 60), 1)];
    let outcome = store
        .admit(
            &admission(checks.clone(), Some(reservation("e", 1, None))),
            expiry,
        )
        .await
        .unwrap();
    assert!(!outcome.admitted);
    assert_eq!(
        outcome.hold,
        Some(ReserveOutcome::KeyExpired { expired_at: expiry })
    );
    assert_eq!(outcome.checks[0].used, 0);
    // New terms replace the old at once: no limit, no expiry.
    store
        .set_key_terms("acct", "key-hash", &KeyTerms::default())
        .await
        .unwrap();
    let outcome = store
        .admit(
            &admission(checks, Some(reservation("f", credits(50), Some(stale)))),
            expiry,
        )
        .await
        .unwrap();
    assert!(outcome.admitted, "{outcome:?}");
    // Invalid terms are refused.
    let negative = KeyTerms {
        limit: Some(KeyLimit {
            limit_nanos: -1,
            reset: None,
            include_byok: false,
        }),
        expires_at: None,
    };
    assert!(
        store
            .set_key_terms("acct", "key-hash", &negative)
            .await
            .is_err()
    );
}

async fn every_ledger_call_lapses_what_has_expired_alike<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(10)).await.unwrap();
    let keeping = RecordKeeping {
        retention: Duration::from_secs(3600),
        max_per_account: 100,
        model: None,
    };
    let orphan = ReserveRequest {
        lapse_record: Some(keeping.clone()),
        ..paid_hold("orphan", credits(1), None)
    };
    assert!(store.reserve(&orphan, t0()).await.unwrap().is_reserved());
    let lapsed_at = after(61 * SECOND);
    // A read of a key the account never used lapses the account's side.
    let other = store
        .key_usage("acct", "never-used", lapsed_at)
        .await
        .unwrap();
    assert_eq!(other.total_nanos, 0);
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        credits(9)
    );
    // An admission its counters refuse still lapses its key's side first.
    let full = Check::new("full", rolling(0, 60), 1);
    let refused = store
        .admit(
            &admission(vec![full], Some(paid_hold("refused", credits(1), None))),
            lapsed_at,
        )
        .await
        .unwrap();
    assert!(!refused.admitted);
    assert!(
        store
            .generation("acct", "orphan", lapsed_at)
            .await
            .unwrap()
            .is_some()
    );
    let usage = store
        .key_usage("acct", "key-hash", lapsed_at)
        .await
        .unwrap();
    assert_eq!((usage.total_nanos, usage.reserved_nanos), (credits(1), 0));
    // Its settlement as never sent gives the charge back, and its record
    // goes with it.
    store
        .settle(&granted("orphan", 0), lapsed_at)
        .await
        .unwrap();
    assert!(
        store
            .generation("acct", "orphan", lapsed_at)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        account_totals(&*store, lapsed_at).await,
        (0, 0, credits(10))
    );
    // Usage uncounted by the limit is answered all time, own only.
    let terms = KeyTerms {
        limit: Some(KeyLimit {
            limit_nanos: credits(100),
            reset: Some(Period::Day),
            include_byok: true,
        }),
        expires_at: None,
    };
    store
        .set_key_terms("acct", "key-hash", &terms)
        .await
        .unwrap();
    store
        .settle(&granted("yesterday", credits(2)), lapsed_at)
        .await
        .unwrap();
    let tomorrow = Utc.with_ymd_and_hms(2024, 1, 2, 0, 0, 0).unwrap();
    let uncounted = ReserveRequest {
        counts_against_key_limit: false,
        ..reservation("uncounted", 0, None)
    };
    assert_eq!(
        store.reserve(&uncounted, tomorrow).await.unwrap(),
        ReserveOutcome::Reserved {
            used_nanos: credits(2),
            reserved_nanos: 0,
            held_nanos: 0,
        }
    );
}

async fn ledger_periods_only_roll_forward<S: Store>(store: Arc<S>) {
    let midnight = Utc.with_ymd_and_hms(2024, 1, 2, 0, 0, 0).unwrap();
    let just_before = midnight - chrono::Duration::microseconds(1);
    store
        .settle(&settlement("new", 5, false), midnight)
        .await
        .unwrap();
    // A settlement stamped a moment earlier arrives late: it must not wipe
    // the new day's usage, and it still counts all-time.
    store
        .settle(&settlement("late", 7, true), just_before)
        .await
        .unwrap();
    store
        .settle(&settlement("late2", 11, false), just_before)
        .await
        .unwrap();
    let usage = store.key_usage("acct", "key-hash", midnight).await.unwrap();
    assert_eq!(
        (usage.day_nanos, usage.week_nanos, usage.month_nanos),
        (5, 16, 16)
    );
    assert_eq!(
        (
            usage.total_nanos,
            usage.byok_total_nanos,
            usage.byok_day_nanos
        ),
        (16, 7, 0)
    );
    assert_eq!(usage.byok_week_nanos, 7);
}

async fn ledger_limits_are_exact_beyond_two_to_the_53<S: Store>(store: Arc<S>) {
    let limit_nanos = 1i64 << 60;
    let limit = KeyLimit {
        limit_nanos,
        reset: None,
        include_byok: false,
    };
    store.top_up("acct", limit_nanos).await.unwrap();
    store
        .settle(&settlement("big", limit_nanos - 2, false), t0())
        .await
        .unwrap();
    // One nano-credit short of the limit: a double would round it up and reject.
    let first = store
        .reserve(&reservation("r1", 1, Some(limit)), t0())
        .await
        .unwrap();
    assert_eq!(
        first,
        ReserveOutcome::Reserved {
            used_nanos: limit_nanos - 2,
            reserved_nanos: 1,
            held_nanos: 1,
        }
    );
    let second = store
        .reserve(&reservation("r2", 1, Some(limit)), t0())
        .await
        .unwrap();
    assert_eq!(
        second,
        ReserveOutcome::Reserved {
            used_nanos: limit_nanos - 2,
            reserved_nanos: 2,
            held_nanos: 1,
        }
    );
    let third = store
        .reserve(&reservation("r3", 1, Some(limit)), t0())
        .await
        .unwrap();
    assert_eq!(
        third,
        ReserveOutcome::KeyLimitReached {
            used_nanos: limit_nanos,
            limit_nanos,
            resets_at: None
        }
    );
    // Reserving an id again replaces its amount.
    let again = store
        .reserve(
            &reservation(
                "r1",
                0,
                Some(KeyLimit {
                    limit_nanos: i64::MAX,
                    ..limit
                }),
            ),
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(
        again,
        ReserveOutcome::Reserved {
            used_nanos: limit_nanos - 2,
            reserved_nanos: 1,
            held_nanos: 0,
        }
    );
    let usage = store.key_usage("acct", "key-hash", t0()).await.unwrap();
    assert_eq!(
        (usage.total_nanos, usage.reserved_nanos),
        (limit_nanos - 2, 1)
    );
    assert!(
        store
            .reserve(
                &reservation(
                    "bad",
                    1,
                    Some(KeyLimit {
                        limit_nanos: -1,
                        ..limit
                    })
                ),
                t0()
            )
            .await
            .is_err()
    );
    let forever = ReserveRequest {
        ttl: Duration::MAX,
        ..reservation("ttl", 1, None)
    };
    assert!(store.reserve(&forever, t0()).await.is_err());
}

async fn concurrent_reservations_admit_exactly_the_limit<S: Store>(store: Arc<S>) {
    let limit = KeyLimit {
        limit_nanos: credits(10),
        reset: Some(Period::Month),
        include_byok: false,
    };
    let handles: Vec<_> = (0..100)
        .map(|index| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let outcome = store
                    .reserve(
                        &reservation(&format!("r{index}"), credits(1), Some(limit)),
                        t0(),
                    )
                    .await
                    .unwrap();
                matches!(outcome, ReserveOutcome::Reserved { .. })
            })
        })
        .collect();
    let mut reserved = 0;
    for handle in handles {
        reserved += usize::from(handle.await.unwrap());
    }
    assert_eq!(reserved, 10);
    assert_eq!(
        store
            .key_usage("acct", "key-hash", t0())
            .await
            .unwrap()
            .reserved_nanos,
        credits(10)
    );
}

fn of_key(key: &str, settlement: Settlement) -> Settlement {
    Settlement {
        key: key.into(),
        ..settlement
    }
}

async fn settled_totals<S: Store>(store: &S, key: &str) -> (i64, i64, i64) {
    let usage = store.key_usage("acct", key, t0()).await.unwrap();
    (
        usage.total_nanos,
        usage.byok_total_nanos,
        usage.reserved_nanos,
    )
}

async fn settlements_of_one_account_go_together_each_once<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(100)).await.unwrap();
    for (key, id) in [("key-hash", "a"), ("other-key", "b"), ("key-hash", "c")] {
        let request = ReserveRequest {
            key: key.into(),
            ..reservation(id, credits(5), None)
        };
        store.reserve(&request, t0()).await.unwrap();
    }
    assert_eq!(
        settled_totals(&*store, "key-hash").await,
        (0, 0, credits(10))
    );
    // Three settlements over two keys of one account, one of them BYOK,
    // and the same one twice within the batch: recorded once each.
    let batch = [
        settlement("a", credits(1), false),
        of_key("other-key", settlement("b", credits(2), false)),
        settlement("c", credits(3), true),
        settlement("a", credits(1), false),
    ];
    store.settle_many(&batch, t0()).await.unwrap();
    assert_eq!(
        settled_totals(&*store, "key-hash").await,
        (credits(1), credits(3), 0)
    );
    assert_eq!(
        settled_totals(&*store, "other-key").await,
        (credits(2), 0, 0)
    );
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        credits(97)
    );
    // The batch retried (its reply lost) with a new settlement: only the
    // new one is recorded.
    let mut retried = batch.to_vec();
    retried.push(settlement("d", credits(4), false));
    store.settle_many(&retried, t0()).await.unwrap();
    assert_eq!(
        settled_totals(&*store, "key-hash").await,
        (credits(5), credits(3), 0)
    );
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        credits(93)
    );
    // Each settled on its own afterwards: nothing more either.
    for settlement in &retried {
        store.settle(settlement, t0()).await.unwrap();
    }
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        credits(93)
    );
    // Nothing to settle is nothing to do.
    store.settle_many(&[], t0()).await.unwrap();
    // Another account in the batch, or a negative cost, is refused whole.
    let mixed = [
        settlement("e", credits(1), false),
        Settlement {
            account: "elsewhere".into(),
            ..settlement("f", credits(1), false)
        },
    ];
    let error = store.settle_many(&mixed, t0()).await.unwrap_err();
    assert!(
        matches!(error.kind(), StoreErrorKind::Invalid(_)),
        "{error}"
    );
    let negative = [
        settlement("e", credits(1), false),
        settlement("g", -1, false),
    ];
    let error = store.settle_many(&negative, t0()).await.unwrap_err();
    assert!(
        matches!(error.kind(), StoreErrorKind::Invalid(_)),
        "{error}"
    );
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        credits(93)
    );
    assert_eq!(
        store
            .account_balance("elsewhere")
            .await
            .unwrap()
            .balance_nanos,
        0
    );
}

async fn a_reservation_sees_the_costs_it_carries_not_their_holds<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(10)).await.unwrap();
    let limit = KeyLimit {
        limit_nanos: credits(10),
        reset: Some(Period::Day),
        include_byok: false,
    };
    let held = store
        .reserve(&reservation("a", credits(6), Some(limit)), t0())
        .await
        .unwrap();
    assert!(matches!(held, ReserveOutcome::Reserved { .. }));
    // 6 held of 10: a request that could cost 5 is refused...
    assert!(matches!(
        store
            .reserve(&reservation("b", credits(5), Some(limit)), t0())
            .await
            .unwrap(),
        ReserveOutcome::KeyLimitReached { .. }
    ));
    // ...unless the first one's settlement (2 credits) goes first.
    let outcome = store
        .reserve_after_settling(
            &[settlement("a", credits(2), false)],
            &reservation("b", credits(5), Some(limit)),
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        ReserveOutcome::Reserved {
            used_nanos: credits(2),
            reserved_nanos: credits(5),
            held_nanos: credits(5),
        }
    );
    assert_eq!(
        settled_totals(&*store, "key-hash").await,
        (credits(2), 0, credits(5))
    );
    // Settlements carried by a refused reservation are still recorded, and
    // one carried again (a retry) is not recorded twice: z's 9 credits, on
    // another key of the account, take the balance to -1, so c is refused
    // for the balance.
    let outcome = store
        .reserve_after_settling(
            &[
                settlement("a", credits(2), false),
                of_key("other-key", settlement("z", credits(9), false)),
            ],
            &reservation("c", credits(1), None),
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        ReserveOutcome::BalanceNegative {
            balance_nanos: -credits(1)
        }
    );
    assert_eq!(
        settled_totals(&*store, "other-key").await,
        (credits(9), 0, 0)
    );
    assert_eq!(
        settled_totals(&*store, "key-hash").await,
        (credits(2), 0, credits(5))
    );
    // With nothing to carry it is a plain reservation; another account's
    // settlement is refused and nothing happens.
    store.top_up("acct", credits(10)).await.unwrap();
    assert!(matches!(
        store
            .reserve_after_settling(&[], &reservation("d", credits(1), None), t0())
            .await
            .unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    let foreign = Settlement {
        account: "elsewhere".into(),
        ..settlement("e", credits(1), false)
    };
    let error = store
        .reserve_after_settling(&[foreign], &reservation("f", credits(1), None), t0())
        .await
        .unwrap_err();
    assert!(
        matches!(error.kind(), StoreErrorKind::Invalid(_)),
        "{error}"
    );
    assert_eq!(
        settled_totals(&*store, "key-hash").await,
        (credits(2), 0, credits(6))
    );
    assert_eq!(
        store
            .account_balance("elsewhere")
            .await
            .unwrap()
            .balance_nanos,
        0
    );
}

async fn batched_settlements_and_reservations_stay_exact_under_concurrency<S: Store>(
    store: Arc<S>,
) {
    // 40 callers, each reserving while carrying the settlement of its
    // previous request, against a 100-credit limit: every cost is recorded
    // once, and the limit holds at every step.
    store.top_up("acct", credits(1_000)).await.unwrap();
    let limit = KeyLimit {
        limit_nanos: credits(100),
        reset: None,
        include_byok: false,
    };
    let handles: Vec<_> = (0..40)
        .map(|caller| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut previous: Option<Settlement> = None;
                let mut admitted = 0i64;
                for round in 0..10 {
                    let id = format!("c{caller}r{round}");
                    let carried: Vec<Settlement> = previous.take().into_iter().collect();
                    let outcome = store
                        .reserve_after_settling(
                            &carried,
                            &reservation(&id, credits(2), Some(limit)),
                            t0(),
                        )
                        .await
                        .unwrap();
                    if matches!(outcome, ReserveOutcome::Reserved { .. }) {
                        admitted += 1;
                        previous = Some(settlement(&id, credits(1), false));
                    }
                }
                if let Some(last) = previous {
                    store.settle_many(&[last], t0()).await.unwrap();
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for handle in handles {
        admitted += handle.await.unwrap();
    }
    // Each admitted request costs 1 but holds 2 until settled: at least 50
    // fit; never more than 100 credits are spent.
    let usage = store.key_usage("acct", "key-hash", t0()).await.unwrap();
    assert_eq!(usage.total_nanos, credits(admitted));
    assert_eq!(usage.reserved_nanos, 0);
    assert!((50..=100).contains(&admitted), "{admitted}");
    assert_eq!(
        store.account_balance("acct").await.unwrap().balance_nanos,
        credits(1_000 - admitted)
    );
}

fn paid_hold(id: &str, amount_nanos: i64, least_nanos: Option<i64>) -> ReserveRequest {
    ReserveRequest {
        min_amount_nanos: least_nanos,
        covered_by_balance: true,
        lapse_record: None,
        counts_against_key_limit: true,
        ..reservation(id, amount_nanos, None)
    }
}

fn admission(checks: Vec<Check>, hold: Option<ReserveRequest>) -> AdmitRequest {
    AdmitRequest {
        account: "acct".into(),
        checks,
        purchase_tier: None,
        hold,
    }
}

async fn admission_is_all_or_nothing_across_counters_and_the_hold<S: Store>(store: Arc<S>) {
    let minute = Check::new("minute", rolling(2, 60), 1);
    // Nothing bought: the hold is refused, and the counter counts nothing.
    for _ in 0..3 {
        let outcome = store
            .admit(
                &admission(vec![minute.clone()], Some(paid_hold("a", credits(1), None))),
                t0(),
            )
            .await
            .unwrap();
        assert!(!outcome.admitted);
        assert_eq!(
            outcome.hold,
            Some(ReserveOutcome::BalanceInsufficient {
                balance_nanos: 0,
                held_nanos: 0
            })
        );
        assert_eq!(
            outcome.checks[0].used, 0,
            "a refused request counts nowhere"
        );
    }
    store.top_up("acct", credits(10)).await.unwrap();
    for id in ["b", "c"] {
        let outcome = store
            .admit(
                &admission(vec![minute.clone()], Some(paid_hold(id, credits(1), None))),
                t0(),
            )
            .await
            .unwrap();
        assert!(outcome.admitted);
    }
    // The counter is full: the hold is not even decided, nothing is held.
    let full = store
        .admit(
            &admission(vec![minute.clone()], Some(paid_hold("d", credits(1), None))),
            t0(),
        )
        .await
        .unwrap();
    assert!(!full.admitted);
    assert_eq!(full.hold, None);
    assert!(!full.checks[0].admitted);
    assert_eq!(
        store
            .key_usage("acct", "key-hash", t0())
            .await
            .unwrap()
            .reserved_nanos,
        credits(2)
    );
    // Counters alone work as check_and_add does.
    let other = Check::new("other", rolling(1, 60), 1);
    assert!(
        store
            .admit(&admission(vec![other.clone()], None), t0())
            .await
            .unwrap()
            .admitted
    );
    assert!(
        !store
            .admit(&admission(vec![other], None), t0())
            .await
            .unwrap()
            .admitted
    );
}

async fn a_revoked_key_is_refused_before_its_counters_and_costs_nothing<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(10)).await.unwrap();
    let minute = Check::new("minute", rolling(1, 60), 1);
    let admitted = store
        .admit(
            &admission(vec![minute.clone()], Some(paid_hold("a", credits(1), None))),
            t0(),
        )
        .await
        .unwrap();
    assert!(admitted.admitted);
    let held_before = store.key_usage("acct", "key-hash", t0()).await.unwrap();
    store.revoke_key("acct", "key-hash", t0()).await.unwrap();
    // Idempotent.
    store.revoke_key("acct", "key-hash", t0()).await.unwrap();
    // Refused as revoked even though the counter is full too, free holds
    // (no amount) included; nothing counted, nothing held.
    for (id, amount) in [("b", credits(1)), ("c", 0)] {
        let outcome = store
            .admit(
                &admission(vec![minute.clone()], Some(paid_hold(id, amount, None))),
                t0(),
            )
            .await
            .unwrap();
        assert!(!outcome.admitted);
        assert_eq!(outcome.hold, Some(ReserveOutcome::KeyRevoked));
        assert_eq!(outcome.checks[0].used, 1, "nothing more counted");
    }
    assert_eq!(
        store.key_usage("acct", "key-hash", t0()).await.unwrap(),
        held_before,
        "nothing held"
    );
    // The hold granted before stays until settled; settling still records.
    store
        .settle(&settlement("a", credits(1) / 2, false), t0())
        .await
        .unwrap();
    let usage = store.key_usage("acct", "key-hash", t0()).await.unwrap();
    assert_eq!(
        (usage.total_nanos, usage.reserved_nanos),
        (credits(1) / 2, 0)
    );
    // Another key of the account, and the same key hash in another account,
    // are untouched.
    let other_key = ReserveRequest {
        key: "other-key".into(),
        ..paid_hold("d", credits(1), None)
    };
    assert!(store.reserve(&other_key, t0()).await.unwrap().is_reserved());
    store.top_up("acct2", credits(10)).await.unwrap();
    let other_account = ReserveRequest {
        account: "acct2".into(),
        ..paid_hold("e", credits(1), None)
    };
    assert!(
        store
            .reserve(&other_account, t0())
            .await
            .unwrap()
            .is_reserved()
    );
    assert_eq!(
        store
            .reserve(&paid_hold("f", credits(1), None), t0())
            .await
            .unwrap(),
        ReserveOutcome::KeyRevoked
    );
}

fn with_record(settlement: Settlement, body: &str, retention_secs: u64, most: u64) -> Settlement {
    Settlement {
        record: Some(SettlementRecord {
            bytes: body.to_owned().into(),
            retention: Duration::from_secs(retention_secs),
            max_per_account: most,
        }),
        ..settlement
    }
}

async fn recent<S: Store>(store: &S, account: &str, now: DateTime<Utc>) -> Vec<String> {
    store
        .recent_generations(account, 10, now)
        .await
        .unwrap()
        .into_iter()
        .map(|bytes| String::from_utf8(bytes.to_vec()).unwrap())
        .collect()
}

async fn generation_records_go_with_their_settlement_once_and_expire<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(10)).await.unwrap();
    // A record is kept with its settlement, in one step, also when it goes
    // along with an admission.
    store
        .settle(&with_record(settlement("a", 5, false), "A", 60, 3), t0())
        .await
        .unwrap();
    let admitted = store
        .admit_after_settling(
            &[with_record(settlement("b", 7, false), "B", 60, 3)],
            &admission(Vec::new(), Some(paid_hold("c", credits(1), None))),
            after(1_000_000),
        )
        .await
        .unwrap();
    assert!(admitted.admitted);
    let read = |id: &'static str, at| {
        let store = Arc::clone(&store);
        async move {
            store
                .generation("acct", id, at)
                .await
                .unwrap()
                .map(|bytes| String::from_utf8(bytes.to_vec()).unwrap())
        }
    };
    assert_eq!(read("a", after(2_000_000)).await.as_deref(), Some("A"));
    assert_eq!(read("b", after(2_000_000)).await.as_deref(), Some("B"));
    // Another account, an unknown id: nothing.
    assert_eq!(
        store
            .generation("acct2", "a", after(2_000_000))
            .await
            .unwrap(),
        None
    );
    assert_eq!(read("zz", after(2_000_000)).await, None);
    // A settlement retried records nothing more: neither cost nor record.
    store
        .settle(
            &with_record(settlement("a", 5, false), "A again", 60, 3),
            after(3_000_000),
        )
        .await
        .unwrap();
    assert_eq!(read("a", after(3_000_000)).await.as_deref(), Some("A"));
    assert_eq!(settled_totals(&*store, "key-hash").await.0, 12);
    // Newest first; the oldest goes past the cap.
    store
        .settle_many(
            &[
                with_record(settlement("d", 1, false), "D", 60, 3),
                with_record(settlement("e", 1, false), "E", 60, 3),
            ],
            after(4_000_000),
        )
        .await
        .unwrap();
    assert_eq!(
        recent(&*store, "acct", after(4_000_000)).await,
        ["E", "D", "B"]
    );
    assert_eq!(
        read("a", after(4_000_000)).await,
        None,
        "the oldest, past the cap"
    );
    // A settlement without a record keeps none, and costs as before.
    store
        .settle(&settlement("f", 1, false), after(5_000_000))
        .await
        .unwrap();
    assert_eq!(read("f", after(5_000_000)).await, None);
    // Records end with their retention.
    assert_eq!(read("b", after(60_999_999)).await.as_deref(), Some("B"));
    assert_eq!(read("b", after(61_000_000)).await, None);
    assert_eq!(recent(&*store, "acct", after(61_000_000)).await, ["E", "D"]);
    assert_eq!(
        recent(&*store, "acct", after(64_000_000)).await,
        Vec::<String>::new()
    );
    assert_eq!(
        store.recent_generations("acct", 0, t0()).await.unwrap(),
        Vec::<bytes::Bytes>::new()
    );
    // A bad retention or cap is refused, and nothing is recorded.
    for bad in [
        with_record(settlement("g", 1, false), "G", 0, 3),
        with_record(settlement("g", 1, false), "G", 60, 0),
    ] {
        assert!(store.settle(&bad, after(65_000_000)).await.is_err());
    }
    assert_eq!(read("g", after(65_000_000)).await, None);
}

/// The ids of a page of `account`'s records (their bodies are their ids).
async fn page<S: Store>(
    store: &S,
    key: Option<&str>,
    skip: usize,
    limit: usize,
    now: DateTime<Utc>,
) -> Vec<String> {
    store
        .generations_page("acct", GenerationsPage { key, skip, limit }, now)
        .await
        .unwrap()
        .into_iter()
        .map(|bytes| String::from_utf8(bytes.to_vec()).unwrap())
        .collect()
}

async fn a_keys_page_holds_its_own_records_newest_first_within_the_cap<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(10)).await.unwrap();
    let of_key = |id: &str, key: &str| Settlement {
        key: key.into(),
        ..with_record(settlement(id, 1, false), id, 60, 6)
    };
    // r0..r9, a second apart; even ones by key-a, odd ones by key-b.
    for n in 0..10 {
        let key = if n % 2 == 0 { "key-a" } else { "key-b" };
        store
            .settle(&of_key(&format!("r{n}"), key), after(n * SECOND))
            .await
            .unwrap();
    }
    let now = after(10 * SECOND);
    // The account keeps its newest 6 (r4..r9): a key's page is its own
    // among them, whatever else the other key wrote.
    assert_eq!(
        page(&*store, None, 0, 20, now).await,
        ["r9", "r8", "r7", "r6", "r5", "r4"]
    );
    assert_eq!(
        page(&*store, Some("key-a"), 0, 20, now).await,
        ["r8", "r6", "r4"]
    );
    assert_eq!(
        page(&*store, Some("key-b"), 0, 20, now).await,
        ["r9", "r7", "r5"]
    );
    assert_eq!(page(&*store, Some("key-a"), 1, 1, now).await, ["r6"]);
    assert_eq!(
        page(&*store, Some("key-a"), 3, 5, now).await,
        Vec::<String>::new()
    );
    assert_eq!(page(&*store, None, 2, 2, now).await, ["r7", "r6"]);
    assert_eq!(page(&*store, None, 5, 9, now).await, ["r4"]);
    assert_eq!(
        page(&*store, Some("key-c"), 0, 20, now).await,
        Vec::<String>::new()
    );
    assert_eq!(
        page(&*store, Some("key-a"), 0, 0, now).await,
        Vec::<String>::new()
    );
    // A lapse's record is its key's; a late settlement without a record
    // takes it off that key's page too.
    let lapsing = ReserveRequest {
        key: "key-b".into(),
        lapse_record: Some(RecordKeeping {
            retention: Duration::from_secs(60),
            max_per_account: 6,
            model: None,
        }),
        ttl: Duration::from_secs(1),
        ..paid_hold("late", credits(1), None)
    };
    assert!(store.reserve(&lapsing, now).await.unwrap().is_reserved());
    let lapsed = after(12 * SECOND);
    store.key_usage("acct", "key-b", lapsed).await.unwrap();
    let newest_of_b = page(&*store, Some("key-b"), 0, 1, lapsed).await;
    assert_eq!(newest_of_b.len(), 1);
    assert!(
        newest_of_b[0].contains("\"lapsed\":true"),
        "{newest_of_b:?}"
    );
    assert_eq!(
        page(&*store, Some("key-a"), 0, 20, lapsed).await,
        ["r8", "r6"]
    );
    store
        .settle(
            &Settlement {
                key: "key-b".into(),
                hold_granted: true,
                ..settlement("late", 1, false)
            },
            after(13 * SECOND),
        )
        .await
        .unwrap();
    assert_eq!(
        page(&*store, Some("key-b"), 0, 20, after(13 * SECOND)).await,
        ["r9", "r7", "r5"]
    );
    // Records end with their retention, on every page.
    let later = after(65 * SECOND + 500_000);
    assert_eq!(
        page(&*store, None, 0, 20, later).await,
        ["r9", "r8", "r7", "r6"]
    );
    assert_eq!(
        page(&*store, Some("key-a"), 0, 20, later).await,
        ["r8", "r6"]
    );
    assert_eq!(
        page(&*store, Some("key-b"), 0, 20, later).await,
        ["r9", "r7"]
    );

    // Records written past the cap within a tidying's interval wait for it
    // unseen, on every page.
    store.top_up("capped", credits(10)).await.unwrap();
    let capped = |id: &str, key: &str| Settlement {
        account: "capped".into(),
        key: key.into(),
        ..with_record(settlement(id, 1, false), id, 60, 3)
    };
    store
        .settle(&capped("c0", "key-a"), after(70 * SECOND))
        .await
        .unwrap();
    store
        .settle_many(
            &[
                capped("c1", "key-b"),
                capped("c2", "key-a"),
                capped("c3", "key-b"),
                capped("c4", "key-a"),
            ],
            after(70 * SECOND + 1),
        )
        .await
        .unwrap();
    let capped_page = |key| {
        let store = Arc::clone(&store);
        async move {
            let page = GenerationsPage {
                key,
                skip: 0,
                limit: 10,
            };
            store
                .generations_page("capped", page, after(70 * SECOND + 2))
                .await
                .unwrap()
                .into_iter()
                .map(|bytes| String::from_utf8(bytes.to_vec()).unwrap())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(capped_page(None).await, ["c4", "c3", "c2"]);
    assert_eq!(capped_page(Some("key-a")).await, ["c4", "c2"]);
    assert_eq!(capped_page(Some("key-b")).await, ["c3"]);
}

fn app_row(app: &str, model: &str, requests: u64, tokens: u64) -> AppUsage {
    AppUsage {
        app: app.into(),
        details: format!("{{\"title\":\"{app}\"}}"),
        model: model.into(),
        requests,
        tokens,
    }
}

async fn app_rows<S: Store>(
    store: &S,
    scope: &str,
    period: Period,
    now: DateTime<Utc>,
) -> Vec<(String, String, u64, u64)> {
    let mut rows: Vec<_> = store
        .app_usage(scope, period, now)
        .await
        .unwrap()
        .into_iter()
        .map(|row| {
            assert_eq!(row.details, format!("{{\"title\":\"{}\"}}", row.app));
            (row.app, row.model, row.requests, row.tokens)
        })
        .collect();
    rows.sort();
    rows
}

async fn app_usage_counts_per_period_and_rolls_forward<S: Store>(store: Arc<S>) {
    // Wednesday 2024-01-31 23:00 UTC: the day ends in an hour, the month too,
    // the week on Monday.
    let wednesday = Utc.with_ymd_and_hms(2024, 1, 31, 23, 0, 0).unwrap();
    store
        .add_app_usage(
            "*",
            &[
                app_row("a.example", "m1", 1, 10),
                app_row("a.example", "m2", 2, 20),
            ],
            wednesday,
        )
        .await
        .unwrap();
    store
        .add_app_usage(
            "*",
            &[app_row("a.example", "m1", 1, 5), app_row("b", "m1", 1, 1)],
            wednesday,
        )
        .await
        .unwrap();
    let expected = vec![
        ("a.example".to_owned(), "m1".to_owned(), 2, 15),
        ("a.example".to_owned(), "m2".to_owned(), 2, 20),
        ("b".to_owned(), "m1".to_owned(), 1, 1),
    ];
    for period in [Period::Day, Period::Week, Period::Month] {
        assert_eq!(app_rows(&*store, "*", period, wednesday).await, expected);
    }
    // Scopes are apart.
    assert!(
        app_rows(&*store, "acct", Period::Day, wednesday)
            .await
            .is_empty()
    );
    // The next day (and month): only the week goes on.
    let thursday = wednesday + chrono::Duration::hours(2);
    store
        .add_app_usage("*", &[app_row("b", "m1", 1, 4)], thursday)
        .await
        .unwrap();
    let only_b = vec![("b".to_owned(), "m1".to_owned(), 1, 4)];
    assert_eq!(app_rows(&*store, "*", Period::Day, thursday).await, only_b);
    assert_eq!(
        app_rows(&*store, "*", Period::Month, thursday).await,
        only_b
    );
    let week = app_rows(&*store, "*", Period::Week, thursday).await;
    assert_eq!(week[2], ("b".to_owned(), "m1".to_owned(), 2, 5));
    // A write stamped in the day that has rolled over counts nowhere.
    store
        .add_app_usage("*", &[app_row("c", "m1", 1, 1)], wednesday)
        .await
        .unwrap();
    assert_eq!(app_rows(&*store, "*", Period::Day, thursday).await, only_b);
    // Nothing read for a period not written yet.
    let next_week = thursday + chrono::Duration::days(7);
    assert!(
        app_rows(&*store, "*", Period::Week, next_week)
            .await
            .is_empty()
    );
    // Bad rows are refused whole.
    let bad = [app_row("", "m1", 1, 1), app_row("x\u{1f}y", "m1", 1, 1)];
    for row in bad {
        assert!(store.add_app_usage("*", &[row], thursday).await.is_err());
    }
}

async fn app_usage_keeps_at_most_its_rows<S: Store>(store: Arc<S>) {
    let rows: Vec<AppUsage> = (0..MAX_APP_USAGE_ROWS + 5)
        .map(|index| app_row(&format!("app{index}"), "m", 1, 1))
        .collect();
    for chunk in rows.chunks(1000) {
        store.add_app_usage("*", chunk, t0()).await.unwrap();
    }
    let counted = store.app_usage("*", Period::Day, t0()).await.unwrap();
    assert_eq!(counted.len(), MAX_APP_USAGE_ROWS);
    // A row already counted goes on counting.
    store
        .add_app_usage(
            "*",
            &[app_row("app0", "m", 1, 1), app_row("new", "m", 1, 1)],
            t0(),
        )
        .await
        .unwrap();
    let counted = store.app_usage("*", Period::Day, t0()).await.unwrap();
    assert_eq!(counted.len(), MAX_APP_USAGE_ROWS);
    assert!(
        counted
            .iter()
            .any(|row| row.app == "app0" && row.requests == 2)
    );
}

async fn the_balance_bounds_the_account_holds<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(5)).await.unwrap();
    // Holds on two keys of the account draw on the one balance.
    let mut on_other_key = paid_hold("k2-a", credits(2), None);
    on_other_key.key = "other-key".into();
    assert!(
        store
            .reserve(&on_other_key, t0())
            .await
            .unwrap()
            .is_reserved()
    );
    assert!(
        store
            .reserve(&paid_hold("a", credits(2), None), t0())
            .await
            .unwrap()
            .is_reserved()
    );
    assert_eq!(
        store
            .reserve(&paid_hold("b", credits(2), None), t0())
            .await
            .unwrap(),
        ReserveOutcome::BalanceInsufficient {
            balance_nanos: credits(5),
            held_nanos: credits(4)
        }
    );
    // A flexible hold takes what is left, down to its least amount.
    assert_eq!(
        store
            .reserve(&paid_hold("c", credits(2), Some(credits(1) / 2)), t0())
            .await
            .unwrap(),
        ReserveOutcome::Reserved {
            used_nanos: 0,
            reserved_nanos: credits(3),
            held_nanos: credits(1),
        }
    );
    assert!(matches!(
        store
            .reserve(&paid_hold("d", credits(2), Some(1)), t0())
            .await
            .unwrap(),
        ReserveOutcome::BalanceInsufficient { .. }
    ));
    // A settlement frees its hold; the balance pays the real cost.
    store
        .settle(
            &of_key("other-key", settlement("k2-a", credits(1), false)),
            t0(),
        )
        .await
        .unwrap();
    let balance = store.account_balance("acct").await.unwrap();
    assert_eq!(balance.balance_nanos, credits(4));
    assert!(
        store
            .reserve(&paid_hold("e", credits(1), None), t0())
            .await
            .unwrap()
            .is_reserved()
    );
    // A BYOK hold (not covered by the balance) is not bounded by it.
    let byok = ReserveRequest {
        covered_by_balance: false,
        lapse_record: None,
        counts_against_key_limit: true,
        ..paid_hold("f", credits(100), None)
    };
    assert!(store.reserve(&byok, t0()).await.unwrap().is_reserved());
    // Holds that reach their expiry unsettled (their instance died) lapse,
    // charged in full: the balance has paid a, c and e, and nothing is left.
    let later = after(61 * SECOND);
    assert_eq!(
        store
            .reserve(&paid_hold("g", credits(1), None), later)
            .await
            .unwrap(),
        ReserveOutcome::BalanceInsufficient {
            balance_nanos: 0,
            held_nanos: 0
        }
    );
    // A late settlement gives back what its request did not use.
    store
        .settle(&granted("a", credits(1) / 2), later)
        .await
        .unwrap();
    let balance = store.account_balance("acct").await.unwrap();
    assert_eq!(balance.balance_nanos, credits(3) / 2);
    assert!(
        store
            .reserve(&paid_hold("g", credits(3) / 2, None), later)
            .await
            .unwrap()
            .is_reserved()
    );
    // The BYOK hold lapsed into the key's BYOK usage, not the balance.
    let usage = store.key_usage("acct", "key-hash", later).await.unwrap();
    assert_eq!(usage.byok_total_nanos, credits(100));
}

async fn a_flexible_hold_takes_what_the_key_limit_leaves<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(100)).await.unwrap();
    let limit = KeyLimit {
        limit_nanos: credits(3),
        reset: None,
        include_byok: false,
    };
    let hold = |id: &str, amount: i64, least: Option<i64>| ReserveRequest {
        key_limit: Some(limit),
        ..paid_hold(id, amount, least)
    };
    assert!(
        store
            .reserve(&hold("a", credits(2), None), t0())
            .await
            .unwrap()
            .is_reserved()
    );
    assert_eq!(
        store
            .reserve(&hold("b", credits(2), Some(1)), t0())
            .await
            .unwrap(),
        ReserveOutcome::Reserved {
            used_nanos: 0,
            reserved_nanos: credits(3),
            held_nanos: credits(1),
        }
    );
    assert!(matches!(
        store
            .reserve(&hold("c", credits(2), Some(1)), t0())
            .await
            .unwrap(),
        ReserveOutcome::KeyLimitReached { .. }
    ));
}

async fn a_purchase_tier_raises_a_capacity_in_the_same_step<S: Store>(store: Arc<S>) {
    let day = Check::new(
        "day",
        Limit::Calendar {
            limit: 2,
            period: Period::Day,
        },
        1,
    );
    let request = AdmitRequest {
        purchase_tier: Some(PurchaseTier {
            check_index: 0,
            threshold_nanos: credits(10),
            raised_capacity: 4,
        }),
        ..admission(vec![day], None)
    };
    let mut admitted = 0;
    for _ in 0..5 {
        let outcome = store.admit(&request, t0()).await.unwrap();
        admitted += usize::from(outcome.admitted);
        assert_eq!(outcome.checks[0].limit, 2);
    }
    assert_eq!(admitted, 2);
    store.top_up("acct", credits(10)).await.unwrap();
    let outcome = store.admit(&request, t0()).await.unwrap();
    assert!(outcome.admitted);
    assert_eq!((outcome.checks[0].limit, outcome.checks[0].used), (4, 3));
}

async fn a_hold_whose_settlement_came_first_holds_nothing<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(10)).await.unwrap();
    // The caller gave up on its admission and released it at no cost; the
    // admission then arrives late.
    store
        .settle(&settlement("late", 0, false), t0())
        .await
        .unwrap();
    let outcome = store
        .reserve(&paid_hold("late", credits(4), None), t0())
        .await
        .unwrap();
    assert!(matches!(
        outcome,
        ReserveOutcome::Reserved { held_nanos: 0, .. }
    ));
    let usage = store.key_usage("acct", "key-hash", t0()).await.unwrap();
    assert_eq!(usage.reserved_nanos, 0);
    // The whole balance is still there for others.
    assert!(
        store
            .reserve(&paid_hold("other", credits(10), None), t0())
            .await
            .unwrap()
            .is_reserved()
    );
    // A least amount of zero still stops at the key's limit.
    let limited = ReserveRequest {
        key_limit: Some(KeyLimit {
            limit_nanos: credits(12),
            reset: None,
            include_byok: false,
        }),
        covered_by_balance: false,
        lapse_record: None,
        counts_against_key_limit: true,
        ..paid_hold("zero-least", credits(5), Some(0))
    };
    assert_eq!(
        store.reserve(&limited, t0()).await.unwrap(),
        ReserveOutcome::Reserved {
            used_nanos: 0,
            reserved_nanos: credits(12),
            held_nanos: credits(2),
        }
    );
}

async fn concurrent_paid_holds_never_overdraw_the_balance<S: Store>(store: Arc<S>) {
    store.top_up("acct", credits(10)).await.unwrap();
    let handles: Vec<_> = (0..200)
        .map(|index| {
            let store = store.clone();
            tokio::spawn(async move {
                let hold = paid_hold(&format!("h{index}"), credits(1), None);
                store.reserve(&hold, t0()).await.unwrap().is_reserved()
            })
        })
        .collect();
    let mut held = 0;
    for handle in handles {
        held += usize::from(handle.await.unwrap());
    }
    assert_eq!(held, 10);
}

async fn records_compare_and_set<S: Store>(store: Arc<S>) {
    let keys = modelgate::store::KEYS;
    assert_eq!(store.get_record_at(keys, "k1", t0()).await.unwrap(), None);
    assert_eq!(
        put(&*store, keys, "k1", b"one", Expect::Absent)
            .await
            .unwrap(),
        WriteOutcome::Written { revision: 1 }
    );
    assert_eq!(
        put(&*store, keys, "k1", b"again", Expect::Absent)
            .await
            .unwrap(),
        WriteOutcome::Conflict {
            current: Some(Versioned {
                value: b"one".to_vec(),
                revision: 1
            })
        }
    );
    assert_eq!(
        put(&*store, keys, "k1", b"two", Expect::Revision(1))
            .await
            .unwrap(),
        WriteOutcome::Written { revision: 2 }
    );
    assert_eq!(
        put(&*store, keys, "k1", b"stale", Expect::Revision(1))
            .await
            .unwrap(),
        WriteOutcome::Conflict {
            current: Some(Versioned {
                value: b"two".to_vec(),
                revision: 2
            })
        }
    );
    assert_eq!(
        put(&*store, keys, "k1", b"three", Expect::Any)
            .await
            .unwrap(),
        WriteOutcome::Written { revision: 3 }
    );
    assert_eq!(
        store.get_record_at(keys, "k1", t0()).await.unwrap(),
        Some(Versioned {
            value: b"three".to_vec(),
            revision: 3
        })
    );
    assert_eq!(
        put(&*store, keys, "nope", b"x", Expect::Revision(1))
            .await
            .unwrap(),
        WriteOutcome::Conflict { current: None }
    );
    // Binary values and awkward ids survive.
    let odd_id = "id with spaces/ü:{x}";
    let binary = [0u8, 255, 10, 13, b'"'];
    put(&*store, keys, odd_id, &binary, Expect::Absent)
        .await
        .unwrap();
    assert_eq!(
        store
            .get_record_at(keys, odd_id, t0())
            .await
            .unwrap()
            .unwrap()
            .value,
        binary.to_vec()
    );
    // Deletes honour their condition.
    assert!(matches!(
        store
            .delete_record_at(keys, "k1", Expect::Revision(2), t0())
            .await
            .unwrap(),
        WriteOutcome::Conflict { .. }
    ));
    assert_eq!(
        store
            .delete_record_at(keys, "k1", Expect::Revision(3), t0())
            .await
            .unwrap(),
        WriteOutcome::Written { revision: 0 }
    );
    assert_eq!(store.get_record_at(keys, "k1", t0()).await.unwrap(), None);
    // Re-created after delete: revision starts again at 1.
    assert_eq!(
        put(&*store, keys, "k1", b"new", Expect::Absent)
            .await
            .unwrap(),
        WriteOutcome::Written { revision: 1 }
    );
}

async fn records_list_newest_first<S: Store>(store: Arc<S>) {
    let flows = modelgate::store::flows("session:main");
    for index in 0..5 {
        put(
            &*store,
            &flows,
            &format!("f{index}"),
            format!("v{index}").as_bytes(),
            Expect::Absent,
        )
        .await
        .unwrap();
    }
    // An update keeps the record's place; a delete removes it.
    put(&*store, &flows, "f1", b"v1b", Expect::Revision(1))
        .await
        .unwrap();
    store
        .delete_record_at(&flows, "f3", Expect::Any, t0())
        .await
        .unwrap();
    let page = store.list_records_at(&flows, 0, 10, t0()).await.unwrap();
    let ids: Vec<_> = page.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["f4", "f2", "f1", "f0"]);
    assert_eq!(
        page[2].1,
        Versioned {
            value: b"v1b".to_vec(),
            revision: 2
        }
    );
    let second_page = store.list_records_at(&flows, 1, 2, t0()).await.unwrap();
    assert_eq!(
        second_page
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>(),
        ["f2", "f1"]
    );
    assert!(
        store
            .list_records_at(&flows, 0, 0, t0())
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .list_records_at(&flows, 10, 5, t0())
            .await
            .unwrap()
            .is_empty()
    );
    // Another session's collection is separate.
    assert!(
        store
            .list_records_at(&modelgate::store::flows("session:other"), 0, 10, t0())
            .await
            .unwrap()
            .is_empty()
    );
}

/// A write with no lifetime and no cap, at `t0()`.
async fn put<S: Store>(
    store: &S,
    collection: &str,
    id: &str,
    value: &[u8],
    expect: Expect,
) -> Result<WriteOutcome, StoreError> {
    store
        .put_record_at(collection, id, value, expect, PutOptions::default(), t0())
        .await?
        .uncapped()
}

/// `put_record_at` with `options`, at `now`.
async fn put_at<S: Store>(
    store: &S,
    collection: &str,
    id: &str,
    value: &[u8],
    expect: Expect,
    options: PutOptions,
    now: DateTime<Utc>,
) -> PutOutcome {
    store
        .put_record_at(collection, id, value, expect, options, now)
        .await
        .expect("store call")
}

fn written(revision: u64) -> PutOutcome {
    PutOutcome::Write(WriteOutcome::Written { revision })
}

async fn listed_at<S: Store>(store: &S, collection: &str, now: DateTime<Utc>) -> Vec<String> {
    store
        .list_records_at(collection, 0, 100, now)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

async fn records_expire_after_their_lifetime<S: Store>(store: Arc<S>) {
    let flows = modelgate::store::flows("session:ttl");
    let ten_seconds = PutOptions::expiring(Duration::from_secs(10));
    assert_eq!(
        put_at(
            &*store,
            &flows,
            "a",
            b"a1",
            Expect::Absent,
            ten_seconds,
            t0()
        )
        .await,
        written(1)
    );
    let forever = PutOptions::default();
    put_at(&*store, &flows, "kept", b"k", Expect::Absent, forever, t0()).await;
    // Live while now < the write + its lifetime, to the microsecond.
    let last_live = after(10 * SECOND - 1);
    assert_eq!(
        store.get_record_at(&flows, "a", last_live).await.unwrap(),
        Some(Versioned {
            value: b"a1".to_vec(),
            revision: 1
        })
    );
    assert_eq!(listed_at(&*store, &flows, last_live).await, ["kept", "a"]);
    assert_eq!(
        store
            .get_record_at(&flows, "a", after(10 * SECOND))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        listed_at(&*store, &flows, after(10 * SECOND)).await,
        ["kept"]
    );
    // Each write sets the lifetime afresh.
    put_at(
        &*store,
        &flows,
        "b",
        b"b1",
        Expect::Absent,
        ten_seconds,
        t0(),
    )
    .await;
    assert_eq!(
        put_at(
            &*store,
            &flows,
            "b",
            b"b2",
            Expect::Revision(1),
            ten_seconds,
            after(8 * SECOND)
        )
        .await,
        written(2)
    );
    assert!(
        store
            .get_record_at(&flows, "b", after(17 * SECOND))
            .await
            .unwrap()
            .is_some()
    );
    // An expired record is absent: a revision no longer matches, and a
    // create takes its id again from revision 1.
    assert_eq!(
        put_at(
            &*store,
            &flows,
            "b",
            b"b3",
            Expect::Revision(2),
            ten_seconds,
            after(18 * SECOND)
        )
        .await,
        PutOutcome::Write(WriteOutcome::Conflict { current: None })
    );
    assert_eq!(
        put_at(
            &*store,
            &flows,
            "a",
            b"a-again",
            Expect::Absent,
            ten_seconds,
            after(20 * SECOND)
        )
        .await,
        written(1)
    );
    assert_eq!(
        listed_at(&*store, &flows, after(20 * SECOND)).await,
        ["a", "kept"],
        "the new `a` is listed as the newest"
    );
    // A write without a lifetime keeps the record for good.
    put_at(
        &*store,
        &flows,
        "a",
        b"a-kept",
        Expect::Revision(1),
        forever,
        after(21 * SECOND),
    )
    .await;
    assert_eq!(
        store
            .get_record_at(&flows, "a", after(1_000_000 * SECOND))
            .await
            .unwrap()
            .map(|record| record.value),
        Some(b"a-kept".to_vec())
    );
    // Deleting an expired record finds nothing there.
    put_at(
        &*store,
        &flows,
        "c",
        b"c1",
        Expect::Absent,
        ten_seconds,
        t0(),
    )
    .await;
    assert_eq!(
        store
            .delete_record_at(&flows, "c", Expect::Revision(1), after(10 * SECOND))
            .await
            .unwrap(),
        WriteOutcome::Conflict { current: None }
    );
    // A lifetime of zero or past the maximum is refused.
    for ttl in [
        Duration::ZERO,
        modelgate::store::MAX_RECORD_TTL + Duration::from_secs(1),
    ] {
        let error = store
            .put_record_at(
                &flows,
                "z",
                b"z",
                Expect::Any,
                PutOptions::expiring(ttl),
                t0(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(error.kind(), StoreErrorKind::Invalid(_)),
            "{error}"
        );
    }
}

async fn a_capped_collection_counts_only_live_records<S: Store>(store: Arc<S>) {
    let flows = modelgate::store::flows("session:capped");
    let capped = PutOptions::expiring(Duration::from_secs(10)).max_records(3);
    for (index, id) in ["a", "b", "c"].into_iter().enumerate() {
        let at = after(index as i64 * SECOND);
        assert_eq!(
            put_at(&*store, &flows, id, b"v", Expect::Absent, capped, at).await,
            written(1)
        );
    }
    assert_eq!(
        put_at(
            &*store,
            &flows,
            "d",
            b"v",
            Expect::Absent,
            capped,
            after(3 * SECOND)
        )
        .await,
        PutOutcome::Full { records: 3 }
    );
    assert_eq!(
        listed_at(&*store, &flows, after(3 * SECOND)).await,
        ["c", "b", "a"],
        "a refused create leaves nothing behind"
    );
    // Rewriting a record is never refused by the cap; nor is a create
    // refused by its condition reported as full.
    assert_eq!(
        put_at(
            &*store,
            &flows,
            "b",
            b"v2",
            Expect::Revision(1),
            capped,
            after(4 * SECOND)
        )
        .await,
        written(2)
    );
    assert!(matches!(
        put_at(
            &*store,
            &flows,
            "c",
            b"v",
            Expect::Absent,
            capped,
            after(4 * SECOND)
        )
        .await,
        PutOutcome::Write(WriteOutcome::Conflict { current: Some(_) })
    ));
    // `a` expires at 10 s: its place is free, and only its place.
    assert_eq!(
        put_at(
            &*store,
            &flows,
            "d",
            b"v",
            Expect::Absent,
            capped,
            after(10 * SECOND)
        )
        .await,
        written(1)
    );
    assert_eq!(
        put_at(
            &*store,
            &flows,
            "e",
            b"v",
            Expect::Absent,
            capped,
            after(10 * SECOND)
        )
        .await,
        PutOutcome::Full { records: 3 }
    );
    // Records without a lifetime count as well.
    let other = modelgate::store::flows("session:capped-forever");
    let forever = PutOptions::default().max_records(1);
    put_at(&*store, &other, "a", b"v", Expect::Absent, forever, t0()).await;
    assert_eq!(
        put_at(
            &*store,
            &other,
            "b",
            b"v",
            Expect::Any,
            forever,
            after(1_000_000 * SECOND)
        )
        .await,
        PutOutcome::Full { records: 1 }
    );
}

async fn concurrent_creators_never_pass_a_collection_cap<S: Store>(store: Arc<S>) {
    let flows = modelgate::store::flows("session:crowded");
    let capped = PutOptions::expiring(Duration::from_secs(60)).max_records(10);
    let handles: Vec<_> = (0..40)
        .map(|index| {
            let store = Arc::clone(&store);
            let flows = flows.clone();
            tokio::spawn(async move {
                put_at(
                    &*store,
                    &flows,
                    &format!("f{index}"),
                    b"v",
                    Expect::Absent,
                    capped,
                    t0(),
                )
                .await
            })
        })
        .collect();
    let mut created = 0;
    for handle in handles {
        match handle.await.unwrap() {
            PutOutcome::Write(WriteOutcome::Written { revision: 1 }) => created += 1,
            PutOutcome::Full { records } => assert_eq!(records, 10),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(created, 10);
    assert_eq!(listed_at(&*store, &flows, t0()).await.len(), 10);
}

async fn concurrent_writers_with_one_revision_exactly_one_wins<S: Store>(store: Arc<S>) {
    let accounts = modelgate::store::ACCOUNTS;
    put(&*store, accounts, "a1", b"v1", Expect::Absent)
        .await
        .unwrap();
    for round in 1..=5u64 {
        let handles: Vec<_> = (0..20)
            .map(|writer| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let value = format!("round {round} writer {writer}");
                    put(
                        &*store,
                        accounts,
                        "a1",
                        value.as_bytes(),
                        Expect::Revision(round),
                    )
                    .await
                    .unwrap()
                })
            })
            .collect();
        let mut winners = 0;
        for handle in handles {
            match handle.await.unwrap() {
                WriteOutcome::Written { revision } => {
                    assert_eq!(revision, round + 1);
                    winners += 1;
                }
                WriteOutcome::Conflict { current } => assert!(current.is_some()),
            }
        }
        assert_eq!(winners, 1, "round {round}");
    }
    // Two creators of one new id: exactly one creates it.
    let handles: Vec<_> = (0..20)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                put(&*store, accounts, "new", b"x", Expect::Absent)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut created = 0;
    for handle in handles {
        created += usize::from(matches!(
            handle.await.unwrap(),
            WriteOutcome::Written { .. }
        ));
    }
    assert_eq!(created, 1);
}

fn balance(purchased_nanos: i64, balance_nanos: i64) -> AccountBalance {
    AccountBalance {
        purchased_nanos,
        balance_nanos,
    }
}

async fn a_top_up_with_an_idempotency_key_credits_once<S: Store>(store: Arc<S>) {
    let first = store
        .top_up_once("acct", credits(5), "order-1", t0())
        .await
        .unwrap();
    assert_eq!(
        first,
        TopUpOutcome::Credited(balance(credits(5), credits(5)))
    );
    store.top_up("acct", credits(1)).await.unwrap();
    // A retry answers what the first call answered, not today's balance.
    let retried = store
        .top_up_once("acct", credits(5), "order-1", after(3600 * SECOND))
        .await
        .unwrap();
    assert_eq!(
        retried,
        TopUpOutcome::Repeated(balance(credits(5), credits(5)))
    );
    assert_eq!(
        store.account_balance("acct").await.unwrap(),
        balance(credits(6), credits(6))
    );
    // Another key is another purchase; another account has its own keys.
    assert_eq!(
        store
            .top_up_once("acct", credits(5), "order-2", t0())
            .await
            .unwrap(),
        TopUpOutcome::Credited(balance(credits(11), credits(11)))
    );
    assert_eq!(
        store
            .top_up_once("other", credits(2), "order-1", t0())
            .await
            .unwrap(),
        TopUpOutcome::Credited(balance(credits(2), credits(2)))
    );
    // The same key for another amount is refused and records nothing.
    assert_eq!(
        store
            .top_up_once("acct", credits(7), "order-1", t0())
            .await
            .unwrap(),
        TopUpOutcome::KeyReused {
            first_amount_nanos: credits(5)
        }
    );
    assert_eq!(
        store.account_balance("acct").await.unwrap(),
        balance(credits(11), credits(11))
    );
    // Keys of every visible ASCII character, kept apart from each other.
    for key in [
        "a:b",
        "a%3Ab",
        "{x}",
        &"~".repeat(MAX_IDEMPOTENCY_KEY_BYTES),
    ] {
        assert!(
            matches!(
                store.top_up_once("keys", 1, key, t0()).await.unwrap(),
                TopUpOutcome::Credited(_)
            ),
            "{key}"
        );
    }
    assert_eq!(store.account_balance("keys").await.unwrap(), balance(4, 4));
    let too_long = "k".repeat(MAX_IDEMPOTENCY_KEY_BYTES + 1);
    for (amount, key) in [
        (1, ""),
        (1, "a b"),
        (1, "caf\u{e9}"),
        (1, too_long.as_str()),
        (-1, "order-3"),
    ] {
        let error = store
            .top_up_once("acct", amount, key, t0())
            .await
            .unwrap_err();
        assert!(
            matches!(error.kind(), StoreErrorKind::Invalid(_)),
            "{key}: {error}"
        );
    }
    // Exact past 2^53, and an overflow refused whole remembers nothing.
    let huge = (1 << 60) + 1;
    let credited = store.top_up_once("rich", huge, "big", t0()).await.unwrap();
    assert_eq!(credited, TopUpOutcome::Credited(balance(huge, huge)));
    assert_eq!(
        store.top_up_once("rich", huge, "big", t0()).await.unwrap(),
        TopUpOutcome::Repeated(balance(huge, huge))
    );
    assert!(
        store
            .top_up_once("rich", i64::MAX, "too-big", t0())
            .await
            .is_err()
    );
    assert_eq!(
        store.top_up_once("rich", 1, "too-big", t0()).await.unwrap(),
        TopUpOutcome::Credited(balance(huge + 1, huge + 1))
    );
}

async fn an_idempotency_key_is_forgotten_after_its_time<S: Store>(store: Arc<S>) {
    let memory = i64::try_from(IDEMPOTENCY_KEY_TTL_HOURS).unwrap() * 3600 * SECOND;
    let once = |amount: i64, at: DateTime<Utc>| {
        let store = Arc::clone(&store);
        async move {
            store
                .top_up_once("acct", amount, "order-1", at)
                .await
                .unwrap()
        }
    };
    assert!(matches!(
        once(credits(1), t0()).await,
        TopUpOutcome::Credited(_)
    ));
    assert_eq!(
        once(credits(1), after(memory - 1)).await,
        TopUpOutcome::Repeated(balance(credits(1), credits(1)))
    );
    // Forgotten: the key is a new purchase, remembered afresh.
    assert_eq!(
        once(credits(1), after(memory)).await,
        TopUpOutcome::Credited(balance(credits(2), credits(2)))
    );
    assert_eq!(
        once(credits(3), after(2 * memory - 1)).await,
        TopUpOutcome::KeyReused {
            first_amount_nanos: credits(1)
        }
    );
    assert_eq!(
        once(credits(3), after(2 * memory)).await,
        TopUpOutcome::Credited(balance(credits(5), credits(5)))
    );
}

async fn concurrent_duplicate_top_ups_credit_once<S: Store>(store: Arc<S>) {
    let handles: Vec<_> = (0..20)
        .map(|index| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let same = store
                    .top_up_once("acct", credits(3), "retried", t0())
                    .await
                    .unwrap();
                let own = store
                    .top_up_once("acct", 7, &format!("own-{index}"), t0())
                    .await
                    .unwrap();
                assert!(matches!(own, TopUpOutcome::Credited(_)));
                same
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for handle in handles {
        outcomes.push(handle.await.unwrap());
    }
    let credited: Vec<_> = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, TopUpOutcome::Credited(_)))
        .collect();
    assert_eq!(credited.len(), 1, "{outcomes:?}");
    let first = credited[0].balance();
    for outcome in &outcomes {
        assert_eq!(outcome.balance(), first);
    }
    let total = credits(3) + 20 * 7;
    assert_eq!(
        store.account_balance("acct").await.unwrap(),
        balance(total, total)
    );
}

/// The suite drives time by hand: the store takes the caller's clock. It
/// checks what the stores decide, not how fast: a debug build reading a
/// full app-usage table on a busy machine may pass the default 500 ms
/// call timeout, so calls here get 10 s.
fn caller_time() -> RedisStoreConfig {
    RedisStoreConfig {
        time_source: TimeSource::Caller,
        call_timeout: std::time::Duration::from_secs(10),
        ..RedisStoreConfig::default()
    }
}

async fn connect(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url(), caller_time())
        .await
        .expect("connect to redis-server")
}

/// Two handles on one SQLite file, as two processes sharing it would be:
/// each call goes to the next handle in turn, each handle with its own
/// connection and thread, so every check also runs across "instances"
/// that share nothing but the file.
struct TwoSqliteHandles {
    handles: [modelgate::store::SqliteStore; 2],
    next: AtomicUsize,
    _directory: tempfile::TempDir,
}

impl TwoSqliteHandles {
    fn open() -> Self {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let path = directory.path().join("modelgate.db");
        let open = || {
            modelgate::store::SqliteStore::open(
                &path,
                modelgate::store::SqliteStoreConfig::default(),
            )
            .expect("open the SQLite store")
        };
        TwoSqliteHandles {
            handles: [open(), open()],
            next: AtomicUsize::new(0),
            _directory: directory,
        }
    }

    fn one(&self) -> &modelgate::store::SqliteStore {
        &self.handles[self.next.fetch_add(1, Ordering::Relaxed) % 2]
    }
}

#[async_trait::async_trait]
impl modelgate::store::CounterStore for TwoSqliteHandles {
    async fn check_and_add(
        &self,
        scope: &str,
        checks: &[Check],
        now: DateTime<Utc>,
    ) -> Result<modelgate::store::Decision, modelgate::store::StoreError> {
        self.one().check_and_add(scope, checks, now).await
    }
    async fn acquire_slot(
        &self,
        scope: &str,
        name: &str,
        holder: &str,
        limit: u64,
        lease: Duration,
        now: DateTime<Utc>,
    ) -> Result<SlotOutcome, modelgate::store::StoreError> {
        self.one()
            .acquire_slot(scope, name, holder, limit, lease, now)
            .await
    }
    async fn release_slot(
        &self,
        scope: &str,
        name: &str,
        holder: &str,
    ) -> Result<(), modelgate::store::StoreError> {
        self.one().release_slot(scope, name, holder).await
    }
}

#[async_trait::async_trait]
impl modelgate::store::LedgerStore for TwoSqliteHandles {
    async fn admit_after_settling(
        &self,
        settlements: &[Settlement],
        request: &AdmitRequest,
        now: DateTime<Utc>,
    ) -> Result<modelgate::store::AdmitOutcome, modelgate::store::StoreError> {
        self.one()
            .admit_after_settling(settlements, request, now)
            .await
    }
    async fn settle(
        &self,
        settlement: &Settlement,
        now: DateTime<Utc>,
    ) -> Result<(), modelgate::store::StoreError> {
        self.one().settle(settlement, now).await
    }
    async fn settle_many(
        &self,
        settlements: &[Settlement],
        now: DateTime<Utc>,
    ) -> Result<(), modelgate::store::StoreError> {
        self.one().settle_many(settlements, now).await
    }
    async fn renew_holds(
        &self,
        account: &str,
        holds: &[HoldRenewal],
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> Result<u64, modelgate::store::StoreError> {
        self.one().renew_holds(account, holds, ttl, now).await
    }
    async fn key_usage(
        &self,
        account: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<modelgate::store::KeyUsage, modelgate::store::StoreError> {
        self.one().key_usage(account, key, now).await
    }
    async fn top_up(
        &self,
        account: &str,
        amount_nanos: i64,
    ) -> Result<AccountBalance, modelgate::store::StoreError> {
        self.one().top_up(account, amount_nanos).await
    }
    async fn top_up_once(
        &self,
        account: &str,
        amount_nanos: i64,
        idempotency_key: &str,
        now: DateTime<Utc>,
    ) -> Result<TopUpOutcome, modelgate::store::StoreError> {
        self.one()
            .top_up_once(account, amount_nanos, idempotency_key, now)
            .await
    }
    async fn account_balance(
        &self,
        account: &str,
    ) -> Result<AccountBalance, modelgate::store::StoreError> {
        self.one().account_balance(account).await
    }
    async fn set_key_terms(
        &self,
        account: &str,
        key: &str,
        terms: &KeyTerms,
    ) -> Result<(), modelgate::store::StoreError> {
        self.one().set_key_terms(account, key, terms).await
    }
    async fn revoke_key(
        &self,
        account: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<(), modelgate::store::StoreError> {
        self.one().revoke_key(account, key, now).await
    }
    async fn generation(
        &self,
        account: &str,
        reservation_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<bytes::Bytes>, modelgate::store::StoreError> {
        self.one().generation(account, reservation_id, now).await
    }
    async fn generations_page(
        &self,
        account: &str,
        page: modelgate::store::GenerationsPage<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<bytes::Bytes>, modelgate::store::StoreError> {
        self.one().generations_page(account, page, now).await
    }
}

#[async_trait::async_trait]
impl modelgate::store::RecordStore for TwoSqliteHandles {
    async fn get_record_at(
        &self,
        collection: &str,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Versioned<Vec<u8>>>, modelgate::store::StoreError> {
        self.one().get_record_at(collection, id, now).await
    }
    async fn put_record_at(
        &self,
        collection: &str,
        id: &str,
        value: &[u8],
        expect: Expect,
        options: PutOptions,
        now: DateTime<Utc>,
    ) -> Result<PutOutcome, modelgate::store::StoreError> {
        self.one()
            .put_record_at(collection, id, value, expect, options, now)
            .await
    }
    async fn delete_record_at(
        &self,
        collection: &str,
        id: &str,
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<WriteOutcome, modelgate::store::StoreError> {
        self.one()
            .delete_record_at(collection, id, expect, now)
            .await
    }
    async fn list_records_at(
        &self,
        collection: &str,
        offset: usize,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, Versioned<Vec<u8>>)>, modelgate::store::StoreError> {
        self.one()
            .list_records_at(collection, offset, limit, now)
            .await
    }
}

#[async_trait::async_trait]
impl modelgate::store::AppUsageStore for TwoSqliteHandles {
    async fn add_app_usage(
        &self,
        scope: &str,
        rows: &[AppUsage],
        now: DateTime<Utc>,
    ) -> Result<(), modelgate::store::StoreError> {
        self.one().add_app_usage(scope, rows, now).await
    }
    async fn app_usage(
        &self,
        scope: &str,
        period: Period,
        now: DateTime<Utc>,
    ) -> Result<Vec<AppUsage>, modelgate::store::StoreError> {
        self.one().app_usage(scope, period, now).await
    }
}

macro_rules! conformance {
    ($($check:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    super::$check(std::sync::Arc::new(modelgate::store::MemoryStore::new())).await;
                }
            )*
        }

        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let server = super::RedisServer::start();
                    super::$check(std::sync::Arc::new(super::connect(&server).await)).await;
                }
            )*
        }

        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let directory = tempfile::tempdir().expect("a temporary directory");
                    let store = modelgate::store::SqliteStore::open(
                        directory.path().join("modelgate.db"),
                        modelgate::store::SqliteStoreConfig::default(),
                    )
                    .expect("open the SQLite store");
                    super::$check(std::sync::Arc::new(store)).await;
                }
            )*
        }

        /// Every check across two handles of one file (see
        /// [`TwoSqliteHandles`]).
        mod sqlite_two_handles {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    super::$check(std::sync::Arc::new(super::TwoSqliteHandles::open())).await;
                }
            )*
        }

        /// The whole suite on one 3-node cluster, a fresh key prefix per check.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_passes_every_check() {
            let cluster = RedisCluster::start();
            let urls = cluster.urls();
            let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
            $(
                let config = RedisStoreConfig { key_prefix: stringify!($check).to_owned(), ..caller_time() };
                let store = RedisStore::connect_cluster(&nodes, config).await.expect("connect to the cluster");
                $check(Arc::new(store)).await;
            )*
        }
    };
}

conformance!(
    fixed_window_edges,
    rolling_window_bounds_every_interval,
    gcra_rate_and_burst,
    calendar_windows_reset_at_utc_boundaries,
    multi_checks_are_all_or_nothing,
    zero_amount_only_reads,
    invalid_checks_are_refused,
    scopes_and_names_never_collide,
    concurrent_callers_admit_exactly_the_limit,
    concurrent_callers_straddling_a_window_edge,
    a_clock_stepping_back_never_resets_a_newer_window,
    slots_hold_their_limit_and_a_refusal_changes_nothing,
    releasing_a_slot_frees_it,
    an_expired_lease_is_reclaimed,
    renewing_a_slot_counts_once,
    slot_scopes_and_names_are_independent,
    invalid_slot_arguments_are_refused,
    concurrent_acquirers_get_exactly_the_limit,
    ledger_periods_only_roll_forward,
    ledger_limits_are_exact_beyond_two_to_the_53,
    ledger_rolls_periods_and_keeps_byok_apart,
    reservations_count_against_the_key_limit_and_expire,
    a_settlement_retried_records_once,
    a_settled_id_is_remembered_longer_than_its_retries,
    a_settlement_is_recorded_once_hold_or_not,
    a_lapsed_hold_is_charged_once_by_its_late_settlement,
    a_cost_counts_in_the_periods_its_hold_was_admitted_in,
    a_renewed_hold_lasts_as_long_as_its_request,
    a_key_s_own_terms_decide_its_admission,
    every_ledger_call_lapses_what_has_expired_alike,
    a_lapse_leaves_a_generation_record_its_settlement_replaces,
    negative_balance_rejects_until_topped_up,
    ledger_sums_are_exact_under_concurrency,
    concurrent_reservations_admit_exactly_the_limit,
    settlements_of_one_account_go_together_each_once,
    a_reservation_sees_the_costs_it_carries_not_their_holds,
    batched_settlements_and_reservations_stay_exact_under_concurrency,
    admission_is_all_or_nothing_across_counters_and_the_hold,
    a_revoked_key_is_refused_before_its_counters_and_costs_nothing,
    generation_records_go_with_their_settlement_once_and_expire,
    a_keys_page_holds_its_own_records_newest_first_within_the_cap,
    app_usage_counts_per_period_and_rolls_forward,
    app_usage_keeps_at_most_its_rows,
    the_balance_bounds_the_account_holds,
    a_flexible_hold_takes_what_the_key_limit_leaves,
    a_purchase_tier_raises_a_capacity_in_the_same_step,
    concurrent_paid_holds_never_overdraw_the_balance,
    a_hold_whose_settlement_came_first_holds_nothing,
    records_compare_and_set,
    records_list_newest_first,
    records_expire_after_their_lifetime,
    a_capped_collection_counts_only_live_records,
    concurrent_creators_never_pass_a_collection_cap,
    concurrent_writers_with_one_revision_exactly_one_wins,
    a_top_up_with_an_idempotency_key_credits_once,
    an_idempotency_key_is_forgotten_after_its_time,
    concurrent_duplicate_top_ups_credit_once,
);

#[tokio::test]
async fn memory_store_evicts_ended_windows() {
    let store = MemoryStore::new();
    for account in 0..10_000 {
        add(
            &store,
            &format!("acct{account}"),
            "minute",
            fixed(5, 60),
            1,
            t0(),
        )
        .await;
    }
    assert_eq!(store.counter_count(), 10_000);
    // Once the windows (and their slack) are over, the next calls sweep
    // them away by themselves (5000 calls reach each of the 64 shards).
    for account in 0..5_000 {
        add(
            &store,
            &format!("acct{account}"),
            "minute",
            fixed(5, 60),
            1,
            after(90 * SECOND),
        )
        .await;
    }
    assert_eq!(store.counter_count(), 5_000);
    store.evict_expired(after(200 * SECOND));
    assert_eq!(store.counter_count(), 0);
}
