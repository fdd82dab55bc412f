#!/usr/bin/env bash
# The cost of `auth:` on the hop (throughput, latency, CPU per request, with and without
# a bearer token check, same run) and a rate limit under load. See perf/lib/auth_cost.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v python3 >/dev/null || { echo "compare-auth.sh: python3 is required (apt-get install -y python3)" >&2; exit 1; }
command -v openssl >/dev/null || { echo "compare-auth.sh: openssl is required (apt-get install -y openssl)" >&2; exit 1; }
exec python3 "$here/lib/auth_cost.py" "$@"
