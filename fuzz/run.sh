#!/usr/bin/env bash
# Builds every fuzz target once and runs each for SECONDS: `bash fuzz/run.sh SECONDS
# [TARGET...]` (all targets when none are named). See fuzz/README.md.
#
# It installs what it needs by itself: cargo-fuzz (pinned, `cargo install --locked`) on a
# machine with only rustup stable, gcc/g++ and crates.io, into a root of its own outside the
# work tree ($FUZZ_TOOLS, by default ~/.cache/mcpyard/cargo-fuzz-<version>), so that fresh
# clones on the same machine (CI's) do not build it again. cargo-fuzz passes -Z flags to
# rustc, which the stable toolchain accepts with RUSTC_BOOTSTRAP=1.
#
# Each target's libFuzzer grows its own copy of the corpus in fuzz/work/<target>/, reading
# the committed seeds in fuzz/corpus/<target>/ too; a crashing input goes to
# fuzz/artifacts/<target>/ and its path is printed. The last line is always
# `fuzz: N targets, M execs, K crashes`; the exit status is non-zero when K > 0 (or when the
# build fails).
#
# FUZZ_SEED fixes libFuzzer's random seed (0, the default, picks one per run). CI sets it so
# that its short run explores the same inputs every time and a red CI always means a change
# in the code, never luck; finding new inputs is the long runs' job.
set -euo pipefail
cd "$(dirname "$0")"

SECONDS_EACH=${1:?usage: bash fuzz/run.sh SECONDS [TARGET...]}
shift
CARGO_FUZZ_VERSION=0.13.2
TOOLS=${FUZZ_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/mcpyard/cargo-fuzz-$CARGO_FUZZ_VERSION}

if [ "$("$TOOLS/bin/cargo-fuzz" --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION into $TOOLS"
  cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" --root "$TOOLS"
fi
export PATH="$TOOLS/bin:$PATH"
# cargo-fuzz's instrumentation flags are unstable rustc options; this is how the stable
# toolchain lets them through.
export RUSTC_BOOTSTRAP=1

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

# One build for all targets: optimised, with debug assertions and overflow checks, without
# a sanitizer (the code under test is safe Rust; see fuzz/README.md).
echo "== cargo fuzz build (${#targets[@]} targets)"
cargo fuzz build -O -a -s none

host=$(rustc -vV | sed -n 's/^host: //p')
bin_dir="target/$host/release"
total_execs=0
crashes=0
for target in "${targets[@]}"; do
  mkdir -p "work/$target" "artifacts/$target" "corpus/$target"
  log="work/$target.log"
  # The HTTP decoders get room to reach their head and target limits (16 KiB, 4 KiB).
  max_len=4096
  case "$target" in http_request | http_response) max_len=20000 ;; esac
  # The tokens a target's parser branches on, where there is a list of them.
  dict=()
  if [ -f "dict/$target.dict" ]; then dict=(-dict="dict/$target.dict"); fi
  status=0
  "$bin_dir/$target" "work/$target" "corpus/$target" "${dict[@]}" \
    -seed="${FUZZ_SEED:-0}" -max_total_time="$SECONDS_EACH" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="artifacts/$target/" -print_final_stats=1 >"$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  execs=${execs:-0}
  total_execs=$((total_execs + execs))
  if [ "$status" -ne 0 ]; then
    crashes=$((crashes + 1))
    input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    echo "fuzz: $target: CRASH after $execs execs: fuzz/${input:-(no input written; see fuzz/$log)}"
    # The panic's place and message, or libFuzzer's own verdict (timeout, out of memory).
    grep -E -A 3 "panicked at|ERROR: libFuzzer" "$log" | head -n 6 | sed 's/^/    /' || true
  else
    corpus=$(find "work/$target" -type f | wc -l)
    echo "fuzz: $target: ok, $execs execs, $corpus grown corpus inputs"
  fi
done
echo "fuzz: ${#targets[@]} targets, $total_execs execs, $crashes crashes"
[ "$crashes" -eq 0 ]
