//! Real `redis-server` processes on loopback for tests and benchmarks.
//!
//! Every server runs from its own temporary directory with persistence off
//! and is killed when its handle drops. A missing `redis-server` is a test
//! failure that names the command that installs it, never a skip.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

// Its own copy: the benchmarks include this file alone (the tests also
// have it as `common::wait`).
#[allow(clippy::duplicate_mod)]
#[path = "wait.rs"]
mod wait;

use wait::{PATIENCE, wait_for_blocking, wait_until_blocking};

const INSTALL_HINT: &str = "redis-server is not on PATH. Run the README's test command, \
`./scripts/test.sh`, which installs it (apt-get install redis-server) and runs the tests.";

/// One `redis-server` on a loopback port.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers.
    pub fn start() -> Self {
        Self::start_with(Vec::new())
    }

    /// Starts a server with extra `redis-server` arguments
    /// (`["--maxmemory-policy", "allkeys-lru"]`).
    pub fn start_with_args(extra_args: &[&str]) -> Self {
        Self::start_with(extra_args.iter().map(|arg| (*arg).to_owned()).collect())
    }

    fn start_with(extra_args: Vec<String>) -> Self {
        let mut server = RedisServer {
            child: None,
            port: free_port(),
            dir: tempfile::tempdir().expect("temporary directory"),
            extra_args,
        };
        server.spawn();
        server
    }

    /// Starts a server that keeps its data across [`restart`](Self::restart)
    /// (every write in its append-only file before it is answered).
    pub fn start_persistent() -> Self {
        Self::start_with_args(&["--appendonly", "yes", "--appendfsync", "always"])
    }

    /// Starts a stopped server again on the same port.
    pub fn start_again(&mut self) {
        if self.child.is_none() {
            self.spawn();
        }
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's own clock (`TIME`), which decides its windows, hold
    /// expiries and key expiries; read without touching any data.
    pub fn clock(&self) -> chrono::DateTime<chrono::Utc> {
        let reply = command(self.port, "TIME");
        // *2\r\n$10\r\n<seconds>\r\n$6\r\n<micros>\r\n
        let numbers: Vec<i64> = reply
            .split("\r\n")
            .filter(|part| !part.starts_with(['*', '$']) && !part.is_empty())
            .map(|part| {
                part.parse()
                    .unwrap_or_else(|_| panic!("TIME said {reply:?}"))
            })
            .collect();
        let [seconds, micros] = numbers[..] else {
            panic!("TIME said {reply:?}");
        };
        chrono::DateTime::from_timestamp(seconds, u32::try_from(micros * 1000).unwrap())
            .expect("a time Redis can have")
    }

    /// Its data directory (`--dir`): a persistent server keeps its
    /// append-only files in `appendonlydir/` there, read at each start.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server (as a crash would) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server with SIGSTOP, as a hung Redis: connections stay
    /// open (the kernel even accepts new ones) but nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (SIGCONT); it answers what was queued.
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("a running redis-server");
        let status = Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} redis-server failed");
    }

    /// Starts the server again on the same port: unless it was started
    /// persistent, with no data and no functions.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(server_args(self.port, self.dir.path()))
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
            Err(error) => panic!("cannot start redis-server: {error}"),
        };
        self.child = Some(child);
        wait_until_ready(self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn server_args(port: u16, dir: &Path) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--dir",
        &dir.display().to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "yes",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A 3-node Redis Cluster (no replicas) on loopback ports.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them and waits until the
    /// cluster reports `cluster_state:ok` on every node.
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(
                    ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"]
                        .map(str::to_owned)
                        .to_vec(),
                )
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let output = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| panic!("cannot run redis-cli ({error}); {INSTALL_HINT}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        for node in &nodes {
            wait_until_blocking(PATIENCE, "the cluster to become ready", || {
                command(node.port, "CLUSTER INFO").contains("cluster_state:ok")
            });
        }
        RedisCluster { nodes }
    }

    /// `redis://127.0.0.1:PORT/` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The port of every node.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// Makes each node announce `ports[i]` to clients (`cluster-announce-port`,
    /// as behind a relay) and waits until every node's `CLUSTER SLOTS`
    /// names only those; the cluster bus keeps its own ports.
    pub fn announce_ports(&self, ports: &[u16]) {
        for (node, port) in self.nodes.iter().zip(ports) {
            let reply = command(
                node.port,
                &format!("CONFIG SET cluster-announce-port {port}"),
            );
            assert_eq!(reply, "+OK\r\n", "CONFIG SET cluster-announce-port");
        }
        for node in &self.nodes {
            wait_for_blocking(PATIENCE, || {
                let slots = command(node.port, "CLUSTER SLOTS");
                let announced = ports
                    .iter()
                    .all(|port| slots.contains(&format!(":{port}\r\n")));
                let real = self
                    .nodes
                    .iter()
                    .any(|other| slots.contains(&format!(":{}\r\n", other.port)));
                if announced && !real {
                    Ok(())
                } else {
                    Err(format!(
                        "the nodes did not announce their new ports: {slots}"
                    ))
                }
            });
        }
    }
}

/// A port nothing listens on, whose cluster bus port (+10000) is free too.
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn wait_until_ready(port: u16) {
    wait_until_blocking(
        PATIENCE,
        format_args!("redis-server on port {port} to answer PING"),
        || command(port, "PING") == "+PONG\r\n",
    );
}

/// Sends one inline command and returns what arrives within a moment.
fn command(port: u16, line: &str) -> String {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(format!("{line}\r\n").as_bytes()).is_err() {
        return String::new();
    }
    let mut buffer = [0u8; 4096];
    let read = stream.read(&mut buffer).unwrap_or(0);
    String::from_utf8_lossy(&buffer[..read]).into_owned()
}

/// Watches a server with `MONITOR` and returns the commands clients sent,
/// leaving out those a Lua script ran inside the server.
pub struct CommandWatch {
    reader: BufReader<TcpStream>,
    port: u16,
}

impl CommandWatch {
    /// Starts watching the server on `port`.
    pub fn start(port: u16) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "+OK\r\n");
        CommandWatch { reader, port }
    }

    /// The commands clients sent since the start, lower-case names.
    pub fn client_commands(mut self) -> Vec<String> {
        let marker = "end-of-watch-marker";
        let mut other = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        other
            .write_all(format!("ECHO {marker}\r\n").as_bytes())
            .unwrap();
        let mut commands = Vec::new();
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            if line.contains(marker) {
                return commands;
            }
            // `+<time> [<db> lua] "cmd" ...` for script calls, `[<db> <addr>]` for clients.
            if !line.contains(" lua] ") {
                let command = line
                    .split('"')
                    .nth(1)
                    .unwrap_or_default()
                    .to_ascii_lowercase();
                commands.push(command);
            }
        }
    }
}
