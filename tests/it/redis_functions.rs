//! The Redis store's Lua as one Redis Functions library: loaded at connect
//! (on every primary of a Cluster), loaded again when Redis has lost it,
//! with the refused call sent once more and run once, and a Redis without
//! Functions refused at connect.

use crate::common;

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use common::redis_server::{CommandWatch, RedisCluster, RedisServer};
use modelgate::store::{
    Check, CounterStore, LedgerStore, Limit, RedisStore, RedisStoreConfig, TimeSource,
};
use redis::Value;

/// Every operation of the store, each a function of the library.
const OPERATIONS: [&str; 14] = [
    "check_and_add",
    "acquire_slot",
    "ledger_write",
    "key_usage",
    "top_up",
    "get_record",
    "put_record",
    "delete_record",
    "list_records",
    "generations",
    "app_usage_add",
    "app_usage_read",
    "migrate_key",
    "migrate_account",
];

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap()
}

fn config() -> RedisStoreConfig {
    RedisStoreConfig {
        time_source: TimeSource::Caller,
        ..RedisStoreConfig::default()
    }
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

async fn node(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Every text in a reply, depth first.
fn texts(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => out.push(text.clone()),
        Value::Array(values) | Value::Set(values) => {
            values.iter().for_each(|value| texts(value, out));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(key, value)| {
            texts(key, out);
            texts(value, out);
        }),
        _ => {}
    }
}

/// The libraries a node has (`FUNCTION LIST`): each name with its
/// functions' names.
async fn libraries(url: &str) -> Vec<(String, Vec<String>)> {
    let mut connection = node(url).await;
    let reply: Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut connection)
        .await
        .unwrap();
    let Value::Array(libraries) = reply else {
        panic!("FUNCTION LIST: {reply:?}");
    };
    libraries
        .iter()
        .map(|library| {
            let mut words = Vec::new();
            texts(library, &mut words);
            let after = |field: &str| {
                words
                    .iter()
                    .position(|word| word == field)
                    .map(|at| words[at + 1].clone())
                    .unwrap()
            };
            let name = after("library_name");
            let functions = words
                .windows(2)
                .filter(|pair| pair[0] == "name")
                .map(|pair| pair[1].clone())
                .collect();
            (name, functions)
        })
        .collect()
}

/// The node has one library, `mg_` and 12 hex digits, whose functions are
/// `<library>_<operation>` for every operation.
async fn assert_library_loaded(url: &str) -> String {
    let libraries = libraries(url).await;
    assert_eq!(libraries.len(), 1, "{libraries:?}");
    let (name, mut functions) = libraries.into_iter().next().unwrap();
    let hash = name.strip_prefix("mg_").expect("named mg_<hash>");
    assert!(
        hash.len() == 12 && hash.bytes().all(|byte| byte.is_ascii_hexdigit()),
        "{name}"
    );
    let mut expected: Vec<String> = OPERATIONS
        .iter()
        .map(|operation| format!("{name}_{operation}"))
        .collect();
    functions.sort();
    expected.sort();
    assert_eq!(functions, expected);
    name
}

async fn function_flush(url: &str) {
    let mut connection = node(url).await;
    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(libraries(url).await.is_empty());
}

