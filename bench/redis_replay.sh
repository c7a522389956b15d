#!/usr/bin/env bash
# The Redis work of a chat request, counted in instructions: exact where
# CPU time on a shared machine moves by ±10 % between runs, so a change to
# the Lua shows even when it saves 1 %.
#
#   bench/redis_replay.sh [SECONDS=4] [CONNECTIONS=32]
#
# Runs the proxy on a fresh Redis under load (as bench/load.sh does) while
# `MONITOR` records every command it sends, from the library's
# `FUNCTION LOAD` on. Then starts another fresh Redis under valgrind's
# callgrind, loads the same library, replays the recorded commands in
# order through one pipelined connection, and prints the instructions
# Redis spent per `FCALL` (the commands the functions run included) and
# how many commands each ran inside. The replay has the load's arguments
# and state (holds, settlements riding on admissions, records past the
# cap), without the load generator and the proxy sharing the cores.
# Each call that would read Redis's clock (`TIME`) is given the instant
# the recording saw it at instead (the functions' `clock_now` argument):
# under valgrind the replay runs fifty times slower, and on Redis's own
# clock holds would lapse and tidying fall due that never did under the
# load, so calls would take other paths from run to run. The `TIME` those
# calls ran is counted among the commands inside; its instructions (about
# 1k a call) are not.
# KEEP=DIR keeps the callgrind dump (callgrind_annotate reads it) and the
# recorded commands. Installs valgrind (Debian's, with apt-get) when
# missing. Results are printed, not committed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-4}"
connections="${2:-32}"
upstream_ms=0

# shellcheck source=bench/common.sh
. bench/common.sh
need valgrind

# 1. The load, recorded.
redis_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$work" >"$work/redis.out" 2>&1 &
echo $! >>"$work/pids"
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.05; done
redis-cli -p "$redis_port" MONITOR >"$work/monitor.txt" &
monitor=$!
echo "$monitor" >>"$work/pids"
url="$(start_proxy redis --redis "redis://127.0.0.1:$redis_port")"
key="$(client_key redis "$url")"
wrk_script "$key" '{"model": "openai/gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello to the load test."}]}' \
  >"$work/chat.lua"
echo "==> recording ${seconds}s at $connections connections"
wrk -t "$(( connections < 2 ? 1 : 2 ))" -c "$connections" -d "${seconds}s" -s "$work/chat.lua" "$url/api/v1/chat/completions" |
  awk '/requests in/ {print "    " $1 " requests"}'
# Let the last settlements land before the recording stops.
sleep 1
kill "$monitor"

# 2. The recording as the client sent it: the library load apart (it runs
# before counting starts), then every other command, in RESP.
python3 - "$work/monitor.txt" "$work/load.resp" "$work/calls.resp" "$work/clocked" src/store/lua <<'PY'
import os, re, sys
# Which argument of each function is its clock: `clock_now(ARGV[n])`.
clock_argument = {}
for name in os.listdir(sys.argv[5]):
    found = re.search(r'clock_now\(ARGV\[(\d+)\]\)', open(os.path.join(sys.argv[5], name)).read())
    if found:
        clock_argument[name[:-len('.lua')]] = int(found.group(1))
ESCAPES = {'n': b'\n', 'r': b'\r', 't': b'\t', 'a': b'\x07', 'b': b'\x08', '"': b'"', '\\': b'\\'}
def words(text):
    # MONITOR quotes each argument as Redis's sdscatrepr does.
    out, i = [], 0
    while i < len(text):
        if text[i] == ' ':
            i += 1
            continue
        i += 1
        word = bytearray()
        while text[i] != '"':
            if text[i] == '\\':
                if text[i + 1] == 'x':
                    word.append(int(text[i + 2:i + 4], 16))
                    i += 4
                else:
                    word += ESCAPES[text[i + 1]]
                    i += 2
            else:
                word += text[i].encode('latin-1')
                i += 1
        i += 1
        out.append(bytes(word))
    return out
def resp(args):
    return b'*%d\r\n' % len(args) + b''.join(b'$%d\r\n%s\r\n' % (len(a), a) for a in args)
skipped = {b'MONITOR', b'CONFIG', b'INFO', b'CLIENT', b'HELLO', b'PING'}
clocked = 0
with open(sys.argv[2], 'wb') as load, open(sys.argv[3], 'wb') as calls:
    for line in open(sys.argv[1], encoding='latin-1'):
        match = re.match(r'^([0-9]+)\.([0-9]{6}) \[\d+ ([^\]]+)\] (.*)$', line.rstrip('\n'))
        # Commands the functions ran are the replay's to run again.
        if not match or match.group(3) == 'lua':
            continue
        args = words(match.group(4))
        if not args or args[0].upper() in skipped:
            continue
        if args[0].upper() in (b'FCALL', b'FCALL_RO'):
            # FCALL <library>_<operation> numkeys key… arg…
            operation = args[1].decode('latin-1').split('_', 2)[-1]
            at = clock_argument.get(operation)
            if at is not None:
                index = 3 + int(args[2]) + at - 1
                if index < len(args) and args[index] == b'':
                    args[index] = (match.group(1) + match.group(2)).encode()
                    clocked += 1
        (load if args[0].upper() == b'FUNCTION' else calls).write(resp(args))
open(sys.argv[4], 'w').write('%d\n' % clocked)
PY

# 3. The replay, counted.
replay_port="$(free_port)"
valgrind --tool=callgrind --callgrind-out-file="$work/replay.cg.%p" \
  redis-server --port "$replay_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$work" >"$work/valgrind.out" 2>&1 &
valgrind_pid=$!
echo "$valgrind_pid" >>"$work/pids"
until redis-cli -p "$replay_port" ping >/dev/null 2>&1; do sleep 0.1; done
redis-cli -p "$replay_port" --pipe <"$work/load.resp" >/dev/null
redis-cli -p "$replay_port" CONFIG RESETSTAT >/dev/null
callgrind_control -z "$valgrind_pid" >/dev/null 2>&1
echo "==> replaying under callgrind"
redis-cli -p "$replay_port" --pipe <"$work/calls.resp" | tail -1
callgrind_control -d "$valgrind_pid" >/dev/null 2>&1
stats="$(redis-cli -p "$replay_port" INFO commandstats | tr -d '\r')"
redis-cli -p "$replay_port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
wait "$valgrind_pid" 2>/dev/null || true
# The dump asked for above (part 1), not the one at shutdown.
dump="$(ls "$work"/replay.cg.*.1)"
instructions="$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")"
# The calls given the recording's clock ran no `TIME` here; live, they did.
echo "$stats" | awk -F'[:=,]' -v total="$instructions" -v clocked="$(cat "$work/clocked")" '
  /^cmdstat_/ {
    name = substr($1, 9)
    if (name == "fcall") fcalls = $3
    else if (name != "config|resetstat" && name != "info") inside += $3
    if (name != "config|resetstat" && name != "info") all += $3
  }
  END {
    inside += clocked
    printf "redis replay: %d FCALL, %.0fk instructions each (all the replay'"'"'s work over the FCALL), %.2f commands each run inside or beside them\n", fcalls, total / fcalls / 1000, inside / fcalls
  }'
if [ -n "${KEEP:-}" ]; then
  mkdir -p "$KEEP"
  cp "$dump" "$KEEP/redis_replay.cg"
  cp "$work/calls.resp" "$work/load.resp" "$KEEP/"
  echo "kept in $KEEP: redis_replay.cg (callgrind_annotate), load.resp and calls.resp"
fi
