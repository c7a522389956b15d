#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 20) with the nightly
# toolchain, installing cargo-fuzz when it is missing. All targets are
# built once, in one profile (`cargo fuzz build`: release with debug
# assertions and coverage tracing; no sanitizer, since the crate forbids
# unsafe code and AddressSanitizer would double the build and slow each
# run; eight codegen units instead of one, so both cores compile; and
# opt-level 1, FUZZ_OPT_LEVEL to change it: these runs last seconds, so
# the build is most of their cost), then run from that build, FUZZ_JOBS
# at a time (default: the cores). The committed seeds in
# fuzz/seeds/<target> start each run; new inputs go to fuzz/corpus.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-20}"
jobs="${FUZZ_JOBS:-$(nproc)}"
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "==> installing the nightly toolchain (rustup)"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
echo "==> building every fuzz target"
CARGO_PROFILE_RELEASE_OPT_LEVEL="${FUZZ_OPT_LEVEL:-1}" \
  cargo +nightly fuzz build --sanitizer none --codegen-units 8
triple="$(rustc +nightly -vV | sed -n 's/^host: //p')"
built="target/$triple/release"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

# One target: its run's last lines on failure (a crash leaves its input in
# artifacts/<target>, kept for a regression test), its figures otherwise.
fuzz_one() {
  local target="$1"
  mkdir -p "corpus/$target" "artifacts/$target"
  if "$built/$target" "corpus/$target" "seeds/$target" \
    -artifact_prefix="artifacts/$target/" -max_total_time="$seconds" \
    -print_final_stats=1 >"$logs/$target" 2>&1; then
    echo "==> $target: $(grep -E '^stat::(number_of_executed_units|new_units_added)' "$logs/$target" | tr '\n' ' ')"
  else
    tail -n 60 "$logs/$target" >&2
    echo "fuzz target $target failed: see above and fuzz/artifacts/$target" >&2
    return 1
  fi
}
export -f fuzz_one
export built seconds logs
echo "==> fuzzing each target for ${seconds}s, $jobs at a time"
cargo +nightly fuzz list | xargs -P "$jobs" -I{} bash -c 'fuzz_one "$1"' _ {}
