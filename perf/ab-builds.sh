#!/usr/bin/env bash
# A/B of two mcpyard builds on the same machine in the same minutes: the builds take turns
# (A, B, A, B, ...) in front of a fresh fixture, 1 worker, 8 connections, so drift of a
# shared VM hits both alike. Prints one line per run and the median per build.
#
# Usage: perf/ab-builds.sh A_BIN_DIR B_BIN_DIR [--io uring|epoll] [--rate R] [--rounds N]
#                          [--result-bytes N] [--duration D]
#   A_BIN_DIR, B_BIN_DIR: target/release directories holding `mcpyard` (the loadgen and
#   fixture come from B_BIN_DIR). Without --rate the runs are closed loop (req/s);
#   with --rate they are open loop at R req/s (p50/p90/p99 µs).
# Example (a commit against the working tree):
#   git worktree add /tmp/base REV && (cd /tmp/base && cargo build --release --bin mcpyard)
#   perf/ab-builds.sh /tmp/base/target/release target/release --io uring --rounds 3
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,14p "$0"; exit 2; }
A="$1"; B="$2"; shift 2
io=uring; rate=""; rounds=3; bytes=1024; duration=4s
while [ $# -gt 0 ]; do
  case "$1" in
    --io) io="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --result-bytes) bytes="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    *) echo "ab-builds.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
loadgen="$B/mcpyard-loadgen"
for bin in "$A/mcpyard" "$B/mcpyard" "$loadgen"; do
  [ -x "$bin" ] || { echo "ab-builds.sh: $bin is missing (cargo build --release)" >&2; exit 1; }
done
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT INT TERM HUP

. "$(dirname "${BASH_SOURCE[0]}")/lib/start.sh"

one() { # one run of build dir $1; prints the figure
  local bin="$1" fixture gw
  start "$work/fixture.log" "$loadgen" upstream --listen 127.0.0.1:0 --workers 1 --result-bytes "$bytes"
  fixture="$addr"
  cat >"$work/gw.yaml" <<EOF
runtime: { workers: 1, io: $io }
bindings:
  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: up }
  up: { kind: client, server: "http://$fixture/mcp" }
EOF
  start "$work/gw.log" "$bin/mcpyard" --config "$work/gw.yaml"
  gw="$addr"
  local mode=(--mode closed)
  [ -n "$rate" ] && mode=(--rate "$rate")
  "$loadgen" run --url "http://$gw/mcp" "${mode[@]}" --connections 8 --duration "$duration" \
    --warmup 0.5s >"$work/run.log" 2>&1 || { cat "$work/run.log" >&2; exit 1; }
  kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=()
  if [ -z "$rate" ]; then
    grep -oE 'throughput [0-9.]+' "$work/run.log" | awk '{print $2}'
  else
    awk '/^response/ {print $2, $3, $4}' "$work/run.log"
  fi
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
: >"$work/A"; : >"$work/B"
what="req/s (closed loop)"; [ -n "$rate" ] && what="p50 p90 p99 µs at $rate req/s"
echo "io=$io result=${bytes}B rounds=$rounds: $what"
for r in $(seq "$rounds"); do
  for side in A B; do
    dir="$A"; [ "$side" = B ] && dir="$B"
    fig="$(one "$dir")"
    echo "round $r $side: $fig"
    echo "$fig" >>"$work/$side"
  done
done
for side in A B; do
  if [ -z "$rate" ]; then
    echo "median $side: $(median <"$work/$side") req/s"
  else
    echo "median $side: p50 $(awk '{print $1}' "$work/$side" | median)" \
      "p90 $(awk '{print $2}' "$work/$side" | median) p99 $(awk '{print $3}' "$work/$side" | median) µs"
  fi
done
