#!/usr/bin/env bash
# Fails when a C++ file of the repository (tracked, or new and not ignored: a file not yet added
# is checked and fixed too) differs from what clang-format (Debian 12's clang-format-14,
# the repository's .clang-format) makes of it; lists each such file and the command that fixes
# it. Usage: scripts/check_format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
if [[ -z "$CLANG_FORMAT" ]]; then
  echo "check_format: clang-format not found (scripts/setup.sh installs clang-format)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h' '*.cu' '*.cuh')
if [[ "${1:-}" == "--fix" ]]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf '%s: not clang-formatted\n' "${bad[@]}"
  echo "check_format: ${#bad[@]} of ${#files[@]} files differ; fix with: scripts/check_format.sh --fix" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted" >&2
