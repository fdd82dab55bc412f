#!/usr/bin/env bash
# Heap allocations per tools/call through mcpyard (1 worker, epoll), by call site, under
# valgrind's DHAT. Writes perf/results/alloc-sites.{md,json}.
# Usage: perf/alloc-sites.sh [--requests N] [--depth D] [--help]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "alloc-sites.sh: python3 is required (apt-get install -y python3)" >&2; exit 1; }
exec python3 "$here/lib/allocsites.py" "$@"
