//! What only the Redis backend has to show: outages, restarts, round trips,
//! key expiry, and that it decides exactly as `MemoryStore` does (those
//! random workloads run on `SqliteStore` too).

use crate::common;

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use common::redis_server::{CommandWatch, RedisCluster, RedisServer};
use common::relay::Relay;
use common::wait::{PATIENCE, wait_for, wait_until};
use modelgate::clock::Period;
use modelgate::store::{
    AdmitRequest, Check, CounterStore, Expect, GenerationsPage, HoldRenewal, KeyLimit, KeyTerms,
    LedgerStore, Limit, MemoryStore, PurchaseTier, PutOptions, RecordKeeping, RecordStore,
    RedisStore, RedisStoreConfig, ReserveRequest, Settlement, SettlementRecord, StoreErrorKind,
    TimeSource,
};
use proptest::prelude::*;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap()
}

fn minute_check() -> Check {
    Check::new(
        "minute",
        Limit::Rolling {
            limit: 1_000,
            window: Duration::from_secs(60),
        },
        1,
    )
}

fn reserve_request() -> ReserveRequest {
    ReserveRequest {
        account: "acct".into(),
        key: "key".into(),
        reservation_id: "r".into(),
        amount_nanos: 5,
        key_limit: None,
        min_amount_nanos: None,
        check_balance: true,
        covered_by_balance: false,
        lapse_record: None,
        counts_against_key_limit: true,
        ttl: Duration::from_secs(60),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_within_their_timeout_while_redis_is_down_and_recover_after_restart() {
    let mut server = RedisServer::start();
    let config_timeout = Duration::from_millis(200);
    let config = RedisStoreConfig {
        call_timeout: config_timeout,
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&server.url(), config).await.unwrap();
    assert!(
        store
            .check_and_add("acct", &[minute_check()], t0())
            .await
            .unwrap()
            .admitted
    );

    server.stop();
    // The call's own timeout plus scheduling margin: no call hangs.
    let bound = config_timeout + Duration::from_millis(500);
    for _ in 0..3 {
        let error =
            tokio::time::timeout(bound, store.check_and_add("acct", &[minute_check()], t0()))
                .await
                .expect("check_and_add returned while redis-server was down")
                .unwrap_err();
        assert!(error.is_unavailable(), "{error}");
        assert_eq!(error.operation(), "check_and_add");
        assert!(error.to_string().contains("check_and_add"));
    }
    let error = tokio::time::timeout(bound, store.reserve(&reserve_request(), t0()))
        .await
        .expect("reserve returned")
        .unwrap_err();
    // A hold alone is an admission with no counter checks.
    assert_eq!(error.operation(), "admit");
    let error = tokio::time::timeout(bound, store.get_record_at("keys", "k", t0()))
        .await
        .expect("get_record returned")
        .unwrap_err();
    assert_eq!(error.operation(), "get_record");

    // Back on the same port, without the function library: the store
    // reconnects by itself and loads the library again.
    server.restart();
    let decision = wait_for(PATIENCE, || async {
        store
            .check_and_add("acct", &[minute_check()], t0())
            .await
            .map_err(|error| format!("the store did not recover after the restart: {error}"))
    })
    .await;
    assert!(decision.admitted);
    store.reserve(&reserve_request(), t0()).await.unwrap();
    store.top_up("acct", 7).await.unwrap();
    assert_eq!(
        store.account_balance("acct").await.unwrap().purchased_nanos,
        7
    );
    store.ping().await.unwrap();
}

/// A frozen Redis (SIGSTOP: connections open, no answers) makes only the
/// first calls wait their timeout; then the breaker refuses calls at once,
/// for every clone of the store, until Redis answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_opens_the_breaker_and_calls_fail_fast_until_it_answers_again() {
    let server = RedisServer::start();
    let call_timeout = Duration::from_millis(300);
    let breaker_failures = 3;
    let config = RedisStoreConfig {
        call_timeout,
        breaker_failures,
        // Long enough that the fast calls below (some 70, a few ms in all)
        // all fall inside it even on a loaded machine; a probe would wait
        // the timeout. The test waits it out once Redis is thawed.
        breaker_cool_down: Duration::from_millis(1500),
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&server.url(), config).await.unwrap();
    let clone = store.clone();
    assert!(
        store
            .check_and_add("acct", &[minute_check()], t0())
            .await
            .unwrap()
            .admitted
    );
    assert!(!store.circuit_open());

    server.freeze();
    // 20 calls in a row: the first ones wait for the timeout, the rest
    // are refused by the breaker.
    let mut waited = 0;
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let started = std::time::Instant::now();
        let error = store
            .check_and_add("acct", &[minute_check()], t0())
            .await
            .unwrap_err();
        latencies.push((started.elapsed(), error.kind().clone()));
        assert!(error.is_unavailable(), "{error}");
        assert_eq!(error.operation(), "check_and_add");
        if !matches!(error.kind(), StoreErrorKind::CircuitOpen) {
            waited += 1;
        }
    }
    for (call, (latency, kind)) in latencies.iter().enumerate() {
        println!(
            "frozen redis, call {:>2}: {latency:>10.3?}  {kind}",
            call + 1
        );
    }
    assert!(
        waited <= breaker_failures + 1,
        "{waited} calls waited for the timeout: {latencies:?}"
    );
    assert!(store.circuit_open() && clone.circuit_open());

    // Open: 50 calls in a row, on either clone and of any operation, all
    // refused by the breaker, and far faster than a timeout each.
    let started = std::time::Instant::now();
    for call in 0..50 {
        let error = if call % 2 == 0 {
            clone.get_record_at("keys", "k", t0()).await.unwrap_err()
        } else {
            store.reserve(&reserve_request(), t0()).await.unwrap_err()
        };
        assert!(
            matches!(error.kind(), StoreErrorKind::CircuitOpen),
            "call {call}: {error}"
        );
        assert!(error.is_unavailable());
        assert!(error.to_string().contains("circuit open"), "{error}");
    }
    let elapsed = started.elapsed();
    println!("frozen redis, breaker open: 50 calls in {elapsed:?}");
    assert!(elapsed < call_timeout * 5, "50 refusals took {elapsed:?}");
    let error = store.ping().await.unwrap_err();
    assert!(matches!(error.kind(), StoreErrorKind::CircuitOpen));

    // Thawed: after the cool-down a probe gets through and closes the
    // breaker; the same store answers again, no reconnect by hand.
    server.thaw();
    let decision = wait_for(PATIENCE, || async {
        clone
            .check_and_add("acct", &[minute_check()], t0())
            .await
            .map_err(|error| format!("the store did not answer after the thaw: {error}"))
    })
    .await;
    assert!(decision.admitted);
    assert!(!store.circuit_open() && !clone.circuit_open());
    store.ping().await.unwrap();
    store.get_record_at("keys", "k", t0()).await.unwrap();
}

/// Arguments the store refuses never reach Redis and never open the breaker.
#[tokio::test]
async fn refused_arguments_do_not_open_the_breaker() {
    let server = RedisServer::start();
    let config = RedisStoreConfig {
        breaker_failures: 1,
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&server.url(), config).await.unwrap();
    let zero_window = Check::new(
        "bad",
        Limit::Rolling {
            limit: 1,
            window: Duration::ZERO,
        },
        1,
    );
    for _ in 0..5 {
        let error = store
            .check_and_add("acct", std::slice::from_ref(&zero_window), t0())
            .await
            .unwrap_err();
        assert!(
            matches!(error.kind(), StoreErrorKind::Invalid(_)),
            "{error}"
        );
    }
    assert!(!store.circuit_open());
    store.ping().await.unwrap();
}

/// Two admissions a minute, counted in a fixed window.
fn two_per_minute() -> Check {
    Check::new(
        "two",
        Limit::FixedWindow {
            limit: 2,
            window: Duration::from_secs(60),
        },
        1,
    )
}

/// Waits until the store answers again after a dropped connection, with
/// a read of `account` (no counter, no purchase).
async fn wait_until_answering(store: &RedisStore, account: &str) {
    wait_until(PATIENCE, "the store to reconnect", || async {
        store.account_balance(account).await.is_ok()
    })
    .await;
}

/// How many requests that contain `marker` the relays forwarded.
fn sent_containing(relays: &[Relay], marker: &[u8]) -> usize {
    relays
        .iter()
        .map(|relay| relay.requests_containing(marker))
        .sum()
}

/// Redis runs an admission and a top-up but their replies are lost (the
/// relays drop the connection): each call fails, nothing sends it again,
/// and each counted exactly once.
async fn lost_replies_count_once(store: &RedisStore, relays: &[Relay]) {
    // Calls before the marked ones: another counter, a first purchase.
    let mut warm = minute_check();
    warm.name = "warm".into();
    store
        .check_and_add("lost-admission", &[warm], t0())
        .await
        .unwrap();
    store.top_up("lost-top-up", 3).await.unwrap();

    let marker = b"lost-admission";
    let sent_before = sent_containing(relays, marker);
    for relay in relays {
        relay.lose_reply_to(marker);
    }
    let error = store
        .check_and_add("lost-admission", &[two_per_minute()], t0())
        .await
        .expect_err("a call whose reply was lost must fail, not be resent");
    assert!(error.is_unavailable(), "{error}");
    for relay in relays {
        relay.disarm();
    }
    let lost: usize = relays.iter().map(Relay::lost_replies).sum();
    assert_eq!(lost, 1);
    let sent = sent_containing(relays, marker) - sent_before;
    assert_eq!(sent, 1, "the admission was sent to Redis {sent} times");
    wait_until_answering(store, "lost-admission").await;
    // Counted once: one more of the two fits, then none.
    let second = store
        .check_and_add("lost-admission", &[two_per_minute()], t0())
        .await
        .unwrap();
    assert!(second.admitted, "the lost admission was counted twice");
    let third = store
        .check_and_add("lost-admission", &[two_per_minute()], t0())
        .await
        .unwrap();
    assert!(!third.admitted, "the lost admission was not counted");

    let marker = b"lost-top-up";
    for relay in relays {
        relay.lose_reply_to(marker);
    }
    let error = store
        .top_up("lost-top-up", 7)
        .await
        .expect_err("a top-up whose reply was lost must fail");
    assert!(error.is_unavailable(), "{error}");
    for relay in relays {
        relay.disarm();
    }
    let lost: usize = relays.iter().map(Relay::lost_replies).sum();
    assert_eq!(lost, 2);
    wait_until_answering(store, "lost-top-up").await;
    let balance = store.account_balance("lost-top-up").await.unwrap();
    assert_eq!(balance.purchased_nanos, 3 + 7, "credited once");
    assert_eq!(balance.balance_nanos, 3 + 7);
}

/// Through a relay that drops the connection after Redis answered: the
/// connection manager reconnects but never sends the call again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_reply_is_lost_fails_and_counts_once() {
    let server = RedisServer::start();
    let relay = Relay::start(server.port()).await;
    let config = RedisStoreConfig {
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&relay.url(), config).await.unwrap();
    lost_replies_count_once(&store, std::slice::from_ref(&relay)).await;
}

/// The same on a 3-node Cluster, each node behind a relay that it
/// announces as its address (`cluster-announce-port`), so that every
/// connection of the Cluster client goes through one. The Cluster client
/// with retries would send the call again on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_call_whose_reply_is_lost_fails_and_counts_once() {
    let cluster = RedisCluster::start();
    let mut relays = Vec::new();
    for port in cluster.ports() {
        relays.push(Relay::start(port).await);
    }
    let ports: Vec<u16> = relays.iter().map(Relay::port).collect();
    tokio::task::block_in_place(|| cluster.announce_ports(&ports));
    let urls: Vec<String> = relays.iter().map(Relay::url).collect();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let config = RedisStoreConfig {
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect_cluster(&nodes, config).await.unwrap();
    lost_replies_count_once(&store, &relays).await;
}

/// A top-up without a key of the caller's, sent to Redis twice (the relay
/// sends the same bytes again, as a client resending after a lost reply
/// would): credited once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_up_sent_twice_is_credited_once() {
    let server = RedisServer::start();
    let relay = Relay::start(server.port()).await;
    let store = RedisStore::connect(&relay.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    store.top_up("twice", 1).await.unwrap();

    relay.send_twice(b"twice");
    let balance = store.top_up("twice", 5).await.unwrap();
    let seconds = relay.second_replies();
    assert_eq!(seconds.len(), 1);
    // The function ran the second time too (a reply array, not an error).
    assert!(
        seconds[0].starts_with(b"*"),
        "{:?}",
        String::from_utf8_lossy(&seconds[0])
    );
    assert_eq!(balance.purchased_nanos, 1 + 5);
    let balance = store.account_balance("twice").await.unwrap();
    assert_eq!(balance.purchased_nanos, 1 + 5, "credited once");
    assert_eq!(balance.balance_nanos, 1 + 5);

    // Each call is still a purchase of its own.
    let balance = store.top_up("twice", 5).await.unwrap();
    assert_eq!(balance.purchased_nanos, 1 + 5 + 5);
}

/// What the calling thread logs (INFO and above) from now on.
///
/// One subscriber for the whole test binary, installed once, writes each
/// line to its thread's capture: a subscriber per test (`set_default`)
/// would race with the tests that connect on other threads meanwhile,
/// since while it is the only one registered, tracing-core judges a
/// callsite first reached on another thread by that thread's (no)
/// subscriber and caches it as unwanted for every thread.
#[derive(Clone, Default)]
struct CapturedLogs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

thread_local! {
    static THIS_THREADS_LOGS: std::cell::RefCell<Option<CapturedLogs>> =
        const { std::cell::RefCell::new(None) };
}

/// Writes to the capture of the thread that logs, if it has one.
struct ThreadsCapture;

