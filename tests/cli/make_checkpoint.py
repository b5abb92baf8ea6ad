#!/usr/bin/env python3
"""Writes a small Hugging Face style checkpoint for a moeshard preset, independently of moeshard's
writer: config.json, two safetensors shards and model.safetensors.index.json. Tensor names and
shapes come from `moeshard plan --tensors --format json` of the 1-rank plan (non-routed
tensors) plus per-expert gate/up/down projections; data is zeros. One extra tensor the model
does not know is added, so the planner must list it.

usage: make_checkpoint.py MOESHARD PRESET_JSON OUT_DIR
"""
import json, os, struct, subprocess, sys

moeshard, preset_json, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
with open(preset_json) as f:
    config = json.load(f)
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f)
plan = json.loads(subprocess.check_output(
    [moeshard, "plan", "--model", out, "--moe-backend", "moeshard-cpu", "--tensors", "--format",
     "json", "--gpu-memory", "1000"]))
text = config.get("text_config", config)
sizes = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}
tensors = []  # (name, dtype, shape)
for t in plan["ranks"][0]["tensors"]:
    if t["category"] == "routed_experts":
        continue
    for layer in t.get("layers", [None]):
        name = t["name"] if layer is None else t["name"].replace("{layer}", str(layer))
        tensors.append((name, t["dtype"], t["logical_shape"]))
I = text.get("moe_intermediate_size", text.get("intermediate_size"))
H = text["hidden_size"]
E = text.get("num_experts", text.get("num_local_experts"))
for layer in range(text["num_hidden_layers"]):
    if any(t[0].startswith(f"model.layers.{layer}.mlp.gate.") or
           t[0].startswith(f"model.layers.{layer}.block_sparse_moe.gate.") for t in tensors):
        mixtral = config.get("model_type") == "mixtral"
        projs = ((("w1", [I, H]), ("w3", [I, H]), ("w2", [H, I])) if mixtral else
                 (("gate_proj", [I, H]), ("up_proj", [I, H]), ("down_proj", [H, I])))
        prefix = "block_sparse_moe" if mixtral else "mlp"
        for e in range(E):
            for proj, shape in projs:
                tensors.append((f"model.layers.{layer}.{prefix}.experts.{e}.{proj}.weight", "BF16", shape))
tensors.append(("model.vision_tower.patch_embed.weight", "BF16", [4, 4]))

def write(path, items):
    header, offset = {}, 0
    for name, dtype, shape in items:
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.write(b"\0" * offset)
    return offset

half = len(tensors) // 2
weight_map, total = {}, 0
for i, part in enumerate((tensors[:half], tensors[half:])):
    fname = f"model-0000{i + 1}-of-00002.safetensors"
    total += write(os.path.join(out, fname), part)
    for name, _, _ in part:
        weight_map[name] = fname
with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
print(f"wrote {len(tensors)} tensors, {total} bytes to {out}")
