//! The example binaries, which some tests run as processes.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The path of the example `name`, built first if it may be out of date:
/// `cargo test` alone builds the library and the tests, not the examples
/// these tests run as processes. An example newer than this test binary
/// was built from the same library (`scripts/test.sh` builds the examples
/// after the tests), so no `cargo` is run then: under nextest every test
/// is a process of its own, and each would wait on cargo's lock.
///
/// An example older than the test binary may still be fresh (cargo links
/// an example again only when the library changed, a test binary whenever
/// a test did): the first test to find it so runs cargo, and leaves a stamp
/// saying the examples were checked after this test binary was built, so
/// that the tests after it (each a process under nextest) do not.
pub fn binary(name: &str) -> PathBuf {
    let this_test = std::env::current_exe().expect("the test's own path");
    let profile_dir = this_test
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let binary = profile_dir.join("examples").join(name);
    let stamp = profile_dir
        .join("examples")
        .join(".checked-after-the-tests");
    static BUILT: OnceLock<()> = OnceLock::new();
    if !newer_than(&binary, &this_test) && !newer_than(&stamp, &this_test) {
        BUILT.get_or_init(|| {
            build_examples(profile_dir);
            // Written after cargo answered: newer than this test binary.
            let _ = std::fs::write(&stamp, "");
        });
    }
    assert!(
        binary.exists(),
        "{} is missing after `cargo build --examples`",
        binary.display()
    );
    binary
}

/// Whether `path` exists and was written after `than`.
fn newer_than(path: &Path, than: &Path) -> bool {
    let modified = |path: &Path| {
        std::fs::metadata(path)
            .and_then(|meta| meta.modified())
            .ok()
    };
    matches!((modified(path), modified(than)), (Some(path), Some(than)) if path > than)
}

