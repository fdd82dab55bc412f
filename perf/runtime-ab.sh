#!/usr/bin/env bash
# The I/O layer alone: a bare HTTP/1.1 relay (perf/runtime-ab, no MCP work) on tokio's epoll
# reactor, tokio-uring, monoio and a purpose-built io_uring loop (raw-uring), next to nginx
# (1 worker process) and mcpyard (1 worker, epoll and io_uring), all in front of the same
# fixture, taking turns. Per connection count (default 8 and 256), target and round:
# closed-loop max req/s, then at a fixed rate (default 50 % of nginx's median max at that
# connection count) p50/p90/p99 µs, CPU µs per request of the target's process group and,
# where `perf` reads the syscall tracepoints, system calls per request. Prints the medians
# and writes perf/results/runtime-ab.{md,json}.
#
# Usage: perf/runtime-ab.sh [--connections 8,256] [--rounds N] [--duration SECONDS]
#                           [--rate-fraction F | --rate R] [--targets LIST] [--warmup D]
#                           [--quiet-wait S] [--quiet-busy PCT]      (--help for all)
#        perf/runtime-ab.sh --report-only   # rewrite the .md from the .json
#   needs target/release/{mcpyard,mcpyard-loadgen} (built if missing) and builds
#   perf/runtime-ab itself (it pulls monoio, which mcpyard does not use); installs nginx with
#   apt-get if it is missing. The Python harness owns every process it starts (own process
#   group each) and stops them on exit, error, SIGINT, SIGTERM or SIGHUP.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "runtime-ab.sh: python3 is required" >&2; exit 1; }
exec python3 "$here/lib/runtime_ab.py" "$@"
