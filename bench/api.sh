#!/usr/bin/env bash
# What a management call costs when the store is full of other callers'
# data, on a SQLite file and on Redis: p50 and p99 latency of
#   1. GET /api/v1/generations?limit=100 by the account's manager, with
#      RECORDS generation records in the account, and the same page of one
#      key's records by that key (which shares the account with the rest);
#   2. GET /api/v1/keys by an account manager, with KEYS keys of other
#      accounts in the store;
#   3. another tenant's GET /api/v1/credits, alone and while 8 clients scan
#      their generation records by model: as fast as they can (the
#      management rate lifted, as for 1 and 2), then with the default
#      management rate (the proxy restarted on the same store; the tenant's
#      calls paced within it).
# A key's first page after an upgrade (older records put in their keys'
# orders) is timed apart.
# The targets (issue 48): each p99 at most 5 ms on this machine.
#
#   [STORES="sqlite redis"] bench/api.sh [RECORDS=100000] [KEYS=50000] [SECONDS=10]
#
# The store is filled through the proxy's own API with wrk (chat requests
# for the records, key creations for the keys), so the data is what the
# gateway writes. Installs wrk and redis-server when missing; builds the
# examples in release mode. Results are printed, not committed.
set -euo pipefail
cd "$(dirname "$0")/.."
record_count="${1:-100000}"
key_count="${2:-50000}"
seconds="${3:-10}"
upstream_ms=0

# shellcheck source=bench/common.sh
. bench/common.sh

# Limits far above the load, records kept as the default keeps them.
cat >"$work/config.json" <<JSON
{"rate_limits": {"account": {"gcra": {"requests": 1000000, "period_seconds": 1, "burst": 1000000}}},
 "management_rate": {"gcra": {"requests": 1000000, "period_seconds": 1, "burst": 1000000}},
 "generations": {"max_per_account": $record_count},
 "pricing": {"models": {"openai/gpt-4o-mini": {"prompt_per_million": 0.15, "completion_per_million": 0.6}}}}
JSON

redis_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$work" >"$work/redis.out" 2>&1 &
echo $! >>"$work/pids"

# `api NAME URL ADMIN METHOD PATH [BODY]`: the answer's body.
api() {
  local url="$2" admin="$3" method="$4" path="$5" body="${6:-}"
  if [ -n "$body" ]; then
    curl -sf -X "$method" "$url$path" -H "authorization: Bearer $admin" \
      -H 'content-type: application/json' -d "$body"
  else
    curl -sf -X "$method" "$url$path" -H "authorization: Bearer $admin"
  fi
}
json_field() {
  python3 -c "import json,sys; print(json.load(sys.stdin)$1)"
}