impl std::io::Write for ThreadsCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        THIS_THREADS_LOGS.with(|logs| {
            if let Some(logs) = logs.borrow().as_ref() {
                logs.0.lock().unwrap().extend_from_slice(bytes);
            }
        });
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    /// Starts capturing this thread's logs (the test runs on a
    /// current-thread runtime, so the store logs on it).
    fn of_this_thread() -> CapturedLogs {
        static SUBSCRIBER: std::sync::Once = std::sync::Once::new();
        SUBSCRIBER.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_writer(|| ThreadsCapture)
                .with_max_level(tracing::Level::INFO)
                .with_ansi(false)
                .finish();
            tracing::subscriber::set_global_default(subscriber).unwrap();
        });
        let logs = CapturedLogs::default();
        THIS_THREADS_LOGS.with(|capture| *capture.borrow_mut() = Some(logs.clone()));
        logs
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn connect_warns_when_redis_may_evict_the_gateways_keys() {
    let logs = CapturedLogs::of_this_thread();

    let evicting = RedisServer::start_with_args(&["--maxmemory-policy", "allkeys-lru"]);
    RedisStore::connect(&evicting.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    let warned = logs.text();
    assert!(warned.contains("WARN"), "{warned}");
    assert!(warned.contains("allkeys-lru"), "{warned}");
    assert!(warned.contains("noeviction"), "{warned}");

    // With an append-only file flushed on every write, so that nothing is
    // said about it either.
    let safe = RedisServer::start_persistent();
    let before = logs.text().len();
    RedisStore::connect(&safe.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    assert_eq!(
        logs.text().len(),
        before,
        "no warning with the default noeviction: {}",
        logs.text()
    );
}

/// What each append-only setting logs at connect, from real servers.
#[tokio::test]
async fn connect_says_what_a_restart_or_crash_can_lose() {
    let logs = CapturedLogs::of_this_thread();
    let connect_and_log = |server: RedisServer| {
        let logs = logs.clone();
        async move {
            let before = logs.text().len();
            RedisStore::connect(&server.url(), RedisStoreConfig::default())
                .await
                .unwrap();
            logs.text()[before..].to_owned()
        }
    };

    let logged = connect_and_log(RedisServer::start()).await;
    assert!(logged.contains("WARN"), "{logged}");
    assert!(logged.contains("appendonly no"), "{logged}");
    assert!(logged.contains("since the last RDB snapshot"), "{logged}");
    assert!(
        logged.contains("appendonly yes"),
        "says how to turn AOF on: {logged}"
    );

    let logged = connect_and_log(RedisServer::start_with_args(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "no",
    ]))
    .await;
    assert!(logged.contains("WARN"), "{logged}");
    assert!(logged.contains("appendfsync no"), "{logged}");
    assert!(logged.contains("30 s"), "{logged}");
    assert!(!logged.contains("appendonly no"), "{logged}");

    let logged = connect_and_log(RedisServer::start_with_args(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
    ]))
    .await;
    assert!(!logged.contains("WARN"), "{logged}");
    assert!(logged.contains("INFO"), "{logged}");
    assert!(logged.contains("up to 1 s"), "{logged}");

    let logged = connect_and_log(RedisServer::start_persistent()).await;
    assert!(
        !logged.contains("append"),
        "nothing to say with appendfsync always: {logged}"
    );
}

