//! The proxy on a SQLite file (`--store sqlite:PATH`), as real processes:
//! killed mid-burst and started again on the same file, nothing committed
//! is lost and every cost is there once; two proxies on one file share a
//! key's limit exactly.

use crate::common;

use std::process::Command;

use common::examples::{ProxyProcess, binary};
use common::wait::{PATIENCE, wait_for, wait_until};
use modelgate::store::{LedgerStore, NANOS_PER_CREDIT, SqliteStore, SqliteStoreConfig};
use serde_json::json;

/// A gateway config: every token costs 1000 nano-credits, 3 s holds, no
/// account rate limit in the way.
fn write_config(directory: &std::path::Path) -> std::path::PathBuf {
    let config = directory.join("gateway.json");
    let price = json!({"prompt_per_million": 1, "completion_per_million": 1});
    std::fs::write(
        &config,
        json!({"pricing": {"default": price}, "credit": {"reservation_ttl_seconds": 3},
               "rate_limits": {"account": {"gcra": {"requests": 1000000, "period_seconds": 1,
                                                    "burst": 1000000}}}})
        .to_string(),
    )
    .unwrap();
    config
}

fn proxy_command(database: &std::path::Path, config: &std::path::Path) -> Command {
    let mut command = Command::new(binary("proxy"));
    command
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--store")
        .arg(format!("sqlite:{}", database.display()))
        .arg("--config")
        .arg(config)
        .env_remove("MODELGATE_ADMIN_KEY");
    command
}

/// The operator's key a first start printed.
fn printed_key(printed: &[String]) -> String {
    let line = printed
        .iter()
        .find(|line| line.starts_with("operator key (shown once): "))
        .unwrap_or_else(|| panic!("no key printed: {printed:?}"));
    line.rsplit(' ').next().unwrap().to_owned()
}

async fn chat(client: &reqwest::Client, address: &str, key: &str) -> Option<u16> {
    client
        .post(format!("{address}/api/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": "openai/gpt-4o-mini",
                      "max_tokens": 50, "messages": [{"role": "user", "content": "hello there"}]}))
        .send()
        .await
        .ok()
        .map(|response| response.status().as_u16())
}

/// 1000 credits bought for the default account.
async fn fund(client: &reqwest::Client, address: &str, admin_key: &str) {
    let funded = client
        .post(format!("{address}/api/v1/accounts/default/credits"))
        .bearer_auth(admin_key)
        .json(&json!({ "amount": 1000 }))
        .send()
        .await
        .unwrap();
    assert!(funded.status().is_success());
}

