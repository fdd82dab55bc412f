# Sourced by the perf/*.sh scripts that start their own processes (ab-builds, runtime-ab).
#
# start LOG CMD...: runs CMD in the background with its output in LOG, appends its pid to
# the caller's `pids` array, waits up to 10 s for it to print `listening [name] ADDR` and
# sets `addr` to ADDR. Call it directly, never inside `$(...)`: a command substitution runs
# in a subshell, whose `pids` never reach the caller, so nothing would stop the process.
start() {
  local log="$1"; shift
  "$@" >"$log" 2>&1 &
  pids+=("$!")
  addr=""
  for _ in $(seq 100); do
    addr="$(grep -m1 -oE 'listening( north)? [0-9.]+:[0-9]+' "$log" | awk '{print $NF}' || true)"
    [ -n "$addr" ] && return
    sleep 0.1
  done
  echo "$(basename "$0"): $1 did not start; see $log" >&2
  cat "$log" >&2
  exit 1
}
