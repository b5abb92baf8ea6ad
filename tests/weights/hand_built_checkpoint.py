#!/usr/bin/env python3
"""Writes a sharded safetensors checkpoint by hand (stdlib only: struct + json), independently of
moeshard's writer, for the loader cross-check in hand_built_checkpoint_test.cc.

usage: hand_built_checkpoint.py PRESET_JSON SPEC_JSON OUT_DIR
       hand_built_checkpoint.py --finite PRESET_JSON OUT_DIR

--finite (gpt_oss only): every tensor of the release is derived here from config.json (no spec),
with finite values a model can run on: bf16 / f32 multiples of 1/16 in [-0.5, 0.5], MXFP4 scale
bytes 122..127 (E8M0 2^-5..2^0), blocks any byte (every E2M1 code is finite); config.json is
copied next to the shards, so `moeshard run --model OUT_DIR --checkpoint OUT_DIR` reads it.

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
    elif mt == "gpt_oss":
        # gpt-oss's release (vLLM gpt_oss.py load_weights, llama.cpp's conversion): experts fused
        # per layer, MXFP4 blocks [E, rows, in / 32, 16] (two E2M1 codes per byte) and one E8M0
        # scale byte per 32 values, gate and up interleaved by row (2j gate j, 2j + 1 up j),
        # bf16 biases, on every layer.
        E, I, H = cfg["num_local_experts"], cfg["intermediate_size"], cfg["hidden_size"]
        for layer in range(cfg["num_hidden_layers"]):
            base = "model.layers.%d.mlp.experts." % layer
            out[base + "gate_up_proj_blocks"] = ("U8", [E, 2 * I, H // 32, 16])
            out[base + "gate_up_proj_scales"] = ("U8", [E, 2 * I, H // 32])
            out[base + "gate_up_proj_bias"] = ("BF16", [E, 2 * I])
            out[base + "down_proj_blocks"] = ("U8", [E, H, I // 32, 16])
            out[base + "down_proj_scales"] = ("U8", [E, H, I // 32])
            out[base + "down_proj_bias"] = ("BF16", [E, H])
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


def gpt_oss_tensors(cfg):
    """[(name, dtype, shape)] of every tensor of a gpt-oss release: the experts above, and the
    bf16 attention (q/k/v/o with biases, sinks), router (with bias), norms, embedding and head."""
    H, V, E = cfg["hidden_size"], cfg["vocab_size"], cfg["num_local_experts"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    out = [("model.embed_tokens.weight", "BF16", [V, H]), ("lm_head.weight", "BF16", [V, H]),
           ("model.norm.weight", "BF16", [H])]
    for layer in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        out += [(p + "input_layernorm.weight", "BF16", [H]),
                (p + "post_attention_layernorm.weight", "BF16", [H]),
                (p + "self_attn.sinks", "BF16", [cfg["num_attention_heads"]]),
                (p + "mlp.router.weight", "BF16", [E, H]), (p + "mlp.router.bias", "BF16", [E])]
        for n, rows, cols in (("q_proj", q, H), ("k_proj", kv, H), ("v_proj", kv, H),
                              ("o_proj", H, q)):
            out += [(p + "self_attn.%s.weight" % n, "BF16", [rows, cols]),
                    (p + "self_attn.%s.bias" % n, "BF16", [rows])]
    out += [(n, d, shape) for n, (d, shape) in expert_tensors(cfg).items()]
    return out


def finite_bytes(name, dtype, nbytes):
    """Values a model runs on (see --finite), from the same name-seeded pattern."""
    s = sum(name.encode()) & 0xFF
    if dtype in ("BF16", "F32"):
        width = DTYPE_BYTES[dtype]
        out = bytearray()
        for k in range(nbytes // width):
            f32 = struct.pack("<f", (((s + 7 * k + (k >> 4)) % 17) - 8) / 16.0)
            out += f32[2:] if dtype == "BF16" else f32  # bf16: the high half of an exact f32
        return bytes(out)
    if name.endswith("_scales"):
        return bytes(122 + (s + k) % 6 for k in range(nbytes))
    return tensor_bytes(name, nbytes)


FINITE = False  # set by --finite


def write_shard(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, dtype, shape in tensors:
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        blobs.append(finite_bytes(name, dtype, n) if FINITE else tensor_bytes(name, n))
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    global FINITE
    if len(sys.argv) == 4 and sys.argv[1] == "--finite":
        FINITE = True
        with open(sys.argv[2]) as f:
            cfg = json.load(f)
        if cfg.get("model_type") != "gpt_oss":
            sys.exit("hand_built_checkpoint.py --finite: gpt_oss configs only")
        spec = [{"name": n, "dtype": d, "shape": shape} for n, d, shape in gpt_oss_tensors(cfg)]
        out_dir = sys.argv[3]
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
    elif len(sys.argv) == 4:
        with open(sys.argv[1]) as f:
            cfg = json.load(f)
        with open(sys.argv[2]) as f:
            spec = json.load(f)
        out_dir = sys.argv[3]
    else:
        sys.exit(__doc__)
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
