#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 20) with the nightly
# toolchain, installing cargo-fuzz when it is missing. The committed seeds
# in fuzz/seeds/<target> start each run; new inputs go to fuzz/corpus.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-20}"
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "==> installing the nightly toolchain (rustup)"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for target in $(cargo +nightly fuzz list); do
  mkdir -p "corpus/$target"
  echo "==> fuzzing $target for ${seconds}s"
  if ! cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
    # A crash leaves its input in artifacts/<target>: kept for a regression test.
    tail -n 60 "$log" >&2
    echo "fuzz target $target failed (a crash or a build error): see above and fuzz/artifacts/$target" >&2
    exit 1
  fi
  grep -E "^stat::(number_of_executed_units|new_units_added)" "$log" || true
done
