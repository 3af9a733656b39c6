#!/usr/bin/env bash
# Builds and runs the whole suite three times: a normal build (GCC; all tests,
# the chaos tests among them: RUN_SERIAL, each has the machine to itself),
# ASan+UBSan (Clang; all but the "no-sanitizer" ones) and TSan (GCC; tests
# labelled "concurrency"); then every libFuzzer target for 30 s under
# ASan+UBSan, built in the same Clang tree as the ASan tests
# (scripts/fuzz.sh with FUZZ_BUILD_DIR=build-asan FUZZ_WITH_TESTS=ON): the
# libraries are compiled once for both.
# Exits non-zero on the first failure. Called by `make test` and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

step() { printf '\n==== %s (%s)\n' "$1" "$(date +%T)"; }

# ccache, when the machine has it, makes a re-run after a small change quick;
# nothing requires it.
# The cache is keyed on paths relative to the checkout (base_dir) and not on
# the build directory (hash_dir off, which -g would otherwise add): a fresh
# clone elsewhere, as CI makes, reuses what an earlier clone compiled. Without
# these, every clone missed (ccache -s: 3 hits of 496 for a clone of a tree
# whose every object was cached). What embeds an absolute path (-D...PATH=)
# still misses, as it must.
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
fi

configure() {  # dir, build type, extra cmake args...
  local dir=$1 type=$2; shift 2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" "${LAUNCHER[@]}" "$@" >/dev/null
}
# Sanitizer builds: -O1 keeps them fast to compile and still quick to run.
SAN_FLAGS=(-DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DRL_BUILD_BENCH=OFF -DRL_UNITY=ON)
# Every tree compiles its libraries and tests in batches of files
# (cmake/RlUnity.cmake: Beast and Asio parsed once per batch), and the
# RelWithDebInfo tree with line tables only (-g1: backtraces and perf keep
# file:line, a compile costs a third less than with -g). On this 2-core VM,
# no ccache, 2026-12-03: the RelWithDebInfo tree in 8:15 instead of about 16
# minutes. fuzz.sh reads RL_UNITY for the ASan tree.
export RL_UNITY=ON

step "npm packages (pinned in lockfiles)"
[[ -d bench/peers/node_modules/rate-limiter-flexible ]] ||
  npm ci --prefix bench/peers --no-audit --no-fund

step "lint"
scripts/lint.sh

# --repeat until-pass:2: a test that fails is run once more, and fails the
# run only if it fails again. The timing bounds of the chaos and load tests
# (p99 < 5 ms, deadline + 10 ms) meet this shared 2-core VM's stalls: on
# 2026-12-03 three clean-clone runs in one hour each failed on a different
# one (a load generator 925 ms late, healthy-phase p99s of 6-7 ms), every one
# passing when run again. A failed first attempt stays in the log.

step "build (RelWithDebInfo)"
# The tests' own code at -O1 (RL_TEST_OPTIMIZE in CMakeLists.txt), the
# libraries and ratelimitd they test at -O2: -O1 still inlines, so the
# clients and load loops in the timing tests keep their pace.
configure build RelWithDebInfo -DRL_BUILD_BENCH=ON -DRL_UNITY=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DRL_TEST_OPTIMIZE=-O1
ninja -C build -j "$JOBS"
step "test (RelWithDebInfo)"
ctest --test-dir build --output-on-failure -j 2 --timeout 900 --repeat until-pass:2

step "build (ASan + UBSan, Clang, the fuzz targets in the same tree)"
# Only the test binaries this run runs (target sanitizer_tests: all but those
# labelled no-sanitizer) and what they start (ratelimitd, rl-lab); the others
# show up in ctest as <binary>_NOT_BUILT, which is what -E skips. fuzz.sh
# configures the tree (Clang, -O1 -gline-tables-only, -fsanitize=fuzzer-no-link:
# the tests link no libFuzzer, the ASan runtime answers the coverage hooks).
# The tests' own code at -O0 here (the libraries, ratelimitd and the fuzz
# targets at -O1): ASan's instrumentation is what makes a compile slow, and
# at -O0 a test file compiles in under half the time.
export FUZZ_BUILD_DIR=build-asan FUZZ_WITH_TESTS=ON FUZZ_TEST_OPTIMIZE=-O0
scripts/fuzz.sh --build-only
ninja -C build-asan -j "$JOBS" sanitizer_tests
step "test (ASan + UBSan)"
ctest --test-dir build-asan --output-on-failure -j 2 --timeout 900 --repeat until-pass:2 -LE no-sanitizer -E '_NOT_BUILT$'

step "build (TSan)"
configure build-tsan Debug -DRL_SANITIZE=thread "${SAN_FLAGS[@]}"
ninja -C build-tsan -j "$JOBS" concurrency_tests
step "test (TSan, concurrency tests)"
ctest --test-dir build-tsan --output-on-failure -j 2 --timeout 900 --repeat until-pass:2 -L concurrency -LE no-sanitizer

step "fuzz (libFuzzer, ASan + UBSan, 20 s per target, in build-asan)"
# Fails on any crash, leak, timeout or out-of-memory and prints the input.
# A fixed seed: the gate explores the same inputs on every run, so what fails
# here fails again on a rerun and what passed on a developer's clean clone
# passes in CI; `make fuzz` draws a new seed each run to find what is new.
# 20 s a target (45 s less than 30 s: 5 rounds of 2) keeps `make test` within
# its 40 minutes on a cold 2-core machine (40 min 48 s at 30 s, 2026-12-07);
# with the seed fixed, 20 s try the first part of the inputs 30 s tried.
FUZZ_SEED=${FUZZ_SEED:-1} scripts/fuzz.sh 20

step "all test runs passed"
