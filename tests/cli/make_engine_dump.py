#!/usr/bin/env python3
"""Test generator: an engine dump written from a moeshard ownership map, with one controlled
mutation reproducing an engine bug (tests/cli/CMakeLists.txt, docs/ownership.md).

usage: make_engine_dump.py MOESHARD OUT_DIR [--replicate N] [--wrap-expert-end] -- PLAN ARGS...
  PLAN ARGS           the `moeshard plan` flags of the engine's (buggy or fixed) layout
  --replicate N       the dump's world is N x the plan's; rank r holds what plan rank r % W
                      holds (an engine that divides by tp where it must divide by dp*pcp*tp)
  --wrap-expert-end   expert ranges end at end % num_experts (the last EP rank loads [b:0))
  --even-split        routed experts' I split evenly over MoE TP, ignoring quantization groups
                      (gpt-oss-120b TP4: 720 rows a rank; scale groups straddle ranks), the
                      allocated shapes unchanged
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts"))
import dump_named_parameters as dnp  # noqa: E402

TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "U8": "uint8",
                "I8": "int8", "I32": "int32", "I64": "int64", "F8_E4M3": "float8_e4m3fn",
                "F8_E8M0": "float8_e8m0fnu", "BOOL": "bool"}


def even_split(t, s, moe_tp, part):
    """The slice s of routed tensor t as an even split of its block over moe_tp parts."""
    block = t["logical_shape"][s["dim"]] // t.get("sections", 1)
    width = block // moe_tp
    return dict(s, begin=part * width, end=(part + 1) * width)


def params_of(rank_map, num_experts, wrap, moe_tp=None):
    out = []
    for t in rank_map["tensors"]:
        slices = [dict(s) for s in t["slices"]]
        if moe_tp and t["category"] == "routed_experts":
            slices = [s if s["dim"] == 0 else even_split(t, s, moe_tp,
                                                         rank_map["coords"]["moe_tp_rank"])
                      for s in slices]
        if wrap:
            for s in slices:
                if t["category"] == "routed_experts" and s["dim"] == 0 and "end" in s:
                    s["end"] = s["end"] % num_experts
        for layer in t.get("layers") or [None]:
            name = t["name"] if layer is None else t["name"].replace("{layer}", str(layer))
            out.append(dnp.param_record(name, t["padded_shape"],
                                        TORCH_DTYPES.get(t["dtype"], t["dtype"]), slices,
                                        t["padding"]))
    return out


def main(argv):
    sep = argv.index("--")
    moeshard, out_dir, opts, plan_args = argv[1], argv[2], argv[3:sep], argv[sep + 1:]
    replicate = int(opts[opts.index("--replicate") + 1]) if "--replicate" in opts else 1
    wrap = "--wrap-expert-end" in opts
    even = "--even-split" in opts
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    map_path = os.path.join(out_dir, "ownership.map")
    subprocess.run([moeshard, "plan", *plan_args, "--ownership", map_path],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    with open(map_path) as f:
        own = json.load(f)
    world = own["topology"]["world"]
    for rank in range(world * replicate):
        params = params_of(own["ranks"][rank % world], own["num_experts"], wrap,
                           own["topology"]["moe_tp"] if even else None)
        dnp.write_rank_record(dnp.rank_record(rank, world * replicate, params, "test"), out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
