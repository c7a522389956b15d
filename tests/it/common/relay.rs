//! A loopback TCP relay between a client and a `redis-server`, which can
//! lose a reply after Redis ran the request, or send a request to Redis a
//! second time, as a dropped connection and a client's resend would; or
//! cut the client off Redis altogether, as Redis going down would, while
//! the test still reads Redis directly.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A relay on a free loopback port to `127.0.0.1:upstream_port`; every
/// connection it accepts gets its own connection to the server.
pub struct Relay {
    port: u16,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Shared {
    /// The request that loses its reply: bytes it contains.
    lose_reply_to: Mutex<Option<Vec<u8>>>,
    /// The request sent twice: bytes it contains.
    send_twice: Mutex<Option<Vec<u8>>>,
    /// Every request forwarded, as read from its client.
    requests: Mutex<Vec<Vec<u8>>>,
    /// All each connection's client sent, in order, by connection.
    sent: Mutex<Vec<Vec<u8>>>,
    lost_replies: AtomicUsize,
    /// What Redis answered to each request the relay sent a second time.
    second_replies: Mutex<Vec<Vec<u8>>>,
    /// Whether clients are cut off: open connections are closed and new
    /// ones closed as soon as they are accepted.
    cut: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    /// Starts relaying to the server on `upstream_port`.
    pub async fn start(upstream_port: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let accepting = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *accepting.cut.borrow() {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                    continue;
                };
                let connection = {
                    let mut sent = accepting.sent.lock().unwrap();
                    sent.push(Vec::new());
                    sent.len() - 1
                };
                tokio::spawn(pump(
                    client,
                    server,
                    upstream_port,
                    accepting.clone(),
                    connection,
                ));
            }
        });
        Relay { port, shared, task }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The next request containing `marker` reaches Redis, which runs it;
    /// its reply is dropped and the client's connection closed.
    pub fn lose_reply_to(&self, marker: &[u8]) {
        *self.shared.lose_reply_to.lock().unwrap() = Some(marker.to_vec());
    }

    /// The next request containing `marker` is also sent to Redis a second
    /// time, on a connection of its own, as a client's resend would be.
    pub fn send_twice(&self, marker: &[u8]) {
        *self.shared.send_twice.lock().unwrap() = Some(marker.to_vec());
    }

    /// How many requests forwarded so far contained `marker`.
    pub fn requests_containing(&self, marker: &[u8]) -> usize {
        self.shared
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|request| contains(request, marker))
            .count()
    }

    /// Cuts every client off Redis, as Redis going down would: the open
    /// connections close, and each new one is closed once accepted, until
    /// [`restore`](Self::restore).
    pub fn cut(&self) {
        self.shared.cut.send_replace(true);
    }

    /// Relays again after [`cut`](Self::cut).
    pub fn restore(&self) {
        self.shared.cut.send_replace(false);
    }

    /// How many times `marker` occurs in what the clients sent so far (each
    /// connection's bytes whole, however they were split into reads).
    pub fn sent_occurrences(&self, marker: &[u8]) -> usize {
        self.shared
            .sent
            .lock()
            .unwrap()
            .iter()
            .map(|sent| {
                sent.windows(marker.len())
                    .filter(|window| *window == marker)
                    .count()
            })
            .sum()
    }

    /// Stops losing a reply or sending a request twice, if still armed.
    pub fn disarm(&self) {
        *self.shared.lose_reply_to.lock().unwrap() = None;
        *self.shared.send_twice.lock().unwrap() = None;
    }

    /// What Redis answered to the requests the relay sent a second time.
    pub fn second_replies(&self) -> Vec<Vec<u8>> {
        self.shared.second_replies.lock().unwrap().clone()
    }

    /// How many replies were dropped.
    pub fn lost_replies(&self) -> usize {
        self.shared.lost_replies.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Takes the armed marker if `request` contains it.
fn take_if_contained(armed: &Mutex<Option<Vec<u8>>>, request: &[u8]) -> bool {
    let mut armed = armed.lock().unwrap();
    if armed
        .as_deref()
        .is_some_and(|marker| contains(request, marker))
    {
        *armed = None;
        true
    } else {
        false
    }
}

async fn pump(
    mut client: TcpStream,
    mut server: TcpStream,
    upstream_port: u16,
    shared: Arc<Shared>,
    connection: usize,
) {
    let mut from_client = vec![0u8; 64 * 1024];
    let mut from_server = vec![0u8; 64 * 1024];
    let mut lose_next_reply = false;
    let mut cut = shared.cut.subscribe();
    loop {
        if *cut.borrow_and_update() {
            return;
        }
        tokio::select! {
            _ = cut.changed() => continue,
            read = client.read(&mut from_client) => {
                let Ok(read @ 1..) = read else { return };
                let request = &from_client[..read];
                shared.requests.lock().unwrap().push(request.to_vec());
                shared.sent.lock().unwrap()[connection].extend_from_slice(request);
                if take_if_contained(&shared.lose_reply_to, request) {
                    lose_next_reply = true;
                }
                let twice = take_if_contained(&shared.send_twice, request);
                if server.write_all(request).await.is_err() {
                    return;
                }
                if twice {
                    let reply = resend(request, upstream_port).await;
                    shared.second_replies.lock().unwrap().push(reply);
                }
            }
            read = server.read(&mut from_server) => {
                let Ok(read @ 1..) = read else { return };
                if lose_next_reply {
                    // Redis ran the request and answered: the client never
                    // hears it; both connections close here.
                    shared.lost_replies.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                if client.write_all(&from_server[..read]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Sends `request` again on a connection of its own and returns Redis's
/// answer (its first bytes).
async fn resend(request: &[u8], upstream_port: u16) -> Vec<u8> {
    let mut again = TcpStream::connect(("127.0.0.1", upstream_port))
        .await
        .unwrap();
    again.write_all(request).await.unwrap();
    let mut reply = [0u8; 4096];
    let read = again.read(&mut reply).await.unwrap();
    reply[..read].to_vec()
}
