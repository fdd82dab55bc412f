#!/usr/bin/env bash
# The proxy hop: tools/call (1 KiB result) through server → proxy (2 routes) → client against
# server → client to the same fixture (io_uring and epoll, 1 worker; max throughput, then
# latency at 50 % of the gateway's max); a merged tools/list of 2 × 1,000 tools against one
# upstream's 2,000; and a 100,000-item merged list read by a streaming client while mcpyard's
# RSS and slot occupancy are sampled. Writes perf/results/compare-proxy.{md,json}.
# Usage: perf/compare-proxy.sh [--rounds N] [--phases call,list,big] [--no-profile] ... (--help)
# The Python harness owns every process it starts (own process group each) and stops them
# on exit, error, SIGINT, SIGTERM or SIGHUP.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "compare-proxy.sh: python3 is required" >&2; exit 1; }
exec python3 "$here/lib/proxy.py" "$@"
