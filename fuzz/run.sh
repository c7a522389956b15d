#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 20) with the nightly
# toolchain, installing cargo-fuzz when it is missing. The committed seeds
# in fuzz/seeds/<target> start each run; new inputs go to fuzz/corpus.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-20}"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
for target in $(cargo +nightly fuzz list); do
  mkdir -p "corpus/$target"
  echo "==> fuzzing $target for ${seconds}s"
  cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- -max_total_time="$seconds"
done
