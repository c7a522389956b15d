#!/usr/bin/env bash
# Resident memory of the proxy with every layer on the in-process store
# (or, with STORE=sqlite, on a SQLite file of its own; with STORE=redis, on
# a Redis of its own, whose memory is sampled too) over a long run at a fixed rate: does anything grow without bound
# (settlement markers, holds, caches, metrics)?
#
#   bench/soak.sh [MINUTES=10] [REQUESTS_PER_SECOND=500] [CONNECTIONS=64]
#
# Samples VmRSS every 30 s and prints the series, then the growth over the
# second half of the run (after the first half has filled what is bounded
# by time or count). Generation records are capped as bench/common.sh
# says (KEEP_RECORDS=1 keeps the default).
# RESERVATION_TTL_SECONDS (default: the proxy's 60) sets the hold's
# lifetime without renewal.
# Installs and builds as bench/load.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-10}"
rate="${2:-500}"
connections="${3:-64}"
upstream_ms=0

# shellcheck source=bench/common.sh
. bench/common.sh

if [ -n "${RESERVATION_TTL_SECONDS:-}" ]; then
  python3 - "$work/config.json" "$RESERVATION_TTL_SECONDS" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config.setdefault("credit", {})["reservation_ttl_seconds"] = int(sys.argv[2])
json.dump(config, open(sys.argv[1], "w"))
PY
fi

store="${STORE:-memory}"
redis_port=""
if [ "$store" = redis ]; then
  redis_port="$(free_port)"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work" >"$work/redis.out" 2>&1 &
  echo $! >>"$work/pids"
  url="$(start_proxy redis --redis "redis://127.0.0.1:$redis_port")"
elif [ "$store" = sqlite ]; then
  url="$(start_proxy sqlite --store "sqlite:$work/modelgate.db")"
else
  url="$(start_proxy memory --store memory)"
fi
key="$(client_key "$store" "$url")"
pid="$(cat "$work/$store.pid")"

# Each connection waits connections/rate seconds between requests: the
# rate holds while responses take far less than that.
delay_ms="$(awk -v c="$connections" -v r="$rate" 'BEGIN { printf "%d", 1000 * c / r }')"
cat >"$work/soak.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model": "openai/gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello to the soak test."}]}'
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = "Bearer $key"
function delay() return $delay_ms end
LUA

echo "==> soak ($store): ${minutes} min at about $rate requests/s over $connections connections"
wrk -t 2 -c "$connections" -d "${minutes}m" -s "$work/soak.lua" "$url/api/v1/chat/completions" >"$work/soak.wrk" &
wrk_pid=$!
samples=()
elapsed=0
while kill -0 "$wrk_pid" 2>/dev/null; do
  rss="$(awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status")"
  samples+=("$rss")
  if [ -n "$redis_port" ]; then
    redis_mib="$(redis-cli -p "$redis_port" INFO memory | awk -F: '/^used_memory:/ { printf "%.1f", $2 / 1048576 }')"
    printf '%5ds  RSS %6s MiB  Redis used_memory %6s MiB\n' "$elapsed" "$rss" "$redis_mib"
  else
    printf '%5ds  RSS %6s MiB\n' "$elapsed" "$rss"
  fi
  sleep 30
  elapsed=$((elapsed + 30))
done
wait "$wrk_pid" || true
grep -E 'requests in|Requests/sec|Non-2xx' "$work/soak.wrk" || true
count="${#samples[@]}"
half="${samples[$((count / 2))]}"
last="${samples[$((count - 1))]}"
peak="$(printf '%s\n' "${samples[@]}" | sort -n | tail -1)"
awk -v h="$half" -v l="$last" -v p="$peak" 'BEGIN {
  printf "RSS at half time %.1f MiB, at the end %.1f MiB (%+.1f MiB over the second half), peak %.1f MiB\n", h, l, l - h, p
}'
