#!/usr/bin/env bash
# Puts the moeshard Python module of this checkout's build on the import path of the Python it
# was built for (CMake's Python3_EXECUTABLE, /usr/bin/python3 on Debian), so that
# `python3 -c "import moeshard"` works without PYTHONPATH: a one-line `moeshard.pth` in that
# Python's user site-packages naming build/python (the way an editable install points at a
# tree). Rerun it from another checkout to point there instead; `rm` the printed file to undo.
# A virtual environment is the other way: `pip install .` (docs/python.md).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${MOESHARD_BUILD_DIR:-build}
module_dir=$(cd "$BUILD_DIR" && pwd)/python
if ! ls "$module_dir"/moeshard/_core*.so >/dev/null 2>&1; then
  echo "python_path: no moeshard module under $module_dir (scripts/build.sh builds it when pybind11-dev and python3-dev are installed)" >&2
  exit 1
fi
py=$(sed -n 's/^_Python3_EXECUTABLE:INTERNAL=//p' "$BUILD_DIR/CMakeCache.txt")
py=${py:-/usr/bin/python3}
site=$("$py" -c 'import site, sys; sys.exit(0 if site.ENABLE_USER_SITE else 1); ' 2>/dev/null &&
  "$py" -m site --user-site) || {
  echo "python_path: $py has no user site-packages; use PYTHONPATH=$module_dir or pip install ." >&2
  exit 1
}
mkdir -p "$site"
tmp=$(mktemp "$site/.moeshard.pth.XXXXXX")
echo "$module_dir" >"$tmp"
mv "$tmp" "$site/moeshard.pth"
"$py" -c "import moeshard" || { echo "python_path: $py still cannot import moeshard" >&2; exit 1; }
echo "python_path: $py imports moeshard from $module_dir ($site/moeshard.pth)"
