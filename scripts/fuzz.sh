#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, in build-fuzz/) and runs
# each one for SECONDS (default 30). Fails (non-zero) if any target crashes,
# leaks, times out (an input taking more than 5 s) or exceeds 2 GB of RSS,
# and prints the reproducer input's path and how to replay it.
#
#   scripts/fuzz.sh [SECONDS]
#   scripts/fuzz.sh --build-only    configure and build, do not fuzz
#
# Only the fuzz targets and the libraries they link are built (target
# `fuzzers`; -O1 -gline-tables-only, as OSS-Fuzz builds; with ccache when it
# is installed). Each run starts from a fresh COPY of fuzz/corpus/<target>/
# and fuzz/regressions/<target>/ in build-fuzz/fuzz-run/<target>/corpus, so
# runs never write into the repository; what a run found (new corpus
# entries, crash-*/leak-*/timeout-*/oom-* files, the log) stays there until
# the next run. A crash: minimize it
# (build-fuzz/fuzz/<target>_fuzzer -minimize_crash=1 -runs=10000 crash-...),
# put it in fuzz/regressions/<target>/ under a name that says what it is and
# fix the bug; tests/fuzz_regressions replays it on every build from then on.
#
# Environment: JOBS (ninja parallelism, and how many targets fuzz at once;
# default nproc), FUZZ_TARGETS (space-separated subset, default all),
# FUZZ_BUILD_DIR (default build-fuzz), FUZZ_SOURCE_DIR (the CMake source
# folder, default the repository), FUZZ_WITH_TESTS=ON (the tree builds the
# test binaries too: scripts/run-tests.sh's ASan + UBSan build is this tree,
# so the libraries are compiled once for the tests and the fuzz targets),
# FUZZ_TEST_OPTIMIZE (RL_TEST_OPTIMIZE for those test binaries),
# RL_UNITY=ON (compile in batches of files: cmake/RlUnity.cmake), FUZZ_SEED
# (libFuzzer's -seed: the same seed and corpus explore the same inputs in the
# same order, so a run is reproducible; unset, every run draws its own seed).
# Called by `make fuzz` (FUZZ_SECONDS) and by scripts/run-tests.sh (20 s per
# target, FUZZ_SEED=1).
# docs/fuzzing.md is the manual.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BUILD_ONLY=0
if [[ ${1:-} == --build-only ]]; then BUILD_ONLY=1; shift; fi
SECONDS_PER_TARGET=${1:-30}
JOBS=${JOBS:-$(nproc)}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
SOURCE=${FUZZ_SOURCE_DIR:-$REPO}
ALL_TARGETS="config path client_ip duration redis_reply redis_url decision_api http gateway grpc"
TARGETS=${FUZZ_TARGETS:-$ALL_TARGETS}

if ! [[ $SECONDS_PER_TARGET =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS]  (a positive number of seconds per target)" >&2
  exit 2
fi
for tool in clang clang++ cmake ninja; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# Configured on every run (a no-op when nothing changed), so an old build-fuzz/
# with other flags is brought to these.
CC=clang CXX=clang++ cmake -S "$SOURCE" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" -DRL_FUZZ=ON -DRL_SANITIZE=address \
  -DRL_BUILD_TESTS="${FUZZ_WITH_TESTS:-OFF}" -DRL_TEST_OPTIMIZE="${FUZZ_TEST_OPTIMIZE:-}" \
  -DRL_BUILD_BENCH=OFF -DRL_UNITY="${RL_UNITY:-OFF}" \
  "${launcher[@]}" >/dev/null
targets=()
for t in $TARGETS; do targets+=("${t}_fuzzer"); done
ninja -C "$BUILD" -j "$JOBS" "${targets[@]}"
(( BUILD_ONLY )) && exit 0

# Leaks fail a run too (libFuzzer checks for them after each input that grew the heap).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# run_one TARGET: fuzzes for SECONDS_PER_TARGET; writes the fuzzer's exit status to status.
run_one() {
  local t=$1 work=$BUILD/fuzz-run/$1
  local dict=()
  if [[ -f $REPO/fuzz/dict/$t.dict ]]; then dict=(-dict="$REPO/fuzz/dict/$t.dict"); fi
  local seed=()
  if [[ -n ${FUZZ_SEED:-} ]]; then seed=(-seed="$FUZZ_SEED"); fi
  local status=0
  "$BUILD/fuzz/${t}_fuzzer" -max_total_time="$SECONDS_PER_TARGET" -timeout=5 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/" "${dict[@]}" "${seed[@]}" "$work/corpus" \
    >"$work/log" 2>&1 || status=$?
  echo "$status" >"$work/status"
}

report() {  # TARGET
  local t=$1 work=$BUILD/fuzz-run/$1
  local status runs speed last cov ft
  status=$(cat "$work/status" 2>/dev/null || echo "?")
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$' || true)
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$work/log" | grep -o '[0-9]*$' || true)
  # The last status line ("#N DONE/pulse cov: C ft: F corp: ...") has the coverage reached.
  last=$(grep -E '^#[0-9]+' "$work/log" | tail -1 || true)
  cov=$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*$' || true)
  ft=$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*$' || true)
  if [[ $status == 0 ]]; then
    printf '  %-13s ok      %9s runs in %s s (%s exec/s), cov %s ft %s\n' "$t" "${runs:-?}" \
      "$SECONDS_PER_TARGET" "${speed:-?}" "${cov:-?}" "${ft:-?}"
    return 0
  fi
  printf '  %-13s FAILED  (exit %s) log: %s\n' "$t" "$status" "$work/log"
  grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz invariant failed)|runtime error|^    #[0-9] ' \
    "$work/log" | head -12 | sed 's/^/      /' || true
  for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
    if [[ -e $a ]]; then echo "      input: $a  (replay: $BUILD/fuzz/${t}_fuzzer $a)"; fi
  done
  return 1
}

echo "fuzzing ${SECONDS_PER_TARGET} s per target, ${JOBS} at a time: $TARGETS"
running=0
for t in $TARGETS; do
  work=$BUILD/fuzz-run/$t
  rm -rf "$work"
  mkdir -p "$work/corpus"
  cp -R "$REPO/fuzz/corpus/$t/." "$work/corpus/"
  if [[ -d $REPO/fuzz/regressions/$t ]]; then cp -R "$REPO/fuzz/regressions/$t/." "$work/corpus/"; fi
  if (( running >= JOBS )); then
    wait -n || true
    running=$((running - 1))
  fi
  run_one "$t" &
  running=$((running + 1))
done
wait || true

failed=0
for t in $TARGETS; do report "$t" || failed=1; done

if (( failed )); then
  echo "fuzz.sh: a fuzz target failed; put the minimized input in fuzz/regressions/<target>/" >&2
  exit 1
fi
echo "fuzz.sh: all targets ran clean"
