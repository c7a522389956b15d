# What bench/load.sh, bench/soak.sh and bench/instructions.sh share: installing wrk and
# redis-server when missing, the release build, a work directory cleaned
# up on exit, the mock upstream, and proxies with a funded key. Sourced,
# with `upstream_ms` set; sets `bin`, `work` and `upstream`.

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}
# `need COMMAND [PACKAGE]`: installs Debian's PACKAGE (default COMMAND)
# with apt-get when COMMAND is missing.
need() {
  command -v "$1" >/dev/null 2>&1 && return
  echo "==> installing ${2:-$1} (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${2:-$1}" >/dev/null
}
need wrk
need redis-server

echo "==> cargo build --release --examples --features full"
cargo build --release --examples --features full --quiet
bin="${CARGO_TARGET_DIR:-target}/release/examples"

work="$(mktemp -d)"
# Started in subshells too ($(start_proxy …)): their pids go to a file.
cleanup() {
  if [ -f "$work/pids" ]; then
    while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$work/pids"
  fi
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Waits for "prefix ADDR" on a process's stdout file; prints ADDR.
wait_for_line() {
  local file="$1" prefix="$2"
  for _ in $(seq 1 200); do
    if line="$(grep -m1 "^$prefix" "$file" 2>/dev/null)"; then
      echo "${line#"$prefix"}"
      return 0
    fi
    sleep 0.05
  done
  echo "timed out waiting for '$prefix' in $file" >&2
  cat "$file" "${file%.out}.err" >&2 2>/dev/null || true
  return 1
}

mock_port="$(free_port)"
"$bin/mock_upstream" --listen "127.0.0.1:$mock_port" --latency-ms "$upstream_ms" >"$work/mock.out" 2>/dev/null &
echo $! >>"$work/pids"
echo $! >"$work/upstream.pid"
upstream="http://127.0.0.1:$mock_port/v1"

# Limits far above the load: the run measures the layers' cost, not their
# refusals. Generation records are data the store keeps (up to
# `generations.max_per_account`, 100,000 by default, about a kilobyte
# each): the runs cap them at 1,000 so that the memory they report is the
# gateway's own; KEEP_RECORDS=1 keeps the default.
records='"generations": {"max_per_account": 1000},'
[ "${KEEP_RECORDS:-0}" = 1 ] && records=''
cat >"$work/config.json" <<JSON
{"rate_limits": {"account": {"gcra": {"requests": 1000000, "period_seconds": 1, "burst": 1000000}}},
 $records
 "pricing": {"models": {"openai/gpt-4o-mini": {"prompt_per_million": 0.15, "completion_per_million": 0.6}}}}
JSON

# Each proxy makes and prints its own management key. `start_proxy NAME
# ARGS…` prints its URL; its pid is in $work/NAME.pid. PROXY_WORKERS=N
# runs it with `--worker-threads N` (default: one thread per core).
start_proxy() {
  local name="$1"; shift
  local port; port="$(free_port)"
  "$bin/proxy" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --upstream "$upstream" \
    --config "$work/config.json" ${PROXY_WORKERS:+--worker-threads "$PROXY_WORKERS"} "$@" \
    >"$work/$name.out" 2>"$work/$name.err" &
  echo $! >>"$work/pids"
  echo $! >"$work/$name.pid"
  wait_for_line "$work/$name.out" "modelgate listening on " >/dev/null
  echo "http://127.0.0.1:$port"
}

# A wrk script that posts JSON `BODY`, with `KEY` as bearer when not
# empty (`wrk_script KEY BODY`), on stdout.
wrk_script() {
  local key="$1" body="$2"
  cat <<LUA
wrk.method = "POST"
wrk.body = [==[$body]==]
wrk.headers["content-type"] = "application/json"
$( [ -n "$key" ] && echo "wrk.headers[\"authorization\"] = \"Bearer $key\"" )
LUA
}

# A key with credits on a full proxy (`client_key NAME URL`), through its
# management API.
client_key() {
  local name="$1" url="$2"
  local admin
  admin="$(wait_for_line "$work/$name.out" "operator key (shown once): ")"
  local key
  key="$(curl -sf "$url/api/v1/keys" -H "authorization: Bearer $admin" \
    -H 'content-type: application/json' -d '{"name": "load"}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')"
  curl -sf "$url/api/v1/accounts/default/credits" -H "authorization: Bearer $admin" \
    -H 'content-type: application/json' -d '{"amount": 1000000}' >/dev/null
  echo "$key"
}
