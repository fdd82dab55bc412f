#!/usr/bin/env bash
# 1 000 and 10 000 idle MCP sessions with GET streams open through mcpyard: RSS per
# session, then list_changed fan-out latency to the last session.
# Writes perf/results/idle-sessions.{md,json}. Usage: perf/idle-sessions.sh [--help]
# The Python harness (standard library only) owns every process it starts, each in its own
# process group, and stops them on exit, error, SIGINT, SIGTERM or SIGHUP.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "idle-sessions.sh: python3 is required (apt-get install -y python3)" >&2; exit 1; }
exec python3 "$here/lib/idle.py" "$@"
