#!/usr/bin/env bash
# 10 KiB, 100 KiB and 1 MiB tools/call results and a 10-notification progress stream
# through mcpyard at 25 % of its max, with its window-grant/stall histograms and slot
# occupancy. Writes perf/results/compare-sizes.{md,json}. Usage: perf/compare-sizes.sh [--help]
# The Python harness (standard library only) owns every process it starts, each in its own
# process group, and stops them on exit, error, SIGINT, SIGTERM or SIGHUP.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "compare-sizes.sh: python3 is required (apt-get install -y python3)" >&2; exit 1; }
exec python3 "$here/lib/sizes.py" "$@"
