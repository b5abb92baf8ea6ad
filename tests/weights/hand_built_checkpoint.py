#!/usr/bin/env python3
"""Writes a sharded safetensors checkpoint by hand (stdlib only: struct + json), independently of
moeshard's writer, for the loader cross-check in hand_built_checkpoint_test.cc.

usage: hand_built_checkpoint.py PRESET_JSON SPEC_JSON OUT_DIR

SPEC_JSON lists the tensors moeshard expects ([{"name", "dtype", "shape"}, ...]). The routed
experts' names, dtypes and shapes are re-derived here from the preset's config.json, with this
script's own knowledge of each family's checkpoint naming, and must agree with the spec (exit 1
otherwise). Byte k of the tensor named n is (sum of n's bytes + 7 k + k // 256) mod 256. Tensors
alternate between two shards tied together by model.safetensors.index.json.
"""
import json
import os
import struct
import sys

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I32": 4}


def expert_tensors(cfg):
    """{name: (dtype, shape)} of every routed-expert tensor, per family."""
    mt = cfg["model_type"]
    out = {}
    if mt == "kimi_k3":
        t = cfg["text_config"]
        prefix, E, I = "language_model.", t["num_experts"], t["moe_intermediate_size"]
        H, first, L = t["routed_expert_hidden_size"], t["first_k_dense_replace"], t["num_hidden_layers"]
        fmt = "mxfp4"
        # The release: block_sparse_moe, experts w1 (gate) / w3 (up) / w2 (down)
        # (shared/reference/checkpoints.md).
        module, projs = "block_sparse_moe", ("w1", "w3", "w2")
    elif mt == "deepseek_v3":
        prefix, E, I, H = "", cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
        first, L = cfg["first_k_dense_replace"], cfg["num_hidden_layers"]
        fmt = "fp8" if cfg.get("quantization_config", {}).get("quant_method") == "fp8" else "bf16"
        module, projs = "mlp", ("gate_proj", "up_proj", "down_proj")
    elif mt in ("qwen3_moe", "qwen3_next"):  # Qwen3-Next keeps Qwen3-MoE's expert names
        prefix, E, I, H = "", cfg["num_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
        first, L, fmt = 0, cfg["num_hidden_layers"], "bf16"
        module, projs = "mlp", ("gate_proj", "up_proj", "down_proj")
    elif mt == "qwen3_5_moe":
        # Qwen3.5-MoE bf16 (vLLM qwen3_5.py; on-disk layout per sglang-jax #1251, miles #1317):
        # experts fused per layer and out-major under model.language_model., gate_up_proj
        # [E, 2I, H] (gate rows, then up) and down_proj [E, H, I], no ".weight" leaf, every layer.
        t = cfg["text_config"]
        E, I, H, L = t["num_experts"], t["moe_intermediate_size"], t["hidden_size"], t["num_hidden_layers"]
        for layer in range(L):
            base = "model.language_model.layers.%d.mlp.experts." % layer
            out[base + "gate_up_proj"] = ("BF16", [E, 2 * I, H])
            out[base + "down_proj"] = ("BF16", [E, H, I])
        return out
    elif mt == "llama4":
        # Llama-4 (vLLM llama4.py): experts fused per layer and stored input-major, gate_up_proj
        # [E, H, 2I] (gate columns, then up) and down_proj [E, I, H], with no ".weight" leaf, on
        # every interleave_moe_layer_step-th layer.
        t = cfg["text_config"]
        E, I, H, L = t["num_local_experts"], t["intermediate_size"], t["hidden_size"], t["num_hidden_layers"]
        step = t.get("interleave_moe_layer_step", 1)
        for layer in range(step - 1, L, step):
            base = "language_model.model.layers.%d.feed_forward.experts." % layer
            out[base + "gate_up_proj"] = ("BF16", [E, H, 2 * I])
            out[base + "down_proj"] = ("BF16", [E, I, H])
        return out
    else:
        sys.exit("hand_built_checkpoint.py: unsupported model_type " + mt)

    def add(name, out_dim, in_dim):
        if fmt == "bf16":
            out[name + ".weight"] = ("BF16", [out_dim, in_dim])
        elif fmt == "fp8":
            out[name + ".weight"] = ("F8_E4M3", [out_dim, in_dim])
            out[name + ".weight_scale_inv"] = ("F32", [-(-out_dim // 128), -(-in_dim // 128)])
        else:  # compressed-tensors MXFP4: two E2M1 codes per byte, one E8M0 scale per 32
            out[name + ".weight_packed"] = ("U8", [out_dim, in_dim // 2])
            out[name + ".weight_scale"] = ("U8", [out_dim, in_dim // 32])

    for layer in range(first, L):
        for e in range(E):
            base = "%smodel.layers.%d.%s.experts.%d." % (prefix, layer, module, e)
            add(base + projs[0], I, H)
            add(base + projs[1], I, H)
            add(base + projs[2], H, I)
    return out


def tensor_bytes(name, nbytes):
    s = sum(name.encode()) & 0xFF
    return bytes((s + 7 * k + (k >> 8)) & 0xFF for k in range(nbytes))


def write_shard(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, dtype, shape in tensors:
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        blobs.append(tensor_bytes(name, n))
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    with open(sys.argv[2]) as f:
        spec = json.load(f)
    out_dir = sys.argv[3]
    by_name = {t["name"]: (t["dtype"], t["shape"]) for t in spec}
    experts = expert_tensors(cfg)
    spec_experts = {n for n in by_name if ".experts." in n and "shared_experts" not in n}
    if spec_experts != set(experts):
        missing = sorted(set(experts) - spec_experts)[:3]
        extra = sorted(spec_experts - set(experts))[:3]
        sys.exit("expert names differ: moeshard lacks %s, has extra %s" % (missing, extra))
    for name, want in experts.items():
        if tuple(by_name[name]) != (want[0], want[1]):
            sys.exit("%s: moeshard expects %s, the family stores %s" % (name, by_name[name], want))
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(by_name)
    shards = {"model-00001-of-00002.safetensors": [], "model-00002-of-00002.safetensors": []}
    files = sorted(shards)
    weight_map = {}
    for i, name in enumerate(names):
        shard = files[i % 2]
        shards[shard].append((name, by_name[name][0], by_name[name][1]))
        weight_map[name] = shard
    for shard, tensors in shards.items():
        write_shard(os.path.join(out_dir, shard), tensors)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    main()
