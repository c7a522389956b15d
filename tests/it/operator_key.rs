//! The operator's key as the proxy example makes, takes and replaces it,
//! run as a process on a real `redis-server` (issue 34, points 3 and 4):
//! a start mints a key only when the store has none, so restarts on a
//! shared store do not pile up full-power keys in the log; `proxy keygen`
//! prints a key to set as `MODELGATE_ADMIN_KEY`; `proxy
//! reset-operator-key` replaces a lost one; a start moves an operator key
//! an older store keeps on `default` to the operator's own account.

use crate::common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::examples::ProxyProcess;
use common::redis_server::RedisServer;
use common::wait::{PATIENCE, wait_for, wait_for_blocking};
use modelgate::auth::ApiKey;
use modelgate::clock::{Clock, SystemClock};
use modelgate::keys::{KeyDirectory, NewKey, OPERATOR_ACCOUNT, SharedStore};
use modelgate::store::{
    Expect, KEYS, MemoryStore, PutOptions, RecordStoreExt, RedisStore, RedisStoreConfig,
};
use serde_json::{Value, json};

/// The proxy on `redis` (in memory when `None`), with `admin_key` as
/// `MODELGATE_ADMIN_KEY` when given (unset otherwise).
fn proxy(redis: Option<&str>, admin_key: Option<&str>) -> Command {
    let mut command = Command::new(common::examples::binary("proxy"));
    command
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env_remove("MODELGATE_ADMIN_KEY");
    match redis {
        Some(url) => command.args(["--redis", url]),
        None => command.args(["--store", "memory"]),
    };
    if let Some(key) = admin_key {
        command.env("MODELGATE_ADMIN_KEY", key);
    }
    command
}

/// `proxy <arguments>` run to its end: exit code, stdout, stderr.
fn run(arguments: &[&str]) -> (Option<i32>, String, String) {
    let mut command = Command::new(common::examples::binary("proxy"));
    command.args(arguments).env_remove("MODELGATE_ADMIN_KEY");
    finish(command)
}

/// Runs `command` to its end (killed after 20 s: a proxy that starts
/// serving instead fails the test): exit code, stdout, stderr.
fn finish(mut command: Command) -> (Option<i32>, String, String) {
    use std::io::Read;
    /// Killed when dropped: also when the wait below fails the test.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Killed(
        command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = wait_for_blocking(Duration::from_secs(20), || {
        child
            .0
            .try_wait()
            .unwrap()
            .ok_or_else(|| format!("{command:?} did not exit"))
    });
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status.code(), stdout, stderr)
}

/// The key in a "… (shown once): mg-v1-…" line.
fn shown_key(line: &str) -> String {
    let key = line
        .split_once("(shown once): ")
        .unwrap_or_else(|| panic!("no key shown in {line:?}"))
        .1
        .trim();
    ApiKey::parse(key).unwrap_or_else(|error| panic!("{key:?}: {error}"));
    key.to_owned()
}

async fn redis_store(server: &RedisServer) -> SharedStore {
    Arc::new(
        RedisStore::connect(&server.url(), RedisStoreConfig::default())
            .await
            .unwrap(),
    )
}

/// `GET /api/v1/key` through `proxy` with `key`: status and body.
async fn whoami(proxy: &ProxyProcess, key: &str) -> (u16, Value) {
    call(proxy, "GET", "/api/v1/key", key, None).await
}

async fn call(
    proxy: &ProxyProcess,
    method: &str,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method.parse().unwrap(), format!("{}{path}", proxy.address))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let reply = request.send().await.unwrap();
    let status = reply.status().as_u16();
    (status, reply.json().await.unwrap())
}

/// Asks with `key` until the answer's status is `status` (a change made
/// by another process is seen within the key cache's second).
async fn until_status(proxy: &ProxyProcess, key: &str, status: u16) -> Value {
    wait_for(PATIENCE, || async {
        let (got, body) = whoami(proxy, key).await;
        if got == status {
            Ok(body)
        } else {
            Err(format!("still {got}: {body}"))
        }
    })
    .await
}