#[tokio::test]
async fn connect_loads_the_library() {
    let server = RedisServer::start();
    assert!(libraries(&server.url()).await.is_empty());
    let store = RedisStore::connect(&server.url(), config()).await.unwrap();
    let name = assert_library_loaded(&server.url()).await;
    // A second instance of the same binary loads the same library.
    let _again = RedisStore::connect(&server.url(), config()).await.unwrap();
    assert_eq!(assert_library_loaded(&server.url()).await, name);
    assert_eq!(store.top_up("acct", 3).await.unwrap().purchased_nanos, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_cluster_loads_the_library_on_every_primary() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let _store = RedisStore::connect_cluster(&nodes, config()).await.unwrap();
    let mut names = Vec::new();
    for url in &urls {
        names.push(assert_library_loaded(url).await);
    }
    names.dedup();
    assert_eq!(names.len(), 1, "one library on every node: {names:?}");
}

/// After `FUNCTION FLUSH` the first call is refused without running; the
/// store loads the library and sends it once more: one `FCALL`, one
/// `FUNCTION LOAD`, one `FCALL`, and the top-up credited once.
#[tokio::test]
async fn after_function_flush_a_call_loads_the_library_and_runs_once() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), config()).await.unwrap();
    store.top_up("acct", 3).await.unwrap();
    function_flush(&server.url()).await;

    let watch = CommandWatch::start(server.port());
    let balance = store.top_up("acct", 5).await.unwrap();
    assert_eq!(watch.client_commands(), ["fcall", "function", "fcall"]);
    assert_eq!(balance.purchased_nanos, 3 + 5);
    let balance = store.account_balance("acct").await.unwrap();
    assert_eq!(balance.purchased_nanos, 3 + 5, "credited once");
    assert_eq!(balance.balance_nanos, 3 + 5);
    assert_library_loaded(&server.url()).await;

    // Loaded again, the library serves the next calls at once.
    let watch = CommandWatch::start(server.port());
    assert!(
        store
            .check_and_add("acct", &[minute_check()], t0())
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(watch.client_commands(), ["fcall"]);
}

/// Calls that find the library missing together load it once: one
/// `FUNCTION LOAD` for a burst of calls, each sent at most twice and
/// counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_find_the_library_missing_together_load_it_once() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), config()).await.unwrap();
    function_flush(&server.url()).await;

    let watch = CommandWatch::start(server.port());
    let calls: Vec<_> = (0..32)
        .map(|index| {
            let store = store.clone();
            tokio::spawn(async move { store.top_up(&format!("acct{index}"), 5).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let commands = watch.client_commands();
    let loads = commands.iter().filter(|name| *name == "function").count();
    let fcalls = commands.iter().filter(|name| *name == "fcall").count();
    assert_eq!(loads, 1, "{commands:?}");
    assert!((32..=64).contains(&fcalls), "{commands:?}");
    for index in 0..32 {
        let balance = store
            .account_balance(&format!("acct{index}"))
            .await
            .unwrap();
        assert_eq!(balance.purchased_nanos, 5, "acct{index}: credited once");
    }
}

/// The same on a 3-node Cluster flushed on every node: the accounts on each
/// node are served, each top-up credited once, and every primary has the
/// library again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_after_function_flush_on_every_node_calls_load_the_library_and_run_once() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::connect_cluster(&nodes, config()).await.unwrap();
    // Enough accounts that every node has some (their hash tags spread
    // over the slots).
    let accounts: Vec<String> = (0..12).map(|index| format!("acct{index}")).collect();
    for account in &accounts {
        store.top_up(account, 3).await.unwrap();
    }
    for url in &urls {
        function_flush(url).await;
    }

    for account in &accounts {
        let balance = store.top_up(account, 5).await.unwrap();
        assert_eq!(balance.purchased_nanos, 3 + 5, "{account}");
        let balance = store.account_balance(account).await.unwrap();
        assert_eq!(balance.purchased_nanos, 3 + 5, "{account}: credited once");
        let decision = store
            .check_and_add(account, &[minute_check()], t0())
            .await
            .unwrap();
        assert!(decision.admitted);
        assert_eq!(decision.outcomes[0].used, 1, "{account}: counted once");
    }
    for url in &urls {
        assert_library_loaded(url).await;
    }
}

/// Redis before 7 has no `FUNCTION` command; a server with it renamed away
/// answers the same: refused at connect, naming the minimum.
#[tokio::test]
async fn a_redis_without_functions_is_refused_at_connect_naming_redis_7() {
    let server = RedisServer::start_with_args(&["--rename-command", "FUNCTION", ""]);
    let error = RedisStore::connect(&server.url(), config())
        .await
        .unwrap_err();
    assert_eq!(error.operation(), "connect");
    let message = error.to_string();
    assert!(message.contains("Redis 7 or later"), "{message}");
    assert!(message.contains("FUNCTION"), "{message}");
}
