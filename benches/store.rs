//! The cost of each store operation on `MemoryStore` and on `RedisStore`
//! over loopback (a `redis-server` started for the run).
//!
//! `cargo bench --features full --bench store`; under `cargo test --all-targets` each
//! benchmark runs once as a smoke test.

#[path = "../tests/it/common/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use criterion::{Criterion, criterion_group, criterion_main};
use modelgate::clock::Period;
use modelgate::store::{
    Check, Expect, KeyLimit, Limit, MemoryStore, PutOptions, RedisStore, RedisStoreConfig,
    ReserveRequest, Settlement, Store,
};

/// Time that moves 1 µs per call, so windows keep a steady size however
/// many iterations criterion runs.
struct Ticks {
    start: DateTime<Utc>,
    elapsed_micros: AtomicI64,
}

impl Ticks {
    fn new() -> Self {
        Ticks {
            start: Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap(),
            elapsed_micros: AtomicI64::new(0),
        }
    }

    fn next(&self) -> DateTime<Utc> {
        let elapsed = self.elapsed_micros.fetch_add(1, Ordering::Relaxed);
        self.start + chrono::Duration::microseconds(elapsed)
    }
}

fn checks() -> Vec<(&'static str, Vec<Check>)> {
    let fixed = Check::new(
        "fixed",
        Limit::FixedWindow {
            limit: 1 << 50,
            window: Duration::from_secs(60),
        },
        1,
    );
    // A window of 1 ms at one call per µs holds about a thousand entries.
    let rolling = Check::new(
        "rolling",
        Limit::Rolling {
            limit: 1 << 50,
            window: Duration::from_millis(1),
        },
        1,
    );
    let gcra = Check::new(
        "gcra",
        Limit::Gcra {
            rate: 1_000_000,
            period: Duration::from_secs(1),
            burst: 1_000,
        },
        1,
    );
    let calendar = Check::new(
        "day",
        Limit::Calendar {
            limit: 1 << 50,
            period: Period::Day,
        },
        1,
    );
    vec![
        ("fixed_window", vec![fixed]),
        ("rolling_window", vec![rolling.clone()]),
        ("gcra", vec![gcra]),
        ("calendar_day", vec![calendar.clone()]),
        ("rolling_and_day", vec![rolling, calendar]),
    ]
}

