#!/usr/bin/env bash
# Installs Debian's redis-server when it is missing (the redis store's tests start their own,
# on ports chosen at run time; only the package is needed). Used by tests/run.sh and
# tests/py/run.sh.
set -euo pipefail
if ! command -v redis-server >/dev/null; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq && $sudo apt-get install -y -qq redis-server >/dev/null
fi
