#!/usr/bin/env bash
# A soak: open-loop load at 60 % of the measured max for MINUTES through server → proxy
# (cache) → two clients, with session churn, a tool-list change every 5 s and route b's
# upstream killed and restarted every minute; mcpyard's RSS, fds, slots and errors sampled
# every second. Writes perf/results/soak.{md,json,svg} (raw per-second data under
# perf/results/raw/soak/). Usage: perf/soak.sh MINUTES [--no-kill] [--io epoll] ... (--help)
# The Python harness (standard library only) owns every process it starts, each in its own
# process group, and stops them on exit, error, SIGINT, SIGTERM or SIGHUP.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "soak.sh: python3 is required" >&2; exit 1; }
exec python3 "$here/lib/soak.py" "$@"
