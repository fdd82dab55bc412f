#!/usr/bin/env bash
# Instructions per tools/call through mcpyard (1 worker, epoll) under valgrind's callgrind,
# and the top functions by inclusive cost. Writes perf/results/callgrind.{md,json}.
# Usage: perf/callgrind.sh [--help]
# The Python harness (standard library only) owns every process it starts, each in its own
# process group, and stops them on exit, error, SIGINT, SIGTERM or SIGHUP.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "callgrind.sh: python3 is required (apt-get install -y python3)" >&2; exit 1; }
exec python3 "$here/lib/callgrind.py" "$@"
