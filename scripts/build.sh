#!/usr/bin/env bash
# Configures (once) and builds moeshard into ./build with Ninja. Extra arguments go to cmake
# at configure time, e.g. scripts/build.sh -DMOESHARD_WERROR=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${MOESHARD_BUILD_DIR:-build}
JOBS=${MOESHARD_JOBS:-2}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
