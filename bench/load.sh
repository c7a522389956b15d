#!/usr/bin/env bash
# One load, four targets, side by side: the mock upstream alone; the proxy
# with no layer (`--bare true`); the proxy with every layer on the
# in-process store; and on Redis. Prints requests per second, p50 and p99
# latency for each, and the ratios to the no-layer proxy.
#
#   bench/load.sh [SECONDS=10] [CONNECTIONS=32] [THREADS=2] [UPSTREAM_MS=0]
#
# UPSTREAM_MS delays each mock answer: with many connections, many
# requests are then in flight at once (holds, leases) as with a real model.
#
# Installs wrk (Debian's, with apt-get) when missing; builds the examples
# in release mode (in $CARGO_TARGET_DIR when set). Each target's CPU per
# request (from /proc) is printed too: it moves less than throughput when
# the load generator shares the cores. For the Redis run it
# also prints the Redis commands each request cost, from the server's
# `INFO commandstats` around the measured run. Results are printed, not
# committed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
connections="${2:-32}"
threads="${3:-2}"
upstream_ms="${4:-0}"

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}
if ! command -v wrk >/dev/null 2>&1; then
  echo "==> installing wrk (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
if ! command -v redis-server >/dev/null 2>&1; then
  echo "==> installing redis-server (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi

echo "==> cargo build --release --examples"
cargo build --release --examples --quiet
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

redis_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$work" >"$work/redis.out" 2>&1 &
echo $! >>"$work/pids"

# Limits far above the load: the run measures the layers' cost, not their refusals.
cat >"$work/config.json" <<'JSON'
{"rate_limits": {"account": {"gcra": {"requests": 1000000, "period_seconds": 1, "burst": 1000000}}},
 "pricing": {"models": {"openai/gpt-4o-mini": {"prompt_per_million": 0.15, "completion_per_million": 0.6}}}}
JSON

# Each proxy makes and prints its own management key.
start_proxy() {
  local name="$1"; shift
  local port; port="$(free_port)"
  "$bin/proxy" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --upstream "$upstream" \
    --config "$work/config.json" "$@" >"$work/$name.out" 2>"$work/$name.err" &
  echo $! >>"$work/pids"
  echo $! >"$work/$name.pid"
  wait_for_line "$work/$name.out" "modelgate listening on " >/dev/null
  echo "http://127.0.0.1:$port"
}

bare_url="$(start_proxy bare --bare true)"
memory_url="$(start_proxy memory)"
redis_url="$(start_proxy redis --redis "redis://127.0.0.1:$redis_port")"

# A key with credits on each full proxy, through its management API.
client_key() {
  local name="$1" url="$2"
  local admin
  admin="$(wait_for_line "$work/$name.out" "management key (shown once): ")"
  local key
  key="$(curl -sf "$url/api/v1/keys" -H "authorization: Bearer $admin" \
    -H 'content-type: application/json' -d '{"name": "load"}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')"
  curl -sf "$url/api/v1/accounts/default/credits" -H "authorization: Bearer $admin" \
    -H 'content-type: application/json' -d '{"amount": 1000000}' >/dev/null
  echo "$key"
}
memory_key="$(client_key memory "$memory_url")"
redis_key="$(client_key redis "$redis_url")"

body='{"model": "openai/gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello to the load test."}]}'
script() {
  local key="$1"
  cat <<LUA
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["content-type"] = "application/json"
$( [ -n "$key" ] && echo "wrk.headers[\"authorization\"] = \"Bearer $key\"" )
LUA
}

# "TOTAL EVALSHA CPU": the commands Redis has run since it started, all
# but INFO (the snapshots' own); the EVALSHA among them; and the CPU
# seconds Redis has used. Redis counts the commands a script runs as well
# as the script call itself, so TOTAL is the work Redis does; the round
# trips are the EVALSHA (the gateway's other direct commands are not on
# the chat path).
redis_calls() {
  redis-cli -p "$redis_port" INFO all | tr -d '\r' | awk -F'[:=,]' '
    /^cmdstat_/ {
      name = substr($1, 9)
      if (name != "info") total += $3
      if (name == "evalsha") evalsha = $3
    }
    /^used_cpu_(sys|user):/ { cpu += $2 }
    END { printf "%d %d %.6f\n", total, evalsha, cpu }'
}

# CPU seconds (user + system) a process has used, in clock ticks.
cpu_ticks() {
  awk '{print $14 + $15}' "/proc/$1/stat"
}
ticks_per_second="$(getconf CLK_TCK)"

