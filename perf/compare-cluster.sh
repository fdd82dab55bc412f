#!/usr/bin/env bash
# Issue 24: mcpyard nodes sharing one Redis (Debian redis-server, started here on a port
# chosen at run time) against one node, in one run: cached tools/list and tools/call through
# one node vs a two-node cluster vs one node without shared sessions (max throughput, then
# p50/p99 at a rate all sustain); sessions used on two nodes without affinity; a session
# taken up by a second node; list_changed fan-out to 2 x 1,000 sessions after a real change
# of an upstream list (exactly one per session checked); Redis commands per second at idle
# and under load (INFO commandstats). 1 worker per node on a 2-core machine: the two-node
# figures measure the cluster's overhead, not scale-out.
# Writes perf/results/compare-cluster.{md,json}. Usage: perf/compare-cluster.sh [--help]
# The Python harness (standard library only) owns every process it starts, each in its own
# process group, and stops them on exit, error, SIGINT, SIGTERM or SIGHUP.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "compare-cluster.sh: python3 is required" >&2; exit 1; }
exec python3 "$here/lib/cluster.py" "$@"
