#!/usr/bin/env bash
# Configures and builds moeshard into ./build with Ninja. Extra arguments go to cmake
# at configure time, e.g. scripts/build.sh -DMOESHARD_WERROR=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${MOESHARD_BUILD_DIR:-build}
JOBS=${MOESHARD_JOBS:-2}
# Always (re)configure: cheap, and picks up layers and files added since the last build.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
