#!/usr/bin/env bash
# The checks that need no test run, in the order of their cost:
#   1. every C++ file is clang-formatted (.clang-format at the top);
#   2. the module boundaries hold: the probes of tests/boundaries/ (a wrong-way
#      include such as "store/over_limit_cache.h" from src/policy, a guarded
#      member read without its mutex) fail to compile, for the reason they
#      state (scripts/check-boundaries.py);
#   3. clang-tidy (.clang-tidy: bugprone, performance, concurrency and a few
#      modernize/readability checks, every finding an error) over the
#      library and daemon sources in src/ (not the tests), read in batches
#      of 8 files (scripts/tidy-batches.py: a third of the time). Parsing them with
#      clang also runs Clang's thread-safety analysis (-Wthread-safety
#      -Werror, include/ratelimit/thread_annotations.h) on every library.
# 2 and 3 use a clang build folder, build-lint/, that is only configured
# (compile_commands.json) and given its generated sources, never built.
# Called by `make lint` and by scripts/run-tests.sh (so by `make test`).
#
# Environment: JOBS (parallel clang-tidy runs, default nproc), LINT_BUILD_DIR
# (default build-lint), LINT_TIDY=0 skips clang-tidy (a quick format check).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
BUILD=${LINT_BUILD_DIR:-build-lint}

files=$(git ls-files '*.h' '*.cc' 2>/dev/null || true)
[[ -n "$files" ]] || exit 0
bad=$(clang-format --dry-run $files 2>&1 | grep -c 'warning:' || true)
if [[ "$bad" != "0" ]]; then
  clang-format --dry-run $files 2>&1 | grep 'warning:' | cut -d: -f1 | sort -u | sed 's/^/not formatted: /'
  echo "lint: run 'make format'"
  exit 1
fi
echo "lint: $(echo "$files" | wc -l) files formatted"
# Boost 1.74's beast::iequals reads one byte past its first argument when the
# two differ only in case (ASan caught it): core::EqualsIgnoreCase instead.
if hits=$(git grep -n 'beast::iequals' -- '*.h' '*.cc'); then
  echo "$hits" | sed 's/^/beast::iequals: /'
  echo "lint: use core::EqualsIgnoreCase (src/core/ascii.h)"
  exit 1
fi
[[ ${LINT_TIDY:-1} == 0 ]] && exit 0

for tool in clang clang++ clang-tidy run-clang-tidy cmake ninja python3; do
  command -v "$tool" >/dev/null || { echo "lint: $tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DRL_BUILD_BENCH=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
# Generated sources (embedded scripts and pages, protoc output): the outputs
# of custom commands, which the sources include. Their commands are run
# directly (ninja -t commands -s: the command itself, not the chain): asked
# for the outputs, ninja would first build every library the owning target
# links, which took 197 s of CPU that nothing here uses.
generated=$(ninja -C "$BUILD" -t targets all | grep ': CUSTOM_COMMAND$' | cut -d: -f1 |
  grep -Ev '(\.util|^/)' || true)
if [[ -n "$generated" ]]; then
  # shellcheck disable=SC2086 # one target per word
  ninja -C "$BUILD" -t commands -s $generated | sort -u | bash -e >/dev/null
fi

echo "lint: module boundaries and thread-safety analysis (tests/boundaries/)"
python3 scripts/check-boundaries.py "$BUILD"

sources=$(git ls-files 'src/*.cc' | grep -v '_test\.cc$')
# In batches of the files that compile alike (scripts/tidy-batches.py: the
# checks walk Beast's and Asio's headers once a batch, not once a file).
# The config is given, not looked up beside the batch files.
# shellcheck disable=SC2086 # one file per word
batches=$(python3 scripts/tidy-batches.py "$BUILD" "$BUILD/tidy" $sources)
echo "lint: clang-tidy on the $batches of src/, $JOBS at a time"
if ! run-clang-tidy -p "$BUILD/tidy" -config="$(cat .clang-tidy)" -quiet -j "$JOBS" \
  >"$BUILD/clang-tidy.log" 2>&1; then
  sed 's/\x1b\[[0-9;]*m//g' "$BUILD/clang-tidy.log" | grep -E '(error|warning):' | sort -u | head -50
  echo "lint: clang-tidy found the above (full log: $BUILD/clang-tidy.log); fix them, or" \
    "say why not with // NOLINT(<check>): <reason>" >&2
  exit 1
fi
echo "lint: clang-tidy clean"