fn bench_store<S: Store>(
    c: &mut Criterion,
    backend: &str,
    runtime: &tokio::runtime::Runtime,
    store: Arc<S>,
) {
    let mut group = c.benchmark_group(backend);
    let ticks = Arc::new(Ticks::new());
    for (name, checks) in checks() {
        group.bench_function(format!("check_and_add/{name}"), |b| {
            b.to_async(runtime).iter(|| {
                let (store, ticks, checks) = (Arc::clone(&store), Arc::clone(&ticks), &checks);
                async move {
                    let decision = store
                        .check_and_add("acct", checks, ticks.next())
                        .await
                        .unwrap();
                    assert!(decision.admitted);
                }
            })
        });
    }
    let limit = KeyLimit {
        limit_nanos: i64::MAX / 2,
        reset: Some(Period::Month),
        include_byok: false,
    };
    let request = ReserveRequest {
        account: "acct".into(),
        key: "key".into(),
        reservation_id: "r".into(),
        amount_nanos: 1_000,
        key_limit: Some(limit),
        min_amount_nanos: None,
        check_balance: true,
        covered_by_balance: false,
        lapse_record: None,
        counts_against_key_limit: true,
        ttl: Duration::from_secs(60),
    };
    // Reserving one id again replaces it, so the key's reservations stay one.
    group.bench_function("reserve", |b| {
        b.to_async(runtime).iter(|| {
            let (store, ticks, request) = (Arc::clone(&store), Arc::clone(&ticks), &request);
            async move { store.reserve(request, ticks.next()).await.unwrap() }
        })
    });
    let settlement = Settlement {
        account: "acct".into(),
        key: "key".into(),
        reservation_id: "r".into(),
        hold_granted: false,
        cost_nanos: 0,
        byok: false,
        record: None,
    };
    group.bench_function("settle", |b| {
        b.to_async(runtime).iter(|| {
            let (store, ticks, settlement) = (Arc::clone(&store), Arc::clone(&ticks), &settlement);
            async move { store.settle(settlement, ticks.next()).await.unwrap() }
        })
    });
    // What every admitted request does: a hold, then its settlement,
    // which finds the hold (a fresh id each time, as requests have).
    let next_id = std::sync::atomic::AtomicU64::new(0);
    group.bench_function("reserve_then_settle_granted", |b| {
        b.to_async(runtime).iter(|| {
            let id = format!(
                "g{}",
                next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            let (store, ticks) = (Arc::clone(&store), Arc::clone(&ticks));
            let hold = ReserveRequest {
                reservation_id: id.clone(),
                ..request.clone()
            };
            let settlement = Settlement {
                reservation_id: id,
                hold_granted: true,
                ..settlement.clone()
            };
            async move {
                let now = ticks.next();
                assert!(store.reserve(&hold, now).await.unwrap().is_reserved());
                store.settle(&settlement, now).await.unwrap();
            }
        })
    });
    group.bench_function("top_up", |b| {
        b.to_async(runtime).iter(|| {
            let store = Arc::clone(&store);
            async move { store.top_up("acct", 0).await.unwrap() }
        })
    });
    group.bench_function("account_balance", |b| {
        b.to_async(runtime).iter(|| {
            let store = Arc::clone(&store);
            async move { store.account_balance("acct").await.unwrap() }
        })
    });
    group.bench_function("key_usage", |b| {
        b.to_async(runtime).iter(|| {
            let (store, ticks) = (Arc::clone(&store), Arc::clone(&ticks));
            async move { store.key_usage("acct", "key", ticks.next()).await.unwrap() }
        })
    });
    runtime
        .block_on(store.put_record_at(
            "keys",
            "k",
            b"{\"label\":\"bench\"}",
            Expect::Any,
            PutOptions::default(),
            ticks.next(),
        ))
        .unwrap();
    group.bench_function("get_record", |b| {
        b.to_async(runtime).iter(|| {
            let (store, ticks) = (Arc::clone(&store), Arc::clone(&ticks));
            async move {
                store
                    .get_record_at("keys", "k", ticks.next())
                    .await
                    .unwrap()
            }
        })
    });
    group.bench_function("put_record", |b| {
        b.to_async(runtime).iter(|| {
            let (store, ticks) = (Arc::clone(&store), Arc::clone(&ticks));
            async move {
                store
                    .put_record_at(
                        "keys",
                        "k",
                        b"{\"label\":\"bench\"}",
                        Expect::Any,
                        PutOptions::default(),
                        ticks.next(),
                    )
                    .await
                    .unwrap()
            }
        })
    });
    group.bench_function("delete_record", |b| {
        b.to_async(runtime).iter(|| {
            let (store, ticks) = (Arc::clone(&store), Arc::clone(&ticks));
            async move {
                store
                    .delete_record_at("keys", "absent", Expect::Any, ticks.next())
                    .await
                    .unwrap()
            }
        })
    });
    for index in 0..20 {
        let id = format!("listed-{index}");
        runtime
            .block_on(store.put_record_at(
                "list",
                &id,
                b"{}",
                Expect::Any,
                PutOptions::default(),
                ticks.next(),
            ))
            .unwrap();
    }
    group.bench_function("list_records/10", |b| {
        b.to_async(runtime).iter(|| {
            let (store, ticks) = (Arc::clone(&store), Arc::clone(&ticks));
            async move {
                store
                    .list_records_at("list", 5, 10, ticks.next())
                    .await
                    .unwrap()
            }
        })
    });
    group.finish();
}

fn memory(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    bench_store(c, "memory", &runtime, Arc::new(MemoryStore::new()));
}

fn redis(c: &mut Criterion) {
    let server = redis_server::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = runtime
        .block_on(RedisStore::connect(
            &server.url(),
            RedisStoreConfig::default(),
        ))
        .unwrap();
    bench_store(c, "redis", &runtime, Arc::new(store));
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = memory, redis
}
criterion_main!(benches);
