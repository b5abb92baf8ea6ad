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
echo
# Then run it: a scaled-down Kimi-K3-shaped model (tiny-kimi-k3: latent MoE 256 -> 128, SiTU,
# sigmoid noaux_tc routing, 2 shared experts, MXFP4 experts) on 4 local ranks, verified against
# the single-rank reference on the same layout-invariant dummy weights. `moeshard run --verify`
# exits non-zero when the sharded output leaves the bf16 tolerance, and so does this script.
echo "== tiny-kimi-k3 on 4 local ranks with expert parallelism (TP4 EP4), verified =="
"$M" run --model tiny-kimi-k3 -tp 4 -ep --load-format dummy --tokens 64 --verify
echo
echo "== tiny-kimi-k3 on 4 local ranks with tensor parallelism (TP4, experts split by I), verified =="
"$M" run --model tiny-kimi-k3 -tp 4 --load-format dummy --tokens 64 --verify
