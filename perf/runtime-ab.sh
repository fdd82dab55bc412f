#!/usr/bin/env bash
# The I/O layer alone: a bare HTTP/1.1 relay (perf/runtime-ab, no MCP work) on tokio's epoll
# reactor, on tokio-uring and on monoio, next to mcpyard (1 worker, io_uring and epoll), all
# in front of the same fixture, taking turns. Per target and round: closed-loop req/s, then
# at a fixed rate p50/p90/p99 µs, the target's CPU µs per request (utime+stime from /proc)
# and, where `perf` can read tracepoints, its system calls per request.
#
# Usage: perf/runtime-ab.sh [--rate R] [--rounds N] [--duration D]
#   needs target/release/{mcpyard,mcpyard-loadgen} (cargo build --release --workspace);
#   builds perf/runtime-ab itself (it pulls monoio, which mcpyard does not use).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
rate=9000; rounds=3; duration=3
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    *) sed -n 2,11p "$0"; exit 2 ;;
  esac
done
loadgen="$root/target/release/mcpyard-loadgen"
mcpyard="$root/target/release/mcpyard"
for bin in "$loadgen" "$mcpyard"; do
  [ -x "$bin" ] || { echo "runtime-ab.sh: $bin is missing (cargo build --release --workspace)" >&2; exit 1; }
done
(cd "$here/runtime-ab" && cargo build --release --quiet)
relay="$here/runtime-ab/target/release/runtime-ab"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT INT TERM HUP
tick="$(getconf CLK_TCK)"
events="syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom"
perf_ok=no
command -v perf >/dev/null && perf stat -e syscalls:sys_enter_epoll_wait -- true >/dev/null 2>&1 && perf_ok=yes

. "$here/lib/start.sh"

start "$work/fixture.log" "$loadgen" upstream --listen 127.0.0.1:0 --workers 1 --result-bytes 1024
fixture="$addr"

# Starts target $1 (in the background): `addr` is its address, its pid the last in pids.
target() {
  case "$1" in
    mcpyard-*)
      cat >"$work/gw.yaml" <<EOC
runtime: { workers: 1, io: ${1#mcpyard-} }
bindings:
  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: up }
  up: { kind: client, server: "http://$fixture/mcp" }
EOC
      start "$work/target.log" "$mcpyard" --config "$work/gw.yaml" ;;
    *) start "$work/target.log" "$relay" --rt "$1" --listen 127.0.0.1:0 --upstream "$fixture" ;;
  esac
}

stop_last() { local p="${pids[-1]}"; kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; unset 'pids[-1]'; }

run() { "$loadgen" run --url "http://$1/mcp" --connections 8 --duration "${duration}s" --warmup 0.5s "${@:2}" 2>>"$work/loadgen.log"; }

targets=(tokio-epoll tokio-uring monoio mcpyard-epoll mcpyard-uring)
echo "runtime-ab: 1 KiB tools/call, 8 connections, ${duration}s per run, $rounds rounds, fixed rate $rate req/s; perf tracepoints: $perf_ok"
for r in $(seq "$rounds"); do
  for t in "${targets[@]}"; do
    target "$t"
    max="$(run "$addr" --mode closed | grep -oE 'throughput [0-9.]+' | awk '{print $2}')"
    stop_last
    target "$t"; pid="${pids[-1]}"
    c0="$(awk '{print $14+$15}' "/proc/$pid/stat")"
    if [ "$perf_ok" = yes ]; then
      perf stat -x, -e "$events" -p "$pid" -- sleep "$duration" 2>"$work/perf.txt" &
      perf_pid=$!
    fi
    lat="$(run "$addr" --rate "$rate" | awk '/^response/ {print $2 "/" $3 "/" $4}')"
    c1="$(awk '{print $14+$15}' "/proc/$pid/stat")"
    sys=""
    if [ "$perf_ok" = yes ]; then
      wait "$perf_pid" || true
      sys="$(awk -F, -v n="$((rate * duration))" '{split($3, a, ":"); sub("sys_enter_", "", a[2]); printf " %s %.2f", a[2], $1 / n}' "$work/perf.txt")"
    fi
    stop_last
    cpu="$(awk -v a="$c0" -v b="$c1" -v t="$tick" -v n="$((rate * duration))" 'BEGIN {printf "%.1f", (b - a) / t * 1e6 / n}')"
    echo "round $r $t: max $max req/s | at $rate: p50/p90/p99 $lat µs, cpu $cpu µs/req, per req:$sys"
    echo "$t $max ${lat//\// } $cpu" >>"$work/figures"
  done
done
echo "medians over the rounds (each column on its own): target, max req/s, p50, p90, p99 µs, cpu µs/req"
for t in "${targets[@]}"; do
  awk -v t="$t" '$1 == t' "$work/figures" | python3 -c '
import statistics, sys
rows = [line.split() for line in sys.stdin]
cols = list(zip(*rows))
print(rows[0][0], *(f"{statistics.median(float(x) for x in c):.1f}" for c in cols[1:]))'
done
