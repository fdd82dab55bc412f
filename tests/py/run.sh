#!/usr/bin/env bash
# Python MCP SDK scenario tests against the release gateway binary.
# Needs python3 and cargo, and installs redis-server (apt) when it is missing; idempotent
# (reuses .venv and the built binary).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/py/requirements.txt

# The proxy tests put the reference server-everything (an npm package) beside the SDK
# upstreams; it comes from tests/js's lock file.
if [ ! -f tests/js/node_modules/@modelcontextprotocol/server-everything/dist/index.js ]; then
  (cd tests/js && npm ci --no-audit --no-fund --loglevel=error)
fi

# The cluster scenarios (test_redis_cluster.py) start Debian's redis-server themselves.
bash tests/install-redis.sh

if [ ! -x target/release/mcpyard ]; then
  cargo build --release --bin mcpyard
fi

status=0
.venv/bin/python -m pytest -q tests/py "$@" || status=$?
exit "$status"