#[tokio::test]
async fn a_second_start_on_a_shared_store_mints_no_key_and_the_first_still_works() {
    let server = RedisServer::start();
    let url = server.url();
    let first = ProxyProcess::spawn_watched(proxy(Some(&url), None));
    assert_eq!(first.printed_before.len(), 1, "{:?}", first.printed_before);
    assert!(first.printed_before[0].starts_with("operator key (shown once): "));
    let key = shown_key(&first.printed_before[0]);
    let (status, me) = whoami(&first.proxy, &key).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["data"]["operator"], true);
    assert_eq!(me["data"]["account"], OPERATOR_ACCOUNT);

    let second = ProxyProcess::spawn_watched(proxy(Some(&url), None));
    let log = second.wait_for_log("none is made or printed");
    assert!(
        log.contains("MODELGATE_ADMIN_KEY")
            && log.contains("proxy keygen")
            && log.contains("proxy reset-operator-key"),
        "{log}"
    );
    assert!(!log.contains("mg-v1-"), "no key in the log: {log}");
    assert_eq!(
        second.printed_before,
        Vec::<String>::new(),
        "no key printed"
    );
    let (status, me) = whoami(&second.proxy, &key).await;
    assert_eq!(status, 200, "the first key works on the second: {me}");
    let operators = KeyDirectory::new(redis_store(&server).await)
        .operator_keys()
        .await
        .unwrap();
    assert_eq!(operators.len(), 1, "{operators:?}");
    drop(first);
}

#[tokio::test]
async fn keygen_prints_a_key_the_proxy_takes_as_its_operators() {
    let (code, first, stderr) = run(&["keygen"]);
    assert_eq!(code, Some(0), "{stderr}");
    let (_, second, _) = run(&["keygen"]);
    let key = first.trim_end();
    assert_eq!(first.lines().count(), 1, "{first}");
    ApiKey::parse(key).unwrap();
    assert_ne!(first, second, "a new key each time");
    let (code, _, stderr) = run(&["keygen", "--redis", "redis://127.0.0.1:1"]);
    assert_eq!(code, Some(2), "keygen takes no store: {stderr}");
    assert!(stderr.contains("unexpected argument '--redis'"), "{stderr}");

    let watched = ProxyProcess::spawn_watched(proxy(None, Some(key)));
    assert!(
        watched.printed_before.is_empty(),
        "{:?}",
        watched.printed_before
    );
    let (status, me) = whoami(&watched.proxy, key).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["data"]["operator"], true);
}