# `wrk_get URL KEY PATH CONNECTIONS`: "p50 p99" in ms over SECONDS.
wrk_get() {
  local url="$1" key="$2" path="$3" connections="$4"
  cat >"$work/get.lua" <<LUA
wrk.headers["authorization"] = "Bearer $key"
LUA
  if ! wrk -t 1 -c "$connections" -d "${seconds}s" --latency -s "$work/get.lua" "$url$path" |
    python3 -c '
import re, sys
text = sys.stdin.read()
def ms(label):
    match = re.search(r"^\s*" + label + r"%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    value, unit = float(match.group(1)), match.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
if non2xx:
    sys.exit("refused: " + non2xx.group(1) + " answers were not 2xx")
print("%.2f %.2f" % (ms("50"), ms("99")))'; then
    echo "GET $path answered:" >&2
    for _ in 1 2 3; do
      curl -s -w ' (%{http_code})' -H "authorization: Bearer $key" "$url$path" | tail -c 600 >&2
      echo >&2
    done
    return 1
  fi
}

# `paced_get URL KEY PATH`: "p50 p99" in ms of 400 calls, 8 a second (a
# tenant within the default management rate of 10 a second), on one
# kept-alive connection as an SDK makes them.
paced_get() {
  python3 - "$1" "$2" "$3" <<'PY'
import http.client, sys, time, urllib.parse
url, key, path = sys.argv[1:4]
address = urllib.parse.urlsplit(url)
connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
times, refused = [], 0
start = time.monotonic()
for call in range(400):
    # Paced from the start, so a slow answer does not shift the rest.
    time.sleep(max(0.0, start + call * 0.125 - time.monotonic()))
    began = time.perf_counter()
    connection.request("GET", path, headers={"authorization": "Bearer " + key})
    response = connection.getresponse()
    response.read()
    times.append((time.perf_counter() - began) * 1000)
    if response.status // 100 != 2:
        refused += 1
if refused:
    sys.exit("refused: %d answers were not 2xx" % refused)
times.sort()
print("%.2f %.2f" % (times[len(times) // 2], times[int(len(times) * 0.99)]))
PY
}

# `fill_records URL KEY`: chat requests until RECORDS were answered.
fill_records() {
  local url="$1" key="$2" done=0
  wrk_script "$key" '{"model": "openai/gpt-4o-mini", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}' \
    >"$work/chat.lua"
  while [ "$done" -lt "$record_count" ]; do
    local out
    out="$(wrk -t 2 -c 32 -d 10s -s "$work/chat.lua" "$url/api/v1/chat/completions")"
    if grep -q "Non-2xx" <<<"$out"; then
      echo "$out" >&2
      echo "the fill was refused" >&2
      exit 1
    fi
    done=$((done + $(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' <<<"$out")))
  done
  echo "$done"
}

# `fill_keys URL ADMIN`: KEYS keys spread over 100 other accounts.
fill_keys() {
  local url="$1" admin="$2"
  for n in $(seq 0 99); do
    api x "$url" "$admin" POST /api/v1/accounts "{\"id\": \"other-$n\"}" >/dev/null
  done
  cat >"$work/keys.lua" <<LUA
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = "Bearer $admin"
local made = 0
request = function()
  made = made + 1
  local body = '{"name": "k' .. made .. '", "account": "other-' .. (made % 100) .. '"}'
  return wrk.format(nil, nil, nil, body)
end
LUA
  local done=0
  while [ "$done" -lt "$key_count" ]; do
    local out
    out="$(wrk -t 1 -c 8 -d 5s -s "$work/keys.lua" "$url/api/v1/keys")"
    if grep -q "Non-2xx" <<<"$out"; then
      echo "$out" >&2
      echo "the key creations were refused" >&2
      exit 1
    fi
    done=$((done + $(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' <<<"$out")))
  done
  echo "$done"
}

run() {
  local name="$1"; shift
  local url
  url="$(start_proxy "$name" "$@")"
  local admin
  admin="$(wait_for_line "$work/$name.out" "operator key (shown once): ")"
  # The busy account and its keys; a quiet tenant beside it.
  api x "$url" "$admin" POST /api/v1/accounts '{"id": "busy"}' >/dev/null
  api x "$url" "$admin" POST /api/v1/accounts '{"id": "quiet"}' >/dev/null
  api x "$url" "$admin" POST /api/v1/accounts/busy/credits '{"amount": 1000000}' >/dev/null
  local client manager neighbour lone
  client="$(api x "$url" "$admin" POST /api/v1/keys '{"name": "client", "account": "busy"}' | json_field '["key"]')"
  lone="$(api x "$url" "$admin" POST /api/v1/keys '{"name": "lone", "account": "busy"}' | json_field '["key"]')"
  manager="$(api x "$url" "$admin" POST /api/v1/keys '{"name": "m", "account": "busy", "management": true}' | json_field '["key"]')"
  neighbour="$(api x "$url" "$admin" POST /api/v1/keys '{"name": "n", "account": "quiet", "management": true}' | json_field '["key"]')"
  # The lone key's few records, then the client's many after them.
  cat >"$work/lone.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model": "openai/gpt-4o-mini", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}'
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = "Bearer $lone"
LUA
  wrk -t 1 -c 1 -d 1s -s "$work/lone.lua" "$url/api/v1/chat/completions" >/dev/null
  echo "==> $name: filling $record_count records and $key_count keys"
  local made_records made_keys
  made_records="$(fill_records "$url" "$client")"
  made_keys="$(fill_keys "$url" "$admin")"
  echo "    $made_records chat requests answered, $made_keys keys made"
  local page own keys_page alone scanned throttled first_key_page
  # A key's first page after an upgrade puts the account's older records
  # in their keys' orders (on Redis, a thousand a call): timed apart.
  first_key_page="$(curl -s -o /dev/null -w '%{time_total}' -H "authorization: Bearer $lone" \
    "$url/api/v1/generations?limit=100")"
  page="$(wrk_get "$url" "$manager" "/api/v1/generations?limit=100" 1)"
  own="$(wrk_get "$url" "$lone" "/api/v1/generations?limit=100" 1)"
  keys_page="$(wrk_get "$url" "$manager" "/api/v1/keys" 1)"
  alone="$(wrk_get "$url" "$neighbour" "/api/v1/credits" 1)"
  # Eight scanners, and the neighbour measured meanwhile.
  cat >"$work/scan.lua" <<LUA
wrk.headers["authorization"] = "Bearer $client"
LUA
  wrk -t 1 -c 8 -d "$((seconds + 2))s" -s "$work/scan.lua" \
    "$url/api/v1/generations?limit=100&model=openai/gpt-4o-mini" >"$work/scan.out" &
  local scanner=$!
  sleep 1
  scanned="$(wrk_get "$url" "$neighbour" "/api/v1/credits" 1)"
  wait "$scanner"
  local scans
  scans="$(sed -n 's/^Requests\/sec: *//p' "$work/scan.out")"
  # Again with the default management rate, which holds a tenant's scans
  # to its allowance (10 a second, bursts of 60): the same store, restarted.
  kill "$(cat "$work/$name.pid")" 2>/dev/null || true
  cp "$work/config.json" "$work/config.lifted.json"
  python3 - "$work/config.json" <<'PY'
import json, sys
path = sys.argv[1]
config = json.load(open(path))
del config["management_rate"]
json.dump(config, open(path, "w"))
PY
  url="$(start_proxy "$name-rated" "$@")"
  wrk -t 1 -c 8 -d 54s -s "$work/scan.lua" \
    "$url/api/v1/generations?limit=100&model=openai/gpt-4o-mini" >"$work/scan.out" &
  scanner=$!
  sleep 1
  throttled="$(paced_get "$url" "$neighbour" "/api/v1/credits")"
  wait "$scanner"
  mv "$work/config.lifted.json" "$work/config.json"
  printf '    %-58s %8s %8s\n' "call (p50, p99 in ms)" p50 p99
  printf '    %-58s %8s %8s\n' "generations?limit=100, manager, $record_count in the account" $page
  printf '    %-58s %8s %8s\n' "generations?limit=100, a key behind $record_count of another" $own
  printf '    %-58s %8s %8s\n' "keys, manager, $key_count keys of other accounts" $keys_page
  printf '    %-58s %8s %8s\n' "another tenant's credits, alone" $alone
  printf '    %-58s %8s %8s\n' "another tenant's credits, 8 clients scanning unthrottled" $scanned
  printf '    %-58s %8s %8s\n' "another tenant's credits, 8 scanning at the default rate" $throttled
  echo "    (unthrottled, the 8 scanners ran $scans filtered scans a second;"
  echo "     a key's first page after the upgrade took ${first_key_page}s)"
  kill "$(cat "$work/$name-rated.pid")" 2>/dev/null || true
}

# STORES picks the runs (default both).
for store in ${STORES:-sqlite redis}; do
  case "$store" in
    sqlite) run sqlite --store "sqlite:$work/modelgate.db" ;;
    redis) run redis --redis "redis://127.0.0.1:$redis_port" ;;
  esac
done
