#!/usr/bin/env bash
# The main job: plan Kimi-K3 on 32 H200 GPUs with and without expert parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MOESHARD_BIN:-build/src/cli/moeshard}
echo "== Kimi-K3 on 32 x H200, TP32 without expert parallelism (routed experts split by TP) =="
"$M" plan --model kimi-k3 -tp 32 --gpu h200
echo
echo "== Kimi-K3 on 32 x H200, TP32 with expert parallelism (-ep: whole experts per GPU) =="
"$M" plan --model kimi-k3 -tp 32 -ep --gpu h200
