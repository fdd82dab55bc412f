#!/usr/bin/env bash
# Where mcpyard's CPU per request goes as agent connections grow: closed-loop load at each
# connection count (default 8 and 256) on each backend, perf record on mcpyard, each
# symbol's self time as µs per request side by side. Writes perf/results/conn-profile.{md,json}.
# Usage: perf/conn-profile.sh [--io uring,epoll] [--connections 8,256] [--duration 5] (--help)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "conn-profile.sh: python3 is required" >&2; exit 1; }
command -v perf >/dev/null || { echo "conn-profile.sh: perf is required (apt-get install -y linux-perf)" >&2; exit 1; }
exec python3 "$here/lib/conn_profile.py" "$@"
