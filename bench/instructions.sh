#!/usr/bin/env bash
# Instructions per request, counted by valgrind's callgrind: the no-layer
# proxy (`--bare true`) and every layer on the in-process store, each with
# a plain and a streamed chat completion. Unlike CPU time on a shared
# machine, the count barely moves from run to run, so it shows what a
# change to the layers costs or saves (a few thousand instructions) where
# bench/load.sh's CPU per request cannot.
#
#   bench/instructions.sh [SECONDS=5]
#
# BODY_FILE=PATH sends that file's JSON as the plain request instead of a
# one-message chat (a large conversation shows what the body's size
# costs); the streamed request stays the small one.
#
# Each proxy runs under callgrind; after a warm-up its counters are zeroed,
# wrk sends requests on 4 connections for SECONDS, and the counters are
# dumped. Keeps the dumps (callgrind_annotate reads them) when KEEP=DIR is
# set. Installs valgrind (Debian's, with apt-get) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
upstream_ms=0

# shellcheck source=bench/common.sh
. bench/common.sh
need valgrind

plain_body='{"model": "openai/gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello to the load test."}]}'
[ -n "${BODY_FILE:-}" ] && plain_body="$(cat "$BODY_FILE")"
streamed_body='{"model": "openai/gpt-4o-mini", "max_tokens": 16, "stream": true, "messages": [{"role": "user", "content": "Say hello to the load test."}]}'

# `measure NAME VARIANT PROXY-ARGS…`: prints the instructions per request.
measure() {
  local name="$1" variant="$2"; shift 2
  local body="$plain_body"
  [ "$variant" = streamed ] && body="$streamed_body"
  local port; port="$(free_port)"
  local out="$work/$name-$variant"
  valgrind --tool=callgrind --callgrind-out-file="$out.cg" \
    "$bin/proxy" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --upstream "$upstream" \
    --config "$work/config.json" "$@" >"$out.out" 2>"$out.err" &
  local pid=$!
  echo "$pid" >>"$work/pids"
  for _ in $(seq 1 600); do
    grep -q "^modelgate listening on " "$out.out" 2>/dev/null && break
    sleep 0.1
  done
  local url="http://127.0.0.1:$port"
  local key=""
  [ "$name" = memory ] && key="$(client_key "$(basename "$out")" "$url")"
  wrk_script "$key" "$body" >"$out.lua"
  wrk -t 1 -c 4 -d 3s -s "$out.lua" "$url/api/v1/chat/completions" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  wrk -t 1 -c 4 -d "${seconds}s" -s "$out.lua" "$url/api/v1/chat/completions" >"$out.wrk"
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local requests total
  requests="$(awk '/requests in/ {print $1}' "$out.wrk")"
  # The dump taken after zeroing: the measured run alone.
  total="$(callgrind_annotate --threshold=100 "$out.cg.1" 2>/dev/null |
    awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')"
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    cp "$out.cg.1" "$KEEP/$name-$variant.callgrind"
  fi
  echo $((total / requests))
}

echo "==> instructions per request: ${seconds}s under callgrind, 4 connections, upstream answering at once"
printf '\n%-9s %14s %14s %14s\n' body bare memory "layers add"
for variant in plain streamed; do
  bare="$(measure bare "$variant" --bare true --store memory)"
  memory="$(measure memory "$variant" --store memory)"
  printf '%-9s %14s %14s %14s\n' "$variant" "$bare" "$memory" "+$((memory - bare))"
done
echo "(instructions the proxy ran per request, all threads; valgrind runs"
echo " them on one core at a time, so the count, not the time, is the figure)"