#[tokio::test]
async fn connecting_to_nothing_fails_with_a_clear_error() {
    let server = RedisServer::start();
    let url = server.url();
    drop(server);
    let config = RedisStoreConfig {
        call_timeout: Duration::from_millis(200),
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let error = RedisStore::connect(&url, config).await.unwrap_err();
    assert_eq!(error.operation(), "connect");
    assert!(
        RedisStore::connect("not a url", RedisStoreConfig::default())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn every_operation_is_one_round_trip() {
    let server = RedisServer::start();
    let store = RedisStore::connect(
        &server.url(),
        RedisStoreConfig {
            time_source: TimeSource::Caller,
            ..RedisStoreConfig::default()
        },
    )
    .await
    .unwrap();
    let checks = [
        minute_check(),
        Check::new(
            "day",
            Limit::Calendar {
                limit: 50,
                period: Period::Day,
            },
            1,
        ),
    ];
    let settlement = Settlement {
        account: "acct".into(),
        key: "key".into(),
        reservation_id: "r".into(),
        hold_granted: false,
        cost_nanos: 3,
        byok: false,
        record: None,
    };
    // Warm up: a first run of each operation.
    store.check_and_add("acct", &checks, t0()).await.unwrap();
    store.reserve(&reserve_request(), t0()).await.unwrap();
    store.settle(&settlement, t0()).await.unwrap();
    store.key_usage("acct", "key", t0()).await.unwrap();
    store.top_up("acct", 1).await.unwrap();
    store
        .put_record_at("keys", "k", b"v", Expect::Any, PutOptions::default(), t0())
        .await
        .unwrap();
    store.get_record_at("keys", "k", t0()).await.unwrap();
    store
        .delete_record_at("keys", "k", Expect::Any, t0())
        .await
        .unwrap();
    store.list_records_at("keys", 0, 10, t0()).await.unwrap();
    store
        .acquire_slot("acct", "s", "h", 1, Duration::from_secs(1), t0())
        .await
        .unwrap();

    let watch = CommandWatch::start(server.port());
    store.check_and_add("acct", &checks, t0()).await.unwrap();
    store.reserve(&reserve_request(), t0()).await.unwrap();
    store.settle(&settlement, t0()).await.unwrap();
    store.key_usage("acct", "key", t0()).await.unwrap();
    store.top_up("acct", 1).await.unwrap();
    store.account_balance("acct").await.unwrap();
    store
        .put_record_at("keys", "k", b"v", Expect::Any, PutOptions::default(), t0())
        .await
        .unwrap();
    store.get_record_at("keys", "k", t0()).await.unwrap();
    store
        .delete_record_at("keys", "k", Expect::Any, t0())
        .await
        .unwrap();
    store.list_records_at("keys", 0, 10, t0()).await.unwrap();
    store
        .acquire_slot("acct", "s", "h", 1, Duration::from_secs(1), t0())
        .await
        .unwrap();
    store.release_slot("acct", "s", "h").await.unwrap();
    // Settlements of one account in one call, with or without a reservation.
    let batch: Vec<Settlement> = (0..5)
        .map(|index| Settlement {
            key: format!("key{}", index % 2),
            reservation_id: format!("batch{index}"),
            hold_granted: false,
            ..settlement.clone()
        })
        .collect();
    store.settle_many(&batch, t0()).await.unwrap();
    store
        .reserve_after_settling(&batch, &reserve_request(), t0())
        .await
        .unwrap();
    let commands = watch.client_commands();
    let mut expected = vec!["fcall"; 5];
    expected.extend(["hmget", "fcall", "fcall", "fcall", "fcall"]);
    expected.extend(["fcall", "zrem", "fcall", "fcall"]);
    assert_eq!(commands, expected);
}

/// A key's reservations are summed once and the sum kept beside them; a
/// ledger without the sum, with holds written by something that did not
/// keep it (an earlier version, during a rolling upgrade), or with a sum
/// below its holds is counted afresh.
#[tokio::test]
async fn counter_keys_expire_and_carry_the_prefix_and_hash_tag() {
    let server = RedisServer::start();
    let config = RedisStoreConfig {
        key_prefix: "gw1".into(),
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&server.url(), config).await.unwrap();
    let checks = [
        Check::new(
            "fixed",
            Limit::FixedWindow {
                limit: 5,
                window: Duration::from_secs(60),
            },
            1,
        ),
        minute_check(),
        Check::new(
            "gcra",
            Limit::Gcra {
                rate: 1,
                period: Duration::from_secs(1),
                burst: 5,
            },
            1,
        ),
    ];
    // The store's clock is far in the past: expiry must not depend on it.
    store.check_and_add("acct:1", &checks, t0()).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let keys = without_layout(
        redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut connection)
            .await
            .unwrap(),
    );
    assert_eq!(keys.len(), 4, "{keys:?}"); // fixed, rolling zset + aux, gcra
    for key in keys {
        assert!(key.starts_with("gw1:{acct%3A1}:c:"), "{key}");
        let ttl_ms: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(ttl_ms > 0 && ttl_ms <= 70_000, "{key} has TTL {ttl_ms} ms");
    }
}

/// The ids the account's ledger tracks (its `ids` zset), with their
/// scores: a live hold's expiry, or minus when a settled or lapsed id is
/// forgotten.
async fn tracked_ids(connection: &mut redis::aio::MultiplexedConnection) -> Vec<(String, i64)> {
    redis::cmd("ZRANGE")
        .arg("mg:{acct}:ids")
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(connection)
        .await
        .unwrap()
}

/// The request fields (`i:<id>`, `l:<id>`) of the account's ledger hash.
async fn request_fields(connection: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg("mg:{acct}:acct")
        .query_async(connection)
        .await
        .unwrap();
    fields
        .into_iter()
        .filter(|field| field.starts_with("i:") || field.starts_with("l:"))
        .collect()
}

/// A store on a Redis of its own, at the caller's clock, with `acct`
/// funded; and a plain connection to read Redis with.
async fn funded_store() -> (RedisServer, RedisStore, redis::aio::MultiplexedConnection) {
    let server = RedisServer::start();
    let config = RedisStoreConfig {
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&server.url(), config).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let connection = client.get_multiplexed_async_connection().await.unwrap();
    store.top_up("acct", 1_000_000).await.unwrap();
    (server, store, connection)
}

/// How many records and tracked ids the account holds in Redis.
async fn records_and_ids(connection: &mut redis::aio::MultiplexedConnection) -> (usize, usize) {
    let records: usize = redis::cmd("ZCARD")
        .arg("mg:{acct}:genexp")
        .query_async(connection)
        .await
        .unwrap();
    (records, tracked_ids(connection).await.len())
}

/// A busy account's cleanup never comes as one long command: each tidying
/// removes at most 200 forgotten ids and 200 records past the cap (1,000
/// at once held Redis for about 0.9 ms), and one that leaves some behind
/// lets a call 10 ms later go on instead of 100 ms later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tidying_removes_a_bounded_batch_and_the_next_call_goes_on() {
    let (_server, store, mut connection) = funded_store().await;
    let settled = |id: usize, most: u64| Settlement {
        reservation_id: format!("r{id}"),
        hold_granted: false,
        account: "acct".into(),
        key: "key".into(),
        cost_nanos: 1,
        byok: false,
        record: Some(SettlementRecord {
            bytes: bytes::Bytes::from(format!("{{\"id\":{id}}}")),
            retention: Duration::from_secs(3600),
            max_per_account: most,
        }),
    };
    let many = 450;
    for id in 0..many {
        store.settle(&settled(id, 1_000_000), t0()).await.unwrap();
    }
    assert_eq!(records_and_ids(&mut connection).await, (many, many));
    // Past the ids' memory, with the cap down to 1: each call, 10 ms after
    // the one before, removes 200 of each and adds its own; a call sooner
    // than that removes nothing.
    let memory = chrono::Duration::from_std(modelgate::store::SETTLEMENT_MEMORY).unwrap();
    let later = t0() + memory + chrono::Duration::seconds(60);
    let mut left = Vec::new();
    let steps_ms = [0, 10, 15, 20, 30];
    for (id, after_ms) in (many..).zip(steps_ms) {
        let then = later + chrono::Duration::milliseconds(after_ms);
        store.settle(&settled(id, 1), then).await.unwrap();
        left.push(records_and_ids(&mut connection).await);
    }
    assert_eq!(left, [(251, 251), (52, 52), (53, 53), (1, 4), (2, 5)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_ids_are_kept_for_their_retries_then_forgotten() {
    let (_server, store, mut connection) = funded_store().await;
    let settle = |id: &str, hold_granted| Settlement {
        reservation_id: id.into(),
        hold_granted,
        account: "acct".into(),
        key: "key".into(),
        cost_nanos: 7,
        byok: false,
        record: None,
    };
    for request in 0..200 {
        let id = format!("r{request}");
        let hold = ReserveRequest {
            reservation_id: id.clone(),
            covered_by_balance: true,
            lapse_record: None,
            counts_against_key_limit: true,
            ..reserve_request()
        };
        assert!(store.reserve(&hold, t0()).await.unwrap().is_reserved());
        // Retried, as after a lost reply.
        store.settle(&settle(&id, true), t0()).await.unwrap();
        store.settle(&settle(&id, true), t0()).await.unwrap();
    }
    // Each id's marker, written with its cost, until SETTLEMENT_MEMORY has
    // passed.
    let memory = chrono::Duration::from_std(modelgate::store::SETTLEMENT_MEMORY).unwrap();
    let forget_at = (t0() + memory).timestamp_micros();
    let markers = tracked_ids(&mut connection).await;
    assert_eq!(markers.len(), 200);
    assert!(
        markers.iter().all(|(_, score)| *score == -forget_at),
        "{markers:?}"
    );
    assert_eq!(request_fields(&mut connection).await.len(), 200);
    let balance = store.account_balance("acct").await.unwrap().balance_nanos;
    assert_eq!(balance, 1_000_000 - 7 * 200);
    // The next call a minute past that time (what is forgotten stays that
    // much longer, unseen, for a clock that steps back) removes them,
    // fields and ids: a busy account's ledger holds only what is in flight
    // or may still be retried.
    let removed = t0() + memory + chrono::Duration::seconds(60);
    store
        .settle(&settle("unheld", false), removed)
        .await
        .unwrap();
    let remembered = tracked_ids(&mut connection).await;
    assert_eq!(remembered.len(), 1, "{remembered:?}");
    assert_eq!(remembered[0].0, "unheld");
    assert_eq!(request_fields(&mut connection).await, ["i:unheld"]);
    // A hold that expires unsettled lapses: known until its settlement
    // takes it, which replaces it with its marker.
    let later = removed;
    assert!(
        store
            .reserve(&reserve_request(), later)
            .await
            .unwrap()
            .is_reserved()
    );
    let expired = later + chrono::Duration::seconds(60);
    store.key_usage("acct", "key", expired).await.unwrap();
    let state = |mut connection: redis::aio::MultiplexedConnection| async move {
        let value: String = redis::cmd("HGET")
            .arg("mg:{acct}:acct")
            .arg("i:r")
            .query_async(&mut connection)
            .await
            .unwrap();
        value
    };
    assert!(state(connection.clone()).await.starts_with("L:"));
    store.settle(&settle("r", true), expired).await.unwrap();
    store.settle(&settle("r", true), expired).await.unwrap();
    assert!(state(connection.clone()).await.starts_with("S:"));
    let balance = store.account_balance("acct").await.unwrap().balance_nanos;
    assert_eq!(balance, 1_000_000 - 7 * 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_of_thousands_of_holds_renews_them_all_and_lapses_the_expired() {
    // An instance renews every hold of an account in one call. Past a few
    // thousand, Lua's unpack() fails: a call that failed part way would
    // leave a lapsed hold half written, never charged.
    let (_server, store, _connection) = funded_store().await;
    let hold = |id: String, ttl_secs| ReserveRequest {
        reservation_id: id,
        amount_nanos: 1,
        covered_by_balance: true,
        lapse_record: None,
        ttl: Duration::from_secs(ttl_secs),
        ..reserve_request()
    };
    assert!(
        store
            .reserve(&hold("old".into(), 1), t0())
            .await
            .unwrap()
            .is_reserved()
    );
    let mut renewals = Vec::new();
    for request in 0..4_100 {
        let id = format!("r{request}");
        assert!(
            store
                .reserve(&hold(id.clone(), 60), t0())
                .await
                .unwrap()
                .is_reserved()
        );
        renewals.push(HoldRenewal {
            key: "key".into(),
            reservation_id: id,
        });
    }
    let later = t0() + chrono::Duration::seconds(30);
    let renewed = store
        .renew_holds("acct", &renewals, Duration::from_secs(60), later)
        .await
        .unwrap();
    assert_eq!(renewed, 4_100);
    // The expired one lapsed, charged once; the rest hold on past their
    // first expiry.
    let balance = store.account_balance("acct").await.unwrap().balance_nanos;
    assert_eq!(balance, 1_000_000 - 1);
    let usage = store
        .key_usage("acct", "key", t0() + chrono::Duration::seconds(80))
        .await
        .unwrap();
    assert_eq!((usage.total_nanos, usage.reserved_nanos), (1, 4_100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_kept_before_keys_had_orders_are_found_on_their_keys_pages() {
    let (_server, store, mut connection) = funded_store().await;
    let settle = |id: &str, key: &str| Settlement {
        account: "acct".into(),
        key: key.into(),
        reservation_id: id.into(),
        hold_granted: false,
        cost_nanos: 7,
        byok: false,
        record: Some(SettlementRecord {
            bytes: format!(r#"{{"id":"gen-{id}","key_hash":"{key}"}}"#).into(),
            retention: Duration::from_secs(3600),
            max_per_account: 100,
        }),
    };
    for (n, key) in ["ka", "kb", "ka"].iter().enumerate() {
        let at = t0() + chrono::Duration::seconds(n as i64);
        store
            .settle(&settle(&format!("r{n}"), key), at)
            .await
            .unwrap();
    }
    // As a store written before the keys' orders: none of them.
    let _: () = redis::cmd("DEL")
        .arg("mg:{acct}:genexp:ka")
        .arg("mg:{acct}:genexp:kb")
        .query_async(&mut connection)
        .await
        .unwrap();
    let now = t0() + chrono::Duration::seconds(5);
    let page_of = |key| GenerationsPage {
        key: Some(key),
        skip: 0,
        limit: 10,
    };
    let ids = |records: Vec<bytes::Bytes>| -> Vec<String> {
        records
            .iter()
            .map(|bytes| {
                serde_json::from_slice::<serde_json::Value>(bytes).unwrap()["id"].to_string()
            })
            .collect()
    };
    let page = store
        .generations_page("acct", page_of("ka"), now)
        .await
        .unwrap();
    assert_eq!(ids(page), [r#""gen-r2""#, r#""gen-r0""#]);
    let page = store
        .generations_page("acct", page_of("kb"), now)
        .await
        .unwrap();
    assert_eq!(ids(page), [r#""gen-r1""#]);
    // Put once: the orders live as long as the records, and the mark stays.
    let ttl_ms = pttl_of(&mut connection, "mg:{acct}:genexp:ka").await;
    assert!(ttl_ms > 3_500_000, "the order lives {ttl_ms} ms");
    assert!(exists(&mut connection, "mg:{acct}:genkeyed").await);
}

/// A settlement of `id`, made with the key named `key`, costing 7, with its
/// record kept for `retention` when given.
fn record_settlement(id: &str, retention: Option<Duration>) -> Settlement {
    Settlement {
        account: "acct".into(),
        key: "key".into(),
        reservation_id: id.into(),
        hold_granted: true,
        cost_nanos: 7,
        byok: false,
        record: retention.map(|retention| SettlementRecord {
            bytes: format!("record of {id}").into(),
            retention,
            max_per_account: 100,
        }),
    }
}

/// Hold `r1` for one second, its lapse's record kept for `retention`.
fn lapsing_with_record(retention: Duration) -> ReserveRequest {
    ReserveRequest {
        reservation_id: "r1".into(),
        ttl: Duration::from_secs(1),
        lapse_record: Some(RecordKeeping {
            retention,
            max_per_account: 100,
            model: None,
        }),
        ..reserve_request()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_keys_live_as_long_as_their_longest_record_after_an_undone_lapse() {
    // A lapse record undone in the call that made it is never written: the
    // record keys' known lifetime must not move for it, or a later record
    // that needs a longer one would not get it and vanish early.
    let (_server, store, mut connection) = funded_store().await;
    let hour = Duration::from_secs(3600);
    store
        .settle(&record_settlement("s1", Some(hour)), t0())
        .await
        .unwrap();
    let lapsing = lapsing_with_record(10 * hour);
    assert!(store.reserve(&lapsing, t0()).await.unwrap().is_reserved());
    // Its late settlement is the first call after it lapsed: the lapse and
    // its record are undone in the same call.
    store
        .settle(
            &record_settlement("r1", None),
            t0() + chrono::Duration::seconds(2),
        )
        .await
        .unwrap();
    store
        .settle(
            &record_settlement("s2", Some(5 * hour)),
            t0() + chrono::Duration::seconds(3),
        )
        .await
        .unwrap();
    for key in ["mg:{acct}:gen", "mg:{acct}:genexp"] {
        let ttl_ms: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(ttl_ms >= 5 * 3_600_000 - 60_000, "{key} lives {ttl_ms} ms");
    }
    let kept = store
        .generation("acct", "s2", t0() + chrono::Duration::seconds(3))
        .await
        .unwrap();
    assert!(kept.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_keys_are_never_shortened_by_a_shorter_kept_record() {
    // An undone lapse forgets how long the record keys are known to live;
    // the next record, kept for less time than one already there, must not
    // cut their lifetime short.
    let (_server, store, mut connection) = funded_store().await;
    let hour = Duration::from_secs(3600);
    store
        .settle(&record_settlement("long", Some(10 * hour)), t0())
        .await
        .unwrap();
    let lapsing = lapsing_with_record(hour);
    assert!(store.reserve(&lapsing, t0()).await.unwrap().is_reserved());
    // The hold lapses (its record kept), then its late settlement undoes it.
    store
        .settle(
            &record_settlement("other", None),
            t0() + chrono::Duration::seconds(2),
        )
        .await
        .unwrap();
    store
        .settle(
            &record_settlement("r1", None),
            t0() + chrono::Duration::seconds(3),
        )
        .await
        .unwrap();
    store
        .settle(
            &record_settlement("short", Some(hour)),
            t0() + chrono::Duration::seconds(4),
        )
        .await
        .unwrap();
    for key in ["mg:{acct}:gen", "mg:{acct}:genexp"] {
        let ttl_ms = pttl_of(&mut connection, key).await;
        assert!(ttl_ms >= 10 * 3_600_000 - 60_000, "{key} lives {ttl_ms} ms");
    }
}

/// How many `PEXPIRE`s the server has run, inside functions included.
async fn pexpires_run(connection: &mut redis::aio::MultiplexedConnection) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .unwrap();
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_pexpire:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// `settlement` made with key `key`, its record in an account that keeps
/// at most `most`.
fn keyed(key: &str, most: u64, settlement: Settlement) -> Settlement {
    let record = settlement.record.map(|record| SettlementRecord {
        max_per_account: most,
        ..record
    });
    Settlement {
        key: key.into(),
        record,
        ..settlement
    }
}

/// Holds `id` on key `key` at `at`, then settles it 10 ms later with its
/// record kept for `retention`: both calls on the short path.
async fn held_then_settled(
    store: &RedisStore,
    key: &str,
    id: &str,
    retention: Duration,
    at: DateTime<Utc>,
) {
    let hold = ReserveRequest {
        key: key.into(),
        reservation_id: id.into(),
        ..reserve_request()
    };
    assert!(store.reserve(&hold, at).await.unwrap().is_reserved());
    let later = at + chrono::Duration::milliseconds(10);
    let settlement = keyed(key, 100, record_settlement(id, Some(retention)));
    store.settle(&settlement, later).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_order_is_made_to_live_once_in_its_margin() {
    // Each record used to set its key's order's TTL again: one or two
    // PEXPIREs per settlement. Known to live long enough, the order is
    // left alone, on the short path and the general one.
    let (_server, store, mut connection) = funded_store().await;
    let hour = Duration::from_secs(3600);
    let at = |ms| t0() + chrono::Duration::milliseconds(ms);
    held_then_settled(&store, "key", "a", hour, at(0)).await;
    let made_to_live = pexpires_run(&mut connection).await;
    assert!(made_to_live > 0);
    held_then_settled(&store, "key", "b", hour, at(20)).await;
    // No hold to settle, past the tidying time: the general path.
    store
        .settle(&record_settlement("c", Some(hour)), at(200))
        .await
        .unwrap();
    assert_eq!(pexpires_run(&mut connection).await, made_to_live);
    let ttl_ms = pttl_of(&mut connection, "mg:{acct}:genexp:key").await;
    assert!(ttl_ms >= 3_600_000, "the order lives {ttl_ms} ms");
    // A record kept longer than the order is known to live extends it.
    store
        .settle(&record_settlement("d", Some(10 * hour)), at(300))
        .await
        .unwrap();
    let ttl_ms = pttl_of(&mut connection, "mg:{acct}:genexp:key").await;
    assert!(ttl_ms >= 36_000_000, "the order lives {ttl_ms} ms");
    // Which the general path remembers too.
    let extended = pexpires_run(&mut connection).await;
    assert!(extended > made_to_live);
    store
        .settle(&record_settlement("e", Some(10 * hour)), at(400))
        .await
        .unwrap();
    assert_eq!(pexpires_run(&mut connection).await, extended);
    // Another key's first record, on the short path: its order is new,
    // whatever the account's record keys are known to live.
    held_then_settled(&store, "k2", "f", hour, at(410)).await;
    let ttl_ms = pttl_of(&mut connection, "mg:{acct}:genexp:k2").await;
    assert!(ttl_ms >= 3_600_000, "the order lives {ttl_ms} ms");
}

/// On a Cluster whose account slot is half moved (one key's order gone
/// ahead), a tidying call fails where it meets that order, keeping what it
/// wrote before. No order it emptied may stay known to live, and no record
/// past the cap may show in a key's page: once the move ends, each key's
/// next record gives its order a TTL again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tidying_that_fails_part_way_leaves_no_order_without_a_ttl() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let config = RedisStoreConfig {
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect_cluster(&nodes, config).await.unwrap();
    let hour = Duration::from_secs(3600);
    let keys = ["k1", "k2", "k3", "k4", "k5", "k6"];
    for (n, key) in keys.iter().enumerate() {
        let settlement = keyed(key, 100, record_settlement(&format!("s{n}"), Some(hour)));
        store.settle(&settlement, t0()).await.unwrap();
    }
    let mut connections = Vec::new();
    for url in &urls {
        let client = redis::Client::open(url.as_str()).unwrap();
        connections.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg("mg:{acct}:acct")
        .query_async(&mut connections[0])
        .await
        .unwrap();
    let mut ids = Vec::new();
    let mut source = None;
    for (index, connection) in connections.iter_mut().enumerate() {
        let id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(connection)
            .await
            .unwrap();
        ids.push(id);
        let held: u64 = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query_async(connection)
            .await
            .unwrap();
        if held > 0 {
            source = Some(index);
        }
    }
    let source = source.expect("a node holds the account");
    let target = (source + 1) % 3;
    let target_port = cluster.ports()[target];
    let set_slot = |state: &str, node: &str| {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(node)
            .to_owned()
    };
    let () = set_slot("IMPORTING", &ids[source])
        .query_async(&mut connections[target])
        .await
        .unwrap();
    let () = set_slot("MIGRATING", &ids[target])
        .query_async(&mut connections[source])
        .await
        .unwrap();
    let migrate = |keys: &[String]| {
        redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(target_port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys)
            .to_owned()
    };
    let moved_ahead = ["mg:{acct}:genexp:k2".to_owned()];
    let () = migrate(&moved_ahead)
        .query_async(&mut connections[source])
        .await
        .unwrap();
    // Past a cap of one, the other records go, out of every key's order.
    let over = keyed("k1", 1, record_settlement("s9", Some(hour)));
    let second = t0() + chrono::Duration::seconds(1);
    assert!(store.settle(&over, second).await.is_err());
    // The move ends.
    let left: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query_async(&mut connections[source])
        .await
        .unwrap();
    let () = migrate(&left)
        .query_async(&mut connections[source])
        .await
        .unwrap();
    for node in [target, source, (source + 2) % 3] {
        let () = set_slot("NODE", &ids[target])
            .query_async(&mut connections[node])
            .await
            .unwrap();
    }
    // The records past the cap wait, unseen, for the next tidying: none
    // is left in a key's page (k1's holds s9, the newest).
    for key in &keys[1..] {
        let records = wait_for(PATIENCE, || async {
            let page = GenerationsPage {
                key: Some(key),
                skip: 0,
                limit: 10,
            };
            store
                .generations_page("acct", page, second)
                .await
                .map_err(|error| error.to_string())
        })
        .await;
        assert!(records.is_empty(), "{key}'s page shows {records:?}");
    }
    let later = t0() + chrono::Duration::seconds(2);
    for (n, key) in keys.iter().enumerate() {
        let settlement = keyed(key, 100, record_settlement(&format!("t{n}"), Some(hour)));
        // Sent again until it lands, as a settlement is: the store's client
        // learns the slot's new node from the refusal (MOVED).
        wait_until(
            PATIENCE,
            "the settlement on the slot's new node",
            || async { store.settle(&settlement, later).await.is_ok() },
        )
        .await;
        let order = format!("mg:{{acct}}:genexp:{key}");
        let ttl_ms = pttl_of(&mut connections[target], &order).await;
        assert!(ttl_ms >= 3_600_000, "{order} lives {ttl_ms} ms");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_recorded_again_on_another_key_leaves_the_first_keys_page() {
    // A late settlement may name another key than its lapsed hold's: its
    // record replaces the lapse's, on its own key's page alone.
    async fn pages<S: LedgerStore>(store: &S) -> String {
        let hour = Duration::from_secs(3600);
        let at = |s| t0() + chrono::Duration::seconds(s);
        store.top_up("acct", 1_000_000).await.unwrap();
        let lapsing = lapsing_with_record(hour);
        assert!(store.reserve(&lapsing, at(0)).await.unwrap().is_reserved());
        store
            .settle(&record_settlement("other", None), at(2))
            .await
            .unwrap();
        let late = keyed("k2", 100, record_settlement("r1", Some(hour)));
        store.settle(&late, at(3)).await.unwrap();
        let mut pages = Vec::new();
        for key in ["key", "k2"] {
            let page = GenerationsPage {
                key: Some(key),
                skip: 0,
                limit: 10,
            };
            let records = store.generations_page("acct", page, at(4)).await.unwrap();
            pages.push(format!("{key}: {} records", records.len()));
        }
        pages.join(", ")
    }
    let server = RedisServer::start();
    let redis = caller_clocked(&server).await;
    assert_eq!(pages(&redis).await, "key: 0 records, k2: 1 records");
    assert_eq!(
        pages(&MemoryStore::new()).await,
        "key: 0 records, k2: 1 records"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_order_emptied_by_tidying_is_made_to_live_again() {
    // Redis drops an emptied order with its TTL; the next record makes it
    // anew, which must live as long as that record, not forever.
    let (_server, store, mut connection) = funded_store().await;
    let hour = Duration::from_secs(3600);
    let at = |s| t0() + chrono::Duration::seconds(s);
    let first = keyed("ka", 1, record_settlement("s1", Some(hour)));
    store.settle(&first, at(0)).await.unwrap();
    // Past the cap of one: s1 leaves the account and its key's order.
    let other = keyed("kb", 1, record_settlement("s2", Some(hour)));
    store.settle(&other, at(1)).await.unwrap();
    assert!(!exists(&mut connection, "mg:{acct}:genexp:ka").await);
    let again = keyed("ka", 1, record_settlement("s3", Some(hour)));
    store.settle(&again, at(2)).await.unwrap();
    let ttl_ms = pttl_of(&mut connection, "mg:{acct}:genexp:ka").await;
    assert!(ttl_ms >= 3_600_000, "the order lives {ttl_ms} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_order_emptied_by_an_undone_lapse_is_made_to_live_again() {
    let (_server, store, mut connection) = funded_store().await;
    let hour = Duration::from_secs(3600);
    let at = |s| t0() + chrono::Duration::seconds(s);
    assert!(
        store
            .reserve(&lapsing_with_record(hour), at(0))
            .await
            .unwrap()
            .is_reserved()
    );
    // The hold lapses, its record in the key's order; its late settlement
    // takes the record out again.
    store
        .settle(&record_settlement("other", None), at(2))
        .await
        .unwrap();
    assert!(exists(&mut connection, "mg:{acct}:genexp:key").await);
    store
        .settle(&record_settlement("r1", None), at(3))
        .await
        .unwrap();
    assert!(!exists(&mut connection, "mg:{acct}:genexp:key").await);
    store
        .settle(&record_settlement("s", Some(hour)), at(4))
        .await
        .unwrap();
    let ttl_ms = pttl_of(&mut connection, "mg:{acct}:genexp:key").await;
    assert!(ttl_ms >= 3_600_000, "the order lives {ttl_ms} ms");
}

/// An account's GCRA rate limit is one counter, whether an admission
/// (with its hold) or a plain check (`check_and_add`, as the limiter makes
/// without a hold) counts against it, and its state lives in the
/// account's hash (layout 4) as soon as that exists: a state an older
/// layout left under the counter's own key still counts until then. A
/// scope with no account hash keeps it under its key, with a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gcra_limit_is_one_counter_for_admissions_and_checks() {
    let server = RedisServer::start();
    let redis = caller_clocked(&server).await;
    let memory = MemoryStore::new();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    // Two a minute, a burst of two.
    let limit = Limit::Gcra {
        rate: 2,
        period: Duration::from_secs(60),
        burst: 2,
    };
    let check = Check::new("rpm", limit, 1);
    let counter = "mg:{acct}:c:g:rpm";
    // A state layout 3 left: one unit used just now.
    let () = redis::cmd("SET")
        .arg(counter)
        .arg((t0() + chrono::Duration::seconds(30)).timestamp_micros())
        .arg("PX")
        .arg(60_000)
        .query_async(&mut connection)
        .await
        .unwrap();
    let one_used = [check.clone()];
    let seeded = memory.check_and_add("acct", &one_used, t0()).await.unwrap();
    assert!(seeded.admitted);
    // The second unit by an admission, the third refused by a check, then
    // a unit freed 30 s later taken by a check and refused to an admission.
    async fn take_turns<S: LedgerStore + CounterStore>(store: &S, check: &Check) -> String {
        let admit = |id: &str| AdmitRequest {
            account: "acct".into(),
            checks: vec![check.clone()],
            purchase_tier: None,
            hold: Some(ReserveRequest {
                reservation_id: id.into(),
                ..reserve_request()
            }),
        };
        let checks = std::slice::from_ref(check);
        store.top_up("acct", 1_000).await.unwrap();
        let first = store
            .admit_after_settling(&[], &admit("a1"), t0())
            .await
            .unwrap();
        let refused = store.check_and_add("acct", checks, t0()).await.unwrap();
        let later = t0() + chrono::Duration::seconds(30);
        let freed = store.check_and_add("acct", checks, later).await.unwrap();
        let full = store
            .admit_after_settling(&[], &admit("a2"), later)
            .await
            .unwrap();
        format!(
            "{} {} {} {}",
            first.admitted, refused.admitted, freed.admitted, full.admitted
        )
    }
    assert_eq!(take_turns(&memory, &check).await, "true false true false");
    assert_eq!(take_turns(&redis, &check).await, "true false true false");
    // A layout 3 state read where most admissions are decided (an account
    // with no upkeep due, a new id: `admit_at_once`): a second limit whose
    // burst its key says is spent refuses the admission.
    let second = Check::new("rpm2", limit, 1);
    let later = t0() + chrono::Duration::seconds(30);
    let () = redis::cmd("SET")
        .arg("mg:{acct}:c:g:rpm2")
        .arg((later + chrono::Duration::seconds(60)).timestamp_micros())
        .arg("PX")
        .arg(120_000)
        .query_async(&mut connection)
        .await
        .unwrap();
    for _ in 0..2 {
        let spent = memory
            .check_and_add("acct", std::slice::from_ref(&second), later)
            .await
            .unwrap();
        assert!(spent.admitted);
    }
    let admission = AdmitRequest {
        account: "acct".into(),
        checks: vec![second],
        purchase_tier: None,
        hold: Some(ReserveRequest {
            reservation_id: "a3".into(),
            ..reserve_request()
        }),
    };
    let soon = later + chrono::Duration::milliseconds(1);
    let on_redis = redis
        .admit_after_settling(&[], &admission, soon)
        .await
        .unwrap();
    let in_memory = memory
        .admit_after_settling(&[], &admission, soon)
        .await
        .unwrap();
    assert!(!on_redis.admitted);
    assert_eq!(format!("{on_redis:?}"), format!("{in_memory:?}"));
    // The state is the account hash's field now; the old key, past its
    // use, only waits for its TTL.
    let field: Option<String> = redis::cmd("HGET")
        .arg("mg:{acct}:acct")
        .arg(counter)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(
        field,
        Some(
            (t0() + chrono::Duration::seconds(90))
                .timestamp_micros()
                .to_string()
        )
    );
    // A scope that is no account: its key, with a TTL, and no hash made.
    let checked = redis.check_and_add("ip-1", &one_used, t0()).await.unwrap();
    assert!(checked.admitted);
    let ttl_ms = pttl_of(&mut connection, "mg:{ip-1}:c:g:rpm").await;
    assert!(ttl_ms > 0, "{ttl_ms}");
    assert!(!exists(&mut connection, "mg:{ip-1}:acct").await);
}

/// A store on `server` that decides time by the caller's clock.
async fn caller_clocked(server: &RedisServer) -> RedisStore {
    let config = RedisStoreConfig {
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    RedisStore::connect(&server.url(), config).await.unwrap()
}

/// Key `key`'s PTTL (-1 none, -2 no such key).
async fn pttl_of(connection: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(connection)
        .await
        .unwrap()
}

/// Whether key `key` exists.
async fn exists(connection: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async(connection)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sums_stop_at_the_i64_bounds_on_both_stores() {
    let server = RedisServer::start();
    let redis = caller_clocked(&server).await;
    let memory = MemoryStore::new();
    let settle = |id: &str| Settlement {
        account: "acct".into(),
        key: "key".into(),
        reservation_id: id.into(),
        hold_granted: false,
        cost_nanos: i64::MAX,
        byok: false,
        record: None,
    };
    for store in [&redis as &dyn LedgerStore, &memory] {
        for id in ["a", "b", "c"] {
            store.settle(&settle(id), t0()).await.unwrap();
        }
        let usage = store.key_usage("acct", "key", t0()).await.unwrap();
        assert_eq!((usage.total_nanos, usage.day_nanos), (i64::MAX, i64::MAX));
        let balance = store.account_balance("acct").await.unwrap().balance_nanos;
        assert_eq!(balance, i64::MIN);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_outlived_on_an_idle_key_is_still_charged() {
    // Redis expires keys by its own clock: a key nobody touches while its
    // request runs past the hold must keep the hold until it lapses.
    let server = RedisServer::start();
    let config = RedisStoreConfig {
        expiry_slack: Duration::from_millis(100),
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&server.url(), config).await.unwrap();
    store.top_up("acct", 1_000).await.unwrap();
    let hold = ReserveRequest {
        ttl: Duration::from_millis(200),
        covered_by_balance: true,
        lapse_record: None,
        counts_against_key_limit: true,
        ..reserve_request()
    };
    assert!(
        store
            .reserve(&hold, chrono::Utc::now())
            .await
            .unwrap()
            .is_reserved()
    );
    // Past the hold's lifetime and the slack, by Redis's own clock.
    let outlived = server.clock() + Duration::from_millis(200 + 100);
    wait_until(
        PATIENCE,
        "Redis's clock past the hold and its slack",
        || async { server.clock() > outlived },
    )
    .await;
    let settlement = Settlement {
        account: "acct".into(),
        key: "key".into(),
        reservation_id: "r".into(),
        hold_granted: true,
        cost_nanos: 7,
        byok: false,
        record: None,
    };
    for _ in 0..2 {
        store.settle(&settlement, chrono::Utc::now()).await.unwrap();
    }
    let balance = store.account_balance("acct").await.unwrap().balance_nanos;
    assert_eq!(balance, 1_000 - 7);
}

/// A lapse forgotten (`LAPSED_HOLD_MEMORY` after it) and then a renewal of
/// its hold, then its settlement: what each store says the account paid
/// (balance, the key's all-time usage).
async fn settled_after_a_forgotten_lapse<S: LedgerStore>(store: &S, renew: bool) -> (i64, i64) {
    store.top_up("acct", 100).await.unwrap();
    let hold = ReserveRequest {
        amount_nanos: 7,
        ttl: Duration::from_secs(1),
        covered_by_balance: true,
        ..reserve_request()
    };
    assert!(store.reserve(&hold, t0()).await.unwrap().is_reserved());
    let renewal = [HoldRenewal {
        key: "key".into(),
        reservation_id: "r".into(),
    }];
    let ttl = Duration::from_secs(60);
    // Its instance died: the first renewal of the account's other requests
    // finds it lapsed, and charges it.
    let lapsed_at = t0() + chrono::Duration::seconds(5);
    assert_eq!(
        store
            .renew_holds("acct", &renewal, ttl, lapsed_at)
            .await
            .unwrap(),
        0
    );
    let memory = chrono::Duration::from_std(modelgate::store::LAPSED_HOLD_MEMORY).unwrap();
    let forgotten = lapsed_at + memory + chrono::Duration::seconds(60);
    if renew {
        assert_eq!(
            store
                .renew_holds("acct", &renewal, ttl, forgotten)
                .await
                .unwrap(),
            0
        );
    }
    let settlement = Settlement {
        account: "acct".into(),
        key: "key".into(),
        reservation_id: "r".into(),
        hold_granted: true,
        cost_nanos: 3,
        byok: false,
        record: None,
    };
    let settled_at = forgotten + chrono::Duration::seconds(1);
    store.settle(&settlement, settled_at).await.unwrap();
    let balance = store.account_balance("acct").await.unwrap().balance_nanos;
    let usage = store.key_usage("acct", "key", settled_at).await.unwrap();
    (balance, usage.total_nanos)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_after_a_lapse_is_forgotten_does_not_bring_its_charge_back() {
    // Found by `ledger_answers_and_state_exactly_as_the_rules_do`: a lapse's
    // charge is known for LAPSED_HOLD_MEMORY, after which a settlement of
    // its request is a charge of its own (the lapse stays charged). A
    // renewal past that time must not make the lapse known again.
    let server = RedisServer::start();
    for renew in [false, true] {
        let config = RedisStoreConfig {
            key_prefix: format!("renew{renew}"),
            time_source: TimeSource::Caller,
            ..RedisStoreConfig::default()
        };
        let redis = RedisStore::connect(&server.url(), config).await.unwrap();
        let expected = (100 - 7 - 3, 7 + 3);
        assert_eq!(
            settled_after_a_forgotten_lapse(&MemoryStore::new(), renew).await,
            expected,
            "memory, renewed after the lapse was forgotten: {renew}"
        );
        assert_eq!(
            settled_after_a_forgotten_lapse(&redis, renew).await,
            expected,
            "Redis, renewed after the lapse was forgotten: {renew}"
        );
    }
}

#[tokio::test]
async fn slot_sets_live_as_long_as_their_longest_lease_in_the_scope_hash_tag() {
    let server = RedisServer::start();
    let config = RedisStoreConfig {
        key_prefix: "gw1".into(),
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&server.url(), config).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let key = "gw1:{acct%3A1}:s:hook%2Fa";
    let pttl = |mut connection: redis::aio::MultiplexedConnection| async move {
        let ttl_ms: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut connection)
            .await
            .unwrap();
        ttl_ms
    };
    let minute = Duration::from_secs(60);
    // The store's clock is far in the past: expiry must not depend on it.
    store
        .acquire_slot("acct:1", "hook/a", "long", 2, minute, t0())
        .await
        .unwrap();
    store
        .acquire_slot("acct:1", "hook/a", "short", 2, Duration::from_secs(1), t0())
        .await
        .unwrap();
    let keys = without_layout(
        redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut connection)
            .await
            .unwrap(),
    );
    assert_eq!(keys, [key]);
    // The longest lease (60 s) plus the 10 s slack, not the latest one's.
    let ttl_ms = pttl(connection.clone()).await;
    assert!((69_000..=70_000).contains(&ttl_ms), "TTL {ttl_ms} ms");
    let holders: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut connection)
        .await
        .unwrap();
    let t0_micros = t0().timestamp_micros();
    assert_eq!(
        holders,
        [
            ("short".to_owned(), t0_micros + 1_000_000),
            ("long".to_owned(), t0_micros + 60_000_000)
        ]
    );
    // The last slot given back takes the key with it.
    store
        .release_slot("acct:1", "hook/a", "long")
        .await
        .unwrap();
    store
        .release_slot("acct:1", "hook/a", "short")
        .await
        .unwrap();
    assert_eq!(pttl(connection).await, -2);
}

/// A differential property test: 48 random workloads, each run through the
/// Rust rules (`MemoryStore`, which keeps its state in maps and decides
/// nothing itself) and through a store under test, answers compared step
/// by step: `$name::redis` on the Redis Functions of a real `redis-server`
/// (a fresh key prefix each), `$name::sqlite` on a SQLite file (the body
/// names the store under test `$store`, the rules `$memory`).
macro_rules! differential_test {
    ($name:ident, $input:ident in $strategy:expr, |$store:ident, $memory:ident| $body:block) => {
        mod $name {
            use super::*;

            #[test]
            fn redis() {
                let server = RedisServer::start();
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let case = std::sync::atomic::AtomicU32::new(0);
                proptest!(ProptestConfig::with_cases(48), |($input in $strategy)| {
                    let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let key_prefix = format!("{}{case}", stringify!($name));
                    let config = RedisStoreConfig { key_prefix, time_source: TimeSource::Caller, ..RedisStoreConfig::default() };
                    runtime.block_on(async {
                        let $store = RedisStore::connect(&server.url(), config).await.unwrap();
                        let $memory = MemoryStore::new();
                        $body
                        Ok(())
                    })?;
                });
            }

            #[test]
            fn sqlite() {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                proptest!(ProptestConfig::with_cases(48), |($input in $strategy)| {
                    let directory = tempfile::tempdir().unwrap();
                    runtime.block_on(async {
                        let $store = modelgate::store::SqliteStore::open(
                            directory.path().join("modelgate.db"),
                            modelgate::store::SqliteStoreConfig::default(),
                        )
                        .unwrap();
                        let $memory = MemoryStore::new();
                        $body
                        Ok(())
                    })?;
                });
            }
        }
    };
}

/// One step of a random workload: a check at some time after the last.
#[derive(Clone, Debug)]
struct Step {
    advance_micros: i64,
    scope: u8,
    limits: Vec<(u8, Limit, u64)>,
}

fn limit_strategy() -> impl Strategy<Value = Limit> {
    prop_oneof![
        (1u64..6, 1u64..5_000_000).prop_map(|(limit, micros)| Limit::FixedWindow {
            limit,
            window: Duration::from_micros(micros)
        }),
        (1u64..6, 1u64..5_000_000).prop_map(|(limit, micros)| Limit::Rolling {
            limit,
            window: Duration::from_micros(micros)
        }),
        (1u64..5, 1u64..5_000_000, 1u64..6).prop_map(|(rate, micros, burst)| Limit::Gcra {
            rate,
            period: Duration::from_micros(micros.max(rate)),
            burst
        }),
        prop_oneof![Just(Period::Day), Just(Period::Week), Just(Period::Month)].prop_flat_map(
            |period| (1u64..6).prop_map(move |limit| Limit::Calendar { limit, period })
        ),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    (
        // Mostly forward, sometimes a little back (clocks of several
        // instances, or a task that read the clock before losing a race).
        prop_oneof![
            4 => 0i64..1_000_000,
            2 => 0i64..100_000_000_000,
            1 => -2_000_000i64..0,
        ],
        0u8..2,
        proptest::collection::vec((0u8..3, limit_strategy(), 0u64..4), 1..3),
    )
        .prop_map(|(advance_micros, scope, mut limits)| {
            // One check per counter name in a call.
            limits.sort_by_key(|(name, _, _)| *name);
            limits.dedup_by_key(|(name, _, _)| *name);
            Step {
                advance_micros,
                scope,
                limits,
            }
        })
}

differential_test!(counters_decide_exactly_as_the_rules_do, steps in proptest::collection::vec(step_strategy(), 1..40), |store, memory| {
    let mut now = Utc.with_ymd_and_hms(2024, 2, 28, 23, 0, 0).unwrap();
    for step in &steps {
        now += chrono::Duration::microseconds(step.advance_micros);
        // A counter keeps its kind: the name carries the limit's shape.
        let checks: Vec<Check> = step.limits.iter()
            .map(|(name, limit, amount)| Check::new(format!("{name}-{limit:?}"), *limit, *amount))
            .collect();
        let scope = format!("acct{}", step.scope);
        let expected = memory.check_and_add(&scope, &checks, now).await.unwrap();
        let actual = store.check_and_add(&scope, &checks, now).await.unwrap();
        prop_assert_eq!(&actual, &expected, "at {} with {:?}", now, checks);
    }
});

#[derive(Clone, Debug)]
struct ReserveArgs {
    id: u8,
    key: u8,
    amount_nanos: i64,
    key_limit: Option<(i64, Option<Period>, bool)>,
    /// A share (0 to 1000‰) of the amount as the least to hold, when flexible.
    least_permille: Option<i64>,
    check_balance: bool,
    covered_by_balance: bool,
    ttl_secs: u64,
    /// A lapse record's retention (s) and cap per account, when asked.
    lapse_record: Option<(u64, u64)>,
}

#[derive(Clone, Debug)]
struct SettleArgs {
    id: u8,
    key: u8,
    cost_nanos: i64,
    byok: bool,
    hold_granted: bool,
    /// The settlement's record's retention (s) and cap per account, when it has one.
    record: Option<(u64, u64)>,
}

#[derive(Clone, Debug)]
enum LedgerOp {
    Reserve(ReserveArgs),
    Settle(SettleArgs),
    /// Several settlements in one call (ids may repeat: a retried batch).
    SettleMany(Vec<SettleArgs>),
    /// Settlements carried by a reservation.
    ReserveAfterSettling(Vec<SettleArgs>, ReserveArgs),
    TopUp {
        amount_nanos: i64,
    },
    Usage {
        key: u8,
    },
    Balance,
    /// Renewals of a few ids: the `n`th most recently reserved (live,
    /// settled or lapsed by now), else one never reserved; each with the
    /// key of its last reservation or (false) the other one.
    Renew {
        holds: Vec<(u8, bool)>,
        ttl_secs: u64,
    },
    /// The generation record of an id: a lapse's or a settlement's.
    Generation {
        id: u8,
    },
    /// A whole admission: settlements carried, counters of the account
    /// (one per name; one may be raised by the purchased total) and a hold.
    Admit {
        settlements: Vec<SettleArgs>,
        checks: Vec<(u8, Limit, u64)>,
        tier: Option<(i64, u64)>,
        hold: Option<ReserveArgs>,
    },
    /// A purchase once per idempotency key (a few keys, so they repeat).
    TopUpOnce {
        idempotency_key: u8,
        amount_nanos: i64,
    },
    /// A key's own terms: its limit, and an expiry some seconds from now
    /// (past when negative).
    SetTerms {
        key: u8,
        limit: Option<(i64, Option<Period>, bool)>,
        expires_in_secs: Option<i64>,
    },
    Revoke {
        key: u8,
    },
}

/// How many reservation ids the ledger workloads use (`r0`, `r1`, ...):
/// few enough that settlements, renewals and reservations meet the same
/// ones, enough that some are live while others wait out their markers.
const LEDGER_IDS: u8 = 8;

fn period_strategy() -> impl Strategy<Value = Option<Period>> {
    prop_oneof![
        Just(None),
        Just(Some(Period::Day)),
        Just(Some(Period::Week)),
        Just(Some(Period::Month)),
    ]
}

fn reserve_strategy() -> impl Strategy<Value = ReserveArgs> {
    (
        0u8..LEDGER_IDS,
        0u8..2,
        0i64..3_000_000_000,
        proptest::option::of((0i64..12_000_000_000, period_strategy(), any::<bool>())),
        any::<bool>(),
        1u64..120,
        proptest::option::of(0i64..=1000),
        any::<bool>(),
        proptest::option::of((1u64..400_000, 1u64..4)),
    )
        .prop_map(
            |(
                id,
                key,
                amount_nanos,
                key_limit,
                check_balance,
                ttl_secs,
                least_permille,
                covered_by_balance,
                lapse_record,
            )| {
                // A reservation id names one request of an account, made
                // with one key (the ledger tracks ids per account).
                let _ = key;
                ReserveArgs {
                    id,
                    key: id % 2,
                    amount_nanos,
                    key_limit,
                    least_permille,
                    check_balance,
                    covered_by_balance,
                    ttl_secs,
                    lapse_record,
                }
            },
        )
}

fn settle_strategy() -> impl Strategy<Value = SettleArgs> {
    (
        0u8..LEDGER_IDS,
        0u8..2,
        0i64..3_000_000_000,
        any::<bool>(),
        any::<bool>(),
        proptest::option::of((1u64..400_000, 1u64..4)),
    )
        .prop_map(
            |(id, _key, cost_nanos, byok, hold_granted, record)| SettleArgs {
                id,
                key: id % 2,
                cost_nanos,
                byok,
                hold_granted,
                record,
            },
        )
}

/// New terms for one of the two keys: a limit or none, an expiry or none
/// (some already past).
fn set_terms_strategy() -> impl Strategy<Value = LedgerOp> {
    (
        0u8..2,
        proptest::option::of((0i64..12_000_000_000, period_strategy(), any::<bool>())),
        proptest::option::of(-60i64..600),
    )
        .prop_map(|(key, limit, expires_in_secs)| LedgerOp::SetTerms {
            key,
            limit,
            expires_in_secs,
        })
}

fn ledger_op_strategy() -> impl Strategy<Value = LedgerOp> {
    // Weighted so that holds are taken, renewed, left to lapse and settled
    // late within a few dozen steps.
    prop_oneof![
        4 => reserve_strategy().prop_map(LedgerOp::Reserve),
        2 => settle_strategy().prop_map(LedgerOp::Settle),
        1 => proptest::collection::vec(settle_strategy(), 0..4).prop_map(LedgerOp::SettleMany),
        2 => (
            proptest::collection::vec(settle_strategy(), 0..3),
            reserve_strategy()
        )
            .prop_map(|(settlements, reserve)| LedgerOp::ReserveAfterSettling(
                settlements,
                reserve
            )),
        1 => (0i64..5_000_000_000).prop_map(|amount_nanos| LedgerOp::TopUp { amount_nanos }),
        1 => (0u8..2).prop_map(|key| LedgerOp::Usage { key }),
        1 => Just(LedgerOp::Balance),
        3 => (
            proptest::collection::btree_map(
                0u8..4,
                prop_oneof![5 => Just(true), 1 => Just(false)],
                1..5
            ),
            1u64..120,
        )
            .prop_map(|(holds, ttl_secs)| LedgerOp::Renew {
                holds: holds.into_iter().collect(),
                ttl_secs
            }),
        2 => (0u8..LEDGER_IDS).prop_map(|id| LedgerOp::Generation { id }),
        3 => (
            proptest::collection::vec(settle_strategy(), 0..3),
            proptest::collection::vec((0u8..3, limit_strategy(), 0u64..3), 0..3),
            proptest::option::of((0i64..6_000_000_000, 2u64..9)),
            proptest::option::of(reserve_strategy()),
        )
            .prop_map(|(settlements, mut checks, tier, hold)| {
                checks.sort_by_key(|(name, _, _)| *name);
                checks.dedup_by_key(|(name, _, _)| *name);
                LedgerOp::Admit { settlements, checks, tier, hold }
            }),
        1 => (0u8..3, 0i64..3_000_000_000).prop_map(|(idempotency_key, amount_nanos)| {
            LedgerOp::TopUpOnce { idempotency_key, amount_nanos }
        }),
        1 => set_terms_strategy(),
        1 => (0u8..2).prop_map(|key| LedgerOp::Revoke { key }),
    ]
}

fn reserve_of(args: &ReserveArgs) -> ReserveRequest {
    ReserveRequest {
        account: "acct".into(),
        key: format!("key{}", args.key),
        reservation_id: format!("r{}", args.id),
        amount_nanos: args.amount_nanos,
        key_limit: args.key_limit.map(|(limit_nanos, reset, include_byok)| {
            modelgate::store::KeyLimit {
                limit_nanos,
                reset,
                include_byok,
            }
        }),
        min_amount_nanos: args
            .least_permille
            .map(|permille| args.amount_nanos / 1000 * permille),
        check_balance: args.check_balance,
        covered_by_balance: args.covered_by_balance,
        lapse_record: args
            .lapse_record
            .map(|(retention_secs, max_per_account)| RecordKeeping {
                retention: Duration::from_secs(retention_secs),
                max_per_account,
                // Half name a model, one a colon and a slash in it.
                model: (max_per_account % 2 == 0).then(|| "p/m:x".to_owned()),
            }),
        counts_against_key_limit: true,
        ttl: Duration::from_secs(args.ttl_secs),
    }
}

fn settlement_of(args: &SettleArgs) -> Settlement {
    Settlement {
        account: "acct".into(),
        key: format!("key{}", args.key),
        reservation_id: format!("r{}", args.id),
        hold_granted: args.hold_granted,
        cost_nanos: args.cost_nanos,
        byok: args.byok,
        record: args
            .record
            .map(|(retention_secs, max_per_account)| SettlementRecord {
                bytes: format!("settled r{} at {}", args.id, args.cost_nanos).into(),
                retention: Duration::from_secs(retention_secs),
                max_per_account,
            }),
    }
}

/// The reservations of a ledger workload so far, for renewals to name.
#[derive(Default)]
struct Reservations {
    /// The key each id was last reserved with.
    keys_of_ids: [u8; LEDGER_IDS as usize],
    /// Ids reserved, the latest last, each once.
    recent_ids: Vec<u8>,
}

impl Reservations {
    fn note(&mut self, op: &LedgerOp) {
        if let LedgerOp::Reserve(args)
        | LedgerOp::ReserveAfterSettling(_, args)
        | LedgerOp::Admit {
            hold: Some(args), ..
        } = op
        {
            self.keys_of_ids[usize::from(args.id)] = args.key;
            self.recent_ids.retain(|id| *id != args.id);
            self.recent_ids.push(args.id);
        }
    }

    /// The renewal `(nth, its_key)` of a [`LedgerOp::Renew`].
    fn renewal(&self, nth: u8, its_key: bool) -> HoldRenewal {
        let (id, key) = match self.recent_ids.iter().rev().nth(usize::from(nth)) {
            Some(id) => (*id, self.keys_of_ids[usize::from(*id)]),
            None => (LEDGER_IDS + nth, 0),
        };
        HoldRenewal {
            key: format!("key{}", key ^ u8::from(!its_key)),
            reservation_id: format!("r{id}"),
        }
    }
}

/// Runs `op` on a store and renders what it answered, for comparison.
async fn apply_ledger_op<S: LedgerStore>(
    store: &S,
    op: &LedgerOp,
    now: DateTime<Utc>,
    reserved: &Reservations,
) -> String {
    match op {
        LedgerOp::Reserve(args) => {
            format!("{:?}", store.reserve(&reserve_of(args), now).await.unwrap())
        }
        LedgerOp::Settle(args) => {
            format!(
                "{:?}",
                store.settle(&settlement_of(args), now).await.unwrap()
            )
        }
        LedgerOp::SettleMany(batch) => {
            let settlements: Vec<Settlement> = batch.iter().map(settlement_of).collect();
            format!("{:?}", store.settle_many(&settlements, now).await.unwrap())
        }
        LedgerOp::ReserveAfterSettling(batch, args) => {
            let settlements: Vec<Settlement> = batch.iter().map(settlement_of).collect();
            let outcome = store
                .reserve_after_settling(&settlements, &reserve_of(args), now)
                .await
                .unwrap();
            format!("{outcome:?}")
        }
        LedgerOp::TopUp { amount_nanos } => {
            format!("{:?}", store.top_up("acct", *amount_nanos).await.unwrap())
        }
        LedgerOp::Usage { key } => format!(
            "{:?}",
            store
                .key_usage("acct", &format!("key{key}"), now)
                .await
                .unwrap()
        ),
        LedgerOp::Balance => format!("{:?}", store.account_balance("acct").await.unwrap()),
        LedgerOp::Renew { holds, ttl_secs } => {
            let renewals: Vec<HoldRenewal> = holds
                .iter()
                .map(|(nth, its_key)| reserved.renewal(*nth, *its_key))
                .collect();
            let renewed = store
                .renew_holds("acct", &renewals, Duration::from_secs(*ttl_secs), now)
                .await
                .unwrap();
            format!("renewed {renewed}")
        }
        LedgerOp::Generation { id } => {
            let record = store
                .generation("acct", &format!("r{id}"), now)
                .await
                .unwrap();
            format!(
                "{:?}",
                record.map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            )
        }
        LedgerOp::Admit {
            settlements,
            checks,
            tier,
            hold,
        } => {
            let settlements: Vec<Settlement> = settlements.iter().map(settlement_of).collect();
            // A counter keeps its kind: the name carries the limit's shape.
            let checks: Vec<Check> = checks
                .iter()
                .map(|(name, limit, amount)| {
                    Check::new(format!("{name}-{limit:?}"), *limit, *amount)
                })
                .collect();
            let purchase_tier = tier
                .filter(|_| {
                    checks
                        .first()
                        .is_some_and(|check| !matches!(check.limit, Limit::Gcra { .. }))
                })
                .map(|(threshold_nanos, raised_capacity)| PurchaseTier {
                    check_index: 0,
                    threshold_nanos,
                    raised_capacity,
                });
            let request = AdmitRequest {
                account: "acct".into(),
                checks,
                purchase_tier,
                hold: hold.as_ref().map(reserve_of),
            };
            let mut outcome = store
                .admit_after_settling(&settlements, &request, now)
                .await
                .unwrap();
            assert_eq!(outcome.decided_at, now, "the caller's clock decides");
            outcome.decided_at = DateTime::<Utc>::UNIX_EPOCH;
            format!("{outcome:?}")
        }
        LedgerOp::TopUpOnce {
            idempotency_key,
            amount_nanos,
        } => {
            let outcome = store
                .top_up_once(
                    "acct",
                    *amount_nanos,
                    &format!("purchase-{idempotency_key}"),
                    now,
                )
                .await
                .unwrap();
            format!("{outcome:?}")
        }
        LedgerOp::SetTerms {
            key,
            limit,
            expires_in_secs,
        } => {
            let terms = KeyTerms {
                limit: limit.map(|(limit_nanos, reset, include_byok)| KeyLimit {
                    limit_nanos,
                    reset,
                    include_byok,
                }),
                expires_at: expires_in_secs.map(|secs| now + chrono::Duration::seconds(secs)),
            };
            store
                .set_key_terms("acct", &format!("key{key}"), &terms)
                .await
                .unwrap();
            "terms set".to_owned()
        }
        LedgerOp::Revoke { key } => {
            store
                .revoke_key("acct", &format!("key{key}"), now)
                .await
                .unwrap();
            "revoked".to_owned()
        }
    }
}

/// What a store holds of the workload's account after a step: its
/// balance, both keys' usage and holds, and its newest records.
async fn ledger_state<S: LedgerStore>(store: &S, now: DateTime<Utc>) -> String {
    let balance = store.account_balance("acct").await.unwrap();
    let mut keys = Vec::new();
    for key in ["key0", "key1"] {
        keys.push(store.key_usage("acct", key, now).await.unwrap());
    }
    // The account's page and each key's, as the index of each store reads them.
    let mut records = Vec::new();
    for key in [None, Some("key0"), Some("key1")] {
        let page: Vec<String> = store
            .generations_page(
                "acct",
                GenerationsPage {
                    key,
                    skip: 0,
                    limit: 20,
                },
                now,
            )
            .await
            .unwrap()
            .iter()
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
            .collect();
        records.push(page);
    }
    format!("{balance:?} {keys:?} {records:?}")
}

differential_test!(ledger_answers_and_state_exactly_as_the_rules_do, steps in proptest::collection::vec(ledger_step_strategy(), 1..40), |store, memory| {
    // Near a month end, so days, weeks and months roll over.
    let mut now = Utc.with_ymd_and_hms(2024, 1, 31, 23, 59, 0).unwrap();
    let mut reserved = Reservations::default();
    for (advance_micros, op) in &steps {
        now += chrono::Duration::microseconds(*advance_micros);
        let expected = apply_ledger_op(&memory, op, now, &reserved).await;
        let actual = apply_ledger_op(&store, op, now, &reserved).await;
        prop_assert_eq!(actual, expected, "at {} after {:?}", now, op);
        // And the state each leaves: every answer and every sum the same.
        let expected = ledger_state(&memory, now).await;
        let actual = ledger_state(&store, now).await;
        prop_assert_eq!(actual, expected, "the state at {} after {:?}", now, op);
        reserved.note(op);
    }
});

// Admissions in quick succession, each request with an id of its own, as
// under load: most are decided where the account needs no upkeep
// (`ledger_write.lua`'s shortest path), among top-ups, new terms,
// revocations, settlements and periods turning at midnight.
differential_test!(quick_admissions_decide_exactly_as_the_rules_do, steps in proptest::collection::vec((0i64..40_000, quick_op_strategy()), 1..40), |store, memory| {
    let mut run = QuickRun::default();
    for (index, (advance_micros, op)) in steps.iter().enumerate() {
        let (now, op) = run.step(index, *advance_micros, op);
        let reserved = &run.reserved;
        let expected = apply_ledger_op(&memory, &op, now, reserved).await;
        let actual = apply_ledger_op(&store, &op, now, reserved).await;
        run.answered(&op, &expected);
        prop_assert_eq!(actual, expected, "at {} after {:?}", now, op);
        let expected = ledger_state(&memory, now).await;
        let actual = ledger_state(&store, now).await;
        prop_assert_eq!(actual, expected, "the state at {} after {:?}", now, op);
    }
});

// The short path must leave what the general path leaves, not only
// answer as it does: a score, a marker's lifetime or a record's TTL that
// no answer shows within a case would still be wrong. So the same steps
// run on two servers, one whose ledger function never takes the short
// path, and every key they leave is compared.
#[test]
fn the_short_path_leaves_what_the_general_path_leaves() {
    let (quick, general) = (RedisServer::start(), RedisServer::start());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let connections = runtime.block_on(async {
        let mut connections = Vec::new();
        for server in [&quick, &general] {
            let client = redis::Client::open(server.url()).unwrap();
            connections.push(client.get_multiplexed_async_connection().await.unwrap());
        }
        connections
    });
    let case = std::sync::atomic::AtomicU32::new(0);
    // Mostly in quick succession, as under load; now and then past a
    // hold's lifetime (a lapse) or a record's (tidying).
    let advance = prop_oneof![
        12 => 0i64..40_000,
        1 => 1_000_000i64..3_000_000,
        1 => 61_000_000i64..70_000_000,
    ];
    let strategy = proptest::collection::vec((advance, quick_op_strategy()), 1..40);
    proptest!(ProptestConfig::with_cases(48), |(steps in strategy)| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key_prefix = format!("paths{case}");
        let mut connections = connections.clone();
        runtime.block_on(async {
            let mut stores = Vec::new();
            for server in [&quick, &general] {
                let config = RedisStoreConfig {
                    key_prefix: key_prefix.clone(),
                    time_source: TimeSource::Caller,
                    ..RedisStoreConfig::default()
                };
                stores.push(RedisStore::connect(&server.url(), config).await.unwrap());
            }
            // Connecting loads the library again: the general one after.
            without_short_path(&mut connections[1]).await;
            let mut run = QuickRun::default();
            for (index, (advance_micros, op)) in steps.iter().enumerate() {
                let (now, op) = run.step(index, *advance_micros, op);
                let reserved = &run.reserved;
                let expected = apply_ledger_op(&stores[1], &op, now, reserved).await;
                let actual = apply_ledger_op(&stores[0], &op, now, reserved).await;
                run.answered(&op, &expected);
                prop_assert_eq!(actual, expected, "at {} after {:?}", now, op);
                let general_state = raw_state(&mut connections[1], &key_prefix).await;
                let quick_state = raw_state(&mut connections[0], &key_prefix).await;
                prop_assert_eq!(quick_state.len(), general_state.len(), "{:?}", quick_state);
                for (quick, general) in quick_state.iter().zip(&general_state) {
                    prop_assert_eq!(&quick.0, &general.0, "the state at {} after {:?}", now, op);
                    // Set at the same instant by the caller's clock, read a
                    // moment apart.
                    prop_assert!(
                        (quick.1 < 0) == (general.1 < 0) && (quick.1 - general.1).abs() < 1_000,
                        "{} lives {} ms, {} ms on the general path, at {} after {:?}",
                        quick.0, quick.1, general.1, now, op
                    );
                }
            }
            Ok(())
        })?;
    });
}

/// Makes the server's ledger function skip its short path: the library
/// it has, loaded again under its name with `at_once` answering nil.
async fn without_short_path(connection: &mut redis::aio::MultiplexedConnection) {
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("WITHCODE")
        .query_async(connection)
        .await
        .unwrap();
    fn code_in(value: &redis::Value) -> Option<String> {
        let items = match value {
            redis::Value::Array(items) => items.clone(),
            redis::Value::Map(pairs) => pairs
                .iter()
                .flat_map(|(name, value)| [name.clone(), value.clone()])
                .collect(),
            _ => return None,
        };
        items
            .iter()
            .enumerate()
            .find_map(|(index, item)| match item {
                redis::Value::BulkString(name) if name == b"library_code" => {
                    match &items[index + 1] {
                        redis::Value::BulkString(code) => {
                            Some(String::from_utf8(code.clone()).unwrap())
                        }
                        _ => None,
                    }
                }
                other => code_in(other),
            })
    }
    let code = code_in(&libraries).expect("the store's library is loaded");
    let start = "local function at_once()\n";
    assert_eq!(code.matches(start).count(), 1);
    let general = code.replace(start, &format!("{start}  do return nil end\n"));
    let () = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(general)
        .query_async(connection)
        .await
        .unwrap();
}

/// Every key under `prefix`, sorted, with what it holds (hash fields and
/// sorted set members in order) and its TTL in ms (-1 for none); a
/// random top-up key by its account alone, without its wall-clock time.
async fn raw_state(
    connection: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> Vec<(String, i64)> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(connection)
        .await
        .unwrap();
    keys.sort();
    let mut state = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(connection)
            .await
            .unwrap();
        let contents = match kind.as_str() {
            "hash" => {
                let mut fields: Vec<(String, String)> = redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async(connection)
                    .await
                    .unwrap();
                fields.sort();
                // A top-up without an idempotency key is kept under a
                // random one until a moment by the wall clock.
                if key.contains(":topup:~") {
                    fields.retain(|(name, _)| name != "forget_at");
                }
                format!("{fields:?}")
            }
            "zset" => {
                let members: Vec<(String, String)> = redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(connection)
                    .await
                    .unwrap();
                format!("{members:?}")
            }
            _ => {
                let value: Option<String> = redis::cmd("GET")
                    .arg(&key)
                    .query_async(connection)
                    .await
                    .unwrap();
                format!("{value:?}")
            }
        };
        let ttl_ms = pttl_of(connection, &key).await;
        let name = match key.split_once(":topup:~") {
            Some((account, _)) => format!("{account}:topup:~"),
            None => key,
        };
        state.push((format!("{name} {kind} {contents}"), ttl_ms));
    }
    state.sort();
    state
}

fn quick_op_strategy() -> impl Strategy<Value = LedgerOp> {
    prop_oneof![
        8 => (
            proptest::collection::vec((0u8..3, limit_strategy(), 0u64..3), 0..3),
            proptest::option::of((0i64..6_000_000_000, 2u64..9)),
            reserve_strategy(),
        )
            .prop_map(|(mut checks, tier, hold)| {
                checks.sort_by_key(|(name, _, _)| *name);
                checks.dedup_by_key(|(name, _, _)| *name);
                LedgerOp::Admit { settlements: Vec::new(), checks, tier, hold: Some(hold) }
            }),
        // Settlements riding on the next admission, as under load.
        6 => (
            proptest::collection::vec(settle_strategy(), 1..5),
            proptest::collection::vec((0u8..3, limit_strategy(), 0u64..3), 0..2),
            reserve_strategy(),
        )
            .prop_map(|(settlements, mut checks, hold)| {
                checks.sort_by_key(|(name, _, _)| *name);
                checks.dedup_by_key(|(name, _, _)| *name);
                LedgerOp::Admit { settlements, checks, tier: None, hold: Some(hold) }
            }),
        3 => (0i64..5_000_000_000).prop_map(|amount_nanos| LedgerOp::TopUp { amount_nanos }),
        1 => set_terms_strategy(),
        1 => (0u8..2).prop_map(|key| LedgerOp::Revoke { key }),
        2 => settle_strategy().prop_map(LedgerOp::Settle),
    ]
}

/// The quick workload as it runs: its instant, from a few steps before
/// midnight at a month's end (some holds are admitted in one day and
/// month and settled in the next), and the ids `with_new_ids` picks from.
struct QuickRun {
    now: DateTime<Utc>,
    reserved: Reservations,
    granted: Vec<u8>,
    settled: Vec<u8>,
}

impl Default for QuickRun {
    fn default() -> Self {
        QuickRun {
            now: Utc.with_ymd_and_hms(2024, 1, 31, 23, 59, 59).unwrap()
                + chrono::Duration::milliseconds(850),
            reserved: Reservations::default(),
            granted: Vec::new(),
            settled: Vec::new(),
        }
    }
}

impl QuickRun {
    /// The `index`th step, `advance_micros` after the last: its instant
    /// and its op with its ids.
    fn step(
        &mut self,
        index: usize,
        advance_micros: i64,
        op: &LedgerOp,
    ) -> (DateTime<Utc>, LedgerOp) {
        self.now += chrono::Duration::microseconds(advance_micros);
        let op = with_new_ids(op.clone(), index, &mut self.granted, &mut self.settled);
        (self.now, op)
    }

    /// Notes what the reference store answered to `op`: a hold granted
    /// may be settled later.
    fn answered(&mut self, op: &LedgerOp, answer: &str) {
        if let LedgerOp::Admit {
            hold: Some(args), ..
        } = op
            && answer.contains("Reserved {")
        {
            self.granted.push(args.id);
        }
    }
}

/// `op`, the `index`th step, with a request id no step before used
/// (100 + index) when it admits, and, when it settles, one of the last few
/// `granted` holds' (taken out of it), else its own; one settlement in five
/// is a retry of the last one `settled`. Each id has its own key, as a
/// request has, but one settlement in eight names the other key.
fn with_new_ids(
    mut op: LedgerOp,
    index: usize,
    granted: &mut Vec<u8>,
    settled: &mut Vec<u8>,
) -> LedgerOp {
    let index = u8::try_from(index).expect("at most 40 steps");
    let mut earlier = |settlement: &mut SettleArgs| {
        let recent = granted.len().min(4);
        settlement.id = match (settlement.cost_nanos % 5, settled.last(), recent) {
            (1, Some(last), _) => *last,
            (_, _, 0) => 100 + index,
            _ => granted.remove(granted.len() - 1 - usize::from(settlement.id) % recent),
        };
        settled.push(settlement.id);
        settlement.key = (settlement.id % 2) ^ u8::from(settlement.cost_nanos % 8 == 0);
    };
    match &mut op {
        LedgerOp::Admit {
            settlements,
            hold: Some(args),
            ..
        } => {
            args.id = 100 + index;
            args.key = args.id % 2;
            settlements.iter_mut().for_each(&mut earlier);
        }
        LedgerOp::Settle(args) => earlier(args),
        _ => {}
    }
    op
}

fn ledger_step_strategy() -> impl Strategy<Value = (i64, LedgerOp)> {
    (
        // Within the moment an account's upkeep waits (so that admissions
        // follow one another as under load, without it), within a hold's
        // lifetime, past it (a lapse), past a settlement's marker and past
        // days (a lapse forgotten, periods rolled), or back.
        prop_oneof![
            6 => 0i64..50_000,
            8 => 0i64..3_000_000,
            2 => 3_000_000i64..120_000_000,
            1 => 120_000_000i64..400_000_000,
            1 => 0i64..200_000_000_000,
            1 => -2_000_000i64..0
        ],
        ledger_op_strategy(),
    )
}

#[derive(Clone, Debug)]
enum RecordOp {
    Put {
        id: u8,
        value: Vec<u8>,
        expect: Expect,
        options: PutOptions,
    },
    Delete {
        id: u8,
        expect: Expect,
    },
    Get {
        id: u8,
    },
    List {
        offset: usize,
        limit: usize,
    },
}

fn expect_strategy() -> impl Strategy<Value = Expect> {
    prop_oneof![
        Just(Expect::Any),
        Just(Expect::Absent),
        (0u64..4).prop_map(Expect::Revision),
    ]
}

/// Lifetimes of a few seconds on a 1 s grid, so records often expire
/// exactly at a later step's instant; caps small enough to be reached.
fn put_options_strategy() -> impl Strategy<Value = PutOptions> {
    (
        prop_oneof![Just(None), (1u64..6).prop_map(Some)],
        prop_oneof![Just(None), (0u64..4).prop_map(Some)],
    )
        .prop_map(|(seconds, max_records)| PutOptions {
            ttl: seconds.map(Duration::from_secs),
            max_records,
        })
}

fn record_op_strategy() -> impl Strategy<Value = RecordOp> {
    prop_oneof![
        3 => (0u8..4, proptest::collection::vec(any::<u8>(), 0..8), expect_strategy(), put_options_strategy())
            .prop_map(|(id, value, expect, options)| RecordOp::Put { id, value, expect, options }),
        1 => (0u8..4, expect_strategy()).prop_map(|(id, expect)| RecordOp::Delete { id, expect }),
        1 => (0u8..4).prop_map(|id| RecordOp::Get { id }),
        1 => (0usize..5, prop_oneof![0usize..6, Just(usize::MAX)])
            .prop_map(|(offset, limit)| RecordOp::List { offset, limit }),
    ]
}

async fn apply_record_op<S: RecordStore>(store: &S, op: &RecordOp, now: DateTime<Utc>) -> String {
    let collection = modelgate::store::flows("session");
    match op {
        RecordOp::Put {
            id,
            value,
            expect,
            options,
        } => format!(
            "{:?}",
            store
                .put_record_at(
                    &collection,
                    &format!("f{id}"),
                    value,
                    *expect,
                    *options,
                    now
                )
                .await
                .unwrap()
        ),
        RecordOp::Delete { id, expect } => format!(
            "{:?}",
            store
                .delete_record_at(&collection, &format!("f{id}"), *expect, now)
                .await
                .unwrap()
        ),
        RecordOp::Get { id } => format!(
            "{:?}",
            store
                .get_record_at(&collection, &format!("f{id}"), now)
                .await
                .unwrap()
        ),
        RecordOp::List { offset, limit } => format!(
            "{:?}",
            store
                .list_records_at(&collection, *offset, *limit, now)
                .await
                .unwrap()
        ),
    }
}

differential_test!(records_answer_exactly_as_memory_does, steps in proptest::collection::vec((0i64..3, record_op_strategy()), 1..40), |store, memory| {
    let mut now = t0();
    for (advance_seconds, op) in &steps {
        now += chrono::Duration::seconds(*advance_seconds);
        let expected = apply_record_op(&memory, op, now).await;
        let actual = apply_record_op(&store, op, now).await;
        prop_assert_eq!(actual, expected, "at {} after {:?}", now, op);
    }
});

/// A collection whose records all expire leaves Redis by itself: its five
/// keys live as long as the longest-lived record (plus the slack), and
/// lose that lifetime while a record without one is there.
#[tokio::test]
async fn a_collection_of_expiring_records_leaves_redis_by_itself() {
    let server = RedisServer::start();
    let config = RedisStoreConfig {
        time_source: TimeSource::Caller,
        expiry_slack: Duration::from_secs(5),
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&server.url(), config).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let connection = client.get_multiplexed_async_connection().await.unwrap();
    let collection = modelgate::store::flows("agent:main");
    let lifetimes = |connection: &redis::aio::MultiplexedConnection| {
        let mut connection = connection.clone();
        async move {
            let mut keys = without_layout(
                redis::cmd("KEYS")
                    .arg("mg:*")
                    .query_async(&mut connection)
                    .await
                    .unwrap(),
            );
            keys.sort();
            let mut lifetimes = Vec::new();
            for key in keys {
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                lifetimes.push((key.rsplit(':').next().unwrap().to_owned(), pttl));
            }
            lifetimes
        }
    };
    let put = |id: &'static str, options: PutOptions, now: DateTime<Utc>| {
        let store = store.clone();
        let collection = collection.clone();
        async move {
            store
                .put_record_at(&collection, id, b"v", Expect::Any, options, now)
                .await
                .unwrap()
        }
    };
    put("a", PutOptions::expiring(Duration::from_secs(30)), t0()).await;
    put("b", PutOptions::expiring(Duration::from_secs(60)), t0()).await;
    let names = ["exp", "order", "revs", "seq", "values"];
    let expiring = lifetimes(&connection).await;
    assert_eq!(
        expiring
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        names
    );
    for (name, pttl) in &expiring {
        // The longest-lived record's 60 s plus 5 s of slack.
        assert!((60_000..=65_000).contains(pttl), "{name}: {pttl}");
    }
    put("kept", PutOptions::default(), t0()).await;
    assert!(
        lifetimes(&connection)
            .await
            .iter()
            .all(|(_, pttl)| *pttl == -1)
    );
    store
        .delete_record_at(&collection, "kept", Expect::Any, t0())
        .await
        .unwrap();
    for (name, pttl) in lifetimes(&connection).await {
        assert!((60_000..=65_000).contains(&pttl), "{name}: {pttl}");
    }
    // Emptied while its keys expire, then given a record without a
    // lifetime: every key that is left is kept, the sequence counter
    // included (it expiring would restart the creation order).
    for id in ["a", "b"] {
        store
            .delete_record_at(&collection, id, Expect::Any, t0())
            .await
            .unwrap();
    }
    put("forever", PutOptions::default(), t0()).await;
    let kept = lifetimes(&connection).await;
    assert!(kept.iter().any(|(name, _)| name == "seq"), "{kept:?}");
    assert!(kept.iter().all(|(_, pttl)| *pttl == -1), "{kept:?}");
    // A record that expires in 1 ms (in the caller's time, which is also
    // how far ahead of Redis the keys are given): the collection leaves
    // within the slack.
    let short = RedisStoreConfig {
        time_source: TimeSource::Caller,
        expiry_slack: Duration::ZERO,
        key_prefix: "short".into(),
        ..RedisStoreConfig::default()
    };
    let store = RedisStore::connect(&server.url(), short).await.unwrap();
    store
        .put_record_at(
            &collection,
            "a",
            b"v",
            Expect::Any,
            PutOptions::expiring(Duration::from_millis(1)),
            t0(),
        )
        .await
        .unwrap();
    wait_for(PATIENCE, || {
        let mut connection = connection.clone();
        async move {
            let keys = without_layout(
                redis::cmd("KEYS")
                    .arg("short:*")
                    .query_async(&mut connection)
                    .await
                    .unwrap(),
            );
            if keys.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "the expired collection's keys stayed in Redis: {keys:?}"
                ))
            }
        }
    })
    .await;
}

#[derive(Clone, Debug)]
enum SlotOp {
    Acquire {
        name: u8,
        holder: u8,
        limit: u64,
        lease_micros: u64,
    },
    Release {
        name: u8,
        holder: u8,
    },
}

/// Mostly on a 100 ms grid, so leases often end exactly at a call's `now`.
fn slot_step_strategy() -> impl Strategy<Value = (i64, SlotOp)> {
    let lease_micros = prop_oneof![
        3 => (1u64..50).prop_map(|tenths| tenths * 100_000),
        1 => 1_000u64..5_000_000,
    ];
    let op = prop_oneof![
        3 => (0u8..2, 0u8..5, 1u64..4, lease_micros).prop_map(
            |(name, holder, limit, lease_micros)| SlotOp::Acquire {
                name,
                holder,
                limit,
                lease_micros,
            }
        ),
        1 => (0u8..2, 0u8..5).prop_map(|(name, holder)| SlotOp::Release { name, holder }),
    ];
    (
        prop_oneof![
            4 => (0i64..20).prop_map(|tenths| tenths * 100_000),
            1 => 0i64..60_000_000,
            1 => (-20i64..0).prop_map(|tenths| tenths * 100_000),
        ],
        op,
    )
}

/// Runs `op` on a store and renders what it answered, for comparison.
async fn apply_slot_op<S: CounterStore>(store: &S, op: &SlotOp, now: DateTime<Utc>) -> String {
    match *op {
        SlotOp::Acquire {
            name,
            holder,
            limit,
            lease_micros,
        } => format!(
            "{:?}",
            store
                .acquire_slot(
                    "acct",
                    &format!("s{name}"),
                    &format!("h{holder}"),
                    limit,
                    Duration::from_micros(lease_micros),
                    now
                )
                .await
                .unwrap()
        ),
        SlotOp::Release { name, holder } => format!(
            "{:?}",
            store
                .release_slot("acct", &format!("s{name}"), &format!("h{holder}"))
                .await
                .unwrap()
        ),
    }
}

differential_test!(slots_answer_exactly_as_memory_does, steps in proptest::collection::vec(slot_step_strategy(), 1..40), |store, memory| {
    let mut now = t0();
    for (advance_micros, op) in &steps {
        now += chrono::Duration::microseconds(*advance_micros);
        let expected = apply_slot_op(&memory, op, now).await;
        let actual = apply_slot_op(&store, op, now).await;
        prop_assert_eq!(actual, expected, "at {} after {:?}", now, op);
    }
});

/// A random integer of at most `bits` bits (a bit count drawn from the
/// range), so that every size is as likely as another.
fn integer_of_bits(
    runner: &mut proptest::test_runner::TestRunner,
    bits: std::ops::Range<u32>,
) -> u64 {
    use proptest::strategy::ValueTree;
    let bits = bits.new_tree(runner).unwrap().current();
    (0u64..=u64::MAX >> 1).new_tree(runner).unwrap().current() >> (63 - bits)
}

/// The scripts' `int` (src/store/lua/int.lua) writes every integer a double
/// holds exactly, as Rust does, and keeps `%.0f` for anything else.
#[tokio::test]
async fn the_scripts_write_integers_exactly() {
    use proptest::strategy::ValueTree;
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let script = redis::Script::new(concat!(
        include_str!("../../src/store/lua/int.lua"),
        "local out = {} for i, v in ipairs(ARGV) do out[i] = int(tonumber(v)) end return out"
    ));
    let mut values: Vec<f64> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        9_007_199_254_740_992.0, // 2^53
        9_007_199_254_740_993.0, // rounds to 2^53 as a double
        1_795_617_959_051_702.0, // a µs timestamp
        123_456_789_012_345_678.0,
        4_611_686_018_427_387_904.0, // 2^62
        9.3e18,                      // past i64: '%.0f'
        -9.3e18,
        1e300,
        0.25,
        -3.75,
        12_345.4,
    ];
    // Integers of every size up to 2^63, and fractions away from a tie.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..300 {
        let magnitude = integer_of_bits(&mut runner, 0..63);
        let negative = any::<bool>().new_tree(&mut runner).unwrap().current();
        let integer = magnitude as f64 * if negative { -1.0 } else { 1.0 };
        values.push(integer);
        values.push(integer / 1_000.0 + 0.1);
    }
    let mut invocation = script.prepare_invoke();
    for value in &values {
        // `{:e}` with full precision: Lua's tonumber reads it back exactly.
        invocation.arg(format!("{value:e}"));
    }
    let written: Vec<String> = invocation.invoke_async(&mut connection).await.unwrap();
    for (value, written) in values.iter().zip(&written) {
        let expected = if *value == 0.0 {
            "0".to_owned()
        } else {
            format!("{value:.0}")
        };
        assert_eq!(written, &expected, "{value:e}");
    }
}

/// The ledger's decimal arithmetic (`add_held`, `less`, `ge`,
/// `signed_add` in src/store/lua/ledger_common.lua) is exact at every size,
/// as i128 is: below 2^53 a sum is taken as Lua numbers, above it as
/// two-part integers, and the edge between them is where rounding would
/// start.
#[tokio::test]
async fn the_scripts_add_and_compare_decimals_exactly() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let script = redis::Script::new(&[
        include_str!("../../src/store/lua/int.lua"),
        include_str!("../../src/store/lua/time.lua"),
        include_str!("../../src/store/lua/counters.lua"),
        include_str!("../../src/store/lua/ledger_common.lua"),
        "local out = {}
        for i = 1, #ARGV, 2 do
          local a, b = ARGV[i], ARGV[i + 1]
          out[#out + 1] = add_held(a, b) .. ' ' .. less(a, b) .. ' ' .. (ge(a, b) and 1 or 0) .. ' '
            .. signed_add(a, b, false) .. ' ' .. signed_add(a, b, true) .. ' ' .. signed_add('-' .. a, b, false)
        end
        return out",
    ]
    .join("\n"));
    let exact: i128 = 1 << 53;
    let mut values: Vec<i128> = vec![0, 1, 999_999_999_999_999, 1_000_000_000_000_000];
    for edge in [exact, 10_000_000_000_000_000, i128::from(i64::MAX)] {
        values.extend([edge - 2, edge - 1, edge, edge + 1]);
    }
    // Every pair of the edges, then random ones near and far from them.
    let mut pairs: Vec<(i128, i128)> = values
        .iter()
        .flat_map(|a| values.iter().map(move |b| (*a, *b)))
        .collect();
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..200 {
        let value = integer_of_bits(&mut runner, 40..63);
        values.push(i128::from(value));
        values.push(exact - 1 - i128::from(value % 1_000_000));
    }
    pairs.extend(
        values
            .iter()
            .zip(values.iter().rev())
            .map(|(a, b)| (*a, *b)),
    );
    let mut invocation = script.prepare_invoke();
    for (a, b) in &pairs {
        invocation.arg(a.to_string()).arg(b.to_string());
    }
    let answered: Vec<String> = invocation.invoke_async(&mut connection).await.unwrap();
    let clamp = |value: i128| value.clamp(i128::from(i64::MIN), i128::from(i64::MAX));
    for ((a, b), answered) in pairs.iter().zip(&answered) {
        let expected = format!(
            "{} {} {} {} {} {}",
            a + b,
            (a - b).max(0),
            u8::from(a >= b),
            clamp(a + b),
            clamp(a - b),
            clamp(-a + b),
        );
        assert_eq!(answered, &expected, "{a} and {b}");
    }
}

/// The money arithmetic of the hold lifecycle against a model small enough
/// to read: each request is finally charged its settled cost when settled
/// (the first settlement; its retries within the marker's time add
/// nothing), else its held amount once its hold lapsed, and nothing while
/// it is held. Random reservations (covered by the balance), renewals,
/// time passing, settlements (at most the hold; some retried, some never
/// made) and top-ups on a `MemoryStore`, checked after every step.
mod money_model {
    use super::*;
    use modelgate::store::{
        AccountBalance, KeyUsage, LAPSED_HOLD_MEMORY, ReserveOutcome, SETTLEMENT_MEMORY,
        SETTLEMENT_RETRY_WINDOW,
    };
    use proptest::sample::Index;

    const ACCOUNT: &str = "acct";
    const KEY: &str = "key";

    #[derive(Clone, Debug)]
    enum Step {
        /// A new request, holding `amount_nanos` for `ttl_secs` unless renewed.
        Reserve {
            amount_nanos: i64,
            ttl_secs: u64,
        },
        /// Its instance renews the holds of the requests picked.
        Renew {
            picks: Vec<Index>,
            ttl_secs: u64,
        },
        /// Time passes; a usage read finds what lapsed meanwhile.
        Advance {
            micros: i64,
        },
        /// A request picked (one held, or lapsed) ends and is settled at
        /// `cost_permille` of what it held.
        Settle {
            pick: Index,
            cost_permille: i64,
        },
        /// A settlement picked is sent again (a reply lost), within the
        /// caller's retry window.
        Retry {
            pick: Index,
        },
        TopUp {
            amount_nanos: i64,
        },
    }

    fn step_strategy() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (1i64..3_000_000_000, 1u64..60)
                .prop_map(|(amount_nanos, ttl_secs)| Step::Reserve { amount_nanos, ttl_secs }),
            3 => (proptest::collection::vec(any::<Index>(), 1..4), 1u64..60)
                .prop_map(|(picks, ttl_secs)| Step::Renew { picks, ttl_secs }),
            4 => prop_oneof![
                6 => 0i64..3_000_000,
                3 => 0i64..90_000_000,
                1 => 90_000_000i64..400_000_000,
                1 => 20 * 3_600_000_000i64..30 * 3_600_000_000,
            ]
            .prop_map(|micros| Step::Advance { micros }),
            3 => (any::<Index>(), 0i64..=1000)
                .prop_map(|(pick, cost_permille)| Step::Settle { pick, cost_permille }),
            1 => any::<Index>().prop_map(|pick| Step::Retry { pick }),
            1 => (0i64..4_000_000_000).prop_map(|amount_nanos| Step::TopUp { amount_nanos }),
        ]
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum State {
        /// Refused: never held, never charged.
        Refused,
        Held {
            expires_at: DateTime<Utc>,
        },
        /// Charged its held amount; a settlement until `forget_at` replaces that.
        Lapsed {
            forget_at: DateTime<Utc>,
        },
        /// Charged its held amount for good.
        LapseForgotten,
        /// Charged its cost; copies of its settlement add nothing until `marker_until`.
        Settled {
            cost_nanos: i64,
            settled_at: DateTime<Utc>,
            marker_until: DateTime<Utc>,
        },
    }

    #[derive(Debug)]
    struct Request {
        id: String,
        held_nanos: i64,
        state: State,
    }

    impl Request {
        fn charged_nanos(&self) -> i64 {
            match self.state {
                State::Refused | State::Held { .. } => 0,
                State::Lapsed { .. } | State::LapseForgotten => self.held_nanos,
                State::Settled { cost_nanos, .. } => cost_nanos,
            }
        }

        fn settlement(&self, cost_nanos: i64) -> Settlement {
            Settlement {
                account: ACCOUNT.into(),
                key: KEY.into(),
                reservation_id: self.id.clone(),
                hold_granted: true,
                cost_nanos,
                byok: false,
                record: None,
            }
        }
    }

    #[derive(Debug, Default)]
    struct Model {
        topped_up_nanos: i64,
        requests: Vec<Request>,
    }

    fn after(now: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
        now + chrono::Duration::from_std(duration).unwrap()
    }

    impl Model {
        /// What the first call at `now` finds: holds past their expiry
        /// lapse, lapses past their memory are forgotten.
        fn lapse(&mut self, now: DateTime<Utc>) {
            for request in &mut self.requests {
                if let State::Held { expires_at } = request.state
                    && expires_at <= now
                {
                    request.state = State::Lapsed {
                        forget_at: after(now, LAPSED_HOLD_MEMORY),
                    };
                }
                if let State::Lapsed { forget_at } = request.state
                    && forget_at <= now
                {
                    request.state = State::LapseForgotten;
                }
            }
        }

        fn charged_nanos(&self) -> i64 {
            self.requests.iter().map(Request::charged_nanos).sum()
        }

        fn balance_nanos(&self) -> i64 {
            self.topped_up_nanos - self.charged_nanos()
        }

        fn held_nanos(&self) -> i64 {
            self.requests
                .iter()
                .filter(|request| matches!(request.state, State::Held { .. }))
                .map(|request| request.held_nanos)
                .sum()
        }

        /// The requests in a state `wanted` says, for a pick among them.
        fn pick(&self, pick: &Index, wanted: impl Fn(&State) -> bool) -> Option<usize> {
            let candidates: Vec<usize> = (0..self.requests.len())
                .filter(|index| wanted(&self.requests[*index].state))
                .collect();
            (!candidates.is_empty()).then(|| candidates[pick.index(candidates.len())])
        }
    }

    async fn read(store: &MemoryStore, now: DateTime<Utc>) -> (AccountBalance, KeyUsage) {
        (
            store.account_balance(ACCOUNT).await.unwrap(),
            store.key_usage(ACCOUNT, KEY, now).await.unwrap(),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_request_is_charged_its_cost_or_its_lapsed_hold_once(
            steps in proptest::collection::vec(step_strategy(), 1..60)
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(async {
                let store = MemoryStore::new();
                // Funded enough for a few holds at once.
                store.top_up(ACCOUNT, 4_000_000_000).await.unwrap();
                let mut model = Model { topped_up_nanos: 4_000_000_000, ..Model::default() };
                let mut now = t0();
                for step in &steps {
                    if let Step::Advance { micros } = step {
                        now += chrono::Duration::microseconds(*micros);
                    }
                    // Every step calls the store at `now`: it finds the lapses.
                    let (before_balance, before_usage) = read(&store, now).await;
                    model.lapse(now);
                    match step {
                        Step::Advance { .. } => {}
                        Step::TopUp { amount_nanos } => {
                            store.top_up(ACCOUNT, *amount_nanos).await.unwrap();
                            model.topped_up_nanos += amount_nanos;
                        }
                        Step::Reserve { amount_nanos, ttl_secs } => {
                            let id = format!("q{}", model.requests.len());
                            let request = ReserveRequest {
                                account: ACCOUNT.into(),
                                key: KEY.into(),
                                reservation_id: id.clone(),
                                amount_nanos: *amount_nanos,
                                min_amount_nanos: None,
                                key_limit: None,
                                check_balance: true,
                                covered_by_balance: true,
                                ttl: Duration::from_secs(*ttl_secs),
                                lapse_record: None,
                                counts_against_key_limit: true,
                            };
                            let outcome = store.reserve(&request, now).await.unwrap();
                            let (balance_nanos, held_nanos) = (model.balance_nanos(), model.held_nanos());
                            let expected = if balance_nanos < 0 {
                                ReserveOutcome::BalanceNegative { balance_nanos }
                            } else if balance_nanos - held_nanos < *amount_nanos {
                                ReserveOutcome::BalanceInsufficient { balance_nanos, held_nanos }
                            } else {
                                ReserveOutcome::Reserved {
                                    used_nanos: model.charged_nanos(),
                                    reserved_nanos: held_nanos + amount_nanos,
                                    held_nanos: *amount_nanos,
                                }
                            };
                            prop_assert_eq!(outcome, expected, "at {} after {:?}", now, step);
                            let state = if outcome.is_reserved() {
                                State::Held { expires_at: after(now, request.ttl) }
                            } else {
                                State::Refused
                            };
                            model.requests.push(Request { id, held_nanos: *amount_nanos, state });
                            if !outcome.is_reserved() {
                                prop_assert_eq!(
                                    read(&store, now).await,
                                    (before_balance, before_usage),
                                    "a refusal changes nothing"
                                );
                            }
                        }
                        Step::Renew { picks, ttl_secs } => {
                            let ttl = Duration::from_secs(*ttl_secs);
                            let mut picked: Vec<usize> = picks
                                .iter()
                                .filter_map(|pick| model.pick(pick, |state| *state != State::Refused))
                                .collect();
                            picked.sort_unstable();
                            picked.dedup();
                            let renewals: Vec<HoldRenewal> = picked
                                .iter()
                                .map(|index| HoldRenewal {
                                    key: KEY.into(),
                                    reservation_id: model.requests[*index].id.clone(),
                                })
                                .collect();
                            let renewed = store.renew_holds(ACCOUNT, &renewals, ttl, now).await.unwrap();
                            let mut live = 0;
                            for index in picked {
                                let request = &mut model.requests[index];
                                match &mut request.state {
                                    State::Held { expires_at } => {
                                        *expires_at = (*expires_at).max(after(now, ttl));
                                        live += 1;
                                    }
                                    State::Lapsed { forget_at } => *forget_at = after(now, LAPSED_HOLD_MEMORY),
                                    _ => {}
                                }
                            }
                            prop_assert_eq!(renewed, live, "at {} after {:?}", now, step);
                        }
                        Step::Settle { pick, cost_permille } => {
                            // Its request still held, or lapsed (its instance
                            // lost the store longer than its hold).
                            let wanted = |state: &State| matches!(state, State::Held { .. } | State::Lapsed { .. });
                            if let Some(index) = model.pick(pick, wanted) {
                                let request = &mut model.requests[index];
                                let cost_nanos = request.held_nanos / 1000 * cost_permille;
                                store.settle(&request.settlement(cost_nanos), now).await.unwrap();
                                request.state = State::Settled {
                                    cost_nanos,
                                    settled_at: now,
                                    marker_until: after(now, SETTLEMENT_MEMORY),
                                };
                            }
                        }
                        Step::Retry { pick } => {
                            let wanted = |state: &State| matches!(state,
                                State::Settled { settled_at, .. } if now < after(*settled_at, SETTLEMENT_RETRY_WINDOW));
                            if let Some(index) = model.pick(pick, wanted) {
                                let request = &model.requests[index];
                                let State::Settled { cost_nanos, marker_until, .. } = request.state else {
                                    unreachable!()
                                };
                                prop_assert!(now < marker_until);
                                store.settle(&request.settlement(cost_nanos), now).await.unwrap();
                            }
                        }
                    }
                    let (balance, usage) = read(&store, now).await;
                    let context = format!("at {now} after {step:?}: {model:?}");
                    prop_assert_eq!(balance.balance_nanos, model.balance_nanos(), "{}", context);
                    prop_assert_eq!(balance.purchased_nanos, model.topped_up_nanos, "{}", context);
                    prop_assert_eq!(usage.total_nanos, model.charged_nanos(), "{}", context);
                    prop_assert_eq!(usage.reserved_nanos, model.held_nanos(), "{}", context);
                    // No admission, nor anything after it, takes what the
                    // balance leaves past the holds below zero.
                    prop_assert!(balance.balance_nanos - usage.reserved_nanos >= 0, "{}", context);
                }
                Ok(())
            })?;
        }
    }
}

/// Redis's keys but the one recording the data's layout, which every
/// store writes at connect.
fn without_layout(keys: Vec<String>) -> Vec<String> {
    keys.into_iter()
        .filter(|key| !key.contains("{layout}"))
        .collect()
}
