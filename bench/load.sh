#!/usr/bin/env bash
# One load, five targets, side by side: the mock upstream alone; the proxy
# with no layer (`--bare true`); the proxy with every layer on the
# in-process store, on a SQLite file, and on Redis. Each runs twice: a plain JSON chat
# completion, then the same request with `"stream": true` (an event
# stream). Prints requests per second, p50 and p99 latency, CPU per
# request and what the layers add to it over the no-layer proxy, and the
# resident memory of each process after its runs.
#
#   bench/load.sh [SECONDS=10] [CONNECTIONS=32] [THREADS=2] [UPSTREAM_MS=0]
#
# Each figure the project has a target for is printed with it, met or
# not: Redis CPU and commands per chat request (at the connections given),
# what Redis adds at one connection, SQLite's p99 over its p50 (when run
# at one connection, beside the in-process store's, which has no target).
#
# TARGETS narrows the run to some of the five (default all), e.g.
# `TARGETS="memory sqlite" bench/load.sh 10 1 1` for SQLite's tail at one
# connection beside the in-process store; STREAMED=0 skips the streamed
# body. Only the targets named are started.
#
# PROXY_WORKERS=N runs each proxy with `--worker-threads N` (default: one
# thread per core).
#
# UPSTREAM_MS delays each mock answer: with many connections, many
# requests are then in flight at once (holds, leases) as with a real model.
# Usage records are capped as bench/common.sh says (KEEP_RECORDS=1 keeps
# the default of 100,000 per account).
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
targets=" ${TARGETS:-upstream bare memory sqlite redis} "
bodies="plain streamed"
[ "${STREAMED:-1}" = 0 ] && bodies="plain"
wanted() { [[ "$targets" == *" $1 "* ]]; }
# wrk's latency (12.5us, 1.2ms, 1.01s) in microseconds.
micros() {
  awk -v v="$1" 'BEGIN {
    unit = v; sub(/[0-9.]+/, "", unit); sub(/[a-z]+$/, "", v)
    printf "%.0f", v * (unit == "ms" ? 1000 : unit == "s" ? 1000000 : 1)
  }'
}

# shellcheck source=bench/common.sh
. bench/common.sh

if wanted redis; then
  redis_port="$(free_port)"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work" >"$work/redis.out" 2>&1 &
  echo $! >>"$work/pids"
fi

wanted bare && bare_url="$(start_proxy bare --bare true --store memory)"
wanted memory && memory_url="$(start_proxy memory --store memory)"
wanted sqlite && sqlite_url="$(start_proxy sqlite --store "sqlite:$work/modelgate.db")"
wanted redis && redis_url="$(start_proxy redis --redis "redis://127.0.0.1:$redis_port")"

wanted memory && memory_key="$(client_key memory "$memory_url")"
wanted sqlite && sqlite_key="$(client_key sqlite "$sqlite_url")"
wanted redis && redis_key="$(client_key redis "$redis_url")"

plain_body='{"model": "openai/gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello to the load test."}]}'
streamed_body='{"model": "openai/gpt-4o-mini", "max_tokens": 16, "stream": true, "messages": [{"role": "user", "content": "Say hello to the load test."}]}'

# "TOTAL FCALL CPU": the commands Redis has run since it started, all
# but INFO (the snapshots' own); the FCALL among them; and the CPU
# seconds Redis has used. Redis counts the commands a function runs as
# well as the function call itself, so TOTAL is the work Redis does; the
# round trips are the FCALL (the gateway's other direct commands are not
# on the chat path).
redis_calls() {
  redis-cli -p "$redis_port" INFO all | tr -d '\r' | awk -F'[:=,]' '
    /^cmdstat_/ {
      name = substr($1, 9)
      if (name != "info") total += $3
      if (name == "fcall") fcall = $3
    }
    /^used_cpu_(sys|user):/ { cpu += $2 }
    END { printf "%d %d %.6f\n", total, fcall, cpu }'
}

# CPU seconds (user + system) a process has used, in clock ticks.
cpu_ticks() {
  awk '{print $14 + $15}' "/proc/$1/stat"
}
ticks_per_second="$(getconf CLK_TCK)"