#[tokio::test]
async fn reset_operator_key_disables_the_lost_key_and_prints_a_new_one_once() {
    let server = RedisServer::start();
    let url = server.url();
    let lost = ApiKey::generate();
    let lost = lost.expose();
    let running = ProxyProcess::spawn(proxy(Some(&url), Some(lost)));
    let (status, _) = whoami(&running, lost).await;
    assert_eq!(status, 200);

    let (code, stdout, stderr) = run(&["reset-operator-key", "--redis", &url]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let new = shown_key(&stdout);
    assert!(stderr.contains("disabled 1 operator key"), "{stderr}");
    assert!(!stderr.contains("mg-v1-"), "{stderr}");

    // The running proxy refuses the old key and takes the new one.
    let refused = until_status(&running, lost, 401).await;
    assert_eq!(refused["error"]["metadata"]["reason"], "disabled_key");
    let (status, me) = whoami(&running, &new).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["data"]["operator"], true);
    let (status, _) = call(&running, "GET", "/api/v1/accounts", &new, None).await;
    assert_eq!(status, 200);

    // A start with the old key stops, saying why.
    let (code, _, stderr) = finish(proxy(Some(&url), Some(lost)));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("MODELGATE_ADMIN_KEY is disabled"),
        "{stderr}"
    );
    // In memory there is nothing to reset.
    let (code, _, stderr) = run(&["reset-operator-key", "--store", "memory"]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("--store sqlite:PATH or --redis URL"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_start_moves_an_older_stores_operator_keys_off_default() {
    let server = RedisServer::start();
    let url = server.url();
    let store = redis_store(&server).await;
    let directory = KeyDirectory::new(store.clone());
    // As a proxy before the operator's own account left them: operator
    // keys (management, not scoped) on `default`.
    let admin = ApiKey::generate();
    let admin = admin.expose().to_owned();
    let old_admin = directory
        .register_key(&ApiKey::parse(&admin).unwrap(), NewKey::named("operator"))
        .await
        .unwrap();
    let (_, old_other) = directory
        .create_key(NewKey::named("another operator"))
        .await
        .unwrap();
    for mut record in [old_admin, old_other] {
        record.management = true;
        store
            .put_json_at(
                KEYS,
                &record.hash.to_hex(),
                &record,
                Expect::Any,
                PutOptions::default(),
                SystemClock.now(),
            )
            .await
            .unwrap();
    }

    let running = ProxyProcess::spawn(proxy(Some(&url), Some(&admin)));
    let (status, me) = whoami(&running, &admin).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["data"]["account"], OPERATOR_ACCOUNT);
    assert_eq!(me["data"]["operator"], true);
    let operators = directory.operator_keys().await.unwrap();
    assert_eq!(operators.len(), 2);
    assert!(
        operators
            .iter()
            .all(|record| record.account == OPERATOR_ACCOUNT),
        "{operators:?}"
    );

    // `default`'s manager no longer sees or reaches them.
    let (status, made) = call(
        &running,
        "POST",
        "/api/v1/keys",
        &admin,
        Some(json!({"name": "default admin", "account": "default", "management": true})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let manager = made["key"].as_str().unwrap();
    let (_, listed) = call(
        &running,
        "GET",
        "/api/v1/keys?include_disabled=true",
        manager,
        None,
    )
    .await;
    let names: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|key| key["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default admin"], "{listed}");
    for record in &operators {
        let (status, body) = call(
            &running,
            "DELETE",
            &format!("/api/v1/keys/{}", record.hash.to_hex()),
            manager,
            None,
        )
        .await;
        assert!(status == 403 || status == 404, "{status} {body}");
    }
    let (status, _) = whoami(&running, &admin).await;
    assert_eq!(status, 200);
}

/// `callers` first starts at once, each with its own directory (on Redis
/// its own connection, as separate proxies have) over `stores`: exactly
/// one is given a key, that key is the store's one operator's key, and a
/// reset still replaces it.
async fn concurrent_mints_make_one_key(stores: Vec<SharedStore>) {
    let directories: Vec<KeyDirectory> = stores.into_iter().map(KeyDirectory::new).collect();
    // Each in its own task, released together, on several threads.
    let barrier = Arc::new(tokio::sync::Barrier::new(directories.len()));
    let starts: Vec<_> = directories
        .iter()
        .map(|directory| {
            let (directory, barrier) = (directory.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                directory.mint_operator_key("operator").await.unwrap()
            })
        })
        .collect();
    let mut keys = Vec::new();
    for start in starts {
        keys.extend(start.await.unwrap());
    }
    assert_eq!(keys.len(), 1, "one key among {} starts", directories.len());
    let operators = directories[0].operator_keys().await.unwrap();
    assert_eq!(operators.len(), 1, "{operators:?}");
    assert_eq!(operators[0].hash.to_hex(), keys[0].hash().to_hex());
    assert_eq!(operators[0].account, OPERATOR_ACCOUNT);
    assert!(!operators[0].disabled);
    // Later starts make none, before and after a reset.
    assert!(
        directories[1]
            .mint_operator_key("operator")
            .await
            .unwrap()
            .is_none()
    );
    let (new, disabled) = directories[1]
        .replace_operator_keys("operator")
        .await
        .unwrap();
    assert_eq!(disabled, 1);
    assert!(
        directories[0]
            .mint_operator_key("operator")
            .await
            .unwrap()
            .is_none()
    );
    let live: Vec<String> = directories[0]
        .operator_keys()
        .await
        .unwrap()
        .into_iter()
        .filter(|record| !record.disabled)
        .map(|record| record.hash.to_hex())
        .collect();
    assert_eq!(live, vec![new.hash().to_hex()]);
}

// MemoryStore's calls rarely yield between the check and the write, so
// this guards the outcome; the Redis case below is the one that races.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_starts_on_memory_mint_exactly_one_operator_key() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    concurrent_mints_make_one_key(vec![store; 16]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_starts_on_redis_mint_exactly_one_operator_key() {
    let server = RedisServer::start();
    let mut stores = Vec::new();
    for _ in 0..16 {
        stores.push(redis_store(&server).await);
    }
    concurrent_mints_make_one_key(stores).await;
}

