#!/usr/bin/env bash
# The proxy's list cache: a cached tools/list (2 routes x 50 and x 5,000 tools; mcpyard 1
# worker, io_uring and epoll) against nginx serving the captured bytes (max throughput, and
# latency at 50 % of mcpyard's max); then list_changed fan-out to 1,000 and 10,000 sessions
# after a real change of an upstream's list (fixture /control/tools_changed), with the CPU,
# a perf profile and the bare send() floor beside it. With --timing-bin DIR (binaries built
# from perf/fanout-timing.patch) also where the fan-out time goes, stage by stage.
# Writes perf/results/compare-cache.{md,json}. Usage: perf/compare-cache.sh [--help]
# The Python harness (standard library only) owns every process it starts, each in its own
# process group, and stops them on exit, error, SIGINT, SIGTERM or SIGHUP.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "compare-cache.sh: python3 is required" >&2; exit 1; }
exec python3 "$here/lib/cache.py" "$@"
