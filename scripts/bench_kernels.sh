#!/usr/bin/env bash
# Builds moeshard and runs the CPU MoE kernel benchmark (`moeshard bench kernels`), writing the
# JSON report to bench-kernels.json (or $1). Extra arguments after the file go to the command,
# e.g. scripts/bench_kernels.sh out.json --quick --shapes qwen3-30b-a3b.
# Run it on an otherwise idle machine: the ratios compare against bandwidth and peak measured in
# the same run, and other load depresses both unevenly.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-kernels.json}
shift || true
BUILD_DIR=${MOESHARD_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j "${MOESHARD_JOBS:-2}" --target moeshard
echo "load average before: $(cat /proc/loadavg)"
"$BUILD_DIR"/src/cli/moeshard bench kernels --json "$OUT" "$@"