results=()
redis_line=""
# Store round trips per chat request on Redis: the EVALSHA calls (the
# gateway's only store calls on the chat path once the key is cached) over
# a short run at `$1` connections.
round_trips() {
  local clients="$1" before after requests
  sleep 0.5
  before="$(redis_calls)"
  wrk -t 1 -c "$clients" -d 3s -s "$work/redis.lua" "$redis_url/api/v1/chat/completions" >"$work/round_trips.wrk"
  sleep 0.5
  after="$(redis_calls)"
  requests="$(awk '/requests in/ {print $1}' "$work/round_trips.wrk")"
  awk -v b="$before" -v a="$after" -v n="$requests" -v c="$clients" 'BEGIN {
    split(b, x, " "); split(a, y, " ")
    printf "redis: %.2f store round trips per chat request at %d connection(s), over %d requests\n", (y[2] - x[2]) / n, c, n
  }'
}

run() {
  local name="$1" url="$2" key="$3"
  script "$key" >"$work/$name.lua"
  # A short warm-up: pools, caches and JIT-free but cold paths.
  wrk -t "$threads" -c "$connections" -d 2s -s "$work/$name.lua" "$url" >/dev/null
  local before=""
  if [ "$name" = redis ]; then
    # Let the warm-up's last requests settle before the first snapshot.
    sleep 0.5
    before="$(redis_calls)"
  fi
  local pid ticks_before
  pid="$(cat "$work/$name.pid")"
  ticks_before="$(cpu_ticks "$pid")"
  wrk -t "$threads" -c "$connections" -d "${seconds}s" --latency -s "$work/$name.lua" "$url" >"$work/$name.wrk"
  # The process under load's own CPU per request: steadier than requests
  # per second on a machine whose cores the load generator shares.
  local cpu_us
  cpu_us="$(awk -v b="$ticks_before" -v a="$(cpu_ticks "$pid")" -v hz="$ticks_per_second" \
    -v n="$(awk '/requests in/ {print $1}' "$work/$name.wrk")" \
    'BEGIN { printf "%.1fus", 1e6 * (a - b) / hz / n }')"
  if [ -n "$before" ]; then
    # Requests in flight when wrk stops settle a moment later: let them
    # land too (a few dozen requests in thousands, counted in neither).
    sleep 0.5
    local after requests
    after="$(redis_calls)"
    requests="$(awk '/requests in/ {print $1}' "$work/$name.wrk")"
    redis_line="$(awk -v b="$before" -v a="$after" -v n="$requests" 'BEGIN {
      split(b, x, " "); split(a, y, " ")
      printf "redis: %.2f commands per request (evalsha %.2f), those run inside the scripts included; %.1f us of Redis CPU per request; over %d requests", (y[1] - x[1]) / n, (y[2] - x[2]) / n, 1e6 * (y[3] - x[3]) / n, n
    }')"
  fi
  local rps p50 p99 errors
  rps="$(awk '/^Requests\/sec:/ {print $2}' "$work/$name.wrk")"
  p50="$(awk '$1 == "50%" {print $2}' "$work/$name.wrk")"
  p99="$(awk '$1 == "99%" {print $2}' "$work/$name.wrk")"
  errors="$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$work/$name.wrk")"
  results+=("$name $rps $p50 $p99 ${errors:-0} $cpu_us")
}

echo "==> load: ${seconds}s, $connections connections, $threads threads, one chat completion per request, upstream answering after ${upstream_ms} ms"
run upstream "$upstream/chat/completions" ""
run bare "$bare_url/api/v1/chat/completions" ""
run memory "$memory_url/api/v1/chat/completions" "$memory_key"
run redis "$redis_url/api/v1/chat/completions" "$redis_key"

base_rps="$(echo "${results[1]}" | awk '{print $2}')"
printf '\n%-10s %12s %10s %10s %8s %14s %14s\n' target "requests/s" p50 p99 non-2xx "vs no-layer" "CPU/request"
for line in "${results[@]}"; do
  set -- $line
  ratio="$(awk -v a="$2" -v b="$base_rps" 'BEGIN { printf "%.1f%%", 100 * a / b }')"
  printf '%-10s %12s %10s %10s %8s %14s %14s\n' "$1" "$2" "$3" "$4" "$5" "$ratio" "$6"
done
echo "(CPU/request: user + system time of the process under load: the mock for"
echo " upstream, else the proxy; Redis's own is on the line below)"
if [ -n "$redis_line" ]; then
  printf '\n%s\n' "$redis_line"
  round_trips 1
  round_trips "$connections"
fi