#[tokio::test]
async fn two_proxies_starting_at_once_on_an_empty_redis_print_one_key() {
    let server = RedisServer::start();
    let url = server.url();
    let starts: Vec<_> = (0..2)
        .map(|_| {
            let command = proxy(Some(&url), None);
            std::thread::spawn(move || ProxyProcess::spawn_watched(command))
        })
        .collect();
    let started: Vec<_> = starts
        .into_iter()
        .map(|start| start.join().unwrap())
        .collect();
    let printed: Vec<&String> = started
        .iter()
        .flat_map(|watched| &watched.printed_before)
        .collect();
    assert_eq!(printed.len(), 1, "{printed:?}");
    let key = shown_key(printed[0]);
    let silent = started
        .iter()
        .find(|watched| watched.printed_before.is_empty())
        .unwrap();
    let log = silent.wait_for_log("none is made or printed");
    assert!(log.contains("MODELGATE_ADMIN_KEY"), "{log}");
    for watched in &started {
        let (status, me) = whoami(&watched.proxy, &key).await;
        assert_eq!(status, 200, "{me}");
        assert_eq!(me["data"]["operator"], true);
    }
    let operators = KeyDirectory::new(redis_store(&server).await)
        .operator_keys()
        .await
        .unwrap();
    assert_eq!(operators.len(), 1, "{operators:?}");
}

