#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing
# (redis-server, faketime, chromium, chromium-driver, curl, python3 and sqlite3
# via apt-get,
# rustfmt and clippy via rustup), then checks formatting, lints every target
# as it is built, runs every test against a real redis-server that the tests
# start on loopback ports, and builds the docs.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || missing+=(redis-server)
# Gateway instances with clocks apart (tests/admission.rs) run under libfaketime.
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
# The key settings page is tested in headless Chromium (tests/settings_page.rs).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# The commands of README.md and docs/*.md (tests/docs.rs) run with curl and python3.
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# docs/operating.md's queries of the proxy's file run with the sqlite3 command line.
command -v sqlite3 >/dev/null 2>&1 || missing+=(sqlite3)
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing ${missing[*]} (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
redis-server --version

# The real clients the tests drive (tests/it/clients.rs): the OpenAI and
# Anthropic Python SDKs, Claude Code and Codex, at pinned versions.
./scripts/clients.sh
export MODELGATE_CLIENTS_DIR="$PWD/target/clients"
# The docs' Python blocks run with the clients' venv (its `openai`).
export PATH="$MODELGATE_CLIENTS_DIR/venv/bin:$PATH"

if command -v rustup >/dev/null 2>&1; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "==> installing cargo-nextest"
  cargo install cargo-nextest --locked
fi

# faketime names its shared memory and semaphore after its process id and
# leaves them behind when that process is killed (the tests kill -9
# proxies under faketime); a later faketime with the same id then fails
# with "sem_open: File exists". Those of processes gone are removed.
for stale in /dev/shm/faketime_shm_* /dev/shm/sem.faketime_sem_*; do
  [ -e "$stale" ] || continue
  pid="${stale##*_}"
  kill -0 "$pid" 2>/dev/null || rm -f "$stale"
done

echo "==> cargo fmt --check"
cargo fmt --all -- --check

# Clippy lints the crate while it is compiled for the tests, instead of in a
# check build of its own: `cargo clippy` is `cargo check` with
# clippy-driver wrapping rustc for this package's crates, and that driver
# compiles as rustc does. So every dependency is compiled once, for the
# tests, and every target of the package (the library, its unit tests, the
# integration tests, the benchmarks, the examples; with and without the
# default features) is linted as it is built, warnings denied.
CLIPPY_DRIVER="$(rustc --print sysroot)/bin/clippy-driver"
[ -x "$CLIPPY_DRIVER" ] || CLIPPY_DRIVER="$(command -v clippy-driver || true)"
if [ ! -x "$CLIPPY_DRIVER" ]; then
  echo "clippy-driver is missing: rustup component add clippy" >&2
  exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$CLIPPY_DRIVER"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

echo "==> build and lint the tests and benchmarks, then the examples the tests run as processes (every feature)"
cargo test --lib --tests --benches --no-run --all-features --locked
cargo build --examples --all-features --locked
echo "==> cargo nextest run (unit and integration tests, and each benchmark once as a test)"
cargo nextest run --lib --tests --benches --all-features --locked
echo "==> cargo test --doc"
cargo test --doc --all-features --locked
echo "==> the default features (the layers alone) bring no HTTP client, store backend, CSV, URL or mail crate"
if cargo tree --edges normal --prefix none --locked \
  | grep -E '^(redis|rusqlite|lettre|p256|hyper|hyper-util|hyper-rustls|h2|csv|url|idna) '; then
  echo "a crate above is built without any feature asking for it" >&2
  exit 1
fi
echo "==> the layers alone (the default features), linted and tested on the in-process store"
cargo build --examples --locked
cargo nextest run --lib --tests --benches --locked
echo "==> cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features --locked
