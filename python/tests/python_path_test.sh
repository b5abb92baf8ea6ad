#!/usr/bin/env bash
# scripts/python_path.sh makes a plain `python3 -c "import moeshard"` find this build's module:
# run with a scratch HOME (its user site-packages), then import from / without PYTHONPATH.
# Usage: python_path_test.sh BUILD_DIR PYTHON
set -euo pipefail
build=$1 py=$2
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
cd /
if HOME=$home env -u PYTHONPATH "$py" -c "import moeshard" 2>/dev/null; then
  echo "python_path_test: moeshard imports before the script ran; the test proves nothing" >&2
  exit 1
fi
HOME=$home MOESHARD_BUILD_DIR=$build "$(dirname "$0")/../../scripts/python_path.sh"
HOME=$home env -u PYTHONPATH "$py" -c "
import moeshard, os, sys
want = os.path.realpath(sys.argv[1])
got = os.path.realpath(moeshard.__file__)
assert got.startswith(want + os.sep), (got, want)
assert moeshard.plan('tiny-qwen3-moe', tp=2).to_dict()['ranks']
" "$build/python"
echo "python_path_test: ok"
