#!/usr/bin/env python3
"""Issue 16's EPLB line, end to end through the CLI: a skewed (Zipf) expert load recorded by
`moeshard run --routing-simulation zipf --expert-load-out`, EPLB placement from it lowers the
per-rank max/mean load in the plan, the EPLB run verifies against one rank with replicas
serving tokens, and the hottest expert's tokens are split over its replicas (measured per slot).

    eplb_recorded_load_test.py MOESHARD WORKDIR
"""
import json
import os
import re
import subprocess
import sys

MODEL = ["--model", "tiny-qwen3-moe", "--dp", "4", "-ep"]
ROUTING = ["--routing-simulation", "zipf:1.2", "--tokens", "96", "--seed", "5"]


def run(moeshard, *args):
    p = subprocess.run([moeshard, *args], capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"FAIL: moeshard {' '.join(args)} exited {p.returncode}\n{out}")
    return out


def rank_imbalance(load, layer, ep):
    """Max over mean of the tokens each EP rank's slots served, from the recorded slots."""
    tokens = load["slot_tokens"][layer]
    per_rank = len(tokens) // ep
    ranks = [sum(tokens[r * per_rank:(r + 1) * per_rank]) for r in range(ep)]
    return max(ranks) / (sum(ranks) / ep)


def check(cond, message):
    if not cond:
        sys.exit("FAIL: " + message)


def main():
    moeshard, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    linear_path = os.path.join(work, "load-linear.json")
    eplb_path = os.path.join(work, "load-eplb.json")
    for p in (linear_path, eplb_path):
        if os.path.exists(p):
            os.remove(p)

    # 1. Record the load of a Zipf-routed run under the linear placement (3 experts a rank).
    run(moeshard, "run", *MODEL, *ROUTING, "--iters", "1", "--expert-load-out", linear_path)
    with open(linear_path) as f:
        linear = json.load(f)
    check(linear["model"] == "tiny-qwen3-moe", f"model {linear['model']!r}")
    check(len(linear["layers"]) == 2, f"{len(linear['layers'])} layers recorded, expected 2")
    for counts in linear["layers"]:
        check(len(counts) == 12, f"{len(counts)} experts counted, expected 12")
        # 4 DP ranks x 96 tokens x top-3, every (token, choice) pair once.
        check(sum(counts) == 4 * 96 * 3, f"{sum(counts)} pairs counted, expected {4 * 96 * 3}")
        check(max(counts) > 3 * min(counts), f"not skewed: {counts}")
    check(not os.path.exists(linear_path + ".tmp"), "temporary file left behind")

    # 2. EPLB from the recorded load lowers the planned max/mean rank load in every layer.
    plan = json.loads(run(moeshard, "plan", *MODEL, "--num-redundant-experts", "4",
                          "--expert-placement", "eplb", "--expert-load", linear_path,
                          "--format", "json"))
    imbalance = plan["routed_experts"]["load_imbalance"]
    for layer, (before, after) in enumerate(zip(imbalance["linear"], imbalance["placed"])):
        check(after < before, f"layer {layer}: eplb {after:.3f} not below linear {before:.3f}")

    # 3. The EPLB run on the same routing verifies against one rank and records its slots.
    out = run(moeshard, "run", *MODEL, *ROUTING, "--iters", "1", "--num-redundant-experts", "4",
              "--expert-placement", "eplb", "--expert-load", linear_path, "--verify",
              "--expert-load-out", eplb_path)
    check(re.search(r"verify against the single-rank reference.*: ok", out), out)
    with open(eplb_path) as f:
        eplb = json.load(f)
    # The same tokens and routing: the same per-expert load, whatever the placement.
    check(eplb["layers"] == linear["layers"], "the EPLB run counted another load")
    check(len(eplb["slot_experts"]) == 16, f"{len(eplb['slot_experts'])} slots, expected 16")
    for layer, counts in enumerate(eplb["layers"]):
        slots = eplb["slot_tokens"][layer]
        hot = max(range(len(counts)), key=lambda e: counts[e])
        replicas = [s for s, e in enumerate(eplb["slot_experts"]) if e == hot]
        served = [slots[s] for s in replicas]
        check(len(replicas) >= 2, f"layer {layer}: hottest expert {hot} has one slot")
        check(sum(served) == counts[hot], f"layer {layer}: slots {served} vs {counts[hot]}")
        # Split, not all on one replica: each gets at least a quarter of an even share.
        for n in served:
            check(n >= counts[hot] / (4 * len(served)),
                  f"layer {layer}: expert {hot}'s {counts[hot]} tokens split {served}")
        # Measured: the EP ranks' loads are more even than under the linear placement.
        before, after = rank_imbalance(linear, layer, 4), rank_imbalance(eplb, layer, 4)
        check(after < before,
              f"layer {layer}: measured max/mean {after:.3f} with eplb, {before:.3f} linear")
        print(f"layer {layer}: expert {hot} ({counts[hot]} tokens) over slots {replicas} "
              f"served {served}; measured rank max/mean {before:.3f} -> {after:.3f}")
    print("OK")


if __name__ == "__main__":
    main()
