#!/usr/bin/env bash
# Scenario tests of mcpyard with the official MCP TypeScript SDK: `bash tests/js/run.sh`.
# Installs the SDK (tests/js/node_modules), builds the release gateway if it is missing,
# and runs tests/js/*.test.mjs with Node's test runner; exits with its status.
# MCPYARD_BIN=/path/to/mcpyard runs the tests against another binary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

command -v node >/dev/null || { echo "tests/js: node is required (20 or newer)" >&2; exit 1; }
command -v npm >/dev/null || { echo "tests/js: npm is required" >&2; exit 1; }

echo "tests/js: installing npm packages ($(node --version))"
if [ -f "$here/package-lock.json" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
else
  (cd "$here" && npm install --no-audit --no-fund --loglevel=error)
fi

if [ -n "${MCPYARD_BIN:-}" ]; then
  [ -x "$MCPYARD_BIN" ] || { echo "tests/js: MCPYARD_BIN=$MCPYARD_BIN is not an executable" >&2; exit 1; }
else
  export MCPYARD_BIN="$root/target/release/mcpyard"
  if [ ! -x "$MCPYARD_BIN" ]; then
    echo "tests/js: building the release gateway"
    (cd "$root" && cargo build --release --quiet --bin mcpyard)
  fi
fi

# proxy.test.mjs runs the Python SDK upstream (tests/py/upstreams) beside server-everything.
if [ ! -x "$root/.venv/bin/python" ]; then
  python3 -m venv "$root/.venv"
fi
"$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/tests/py/requirements.txt"

cd "$root"
status=0
node --test --test-timeout=120000 tests/js/*.test.mjs || status=$?
exit "$status"
