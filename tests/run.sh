#!/usr/bin/env bash
# The whole test suite, as CI and the README run it: `bash tests/run.sh`.
# Installs what the tests need by itself: a Python venv with the official MCP SDK
# (tests/py), Node packages with the official TypeScript SDK (tests/js) and the MCP
# conformance suite with a Node 22 from npm (tests/conformance), cargo-fuzz for the fuzz
# smoke run (fuzz/run.sh), and Debian's redis-server for the redis store's tests.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== build (release binary used by the scenario tests)"
cargo build --release --workspace

echo "== cargo fmt / clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

echo "== house plan (every import points down the layers; docs/architecture.md)"
python3 tests/plan/check.py

echo "== redis-server (the redis store's tests start their own, on ports chosen at run time)"
bash tests/install-redis.sh

echo "== cargo test (unit, binding and raw-HTTP scenario tests)"
cargo test --workspace --release

echo "== fuzz smoke run (every target a few seconds, fixed seed; fuzz/README.md for long runs)"
FUZZ_SEED=1 bash fuzz/run.sh 5

if [ -x tests/py/run.sh ]; then
  echo "== Python MCP SDK scenarios"
  tests/py/run.sh
fi
if [ -x tests/js/run.sh ]; then
  echo "== TypeScript MCP SDK scenarios"
  tests/js/run.sh
fi
if [ -x tests/conformance/run.sh ]; then
  echo "== MCP conformance suite (server scenarios; fails if anything is worse through mcpyard)"
  tests/conformance/run.sh
fi
echo "== all tests passed"
