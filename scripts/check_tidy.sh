#!/usr/bin/env bash
# Runs clang-tidy (Debian 12's clang-tidy-14, the repository's curated .clang-tidy) over every
# source under src/ and include/ in the build's compile_commands.json and fails on any warning,
# listing each. Needs a configured build (scripts/build.sh). About 10 minutes on 2 cores, so it
# runs in .ci/run beside the test suite rather than inside it.
# Usage: scripts/check_tidy.sh [BUILD_DIR [FILE...]]   (FILEs: only those sources, e.g. the ones
# a change touched; headers are checked through the sources that include them)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-${MOESHARD_BUILD_DIR:-build}}
shift $(($# > 0 ? 1 : 0))
RUN_TIDY=$(command -v run-clang-tidy-14 || command -v run-clang-tidy || true)
if [[ -z "$RUN_TIDY" ]]; then
  echo "check_tidy: run-clang-tidy not found (scripts/setup.sh installs clang-tidy)" >&2
  exit 2
fi
if [[ ! -f "$BUILD_DIR/compile_commands.json" ]]; then
  echo "check_tidy: $BUILD_DIR/compile_commands.json missing: run scripts/build.sh first" >&2
  exit 2
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
root=$(pwd)
files=("^$root/(src|include)/")
if (($#)); then
  files=()
  for f in "$@"; do files+=("^$root/${f#./}\$"); done
fi
"$RUN_TIDY" -p "$BUILD_DIR" -j "${MOESHARD_JOBS:-2}" -quiet "${files[@]}" >"$log" 2>&1 || true
# Warnings in our files (system and third-party headers are filtered by HeaderFilterRegex).
warnings=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E "^$root/(src|include)/.*: (warning|error):" | sort -u || true)
if [[ -n "$warnings" ]]; then
  echo "$warnings"
  echo "check_tidy: $(echo "$warnings" | wc -l) clang-tidy finding(s); fix them or, where a check is wrong for this code, say why in a NOLINT" >&2
  exit 1
fi
echo "check_tidy: clean" >&2