/// `cargo build --examples` into the tests' own target directory and
/// profile, with the features the tests were built with. Cheap when the
/// examples are fresh; several test binaries at once wait on cargo's lock.
fn build_examples(profile_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command
        .args(["build", "--examples", "--quiet"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if let Some(target_dir) = profile_dir.parent() {
        command.env("CARGO_TARGET_DIR", target_dir);
    }
    // What cargo told this test about its own package is no setting for
    // the build: build scripts (ring's, among others) ask cargo to build
    // again when such a variable changes, so a cargo run with them would
    // compile ring, rustls and the crate again here, and the next plain
    // `cargo build` again back (about 40 s each time, under the lock every
    // other test waits on).
    for (variable, _) in std::env::vars_os() {
        let Some(name) = variable.to_str() else {
            continue;
        };
        let set_for_the_test = ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_", "CARGO_CFG_"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
            || [
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&name);
        if set_for_the_test {
            command.env_remove(&variable);
        }
    }
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        command.arg("--release");
    }
    // The features this test was built with, so that the examples link
    // against the same library build.
    let features: Vec<&str> = [
        ("redis", cfg!(feature = "redis")),
        ("sqlite", cfg!(feature = "sqlite")),
        ("proxy", cfg!(feature = "proxy")),
        ("flows", cfg!(feature = "flows")),
        ("leaks", cfg!(feature = "leaks")),
        ("notify", cfg!(feature = "notify")),
        ("oauth", cfg!(feature = "oauth")),
        ("settings", cfg!(feature = "settings")),
        ("apps", cfg!(feature = "apps")),
        ("csv", cfg!(feature = "csv")),
        ("http-client", cfg!(feature = "http-client")),
        ("otel", cfg!(feature = "otel")),
        ("axum", cfg!(feature = "axum")),
        ("full", cfg!(feature = "full")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
    let status = command
        .status()
        .expect("cargo runs (the CARGO variable names it under `cargo test`)");
    assert!(
        status.success(),
        "`cargo build --examples` failed: {status}"
    );
}

/// The proxy example running as a process, killed when dropped.
pub struct ProxyProcess {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`, as it printed.
    pub address: String,
    /// Where `/metrics`, `/healthz` and `/readyz` are, as it printed.
    pub admin: String,
}

/// A proxy started with [`ProxyProcess::spawn_watched`], and what it said.
pub struct WatchedProxy {
    /// The running proxy.
    pub proxy: ProxyProcess,
    /// What it printed on stdout before its address (a key shown once).
    pub printed_before: Vec<String>,
    /// Its stderr (the log) so far, read as it comes.
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl WatchedProxy {
    /// Waits until the log holds `text`; the log.
    pub fn wait_for_log(&self, text: &str) -> String {
        super::wait::wait_for_blocking(super::wait::PATIENCE, || {
            let log = self.log();
            if log.contains(text) {
                Ok(log)
            } else {
                Err(format!("the log never said {text:?}: {log}"))
            }
        })
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl std::ops::Deref for WatchedProxy {
    type Target = ProxyProcess;

    fn deref(&self) -> &ProxyProcess {
        &self.proxy
    }
}

impl std::ops::DerefMut for WatchedProxy {
    fn deref_mut(&mut self) -> &mut ProxyProcess {
        &mut self.proxy
    }
}

impl ProxyProcess {
    /// Runs `command` (the proxy, or a wrapper such as `faketime` running
    /// it) with its output piped, and waits for the address it prints.
    pub fn spawn(command: std::process::Command) -> ProxyProcess {
        Self::start(command, false).proxy
    }

    /// [`spawn`](Self::spawn), keeping what the proxy prints before its
    /// address and its log.
    pub fn spawn_watched(command: std::process::Command) -> WatchedProxy {
        Self::start(command, true)
    }

    fn start(mut command: std::process::Command, watched: bool) -> WatchedProxy {
        use std::io::{BufRead, BufReader, Read};
        use std::os::unix::process::CommandExt;
        // A test that names no store keeps its state in memory, as it did
        // before the proxy's default became a file in its working directory
        // (a test that gives it a directory gets that default).
        let names_a_store = command
            .get_args()
            .any(|argument| argument == "--store" || argument == "--redis");
        if !names_a_store && command.get_current_dir().is_none() {
            command.args(["--store", "memory"]);
        }
        // Its own process group, so that dropping it also ends what a
        // wrapper (faketime forks the proxy) started.
        command.process_group(0);
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Kept whole for a watched proxy; otherwise its last 64 KiB, to say
        // why a proxy that ended before listening did.
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut reader = None;
        if let Some(mut pipe) = child.stderr.take() {
            let stderr = stderr.clone();
            reader = Some(std::thread::spawn(move || {
                let mut buffer = [0; 4096];
                while let Ok(read @ 1..) = pipe.read(&mut buffer) {
                    let mut kept = stderr.lock().unwrap();
                    kept.push_str(&String::from_utf8_lossy(&buffer[..read]));
                    if !watched && kept.len() > 64 * 1024 {
                        let cut = kept.len() - 32 * 1024;
                        let cut = (cut..kept.len())
                            .find(|&at| kept.is_char_boundary(at))
                            .unwrap_or(kept.len());
                        kept.drain(..cut);
                    }
                }
            }));
        }
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next_line = |child: &mut std::process::Child| match lines.next() {
            Some(line) => line.unwrap(),
            None => {
                let status = child.wait().unwrap();
                // The reader thread has the last of it once the pipe closes
                // (a process the proxy started may still hold it open).
                if let Some(reader) = &reader {
                    super::wait::waited_blocking(std::time::Duration::from_secs(5), || {
                        reader.is_finished()
                    });
                }
                panic!(
                    "the proxy ended ({status}) before it printed its address; its stderr:\n{}",
                    stderr.lock().unwrap()
                )
            }
        };
        let mut printed_before = Vec::new();
        let mut first = next_line(&mut child);
        while watched && !first.starts_with("modelgate listening on ") {
            printed_before.push(first);
            first = next_line(&mut child);
        }
        let address = first
            .strip_prefix("modelgate listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_owned();
        let second = next_line(&mut child);
        let admin = second
            .strip_prefix("admin (metrics, healthz, readyz) on ")
            .unwrap_or_else(|| panic!("unexpected second line: {second}"))
            .to_owned();
        // Drained as it comes: a full pipe would stall the proxy.
        std::thread::spawn(move || for _ in lines {});
        WatchedProxy {
            proxy: ProxyProcess {
                child,
                address,
                admin,
            },
            printed_before,
            stderr,
        }
    }

    /// A new key named `name`, made through the management API with
    /// `admin_key`; its plaintext.
    pub async fn create_key(&self, admin_key: &str, name: &str) -> String {
        let created: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/api/v1/keys", self.address))
            .bearer_auth(admin_key)
            .json(&serde_json::json!({ "name": name }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        created["key"].as_str().unwrap().to_owned()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM, as an orchestrator stopping it would.
    pub fn terminate(&self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit by itself; its exit code.
    pub fn wait(&mut self, bound: std::time::Duration) -> Option<i32> {
        super::wait::wait_for_blocking(bound, || match self.child.try_wait().unwrap() {
            Some(status) => Ok(status.code()),
            None => Err("the proxy did not exit".to_owned()),
        })
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