/// The cost a generation record says, in nano-credits.
fn record_cost_nanos(record: &[u8]) -> i64 {
    let record: serde_json::Value = serde_json::from_slice(record).unwrap();
    (record["total_cost"].as_f64().unwrap() * NANOS_PER_CREDIT as f64).round() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_no_store_a_proxy_keeps_its_state_in_modelgate_db_where_it_runs() {
    let directory = tempfile::tempdir().unwrap();
    let start = || {
        let mut command = Command::new(binary("proxy"));
        command
            .current_dir(directory.path())
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .env_remove("MODELGATE_ADMIN_KEY");
        ProxyProcess::spawn_watched(command)
    };
    let first = start();
    let admin_key = printed_key(&first.printed_before);
    let key = first.proxy.create_key(&admin_key, "kept").await;
    drop(first);
    assert!(directory.path().join("modelgate.db").exists());
    // Started again: the operator's key is not printed again, and both
    // keys still work.
    let second = start();
    assert!(
        second
            .printed_before
            .iter()
            .all(|line| !line.contains("management key")),
        "{:?}",
        second.printed_before
    );
    let client = reqwest::Client::new();
    // The operator's key manages keys; the key it made calls models.
    for (bearer, path) in [(&admin_key, "keys"), (&key, "models")] {
        let answer = client
            .get(format!("{}/api/v1/{path}", second.proxy.address))
            .bearer_auth(bearer)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 200, "{path}");
    }
    // Its store calls are timed as Redis's are.
    let metrics = client
        .get(format!("{}/metrics", second.proxy.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"modelgate_store_call_duration_seconds_count{operation="#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_burst_and_started_again_nothing_committed_is_lost() {
    let directory = tempfile::tempdir().unwrap();
    let database = directory.path().join("modelgate.db");
    let config = write_config(directory.path());
    let first = ProxyProcess::spawn_watched(proxy_command(&database, &config));
    let admin_key = printed_key(&first.printed_before);
    let key = first.proxy.create_key(&admin_key, "burst").await;
    let client = reqwest::Client::new();
    fund(&client, &first.proxy.address, &admin_key).await;

    // A burst from 16 clients; the process is killed while it runs (once
    // it has answered twice as many requests as there are clients).
    let address = first.proxy.address.clone();
    let answered_so_far = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let burst: Vec<_> = (0..16)
        .map(|_| {
            let (client, address, key) = (client.clone(), address.clone(), key.clone());
            let answered_so_far = answered_so_far.clone();
            tokio::spawn(async move {
                let mut answered = 0;
                while let Some(status) = chat(&client, &address, &key).await {
                    assert_eq!(status, 200);
                    answered += 1;
                    answered_so_far.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                answered
            })
        })
        .collect();
    wait_until(PATIENCE, "32 answers of the burst", || async {
        answered_so_far.load(std::sync::atomic::Ordering::SeqCst) >= 32
    })
    .await;
    let killed = Command::new("kill")
        .args(["-KILL", &first.proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut answered = 0;
    for client in burst {
        answered += client.await.unwrap();
    }
    assert!(answered > 16, "the burst ran: {answered} answers");
    drop(first);

    // Started again on the file: no new operator's key; the old one and
    // the key it made still work, and the balance is what was bought less
    // what was spent.
    let second = ProxyProcess::spawn_watched(proxy_command(&database, &config));
    assert!(
        second
            .printed_before
            .iter()
            .all(|line| !line.contains("management key")),
        "{:?}",
        second.printed_before
    );
    assert_eq!(chat(&client, &second.proxy.address, &key).await, Some(200));
    let listed = client
        .get(format!("{}/api/v1/keys", second.proxy.address))
        .bearer_auth(&admin_key)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status().as_u16(), 200);

    // Once the holds of the requests cut short have lapsed (3 s after
    // their last renewal; the first read after that charges them), the
    // key's usage is exactly the sum of its generation records: each
    // request charged once, those cut short at their hold.
    let store = SqliteStore::open(&database, SqliteStoreConfig::default()).unwrap();
    let hash = modelgate::auth::KeyHash::of(&key).to_hex();
    let usage = wait_for(PATIENCE, || async {
        let usage = store
            .key_usage("default", &hash, chrono::Utc::now())
            .await
            .unwrap();
        if usage.reserved_nanos == 0 {
            Ok(usage)
        } else {
            Err(format!("the holds cut short never lapsed: {usage:?}"))
        }
    })
    .await;
    let records = store
        .recent_generations("default", 1_000_000, chrono::Utc::now())
        .await
        .unwrap();
    assert!(records.len() > answered / 2, "{} records", records.len());
    let recorded: i64 = records.iter().map(|record| record_cost_nanos(record)).sum();
    let tolerance = records.len() as i64; // each record's cost rounds to a nano-credit
    assert!(
        (usage.total_nanos - recorded).abs() <= tolerance,
        "usage {} but the records sum to {recorded}",
        usage.total_nanos
    );
    let balance = store.account_balance("default").await.unwrap();
    assert_eq!(balance.purchased_nanos, 1000 * NANOS_PER_CREDIT);
    assert_eq!(
        balance.balance_nanos,
        balance.purchased_nanos - usage.total_nanos
    );
    drop(second);
    drop(store);

    let file = rusqlite::Connection::open(&database).unwrap();
    let integrity: String = file
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");

    // The two queries docs/operating.md shows, on this file: the spend per
    // key per day adds up to the key's usage, and the models' request
    // counts to its records.
    let queries = documented_queries();
    assert_eq!(queries.len(), 2, "{queries:?}");
    let spend: Vec<(String, String, f64)> = file
        .prepare(&queries[0])
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        spend
            .iter()
            .all(|(spender, day, _)| *spender == hash && day.len() == 10)
    );
    let spent_nanos: f64 =
        spend.iter().map(|(_, _, credits)| credits).sum::<f64>() * NANOS_PER_CREDIT as f64;
    assert!((spent_nanos - usage.total_nanos as f64).abs() <= tolerance as f64);
    let models: Vec<(Option<String>, i64)> = file
        .prepare(&queries[1])
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let counted: i64 = models.iter().map(|(_, requests)| requests).sum();
    assert_eq!(counted, records.len() as i64);
}

/// The SQL of the `sqlite3` examples in docs/operating.md (each between
/// `<<'SQL'` and `SQL`).
fn documented_queries() -> Vec<String> {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operating.md"),
    )
    .unwrap();
    page.split("sqlite3 modelgate.db <<'SQL'\n")
        .skip(1)
        .map(|rest| rest[..rest.find("\nSQL\n").unwrap()].to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_one_file_share_a_key_limit_exactly() {
    let directory = tempfile::tempdir().unwrap();
    let database = directory.path().join("modelgate.db");
    let config = write_config(directory.path());
    let first = ProxyProcess::spawn_watched(proxy_command(&database, &config));
    let admin_key = printed_key(&first.printed_before);
    let second = ProxyProcess::spawn_watched(proxy_command(&database, &config));
    assert!(
        second
            .printed_before
            .iter()
            .all(|line| !line.contains("management key"))
    );
    let client = reqwest::Client::new();
    fund(&client, &first.proxy.address, &admin_key).await;
    // A key whose limit lets only a few requests through.
    let created: serde_json::Value = client
        .post(format!("{}/api/v1/keys", first.proxy.address))
        .bearer_auth(&admin_key)
        .json(&json!({ "name": "shared", "limit": 0.0005 }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = created["key"].as_str().unwrap().to_owned();
    let addresses = [first.proxy.address.clone(), second.proxy.address.clone()];
    let requests: Vec<_> = (0..60)
        .map(|index| {
            let (client, address, key) =
                (client.clone(), addresses[index % 2].clone(), key.clone());
            tokio::spawn(async move { chat(&client, &address, &key).await.unwrap() })
        })
        .collect();
    let mut admitted = 0;
    for request in requests {
        match request.await.unwrap() {
            200 => admitted += 1,
            402 => {}
            other => panic!("status {other}"),
        }
    }
    assert!(admitted > 0 && admitted < 60, "{admitted} admitted");
    let store = SqliteStore::open(&database, SqliteStoreConfig::default()).unwrap();
    let hash = modelgate::auth::KeyHash::of(&key).to_hex();
    let usage = common::settle::settled(&store, "default", &hash, chrono::Utc::now()).await;
    assert!(
        usage.total_nanos <= NANOS_PER_CREDIT / 2000,
        "the two proxies let the key spend {} of its 500000 nano-credits",
        usage.total_nanos
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_operator_key_replaces_the_key_a_file_keeps() {
    let directory = tempfile::tempdir().unwrap();
    let database = directory.path().join("modelgate.db");
    let config = write_config(directory.path());
    let first = ProxyProcess::spawn_watched(proxy_command(&database, &config));
    let lost = printed_key(&first.printed_before);
    drop(first);
    let output = Command::new(binary("proxy"))
        .args(["reset-operator-key", "--store"])
        .arg(format!("sqlite:{}", database.display()))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let new_key = stdout
        .lines()
        .find_map(|line| line.strip_prefix("operator key (shown once): "))
        .unwrap_or_else(|| panic!("no new key printed: {stdout}"))
        .to_owned();
    // Started again with the new key: it manages keys; the lost one no
    // longer does.
    let mut command = proxy_command(&database, &config);
    command.env("MODELGATE_ADMIN_KEY", &new_key);
    let second = ProxyProcess::spawn(command);
    let client = reqwest::Client::new();
    let status = |key: String| {
        let (client, address) = (client.clone(), second.address.clone());
        async move {
            client
                .get(format!("{address}/api/v1/keys"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status(new_key.clone()).await, 200);
    let refused = status(lost).await;
    assert!(matches!(refused, 401 | 403), "{refused}");
}

/// Commits are copied into the database file beside the store's calls,
/// not inside whichever commit crosses SQLite's threshold: with the calls
/// idle, the file catches up with the WAL while the store stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_checkpointed_beside_the_calls_while_the_store_is_open() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("modelgate.db");
    let store = SqliteStore::open(&path, SqliteStoreConfig::default()).unwrap();
    // A few hundred pages of the WAL: far below the store's own bound on
    // it, so only the checkpointer puts them in the file.
    for account in 0..2_000 {
        store
            .top_up(&format!("account-{account:05}-{}", "x".repeat(100)), 1)
            .await
            .unwrap();
    }
    let wal_bytes = std::fs::metadata(directory.path().join("modelgate.db-wal"))
        .unwrap()
        .len();
    assert!(wal_bytes > 100 * 4096, "the WAL holds {wal_bytes} bytes");
    wait_until(PATIENCE, "the database file holds the accounts", || async {
        std::fs::metadata(&path).unwrap().len() > 50 * 4096
    })
    .await;
    drop(store);
}
