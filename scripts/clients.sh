#!/usr/bin/env bash
# The real clients the integration tests drive against the proxy
# (tests/it/clients.rs): the OpenAI and Anthropic Python SDKs in a venv, and
# Claude Code and Codex from npm, each at an exact version, all under
# target/clients/ (ignored by git). Idempotent: when what is installed
# matches the pins below, it prints nothing and exits 0. Run it again after
# changing a pin; it installs anew.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_PINS=(openai==3.57.0 anthropic==2.14.0)
NPM_PINS=(@anthropic-ai/claude-code@2.1.332 @openai/codex@0.169.0)

dir="$PWD/target/clients"
stamp="$dir/installed"
want="python: ${PYTHON_PINS[*]}; npm: ${NPM_PINS[*]}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
  && [ -x "$dir/venv/bin/python" ] \
  && [ -x "$dir/node_modules/@anthropic-ai/claude-code-linux-x64/claude" ] \
  && [ -x "$dir/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex" ]; then
  exit 0
fi

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}
missing=()
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing ${missing[*]} (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "==> installing the clients into target/clients: $want"
rm -f "$stamp"
mkdir -p "$dir"
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check "${PYTHON_PINS[@]}"
# A package.json of its own, so npm installs here and not in a parent folder.
[ -f "$dir/package.json" ] || echo '{"private": true}' >"$dir/package.json"
(cd "$dir" && npm install --no-audit --no-fund --loglevel=error --save-exact "${NPM_PINS[@]}" >/dev/null)
echo "$want" >"$stamp"