#[tokio::test]
async fn a_store_an_older_version_wrote_is_refused_until_migrated_once() {
    let server = RedisServer::start();
    let url = server.url();
    // What an older version leaves: key records, no layout recorded, no
    // terms in the ledger.
    let unchecked = RedisStoreConfig {
        check_layout: false,
        ..RedisStoreConfig::default()
    };
    let old = RedisStore::connect(&url, unchecked).await.unwrap();
    let key = ApiKey::generate();
    let record = modelgate::keys::KeyRecord {
        hash: key.hash(),
        name: "old".into(),
        account: "default".into(),
        management: false,
        scoped_to_account: false,
        disabled: false,
        disabled_by_operator: false,
        limit_nanos: Some(2 * modelgate::store::NANOS_PER_CREDIT),
        limit_reset: None,
        include_byok_in_limit: false,
        created_at: chrono::Utc::now(),
        updated_at: None,
        expires_at: None,
        last_used_at: None,
        leak: None,
        hint: None,
        rotated_to: None,
        allowed_models: None,
        rate_limit: None,
    };
    old.put_json_at(
        KEYS,
        &record.hash.to_hex(),
        &record,
        Expect::Absent,
        PutOptions::default(),
        SystemClock.now(),
    )
    .await
    .unwrap();
    // A second key that has never been charged: holds, but no usage hash.
    let fresh = modelgate::keys::KeyRecord {
        hash: ApiKey::generate().hash(),
        name: "fresh".into(),
        ..record.clone()
    };
    old.put_json_at(
        KEYS,
        &fresh.hash.to_hex(),
        &fresh,
        Expect::Absent,
        PutOptions::default(),
        SystemClock.now(),
    )
    .await
    .unwrap();
    assert_eq!(old.layout().await.unwrap(), None);
    // Its ledger in the older layout: five keys per key, holds per
    // account: 1.5 credits used today, and a request in flight holding 0.5.
    let credit = modelgate::store::NANOS_PER_CREDIT;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let key_base = format!("mg:{{default}}:k:{}", record.hash.to_hex());
    let day_start = chrono::Utc::now()
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc()
        .timestamp_micros();
    let held_until = (chrono::Utc::now() + chrono::Duration::minutes(10)).timestamp_micros();
    let mut seed = redis::pipe();
    seed.cmd("HSET")
        .arg(format!("{key_base}:use"))
        .arg("t")
        .arg(3 * credit / 2)
        .arg("ds")
        .arg(day_start)
        .arg("d")
        .arg(3 * credit / 2)
        .arg(&b"\xfftotal"[..])
        .arg(credit / 2)
        .ignore()
        .cmd("ZADD")
        .arg(format!("{key_base}:res"))
        .arg(held_until)
        .arg("in-flight")
        .ignore()
        .cmd("HSET")
        .arg(format!("{key_base}:resamt"))
        .arg("in-flight")
        .arg(format!("{}:c", credit / 2))
        .ignore()
        .cmd("ZADD")
        .arg("mg:{default}:holds")
        .arg(held_until)
        .arg("in-flight")
        .ignore()
        .cmd("HSET")
        .arg("mg:{default}:holdamt")
        .arg("in-flight")
        .arg(credit / 2)
        .ignore();
    // A hold whose account side lapsed already (the balance was charged
    // 0.3), its key's side not yet; one of a deleted key (0.4), on the
    // account only; and one of the fresh key (0.1), in flight.
    let long_ago = (chrono::Utc::now() - chrono::Duration::minutes(10)).timestamp_micros();
    let fresh_base = format!("mg:{{default}}:k:{}", fresh.hash.to_hex());
    seed.cmd("ZADD")
        .arg(format!("{key_base}:res"))
        .arg(long_ago)
        .arg("lapsed-on-account")
        .ignore()
        .cmd("HSET")
        .arg(format!("{key_base}:resamt"))
        .arg("lapsed-on-account")
        .arg(format!("{}:c", 3 * credit / 10))
        .ignore()
        .cmd("ZADD")
        .arg("mg:{default}:holds")
        .arg(held_until)
        .arg("of-a-deleted-key")
        .ignore()
        .cmd("HSET")
        .arg("mg:{default}:holdamt")
        .arg("of-a-deleted-key")
        .arg(4 * credit / 10)
        .ignore()
        .cmd("ZADD")
        .arg(format!("{key_base}:res"))
        .arg(held_until)
        .arg("legacy-byok")
        .ignore()
        // Written by layout 1, which said nothing of the balance: not held
        // on the account, so not covered by it.
        .cmd("HSET")
        .arg(format!("{key_base}:resamt"))
        .arg("legacy-byok")
        .arg(credit / 10)
        .ignore()
        .cmd("ZADD")
        .arg(format!("{fresh_base}:res"))
        .arg(held_until)
        .arg("fresh-in-flight")
        .ignore()
        .cmd("HSET")
        .arg(format!("{fresh_base}:resamt"))
        .arg("fresh-in-flight")
        .arg(format!("{}:c", credit / 10))
        .ignore()
        .cmd("ZADD")
        .arg("mg:{default}:holds")
        .arg(held_until)
        .arg("fresh-in-flight")
        .ignore()
        .cmd("HSET")
        .arg("mg:{default}:holdamt")
        .arg("fresh-in-flight")
        .arg(credit / 10)
        .ignore();
    let () = seed.query_async(&mut connection).await.unwrap();

    // A new instance refuses it, naming the command.
    let refused = refused_by_layout(&url).await;
    assert!(
        refused
            .to_string()
            .contains("proxy migrate-store --redis URL"),
        "{refused}"
    );
    let (code, _, stderr) = finish(proxy(Some(&url), Some(key.expose())));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("proxy migrate-store --redis URL"),
        "{stderr}"
    );

    // Migrated once: every key's ledger moved and terms written, the
    // layout recorded; again changes nothing.
    for holds in [3, 0] {
        let (code, _, stderr) = run(&["migrate-store", "--redis", &url]);
        assert_eq!(code, Some(0), "{stderr}");
        assert!(stderr.contains("wrote the terms of 2 key(s)"), "{stderr}");
        assert!(
            stderr.contains(&format!("with {holds} hold(s) in flight")),
            "{stderr}"
        );
    }
    let store = in_current_layout(&url).await;
    // The key's usage and its request in flight came along, with the
    // lapse its key had not been charged yet; the fresh key's hold too;
    // the old keys are gone.
    let usage = store
        .key_usage("default", &record.hash.to_hex(), chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(
        (usage.total_nanos, usage.day_nanos, usage.reserved_nanos),
        (18 * credit / 10, 18 * credit / 10, 6 * credit / 10)
    );
    let fresh_usage = store
        .key_usage("default", &fresh.hash.to_hex(), chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(
        (fresh_usage.total_nanos, fresh_usage.reserved_nanos),
        (0, credit / 10)
    );
    // The deleted key's hold was charged to the balance, once; the lapse
    // the balance had paid was not charged again.
    assert_eq!(
        store
            .account_balance("default")
            .await
            .unwrap()
            .balance_nanos,
        -4 * credit / 10
    );
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("mg:{default}:*")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(
        left.iter().all(|name| !name.starts_with(&key_base)
            && !name.starts_with(&fresh_base)
            && name != "mg:{default}:holds"
            && name != "mg:{default}:holdamt"),
        "{left:?}"
    );
    // The key's limit now decides in the store, whatever a request says.
    use modelgate::store::{LedgerStore, ReserveOutcome, ReserveRequest};
    store
        .top_up("default", 10 * modelgate::store::NANOS_PER_CREDIT)
        .await
        .unwrap();
    let request = ReserveRequest {
        account: "default".into(),
        key: record.hash.to_hex(),
        reservation_id: "r".into(),
        amount_nanos: 3 * modelgate::store::NANOS_PER_CREDIT,
        min_amount_nanos: None,
        key_limit: None,
        counts_against_key_limit: true,
        check_balance: true,
        covered_by_balance: true,
        ttl: Duration::from_secs(60),
        lapse_record: None,
    };
    assert!(matches!(
        store.reserve(&request, chrono::Utc::now()).await.unwrap(),
        ReserveOutcome::KeyLimitReached { .. }
    ));
    // The request in flight settles as any other: its hold released, its
    // cost charged once.
    let settlement = modelgate::store::Settlement {
        account: "default".into(),
        key: record.hash.to_hex(),
        reservation_id: "in-flight".into(),
        hold_granted: true,
        cost_nanos: credit / 5,
        byok: false,
        record: None,
    };
    for _ in 0..2 {
        store.settle(&settlement, chrono::Utc::now()).await.unwrap();
    }
    let usage = store
        .key_usage("default", &record.hash.to_hex(), chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(
        (usage.total_nanos, usage.reserved_nanos),
        (2 * credit, credit / 10)
    );
    assert_eq!(
        store
            .account_balance("default")
            .await
            .unwrap()
            .balance_nanos,
        10 * credit - credit / 5 - 4 * credit / 10
    );
    // A layout newer than this version's is refused as such.
    let () = redis::cmd("SET")
        .arg("mg:{layout}:version")
        .arg(modelgate::store::LEDGER_LAYOUT + 1)
        .query_async(&mut connection)
        .await
        .unwrap();
    let newer = refused_by_layout(&url).await;
    assert!(newer.to_string().contains("newer"), "{newer}");
    let (code, _, stderr) = run(&["migrate-store", "--redis", &url]);
    assert_eq!(code, Some(2), "{stderr}");
}

/// Layout 3 kept each GCRA rate limit's state under a key of its own;
/// layout 4 keeps it in the account's hash and reads a layout 3 key until
/// then, so the migration moves nothing and records the layout. A store in
/// layout 3 is refused until then, as any older one is.
#[tokio::test]
async fn a_layout_3_store_is_migrated_by_recording_the_layout() {
    let server = RedisServer::start();
    let url = server.url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let arrival = (chrono::Utc::now() + chrono::Duration::seconds(30)).timestamp_micros();
    let () = redis::pipe()
        .cmd("SET")
        .arg("mg:{layout}:version")
        .arg(3)
        .ignore()
        .cmd("SET")
        .arg("mg:{default}:c:g:rpm")
        .arg(arrival)
        .arg("PX")
        .arg(600_000)
        .ignore()
        .query_async(&mut connection)
        .await
        .unwrap();
    let refused = refused_by_layout(&url).await;
    assert!(
        refused.to_string().contains("layout 3") && refused.to_string().contains("migrate-store"),
        "{refused}"
    );
    let (code, _, stderr) = run(&["migrate-store", "--redis", &url]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("from layout 3 to 4"), "{stderr}");
    in_current_layout(&url).await;
    let kept: Option<i64> = redis::cmd("GET")
        .arg("mg:{default}:c:g:rpm")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(kept, Some(arrival));
}

/// The store at `url`, which a new instance takes: its layout recorded
/// as this version's.
async fn in_current_layout(url: &str) -> RedisStore {
    let store = RedisStore::connect(url, RedisStoreConfig::default())
        .await
        .unwrap();
    assert_eq!(
        store.layout().await.unwrap(),
        Some(modelgate::store::LEDGER_LAYOUT)
    );
    store
}

/// Why a new instance refuses the store at `url`: its layout.
async fn refused_by_layout(url: &str) -> modelgate::store::StoreError {
    let refused = RedisStore::connect(url, RedisStoreConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(refused.kind(), modelgate::store::StoreErrorKind::Layout(_)),
        "{refused}"
    );
    refused
}

#[tokio::test]
async fn a_fresh_store_is_given_the_current_layout() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), RedisStoreConfig::default())
        .await
        .unwrap();
    assert_eq!(
        store.layout().await.unwrap(),
        Some(modelgate::store::LEDGER_LAYOUT)
    );
}

