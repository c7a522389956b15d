//! CreditGuard's group commit on Redis, over real HTTP, with two gateway
//! instances sharing one `redis-server`: settlements ride with
//! reservations or go together, and still every limit holds exactly, every
//! cost is recorded once, and a cost is recorded before its response ends.

use crate::common;

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use common::http_server::serve;
use common::redis_server::RedisServer;
use common::settle::settled;
use futures::future::join_all;
use http::{Request, Response};
use http_body_util::Full;
use modelgate::auth::{BearerAuthLayer, KeyHash};
use modelgate::body::BodyLimitLayer;
use modelgate::credit::{CreditGuardLayer, PriceTable};
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::store::{NANOS_PER_CREDIT, RedisStore, RedisStoreConfig, TimeSource};
use serde_json::{Value, json};
use tower::{ServiceBuilder, service_fn};

/// 1000 credits per million completion tokens and free prompts: a request
/// with `max_tokens` 1000 is estimated at exactly one credit.
fn prices() -> PriceTable {
    PriceTable::from_json(
        r#"{"default": {"prompt_per_million": 0, "completion_per_million": 1000}}"#,
    )
    .unwrap()
}

/// Takes `delay`, then answers with usage of 1000 completion tokens: one credit.
async fn upstream(delay: Duration) -> Result<Response<Full<Bytes>>, Infallible> {
    tokio::time::sleep(delay).await;
    let body = json!({
        "choices": [{"message": {"role": "assistant", "content": "Hi"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1000},
    });
    Ok(Response::new(Full::new(Bytes::from(body.to_string()))))
}

struct Gateways {
    addresses: Vec<SocketAddr>,
    /// One store per instance, each its own connection.
    stores: Vec<SharedStore>,
    server: RedisServer,
}

/// Two gateway instances, each with its own store connection and
/// CreditGuard, on one Redis; the upstream takes `delay`.
async fn two_instances(delay: Duration) -> Gateways {
    let server = RedisServer::start();
    let mut addresses = Vec::new();
    let mut stores = Vec::new();
    for _ in 0..2 {
        let store: SharedStore = Arc::new(
            RedisStore::connect(
                &server.url(),
                RedisStoreConfig {
                    time_source: TimeSource::Caller,
                    ..RedisStoreConfig::default()
                },
            )
            .await
            .unwrap(),
        );
        let service = ServiceBuilder::new()
            .layer(ErrorMapperLayer::new())
            .layer(BodyLimitLayer::new())
            .layer(BearerAuthLayer::new(KeyDirectory::new(store.clone())))
            .layer(CreditGuardLayer::new(store.clone(), Arc::new(prices())))
            .service(service_fn(move |_: Request<Full<Bytes>>| upstream(delay)));
        addresses.push(serve(service).await);
        stores.push(store);
    }
    stores[0]
        .top_up("default", 10_000 * NANOS_PER_CREDIT)
        .await
        .unwrap();
    Gateways {
        addresses,
        stores,
        server,
    }
}

/// `count` keys of the default account, each limited to `limit` credits:
/// (key, hash).
async fn keys(store: &SharedStore, count: usize, limit: i64) -> Vec<(String, String)> {
    let directory = KeyDirectory::new(store.clone());
    let mut keys = Vec::new();
    for index in 0..count {
        let new = NewKey {
            limit_nanos: Some(limit * NANOS_PER_CREDIT),
            ..NewKey::named(format!("worker {index}"))
        };
        let (key, record) = directory.create_key(new).await.unwrap();
        keys.push((key.expose().to_owned(), record.hash.to_hex()));
    }
    keys
}

/// One chat completion of one credit; the status and body, read to the end.
async fn chat(client: &reqwest::Client, address: SocketAddr, key: &str) -> (u16, Value) {
    let body = json!({"model": "openai/gpt-4o", "max_tokens": 1000, "messages": [{"role": "user", "content": "Hi"}]});
    let response = client
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Counts, through MONITOR, the ledger writes (the calls of the library's
/// `<library>_ledger_write` function) the server runs from now on.
struct LedgerWrites {
    reader: BufReader<TcpStream>,
    port: u16,
}

impl LedgerWrites {
    fn start(server: &RedisServer) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "+OK\r\n");
        LedgerWrites {
            reader,
            port: server.port(),
        }
    }

    /// The ledger writes since the start.
    fn count(mut self) -> usize {
        let marker = "end-of-ledger-writes";
        let mut other = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        other
            .write_all(format!("ECHO {marker}\r\n").as_bytes())
            .unwrap();
        let mut writes = 0;
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            if line.contains(marker) {
                return writes;
            }
            // `+<time> [<db> <addr>] "fcall" "mg_<hash>_ledger_write" …`
            let mut quoted = line.split('"').skip(1).step_by(2);
            let command = quoted.next().unwrap_or_default();
            let function = quoted.next().unwrap_or_default();
            if command.eq_ignore_ascii_case("fcall") && function.ends_with("_ledger_write") {
                writes += 1;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_hold_every_limit_and_record_each_cost_once_in_about_one_write_per_request() {
    // Ten keys of one account, 15 credits each; 20 one-credit requests per
    // key, all at once, alternating between the instances.
    let gateways = two_instances(Duration::from_millis(20)).await;
    let (warm_key, _) = keys(&gateways.stores[0], 1, 1000).await.remove(0);
    let keys = keys(&gateways.stores[0], 10, 15).await;
    let client = reqwest::Client::new();
    // Warm up: each instance's first request, outside the count.
    for address in &gateways.addresses {
        assert_eq!(chat(&client, *address, &warm_key).await.0, 200);
    }
    let warm_hash = KeyHash::of(&warm_key).to_hex();
    settled(
        gateways.stores[0].as_ref(),
        "default",
        &warm_hash,
        Utc::now(),
    )
    .await;
    let before = gateways.stores[0]
        .account_balance("default")
        .await
        .unwrap()
        .balance_nanos;
    let writes = LedgerWrites::start(&gateways.server);
    let replies = join_all((0..200).map(|index| {
        let address = gateways.addresses[index % 2];
        let key = keys[index % 10].0.clone();
        let client = client.clone();
        async move { chat(&client, address, &key).await }
    }))
    .await;
    let admitted = replies.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!(admitted, 150, "exactly 15 of 20 for each key");
    for (status, body) in replies.iter().filter(|(status, _)| *status != 200) {
        assert_eq!(*status, 402);
        assert_eq!(body["error"]["metadata"]["limit_source"], "key_limit");
    }
    for (_, hash) in &keys {
        let usage = settled(gateways.stores[1].as_ref(), "default", hash, Utc::now()).await;
        assert_eq!(
            (usage.total_nanos, usage.reserved_nanos),
            (15 * NANOS_PER_CREDIT, 0),
            "each cost recorded once, every hold released"
        );
    }
    let after = gateways.stores[1]
        .account_balance("default")
        .await
        .unwrap()
        .balance_nanos;
    assert_eq!(before - after, 150 * NANOS_PER_CREDIT);
    let writes = writes.count();
    // Without grouping: 200 reservations and 150 settlements, a call each.
    // With it, a settlement waits while another of its account is on its
    // way, then rides with a reservation or goes with the others waiting:
    // one settlement call per round trip at most while they come in (here
    // about 20 in all), and never fewer writes than reservations.
    assert!(
        (200..=200 + 150 / 2).contains(&writes),
        "{writes} ledger writes for 200 reservations and 150 settlements"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_is_recorded_once_on_either_instance_and_its_hold_keeps_the_limit_meanwhile() {
    // Twelve clients, each with its own 4-credit key, each sending six
    // requests one after the other, alternating between the instances;
    // after each answer the client reads its usage from the other
    // instance's connection. The others keep the account busy, so
    // settlements wait to go with other calls: the answer ends at once,
    // its cost lands just after, and until it does its hold keeps the
    // key's limit exact (the fifth request is refused all the same).
    let gateways = Arc::new(two_instances(Duration::from_millis(5)).await);
    let keys = keys(&gateways.stores[0], 12, 4).await;
    let writes = LedgerWrites::start(&gateways.server);
    let clients = keys.into_iter().enumerate().map(|(worker, (key, hash))| {
        let gateways = Arc::clone(&gateways);
        async move {
            let client = reqwest::Client::new();
            for round in 0..6 {
                let instance = (worker + round) % 2;
                let (status, body) = chat(&client, gateways.addresses[instance], &key).await;
                let usage = settled(
                    gateways.stores[1 - instance].as_ref(),
                    "default",
                    &hash,
                    Utc::now(),
                )
                .await;
                if round < 4 {
                    assert_eq!(status, 200, "{body}");
                    assert_eq!(
                        usage.total_nanos,
                        (round as i64 + 1) * NANOS_PER_CREDIT,
                        "worker {worker}, round {round}: the cost is in, once"
                    );
                    assert_eq!(usage.reserved_nanos, 0);
                } else {
                    assert_eq!(status, 402, "{body}");
                    assert_eq!(usage.total_nanos, 4 * NANOS_PER_CREDIT);
                }
            }
        }
    });
    join_all(clients).await;
    // 72 reservations and 48 settlements: some of them went together.
    let writes = writes.count();
    assert!((72..72 + 48).contains(&writes), "{writes} ledger writes");
}
