#!/usr/bin/env bash
# Fails when a C++ file is not clang-formatted (.clang-format at the top).
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cc' 2>/dev/null || true)
[[ -n "$files" ]] || exit 0
bad=$(clang-format --dry-run $files 2>&1 | grep -c 'warning:' || true)
if [[ "$bad" != "0" ]]; then
  clang-format --dry-run $files 2>&1 | grep 'warning:' | cut -d: -f1 | sort -u | sed 's/^/not formatted: /'
  echo "lint: run 'make format'"
  exit 1
fi
echo "lint: $(echo "$files" | wc -l) files formatted"