/// The proxy on the SQLite file `path`, listening on `listen` and `admin`.
fn proxy_on_file(path: &std::path::Path, listen: &str, admin: &str) -> Command {
    let mut command = Command::new(common::examples::binary("proxy"));
    command
        .args(["--listen", listen, "--admin-listen", admin])
        .args(["--store", &format!("sqlite:{}", path.display())])
        .env("RUST_LOG", "info")
        .env_remove("MODELGATE_ADMIN_KEY");
    command
}

/// A first start whose port (or admin port) is taken fails before it makes
/// the operator's key: nothing printed, nothing stored; the next start on a
/// free port makes and prints the key, once.
#[tokio::test]
async fn a_first_start_that_cannot_listen_makes_and_prints_no_key() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("m.db");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = busy.local_addr().unwrap().to_string();
    for (listen, admin) in [
        (busy.as_str(), "127.0.0.1:0"),
        ("127.0.0.1:0", busy.as_str()),
    ] {
        let (code, stdout, stderr) = finish(proxy_on_file(&path, listen, admin));
        assert_ne!(code, Some(0), "{stdout} {stderr}");
        assert!(stderr.contains("cannot listen"), "{stderr}");
        assert!(!stdout.contains("shown once"), "{stdout}");
        assert!(!stdout.contains("mg-v1-") && !stderr.contains("mg-v1-"));
    }
    let started = ProxyProcess::spawn_watched(proxy_on_file(&path, "127.0.0.1:0", "127.0.0.1:0"));
    assert_eq!(
        started.printed_before.len(),
        1,
        "{:?}",
        started.printed_before
    );
    let key = shown_key(&started.printed_before[0]);
    assert!(started.printed_before[0].starts_with("operator key (shown once): "));
    let (status, me) = whoami(&started.proxy, &key).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["data"]["operator"], true);
}

