#!/usr/bin/env bash
# Instructions per session of a list_changed fan-out through the caching proxy (mcpyard 1
# worker, epoll, under valgrind's callgrind), task polls and allocations per session.
# Writes perf/results/callgrind-fanout.{md,json}. Usage: perf/callgrind-fanout.sh [--help]
# The Python harness (standard library only) owns every process it starts, each in its own
# process group, and stops them on exit, error, SIGINT, SIGTERM or SIGHUP.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "callgrind-fanout.sh: python3 is required (apt-get install -y python3)" >&2; exit 1; }
exec python3 "$here/lib/callgrind_fanout.py" "$@"
