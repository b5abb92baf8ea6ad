#!/usr/bin/env bash
# Builds moeshard and runs the whole test suite (unit, regression, multi-rank, MPI, short fuzz).
# Select a subset with ctest arguments, e.g. scripts/test.sh -L unit  or  -LE mpi.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir "${MOESHARD_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