results=()
redis_line=""
# Store round trips per chat request on Redis: the FCALL calls (the
# gateway's only store calls on the chat path once the key is cached) over
# a short run at `$1` connections.
round_trips() {
  local clients="$1" before after requests
  sleep 0.5
  before="$(redis_calls)"
  wrk -t 1 -c "$clients" -d 3s -s "$work/redis-plain.lua" "$redis_url/api/v1/chat/completions" >"$work/round_trips.wrk"
  sleep 0.5
  after="$(redis_calls)"
  requests="$(awk '/requests in/ {print $1}' "$work/round_trips.wrk")"
  awk -v b="$before" -v a="$after" -v n="$requests" -v c="$clients" 'BEGIN {
    split(b, x, " "); split(a, y, " ")
    printf "redis: %.2f store round trips per chat request at %d connection(s), over %d requests\n", (y[2] - x[2]) / n, c, n
  }'
}

# Resident memory (VmRSS) of a process, in MiB.
rss_mib() {
  awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"
}

run() {
  local name="$1" url="$2" key="$3" variant="$4"
  local body="$plain_body"
  [ "$variant" = streamed ] && body="$streamed_body"
  wrk_script "$key" "$body" >"$work/$name-$variant.lua"
  # A short warm-up: pools, caches and JIT-free but cold paths.
  wrk -t "$threads" -c "$connections" -d 2s -s "$work/$name-$variant.lua" "$url" >/dev/null
  local before=""
  if [ "$name" = redis ] && [ "$variant" = plain ]; then
    # Let the warm-up's last requests settle before the first snapshot.
    sleep 0.5
    before="$(redis_calls)"
  fi
  local pid ticks_before
  pid="$(cat "$work/$name.pid")"
  ticks_before="$(cpu_ticks "$pid")"
  wrk -t "$threads" -c "$connections" -d "${seconds}s" --latency -s "$work/$name-$variant.lua" "$url" >"$work/$name.wrk"
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
    redis_line="$(awk -v b="$before" -v a="$after" -v n="$requests" -v c="$connections" 'BEGIN {
      split(b, x, " "); split(a, y, " ")
      commands = (y[1] - x[1]) / n; cpu = 1e6 * (y[3] - x[3]) / n
      printf "redis: %.2f commands per request (fcall %.2f), those run inside the functions included; %.1f us of Redis CPU per request; over %d requests\n", commands, (y[2] - x[2]) / n, cpu, n
      printf "  target (set at 32 connections; this run %d): <= 25 us of Redis CPU (%s), <= 6 commands (%s)", c, cpu <= 25 ? "met" : "not met", commands <= 6 ? "met" : "not met"
    }')"
  fi
  local rps p50 p99 errors
  rps="$(awk '/^Requests\/sec:/ {print $2}' "$work/$name.wrk")"
  p50="$(awk '$1 == "50%" {print $2}' "$work/$name.wrk")"
  p99="$(awk '$1 == "99%" {print $2}' "$work/$name.wrk")"
  errors="$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$work/$name.wrk")"
  results+=("$variant $name $rps $p50 $p99 ${errors:-0} $cpu_us $(rss_mib "$pid")")
}

echo "==> load: ${seconds}s, $connections connections, $threads threads, one chat completion per request, upstream answering after ${upstream_ms} ms, proxy on ${PROXY_WORKERS:-one per core} worker thread(s)"
for variant in $bodies; do
  wanted upstream && run upstream "$upstream/chat/completions" "" "$variant"
  wanted bare && run bare "$bare_url/api/v1/chat/completions" "" "$variant"
  wanted memory && run memory "$memory_url/api/v1/chat/completions" "$memory_key" "$variant"
  wanted sqlite && run sqlite "$sqlite_url/api/v1/chat/completions" "$sqlite_key" "$variant"
  wanted redis && run redis "$redis_url/api/v1/chat/completions" "$redis_key" "$variant"
done

