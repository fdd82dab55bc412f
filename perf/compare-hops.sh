#!/usr/bin/env bash
# tools/call with a 1 KiB result: direct to the fixture vs through mcpyard (1/2 workers ×
# io_uring/epoll) vs through nginx (1/2 worker processes); max throughput, then latency at
# 25/50/75 % of mcpyard's (1 worker, uring) max. Writes perf/results/compare-hops.{md,json}.
# Usage: perf/compare-hops.sh [--connections N] [--max-duration D] [--rate-duration D] [--warmup D]
#                             [--phases plain,tls] [--handshake-rounds N]
# --phases tls: the same hops with TLS on every hop (mcpyard server(tls) -> client(https) vs
# nginx listen ssl + proxy_pass https://), 1 worker, with a handshake-cost row set; writes
# perf/results/compare-tls.{md,json}.
# The Python harness owns every process it starts (own process group each) and stops them
# on exit, error, SIGINT, SIGTERM or SIGHUP.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "compare-hops.sh: python3 is required" >&2; exit 1; }
exec python3 "$here/lib/hops.py" "$@"