/// The access log names a key's route by its pattern and an 8-hex-digit
/// hash prefix, never the whole hash (the operator key's included).
#[tokio::test]
async fn the_access_log_carries_no_whole_key_hash() {
    let started = ProxyProcess::spawn_watched(proxy(None, None));
    let key = shown_key(&started.printed_before[0]);
    let hash = modelgate::auth::KeyHash::of(&key).to_hex();
    for path in [
        format!("/api/v1/keys/{hash}"),
        format!("/api/v1/keys/{}/rotate", hash.to_uppercase()),
        format!("/nowhere/{hash}"),
    ] {
        let method = if path.ends_with("rotate") {
            "POST"
        } else {
            "GET"
        };
        call(&started.proxy, method, &path, &key, None).await;
    }
    let log = started.wait_for_log("/nowhere/");
    let prefix = &hash[..8];
    assert!(log.contains(&format!("/api/v1/keys/{prefix}…")), "{log}");
    assert!(
        log.contains(&format!("/api/v1/keys/{prefix}…/rotate")),
        "{log}"
    );
    assert!(!log.to_ascii_lowercase().contains(&hash[..16]), "{log}");
}

/// Two webhook routes with one secret: the start says so, naming both.
#[tokio::test]
async fn routes_sharing_a_secret_are_named_in_a_warning_at_start() {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        json!({"plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {
            "deploys": {"sessionKey": "agent:main", "secret": "one-shared-secret-0123456789"},
            "audit": {"sessionKey": "agent:audit", "secret": "one-shared-secret-0123456789"},
            "other": {"sessionKey": "agent:other", "secret": "its-own-secret-0123456789ab"},
        }}}}}})
        .to_string(),
    )
    .unwrap();
    let mut command = proxy(None, None);
    command.arg("--config").arg(config.path());
    let started = ProxyProcess::spawn_watched(command);
    let log = started.wait_for_log("share one secret");
    assert!(log.contains("audit, deploys"), "{log}");
    assert!(!log.contains("one-shared-secret"), "{log}");
}