printf '\n%-9s %-9s %11s %9s %9s %8s %12s %12s %10s %9s\n' body target "requests/s" p50 p99 non-2xx "vs no-layer" CPU/request "CPU added" "RSS MiB"
for line in "${results[@]}"; do
  set -- $line
  variant="$1"
  base_rps=""
  base_cpu=""
  # The bare run of the same body is the baseline of its rows.
  for other in "${results[@]}"; do
    set -- $other
    if [ "$2" = bare ] && [ "$1" = "$variant" ]; then
      base_rps="$3"
      base_cpu="${7%us}"
    fi
  done
  set -- $line
  ratio="-"
  [ -n "$base_rps" ] && ratio="$(awk -v a="$3" -v b="$base_rps" 'BEGIN { printf "%.1f%%", 100 * a / b }')"
  added="-"
  if [ -n "$base_cpu" ] && { [ "$2" = memory ] || [ "$2" = sqlite ] || [ "$2" = redis ]; }; then
    added="$(awk -v a="${7%us}" -v b="$base_cpu" 'BEGIN { printf "%+.1fus", a - b }')"
  fi
  printf '%-9s %-9s %11s %9s %9s %8s %12s %12s %10s %9s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$ratio" "$7" "$added" "$8"
done
# SQLite's tail at one connection: its p99 within 2 ms of its p50. The
# in-process store's own spread, when it ran too, is the share of the
# machine (scheduling, the load generator on the same cores) beside it.
if [ "$connections" = 1 ]; then
  for line in "${results[@]}"; do
    set -- $line
    if [ "$1" = plain ] && { [ "$2" = sqlite ] || [ "$2" = memory ]; }; then
      spread="$(( $(micros "$5") - $(micros "$4") ))"
      if [ "$2" = memory ]; then
        echo "memory at one connection: p99 is ${spread}us above p50 (no target; the machine's share)"
        continue
      fi
      verdict="not met"
      [ "$spread" -le 2000 ] && verdict="met"
      echo "sqlite at one connection: p99 is ${spread}us above p50; target <= 2000us ($verdict)"
    fi
  done
fi
echo "(CPU/request: user + system time of the process under load: the mock for"
echo " upstream, else the proxy; CPU added: over the no-layer proxy with the"
echo " same body; RSS: the process's resident memory after that run; Redis's"
echo " own CPU is on the line below)"
# At one connection, what Redis adds to a request's latency over the
# in-process store, against one Redis round trip (a PING, as
# redis-benchmark times it from this machine).
one_connection_p50_us() {
  local url="$1" key="$2"
  wrk_script "$key" "$plain_body" >"$work/one.lua"
  wrk -t 1 -c 1 -d 1s -s "$work/one.lua" "$url" >/dev/null
  wrk -t 1 -c 1 -d 5s --latency -s "$work/one.lua" "$url" >"$work/one.wrk"
  micros "$(awk '$1 == "50%" {print $2}' "$work/one.wrk")"
}
latency_line() {
  local memory_p50 redis_p50 ping_p50
  memory_p50="$(one_connection_p50_us "$memory_url/api/v1/chat/completions" "$memory_key")"
  redis_p50="$(one_connection_p50_us "$redis_url/api/v1/chat/completions" "$redis_key")"
  ping_p50="$(redis-benchmark -p "$redis_port" -t ping -c 1 -n 20000 --csv 2>/dev/null |
    awk -F'"' '/PING_MBULK/ { printf "%.0f", $10 * 1000 }')"
  printf 'one connection: p50 %sus on memory, %sus on redis: Redis adds %sus; one Redis round trip (PING p50) is %sus\n' \
    "$memory_p50" "$redis_p50" "$((redis_p50 - memory_p50))" "$ping_p50"
  local verdict="not met"
  [ "$((redis_p50 - memory_p50))" -le "$((4 * ping_p50))" ] && verdict="met"
  printf '  target: Redis adds <= 4 PINGs (%sus) of p50 (%s)\n' "$((4 * ping_p50))" "$verdict"
}

if [ -n "$redis_line" ]; then
  printf '\n%s\n' "$redis_line"
  round_trips 1
  round_trips "$connections"
  # Against the in-process store: only when it ran too.
  if [ -n "${memory_url:-}" ]; then
    latency_line
  else
    echo "one connection: not measured (add memory to TARGETS)"
  fi
fi
