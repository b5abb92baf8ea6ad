#!/usr/bin/env python3
"""Header-exact copies of released Hugging Face MoE checkpoints.

A *header-exact copy* of a release is a directory that holds

* the release's ``config.json`` (``configs/<release>.json`` beside this script),
* the release's shard file names, each shard a valid safetensors file whose 8-byte
  little-endian header length and JSON header list the tensors the release stores in that
  shard (names, dtypes, shapes, ``data_offsets`` contiguous from 0, ``__metadata__``
  ``{"format": "pt"}``), with the data region left as a sparse hole (the file is truncated
  to its full apparent size, so it occupies almost no disk), and
* ``model.safetensors.index.json`` (``{"metadata": {"total_size": N}, "weight_map": ...}``).

It encodes published facts about what each release stores and is independent of moeshard,
so moeshard's model descriptors can be tested against it.  Sources of every fact are cited
next to the code that encodes it and collected in README.md beside this script.

Usage::

    header_copy.py --list
    header_copy.py RELEASE --summary [--layers N]
    header_copy.py RELEASE OUT_DIR [--layers N]

``--layers N`` cuts the model to its first N decoder layers: the config's
``num_hidden_layers`` becomes N (inside ``text_config`` where the config nests one),
per-layer config lists are cut to match, and only those layers' tensors (plus the
model-level, vision and multi-token-prediction tensors) are written.  Shards keep the
release's names; only shards that receive tensors are written.

Python 3.11, standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

HERE = Path(__file__).resolve().parent
CONFIG_DIR = HERE / "configs"

# Bytes per element of each safetensors dtype used here.
DTYPE_SIZE = {"BF16": 2, "F32": 4, "I64": 8, "I32": 4, "U8": 1, "I8": 1, "F8_E4M3": 1,
              "F8_E8M0": 1}

# Position of each dtype in the safetensors library's Dtype enum (BOOL, U8, I8, F8_E5M2,
# F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64).  The library writes a file's
# tensors sorted by dtype (descending in that order) and then by name, and its header lists
# them in that order; the copy lays out each shard the same way.  Only the order of the
# data region depends on this: names, dtypes and shapes do not.
_ST_DTYPE_ORDER = {"U8": 1, "I8": 2, "F8_E4M3": 4, "F8_E8M0": 4.5, "BF16": 8, "I32": 9,
                   "F32": 11, "I64": 13}

# A tensor: (name, dtype, shape, tag).  tag says what the tensor belongs to:
#   ("layer", L)  decoder layer L (0-based)
#   ("mtp", L)    multi-token-prediction layer stored as layer index L (DeepSeek-V3: 61)
#   ("model",)    text model-level tensor (embeddings, final norm, head)
#   ("mtp_block",) a multi-token-prediction block under its own name (DeepSeek-V4: mtp.0.*),
#                 kept as it is when the model is cut
#   ("proj",)     multimodal projector
#   ("vision",)   vision tower
Tensor = tuple[str, str, tuple[int, ...], tuple]


def nbytes(dtype: str, shape: Iterable[int]) -> int:
    n = DTYPE_SIZE[dtype]
    for d in shape:
        n *= d
    return n


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def load_config(release: str) -> dict:
    with open(CONFIG_DIR / f"{release}.json", encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------
# Kimi-K3 (moonshotai/Kimi-K3)
#
# Everything here follows /work/shared/reference/checkpoints.md ("Kimi-K3"), which records
# the released headers (sources named there: SGLang models/kimi_k3.py, llama.cpp
# conversion/kimi_k3.py and PR 26185, vLLM PR 50817, TensorRT-LLM PR 17269, llm-compressor
# PR 2980).  Check: 497,220 tensors, 1,560,860,324,864 bytes, 96 shards.
# ---------------------------------------------------------------------------------------

def build_kimi_k3(cfg: dict) -> list[Tensor]:
    tc = cfg["text_config"]
    H = tc["hidden_size"]
    L = tc["num_hidden_layers"]
    lac = tc["linear_attn_config"]
    nh, hd = lac["num_heads"], lac["head_dim"]
    P = nh * hd                                   # 96 x 128 = 12288
    kconv = lac["short_conv_kernel_size"]         # 4
    # kda_layers / full_attn_layers are 1-based layer numbers.
    kda = {k - 1 for k in lac["kda_layers"]}
    mla = {k - 1 for k in lac["full_attn_layers"]}
    heads = tc["num_attention_heads"]
    q_lora, kv_lora = tc["q_lora_rank"], tc["kv_lora_rank"]
    nope, rope, vdim = tc["qk_nope_head_dim"], tc["qk_rope_head_dim"], tc["v_head_dim"]
    E = tc["num_experts"]
    I = tc["moe_intermediate_size"]               # 3072
    R = tc["routed_expert_hidden_size"]           # 3584 (latent)
    shared = tc["num_shared_experts"] * I         # 6144
    dense = tc["intermediate_size"]               # 33792
    fk = tc["first_k_dense_replace"]
    V = tc["vocab_size"]
    g = 32                                        # mxfp4 group (one E8M0 scale byte per 32)

    out: list[Tensor] = []
    for li in range(L):
        tag = ("layer", li)
        p = f"language_model.model.layers.{li}."
        t = [
            (p + "input_layernorm.weight", "BF16", (H,)),
            (p + "post_attention_layernorm.weight", "BF16", (H,)),
            # attention residuals: on every layer
            (p + "self_attention_res_norm.weight", "BF16", (H,)),
            (p + "mlp_res_norm.weight", "BF16", (H,)),
            (p + "self_attention_res_proj.weight", "BF16", (1, H)),
            (p + "mlp_res_proj.weight", "BF16", (1, H)),
        ]
        a = p + "self_attn."
        if li in kda:
            t += [
                (a + "q_proj.weight", "BF16", (P, H)),
                (a + "k_proj.weight", "BF16", (P, H)),
                (a + "v_proj.weight", "BF16", (P, H)),
                (a + "q_conv1d.weight", "F32", (P, 1, kconv)),
                (a + "k_conv1d.weight", "F32", (P, 1, kconv)),
                (a + "v_conv1d.weight", "F32", (P, 1, kconv)),
                (a + "A_log", "F32", (hd,)),      # stored as [head_dim] (128)
                (a + "dt_bias", "F32", (P,)),
                (a + "f_a_proj.weight", "BF16", (hd, H)),
                (a + "f_b_proj.weight", "BF16", (P, hd)),
                (a + "b_proj.weight", "BF16", (nh, H)),
                (a + "g_proj.weight", "BF16", (P, H)),  # use_full_rank_gate: one g_proj
                (a + "o_norm.weight", "F32", (hd,)),
                (a + "o_proj.weight", "BF16", (H, P)),
            ]
        elif li in mla:
            t += [
                (a + "q_a_proj.weight", "BF16", (q_lora, H)),
                (a + "q_a_layernorm.weight", "BF16", (q_lora,)),
                (a + "q_b_proj.weight", "BF16", (heads * (nope + rope), q_lora)),
                (a + "kv_a_proj_with_mqa.weight", "BF16", (kv_lora + rope, H)),
                (a + "kv_a_layernorm.weight", "BF16", (kv_lora,)),
                (a + "kv_b_proj.weight", "BF16", (heads * (nope + vdim), kv_lora)),
                (a + "g_proj.weight", "BF16", (heads * vdim, H)),
                (a + "o_proj.weight", "BF16", (H, heads * vdim)),
            ]
        else:
            raise ValueError(f"kimi-k3 layer {li} is neither KDA nor MLA in the config")
        if li < fk:
            m = p + "mlp."
            t += [
                (m + "gate_proj.weight", "BF16", (dense, H)),
                (m + "up_proj.weight", "BF16", (dense, H)),
                (m + "down_proj.weight", "BF16", (H, dense)),
            ]
        else:
            m = p + "block_sparse_moe."
            t += [
                (m + "gate.weight", "BF16", (E, H)),
                (m + "gate.e_score_correction_bias", "F32", (E,)),
                (m + "shared_experts.gate_proj.weight", "BF16", (shared, H)),
                (m + "shared_experts.up_proj.weight", "BF16", (shared, H)),
                (m + "shared_experts.down_proj.weight", "BF16", (H, shared)),
                # latent projections are stored BF16 (not matched by `ignore`, still BF16)
                (m + "routed_expert_down_proj.weight", "BF16", (R, H)),
                (m + "routed_expert_up_proj.weight", "BF16", (H, R)),
                (m + "routed_expert_norm.weight", "BF16", (R,)),
            ]
            for e in range(E):
                x = f"{m}experts.{e}."
                # w1 gate, w3 up: R -> I; w2 down: I -> R.  MXFP4: two values per byte,
                # one U8 scale per group of 32.
                t += [
                    (x + "w1.weight_packed", "U8", (I, R // 2)),
                    (x + "w1.weight_scale", "U8", (I, R // g)),
                    (x + "w3.weight_packed", "U8", (I, R // 2)),
                    (x + "w3.weight_scale", "U8", (I, R // g)),
                    (x + "w2.weight_packed", "U8", (R, I // 2)),
                    (x + "w2.weight_scale", "U8", (R, I // g)),
                ]
        out += [(n, d, s, tag) for n, d, s in t]

    mt = ("model",)
    out += [
        ("language_model.model.embed_tokens.weight", "BF16", (V, H), mt),
        ("language_model.model.norm.weight", "BF16", (H,), mt),
        ("language_model.model.output_attn_res_norm.weight", "BF16", (H,), mt),
        ("language_model.model.output_attn_res_proj.weight", "BF16", (1, H), mt),
        ("language_model.lm_head.weight", "BF16", (V, H), mt),
    ]

    vc = cfg["vision_config"]
    vh = vc["vt_hidden_size"]                      # 1024
    qkvh = vc["qkv_hidden_size"]                   # 1536
    vi = vc["vt_intermediate_size"]                # 4096
    ps = vc["patch_size"]
    kh, kw = vc["merge_kernel_size"]
    th = vc["text_hidden_size"]
    pt = ("proj",)
    out += [
        ("mm_projector.post_norm.weight", "BF16", (th,), pt),
        ("mm_projector.proj.0.weight", "BF16", (vh * kh * kw, vh * kh * kw), pt),
        ("mm_projector.proj.2.weight", "BF16", (th, vh * kh * kw), pt),
    ]
    vt = ("vision",)
    for b in range(vc["vt_num_hidden_layers"]):
        p = f"vision_tower.encoder.blocks.{b}."
        out += [
            (p + "wqkv.weight", "BF16", (3 * qkvh, vh), vt),
            (p + "wo.weight", "BF16", (vh, qkvh), vt),
            (p + "mlp.fc0.weight", "BF16", (vi, vh), vt),
            (p + "mlp.fc1.weight", "BF16", (vh, vi), vt),
            (p + "norm0.weight", "BF16", (vh,), vt),
            (p + "norm1.weight", "BF16", (vh,), vt),
        ]
    out += [
        ("vision_tower.encoder.final_layernorm.weight", "BF16", (vh,), vt),
        ("vision_tower.patch_embed.pos_emb.weight", "BF16",
         (vc["init_pos_emb_height"], vc["init_pos_emb_width"], vh), vt),
        ("vision_tower.patch_embed.proj.weight", "BF16", (vh, 3, ps, ps), vt),
    ]
    return out


def shard_kimi_k3(tensors: list[Tensor], n_shards: int) -> list[int]:
    # checkpoints.md: decoder layers in shards 1-93 in order (one layer per shard, layer 0
    # with its dense MLP in 1), embeddings/head/final norms in 94, projector in 95, vision
    # tower in 96.  Shard indices here are 0-based.
    fixed = {"model": n_shards - 3, "proj": n_shards - 2, "vision": n_shards - 1}
    return [t[3][1] if t[3][0] == "layer" else fixed[t[3][0]] for t in tensors]


def cut_kimi_k3(cfg: dict, n: int) -> None:
    tc = cfg["text_config"]
    tc["num_hidden_layers"] = n
    lac = tc["linear_attn_config"]
    lac["kda_layers"] = [k for k in lac["kda_layers"] if k <= n]
    lac["full_attn_layers"] = [k for k in lac["full_attn_layers"] if k <= n]


# ---------------------------------------------------------------------------------------
# DeepSeek-V3 layout (DeepSeek-V3, Kimi-K2-Thinking, Kimi-K2.5)
# ---------------------------------------------------------------------------------------

def _mla_attention(p: str, cfg: dict, linear) -> list[tuple]:
    H = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    q_lora, kv_lora = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vdim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    a = p + "self_attn."
    t = []
    if q_lora:
        t += linear(a + "q_a_proj", q_lora, H)
        t += [(a + "q_a_layernorm.weight", "BF16", (q_lora,))]
        t += linear(a + "q_b_proj", heads * (nope + rope), q_lora)
    else:  # DeepSeek-V2-Lite: q_lora_rank null, one full-rank q_proj (vLLM deepseek_v2.py)
        t += linear(a + "q_proj", heads * (nope + rope), H)
    t += linear(a + "kv_a_proj_with_mqa", kv_lora + rope, H)
    t += [(a + "kv_a_layernorm.weight", "BF16", (kv_lora,))]
    t += linear(a + "kv_b_proj", heads * (nope + vdim), kv_lora)
    t += linear(a + "o_proj", H, heads * vdim)
    return t


def _deepseek_layer(p: str, li: int, cfg: dict, attn_linear, dense_linear, expert_linear
                    ) -> list[tuple]:
    """One DeepSeek-V3-style decoder layer.  *_linear(prefix, out, in) -> tensors."""
    H = cfg["hidden_size"]
    t = [(p + "input_layernorm.weight", "BF16", (H,))]
    t += _mla_attention(p, cfg, attn_linear)
    t += [(p + "post_attention_layernorm.weight", "BF16", (H,))]
    m = p + "mlp."
    if li < cfg["first_k_dense_replace"]:
        d = cfg["intermediate_size"]
        t += dense_linear(m + "gate_proj", d, H)
        t += dense_linear(m + "up_proj", d, H)
        t += dense_linear(m + "down_proj", H, d)
    else:
        E = cfg["n_routed_experts"]
        I = cfg["moe_intermediate_size"]
        S = cfg["n_shared_experts"] * I
        # router BF16, correction bias F32 (checkpoints.md; transformers commit 2e29a9a); only
        # noaux_tc routers have the bias (DeepSeek-V2's softmax routers do not).
        t += [(m + "gate.weight", "BF16", (E, H))]
        if cfg.get("topk_method", "noaux_tc") == "noaux_tc":
            t += [(m + "gate.e_score_correction_bias", "F32", (E,))]
        t += dense_linear(m + "shared_experts.gate_proj", S, H)
        t += dense_linear(m + "shared_experts.up_proj", S, H)
        t += dense_linear(m + "shared_experts.down_proj", H, S)
        for e in range(E):
            x = f"{m}experts.{e}."
            t += expert_linear(x + "gate_proj", I, H)
            t += expert_linear(x + "up_proj", I, H)
            t += expert_linear(x + "down_proj", H, I)
    return t


def _bf16_linear(prefix: str, o: int, i: int) -> list[tuple]:
    return [(prefix + ".weight", "BF16", (o, i))]


def _fp8_linear(prefix: str, o: int, i: int) -> list[tuple]:
    # DeepSeek-V3 fp8: e4m3 weight + F32 weight_scale_inv per 128x128 block
    # (checkpoints.md; config quantization_config.weight_block_size [128, 128]).
    return [(prefix + ".weight", "F8_E4M3", (o, i)),
            (prefix + ".weight_scale_inv", "F32", (cdiv(o, 128), cdiv(i, 128)))]


def _int4_linear(shape_dtype: str):
    # compressed-tensors pack-quantized int4, group 32: eight 4-bit values per int32,
    # one BF16 scale per 32 inputs, and the logical [out, in] (checkpoints.md "Kimi-K2").
    def lin(prefix: str, o: int, i: int) -> list[tuple]:
        return [(prefix + ".weight_packed", "I32", (o, i // 8)),
                (prefix + ".weight_scale", "BF16", (o, i // 32)),
                (prefix + ".weight_shape", shape_dtype, (2,))]
    return lin


def build_deepseek_v3(cfg: dict) -> list[Tensor]:
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    L = cfg["num_hidden_layers"]
    out: list[Tensor] = [("model.embed_tokens.weight", "BF16", (V, H), ("model",))]
    for li in range(L):
        p = f"model.layers.{li}."
        out += [(n, d, s, ("layer", li)) for n, d, s in
                _deepseek_layer(p, li, cfg, _fp8_linear, _fp8_linear, _fp8_linear)]
    out += [("model.norm.weight", "BF16", (H,), ("model",)),
            ("lm_head.weight", "BF16", (V, H), ("model",))]
    for k in range(cfg.get("num_nextn_predict_layers", 0)):
        li = L + k
        p = f"model.layers.{li}."
        tag = ("mtp", li)
        # The MTP layer is a full MoE layer plus its own embedding, norms, projection and
        # head (checkpoints.md; DeepSeek-V3 README_WEIGHTS.md).  eh_proj is BF16: the
        # published R1 count of 91,991 tensors holds only with an unquantized eh_proj (no
        # weight_scale_inv), and the public DeepSeek-V3.2 header dump lists it as bf16.
        t = [(p + "embed_tokens.weight", "BF16", (V, H)),
             (p + "enorm.weight", "BF16", (H,)),
             (p + "hnorm.weight", "BF16", (H,)),
             (p + "eh_proj.weight", "BF16", (H, 2 * H))]
        moe_cfg = dict(cfg, first_k_dense_replace=0)  # the MTP layer is always MoE
        t += _deepseek_layer(p, li, moe_cfg, _fp8_linear, _fp8_linear, _fp8_linear)
        t += [(p + "shared_head.norm.weight", "BF16", (H,)),
              (p + "shared_head.head.weight", "BF16", (V, H))]
        out += [(n, d, s, tag) for n, d, s in t]
    return out


def cut_deepseek_v3(cfg: dict, n: int) -> None:
    cfg["num_hidden_layers"] = n
    # The MTP layer (stored as layer index n after the cut) is a MoE layer.  Keeping
    # first_k_dense_replace <= n keeps the config consistent with that: layers < n keep
    # their kind, and layer n reads as MoE.
    cfg["first_k_dense_replace"] = min(cfg["first_k_dense_replace"], n)


def _kimi_k2_text(cfg: dict, prefix: str, shape_dtype: str) -> list[Tensor]:
    """Kimi-K2-family text model (DeepSeek-V3 layout, int4 routed experts)."""
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    out: list[Tensor] = []
    for li in range(L):
        p = f"{prefix}model.layers.{li}."
        out += [(n, d, s, ("layer", li)) for n, d, s in
                _deepseek_layer(p, li, cfg, _bf16_linear, _bf16_linear,
                                _int4_linear(shape_dtype))]
    out += [(f"{prefix}model.embed_tokens.weight", "BF16", (V, H), ("model",)),
            (f"{prefix}model.norm.weight", "BF16", (H,), ("model",)),
            (f"{prefix}lm_head.weight", "BF16", (V, H), ("model",))]
    return out


def build_kimi_k2_thinking(cfg: dict) -> list[Tensor]:
    # checkpoints.md: weight_shape I64 [2] for K2 / K2-Thinking.
    return _kimi_k2_text(cfg, "", "I64")


# Kimi-K2.5 stores weight_shape as I32: the public header dump of moonshotai/Kimi-K2.5
# (README.md, "Sources") lists `...weight_shape` as torch.int32 [2] with 180 KB for the
# 23,040 of each projection (23,040 x 2 x 4 bytes).  checkpoints.md does not spell the
# K2.5 dtype out (it says "the same text backbone"); set this to "I64" to follow K2-Thinking.
K25_WEIGHT_SHAPE_DTYPE = "I32"


def build_kimi_k25(cfg: dict) -> list[Tensor]:
    out = _kimi_k2_text(cfg["text_config"], "language_model.", K25_WEIGHT_SHAPE_DTYPE)
    # Vision tower (MoonViT 3D) and patch-merger projector, without prefix, all BF16, as
    # listed by the public Kimi-K2.5 header dump (335 tensors; the exo PR 2167 for
    # Kimi-K2.7-Code, same vision config, also counts 335 vision_tower/mm_projector
    # tensors).  Shapes follow vision_config: hidden 1152, MLP 4304, 27 blocks, patch 14.
    vc = cfg["vision_config"]
    vh, vi = vc["vt_hidden_size"], vc["vt_intermediate_size"]
    kh, kw = vc["merge_kernel_size"]
    th = vc["text_hidden_size"]
    ps = vc["patch_size"]
    merged = vh * kh * kw                      # 4608
    pt = ("proj",)
    out += [
        ("mm_projector.pre_norm.weight", "BF16", (vh,), pt),
        ("mm_projector.pre_norm.bias", "BF16", (vh,), pt),
        ("mm_projector.proj.0.weight", "BF16", (merged, merged), pt),
        ("mm_projector.proj.0.bias", "BF16", (merged,), pt),
        ("mm_projector.proj.2.weight", "BF16", (th, merged), pt),
        ("mm_projector.proj.2.bias", "BF16", (th,), pt),
    ]
    vt = ("vision",)
    for b in range(vc["vt_num_hidden_layers"]):
        p = f"vision_tower.encoder.blocks.{b}."
        out += [
            (p + "wqkv.weight", "BF16", (3 * vh, vh), vt),
            (p + "wqkv.bias", "BF16", (3 * vh,), vt),
            (p + "wo.weight", "BF16", (vh, vh), vt),
            (p + "wo.bias", "BF16", (vh,), vt),
            (p + "mlp.fc0.weight", "BF16", (vi, vh), vt),
            (p + "mlp.fc0.bias", "BF16", (vi,), vt),
            (p + "mlp.fc1.weight", "BF16", (vh, vi), vt),
            (p + "mlp.fc1.bias", "BF16", (vh,), vt),
            (p + "norm0.weight", "BF16", (vh,), vt),
            (p + "norm0.bias", "BF16", (vh,), vt),
            (p + "norm1.weight", "BF16", (vh,), vt),
            (p + "norm1.bias", "BF16", (vh,), vt),
        ]
    out += [
        ("vision_tower.encoder.final_layernorm.weight", "BF16", (vh,), vt),
        ("vision_tower.encoder.final_layernorm.bias", "BF16", (vh,), vt),
        ("vision_tower.patch_embed.pos_emb.weight", "BF16",
         (vc["init_pos_emb_height"], vc["init_pos_emb_width"], vh), vt),
        ("vision_tower.patch_embed.proj.weight", "BF16", (vh, 3, ps, ps), vt),
        ("vision_tower.patch_embed.proj.bias", "BF16", (vh,), vt),
    ]
    return out


def shard_layer_per_file(tensors: list[Tensor], n_shards: int) -> list[int]:
    """Layer L in shard L (0-based), then text model-level, projector, vision in the next
    shards.  Kimi-K2.5 (64 shards: 61 layers, 62 embeddings/head/norm, 63 projector, 64
    vision, as its public header dump shows for layer 0, 62, 63 and 64) and, by analogy,
    Kimi-K2-Thinking (62 shards: 61 layers, then 62)."""
    n_layers = 1 + max(t[3][1] for t in tensors if t[3][0] == "layer")
    extra = {"model": n_layers, "proj": n_layers + 1, "vision": n_layers + 2}
    out = [t[3][1] if t[3][0] == "layer" else extra[t[3][0]] for t in tensors]
    if max(out) >= n_shards:
        raise ValueError("more groups than shards")
    return out


def cut_plain(cfg: dict, n: int) -> None:
    cfg["num_hidden_layers"] = n


def cut_text_config(cfg: dict, n: int) -> None:
    cfg["text_config"]["num_hidden_layers"] = n


# ---------------------------------------------------------------------------------------
# Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B) and Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1)
# ---------------------------------------------------------------------------------------

def _gqa_attention(p: str, cfg: dict, qk_norm: bool) -> list[tuple]:
    H = cfg["hidden_size"]
    nh, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    a = p + "self_attn."
    t = [(a + "q_proj.weight", "BF16", (nh * hd, H)),
         (a + "k_proj.weight", "BF16", (kv * hd, H)),
         (a + "v_proj.weight", "BF16", (kv * hd, H)),
         (a + "o_proj.weight", "BF16", (H, nh * hd))]
    if qk_norm:
        t += [(a + "q_norm.weight", "BF16", (hd,)), (a + "k_norm.weight", "BF16", (hd,))]
    return t


def _bf16_gqa_moe(cfg: dict, E: int, I: int, moe: str, projs: tuple, qk_norm: bool) -> list[Tensor]:
    """A BF16 GQA MoE model without shared experts: router `<moe>.gate`, experts
    `<moe>.experts.E.<proj>` with projs (name, gate/up or down) in the release's order."""
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    out: list[Tensor] = [("model.embed_tokens.weight", "BF16", (V, H), ("model",))]
    for li in range(L):
        p = f"model.layers.{li}."
        t = [(p + "input_layernorm.weight", "BF16", (H,))]
        t += _gqa_attention(p, cfg, qk_norm=qk_norm)
        t += [(p + "post_attention_layernorm.weight", "BF16", (H,)),
              (p + moe + ".gate.weight", "BF16", (E, H))]
        for e in range(E):
            x = f"{p}{moe}.experts.{e}."
            t += [(x + name + ".weight", "BF16", (H, I) if down else (I, H)) for name, down in projs]
        out += [(n, d, s, ("layer", li)) for n, d, s in t]
    out += [("model.norm.weight", "BF16", (H,), ("model",)),
            ("lm_head.weight", "BF16", (V, H), ("model",))]
    return out


def build_qwen3_moe(cfg: dict) -> list[Tensor]:
    # checkpoints.md "Qwen3-MoE"; every tensor BF16.
    return _bf16_gqa_moe(cfg, cfg["num_experts"], cfg["moe_intermediate_size"], "mlp",
                         (("gate_proj", False), ("up_proj", False), ("down_proj", True)),
                         qk_norm=True)


def cut_qwen3_moe(cfg: dict, n: int) -> None:
    cfg["num_hidden_layers"] = n
    cfg["mlp_only_layers"] = [x for x in cfg.get("mlp_only_layers", []) if x < n]


def build_mixtral(cfg: dict) -> list[Tensor]:
    # checkpoints.md "Mixtral": block_sparse_moe.gate, experts.E.{w1,w2,w3} (w1 gate,
    # w3 up, w2 down), BF16.
    return _bf16_gqa_moe(cfg, cfg["num_local_experts"], cfg["intermediate_size"],
                         "block_sparse_moe", (("w1", False), ("w2", True), ("w3", False)),
                         qk_norm=False)


# ---------------------------------------------------------------------------------------
# gpt-oss-20b / gpt-oss-120b (openai/gpt-oss-*)
# ---------------------------------------------------------------------------------------

# Per-layer tensor order of the released gpt-oss index (openai/gpt-oss-20b
# model.safetensors.index.json, public copy cited in README.md).
_GPT_OSS_LAYER_ORDER = [
    "input_layernorm.weight",
    "self_attn.o_proj.bias", "self_attn.o_proj.weight",
    "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.sinks",
    "mlp.router.bias", "mlp.router.weight",
    "mlp.experts.gate_up_proj_bias", "mlp.experts.gate_up_proj_blocks",
    "mlp.experts.gate_up_proj_scales",
    "mlp.experts.down_proj_bias", "mlp.experts.down_proj_blocks",
    "mlp.experts.down_proj_scales",
    "post_attention_layernorm.weight",
]


def build_gpt_oss(cfg: dict) -> list[Tensor]:
    # checkpoints.md "gpt-oss": fused MXFP4 experts (U8 blocks of 16 bytes = 32 values,
    # U8 E8M0 scales per 32), BF16 biases, BF16 sinks [num_heads], everything else BF16.
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    E, I = cfg["num_local_experts"], cfg["intermediate_size"]
    nh, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    shapes = {
        "input_layernorm.weight": ("BF16", (H,)),
        "post_attention_layernorm.weight": ("BF16", (H,)),
        "self_attn.q_proj.weight": ("BF16", (nh * hd, H)),
        "self_attn.q_proj.bias": ("BF16", (nh * hd,)),
        "self_attn.k_proj.weight": ("BF16", (kv * hd, H)),
        "self_attn.k_proj.bias": ("BF16", (kv * hd,)),
        "self_attn.v_proj.weight": ("BF16", (kv * hd, H)),
        "self_attn.v_proj.bias": ("BF16", (kv * hd,)),
        "self_attn.o_proj.weight": ("BF16", (H, nh * hd)),
        "self_attn.o_proj.bias": ("BF16", (H,)),
        "self_attn.sinks": ("BF16", (nh,)),
        "mlp.router.weight": ("BF16", (E, H)),
        "mlp.router.bias": ("BF16", (E,)),
        "mlp.experts.gate_up_proj_blocks": ("U8", (E, 2 * I, H // 32, 16)),
        "mlp.experts.gate_up_proj_scales": ("U8", (E, 2 * I, H // 32)),
        "mlp.experts.gate_up_proj_bias": ("BF16", (E, 2 * I)),
        "mlp.experts.down_proj_blocks": ("U8", (E, H, I // 32, 16)),
        "mlp.experts.down_proj_scales": ("U8", (E, H, I // 32)),
        "mlp.experts.down_proj_bias": ("BF16", (E, H)),
    }
    assert set(shapes) == set(_GPT_OSS_LAYER_ORDER)
    out: list[Tensor] = []
    # The released index lists layers in string order (0, 1, 10, 11, ..., 19, 2, 20, ...)
    # and fills the shards in that order; the model-level tensors come last.
    for li in sorted(range(L), key=str):
        for suffix in _GPT_OSS_LAYER_ORDER:
            d, s = shapes[suffix]
            out.append((f"model.layers.{li}.{suffix}", d, s, ("layer", li)))
    out += [("model.embed_tokens.weight", "BF16", (V, H), ("model",)),
            ("model.norm.weight", "BF16", (H,), ("model",)),
            ("lm_head.weight", "BF16", (V, H), ("model",))]
    return out


def shard_gpt_oss_20b(tensors: list[Tensor], n_shards: int) -> list[int]:
    # The released openai/gpt-oss-20b index (public copy, README.md): shard 00000 holds the
    # tensors up to and including model.layers.18.self_attn.v_proj.bias, shard 00001 the
    # next ones up to and including model.layers.6.mlp.experts.gate_up_proj_bias, shard
    # 00002 the rest, in the order build_gpt_oss() produces.
    starts = ["model.layers.18.self_attn.q_proj.weight",
              "model.layers.6.mlp.experts.gate_up_proj_blocks"]
    assert n_shards == len(starts) + 1
    out, cur = [], 0
    for name, *_ in tensors:
        if cur < len(starts) and name == starts[cur]:
            cur += 1
        out.append(cur)
    assert cur == len(starts), "gpt-oss-20b split points not found"
    return out


def cut_gpt_oss(cfg: dict, n: int) -> None:
    cfg["num_hidden_layers"] = n
    cfg["layer_types"] = cfg["layer_types"][:n]


# ---------------------------------------------------------------------------------------
# DeepSeek-V2-Lite, Qwen1.5-MoE-A2.7B, GLM-4.5-Air, MiniMax-M2: tensor names, shapes and
# dtypes as vLLM's loaders read them (deepseek_v2.py, qwen2_moe.py, glm4_moe.py,
# minimax_m2.py) and third-party header listings; these releases' shard counts and file names
# were not verified here (no hub access): the counts below are assumptions, and the copies
# are header-exact in names, dtypes and shapes only.
# ---------------------------------------------------------------------------------------

def build_deepseek_v2(cfg: dict) -> list[Tensor]:
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    out: list[Tensor] = [("model.embed_tokens.weight", "BF16", (V, H), ("model",))]
    for li in range(L):
        out += [(n, d, s, ("layer", li)) for n, d, s in _deepseek_layer(
            f"model.layers.{li}.", li, cfg, _bf16_linear, _bf16_linear, _bf16_linear)]
    out += [("model.norm.weight", "BF16", (H,), ("model",)),
            ("lm_head.weight", "BF16", (V, H), ("model",))]
    return out


def _gqa_biased(p: str, cfg: dict, qk_norm: bool) -> list[tuple]:
    """GQA with q/k/v biases and no o bias (Qwen2Attention, Glm4MoeAttention)."""
    H, nh, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    a = p + "self_attn."
    return _gqa_attention(p, cfg, qk_norm) + [
        (a + "q_proj.bias", "BF16", (nh * hd,)), (a + "k_proj.bias", "BF16", (kv * hd,)),
        (a + "v_proj.bias", "BF16", (kv * hd,))]


def build_qwen2_moe(cfg: dict) -> list[Tensor]:
    # Qwen2MoeSparseMoeBlock: router mlp.gate, experts, one shared_expert and its [1, H] gate.
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    E, I, S = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    out: list[Tensor] = [("model.embed_tokens.weight", "BF16", (V, H), ("model",))]
    for li in range(L):
        p = f"model.layers.{li}."
        m = p + "mlp."
        t = [(p + "input_layernorm.weight", "BF16", (H,))]
        t += _gqa_biased(p, cfg, qk_norm=False)
        t += [(p + "post_attention_layernorm.weight", "BF16", (H,)),
              (m + "gate.weight", "BF16", (E, H)),
              (m + "shared_expert.gate_proj.weight", "BF16", (S, H)),
              (m + "shared_expert.up_proj.weight", "BF16", (S, H)),
              (m + "shared_expert.down_proj.weight", "BF16", (H, S)),
              (m + "shared_expert_gate.weight", "BF16", (1, H))]
        for e in range(E):
            x = f"{m}experts.{e}."
            t += [(x + "gate_proj.weight", "BF16", (I, H)), (x + "up_proj.weight", "BF16", (I, H)),
                  (x + "down_proj.weight", "BF16", (H, I))]
        out += [(n, d, s, ("layer", li)) for n, d, s in t]
    out += [("model.norm.weight", "BF16", (H,), ("model",)),
            ("lm_head.weight", "BF16", (V, H), ("model",))]
    return out


def build_olmoe(cfg: dict) -> list[Tensor]:
    # OlmoeForCausalLM (transformers modeling_olmoe.py, vLLM olmoe.py): GQA whose q_norm and
    # k_norm are RMSNorms over the whole q / k projection ([heads * head_dim], [kv * head_dim]),
    # router mlp.gate, experts mlp.experts.E.{gate,up,down}_proj, no shared expert, an untied
    # lm_head; every tensor BF16.
    H = cfg["hidden_size"]
    nh, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    out = _bf16_gqa_moe(cfg, cfg["num_experts"], cfg["intermediate_size"], "mlp",
                        (("gate_proj", False), ("up_proj", False), ("down_proj", True)),
                        qk_norm=False)
    with_norms: list[Tensor] = []
    for t in out:
        with_norms.append(t)
        if t[0].endswith(".self_attn.o_proj.weight"):
            a = t[0][: -len("o_proj.weight")]
            with_norms += [(a + "q_norm.weight", "BF16", (nh * hd,), t[3]),
                           (a + "k_norm.weight", "BF16", (kv * hd,), t[3])]
    return with_norms


def build_glm4_moe(cfg: dict) -> list[Tensor]:
    # Glm4MoeDecoderLayer: dense first_k_dense_replace layers, then mlp.gate (+ F32
    # e_score_correction_bias), shared_experts and experts.  The MTP layer
    # (num_nextn_predict_layers) follows vLLM glm4_moe_mtp.py: a MoE decoder layer at index
    # num_hidden_layers plus enorm, hnorm, eh_proj [H, 2H], shared_head.{norm, head} and its
    # own embed_tokens (vLLM reads it from the first MTP layer; assumed present).
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    E, I = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    S, D = cfg["n_shared_experts"] * I, cfg["intermediate_size"]
    out: list[Tensor] = [("model.embed_tokens.weight", "BF16", (V, H), ("model",))]
    for li in range(L + cfg.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{li}."
        m = p + "mlp."
        t = [(p + "input_layernorm.weight", "BF16", (H,))]
        t += _gqa_biased(p, cfg, qk_norm=cfg.get("use_qk_norm", False))
        t += [(p + "post_attention_layernorm.weight", "BF16", (H,))]
        if li < cfg["first_k_dense_replace"]:
            t += [(m + "gate_proj.weight", "BF16", (D, H)), (m + "up_proj.weight", "BF16", (D, H)),
                  (m + "down_proj.weight", "BF16", (H, D))]
        else:
            t += [(m + "gate.weight", "BF16", (E, H)),
                  (m + "gate.e_score_correction_bias", "F32", (E,)),
                  (m + "shared_experts.gate_proj.weight", "BF16", (S, H)),
                  (m + "shared_experts.up_proj.weight", "BF16", (S, H)),
                  (m + "shared_experts.down_proj.weight", "BF16", (H, S))]
            for e in range(E):
                x = f"{m}experts.{e}."
                t += [(x + "gate_proj.weight", "BF16", (I, H)),
                      (x + "up_proj.weight", "BF16", (I, H)),
                      (x + "down_proj.weight", "BF16", (H, I))]
        tag = ("layer", li)
        if li >= L:
            tag = ("mtp", li)
            t += [(p + "embed_tokens.weight", "BF16", (V, H)), (p + "enorm.weight", "BF16", (H,)),
                  (p + "hnorm.weight", "BF16", (H,)), (p + "eh_proj.weight", "BF16", (H, 2 * H)),
                  (p + "shared_head.norm.weight", "BF16", (H,)),
                  (p + "shared_head.head.weight", "BF16", (V, H))]
        out += [(n, d, s, tag) for n, d, s in t]
    out += [("model.norm.weight", "BF16", (H,), ("model",)),
            ("lm_head.weight", "BF16", (V, H), ("model",))]
    return out


def build_minimax_m2(cfg: dict) -> list[Tensor]:
    # MiniMaxM2: fp8 block-quantized attention and experts (weight + F32 weight_scale_inv),
    # full-width BF16 q_norm / k_norm, F32 router block_sparse_moe.gate and F32
    # block_sparse_moe.e_score_correction_bias, experts w1 / w2 / w3.  MTP modules are left out
    # (whether the release ships them is not verified).
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    E, I = cfg["num_local_experts"], cfg["intermediate_size"]
    nh, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    out: list[Tensor] = [("model.embed_tokens.weight", "BF16", (V, H), ("model",))]
    for li in range(L):
        p = f"model.layers.{li}."
        a, m = p + "self_attn.", p + "block_sparse_moe."
        t = [(p + "input_layernorm.weight", "BF16", (H,))]
        t += _fp8_linear(a + "q_proj", nh * hd, H) + _fp8_linear(a + "k_proj", kv * hd, H)
        t += _fp8_linear(a + "v_proj", kv * hd, H) + _fp8_linear(a + "o_proj", H, nh * hd)
        t += [(a + "q_norm.weight", "BF16", (nh * hd,)), (a + "k_norm.weight", "BF16", (kv * hd,)),
              (p + "post_attention_layernorm.weight", "BF16", (H,)),
              (m + "gate.weight", "F32", (E, H)),
              (m + "e_score_correction_bias", "F32", (E,))]
        for e in range(E):
            x = f"{m}experts.{e}."
            t += _fp8_linear(x + "w1", I, H) + _fp8_linear(x + "w2", H, I) + _fp8_linear(x + "w3", I, H)
        out += [(n, d, s, ("layer", li)) for n, d, s in t]
    out += [("model.norm.weight", "BF16", (H,), ("model",)),
            ("lm_head.weight", "BF16", (V, H), ("model",))]
    return out


# ---------------------------------------------------------------------------------------
# Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct) and Qwen3.5-35B-A3B
# (Qwen/Qwen3.5-35B-A3B): tensor names, dtypes and shapes as public header dumps of the two
# releases list them (README.md, "Sources"), with the module names of vLLM's qwen3_next.py,
# qwen3_next_mtp.py, qwen3_5.py and qwen3_vl.py.
# ---------------------------------------------------------------------------------------

def _qwen_full_attention(p: str, cfg: dict) -> list[tuple]:
    # Gated attention: q_proj holds q and the per-head output gate (2 x heads x head_dim rows);
    # q_norm / k_norm over head_dim.  All BF16.
    H, nh, kv, hd = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                     cfg["head_dim"])
    a = p + "self_attn."
    return [(a + "q_proj.weight", "BF16", (2 * nh * hd, H)),
            (a + "k_proj.weight", "BF16", (kv * hd, H)),
            (a + "v_proj.weight", "BF16", (kv * hd, H)),
            (a + "o_proj.weight", "BF16", (H, nh * hd)),
            (a + "q_norm.weight", "BF16", (hd,)),
            (a + "k_norm.weight", "BF16", (hd,))]


def _qwen_gated_deltanet(p: str, cfg: dict, split: bool, small_dtype: str) -> list[tuple]:
    # Qwen3-Next: in_proj_qkvz [2 kd + 2 vd, H] and in_proj_ba [2 nv, H]; Qwen3.5: in_proj_qkv
    # [2 kd + vd, H], in_proj_z [vd, H], in_proj_b / in_proj_a [nv, H].  The depthwise conv over
    # [q, k, v] is BF16 in both; A_log [nv] and the gated norm [v_head_dim] are BF16 in
    # Qwen3-Next and F32 in Qwen3.5 (the dumps), dt_bias [nv] BF16 in both.
    H, nk, nv = cfg["hidden_size"], cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    kd, vd = nk * cfg["linear_key_head_dim"], nv * cfg["linear_value_head_dim"]
    a = p + "linear_attn."
    t = [(a + "dt_bias", "BF16", (nv,)), (a + "A_log", small_dtype, (nv,)),
         (a + "conv1d.weight", "BF16", (2 * kd + vd, 1, cfg["linear_conv_kernel_dim"]))]
    if split:
        t += [(a + "in_proj_qkv.weight", "BF16", (2 * kd + vd, H)),
              (a + "in_proj_z.weight", "BF16", (vd, H)),
              (a + "in_proj_b.weight", "BF16", (nv, H)),
              (a + "in_proj_a.weight", "BF16", (nv, H))]
    else:
        t += [(a + "in_proj_qkvz.weight", "BF16", (2 * kd + 2 * vd, H)),
              (a + "in_proj_ba.weight", "BF16", (2 * nv, H))]
    t += [(a + "norm.weight", small_dtype, (cfg["linear_value_head_dim"],)),
          (a + "out_proj.weight", "BF16", (H, vd))]
    return t


def _qwen_moe_block(p: str, cfg: dict, fused: bool) -> list[tuple]:
    # Router mlp.gate [E, H], experts (per expert [I, H] / [H, I], or fused out-major as Qwen3.5
    # stores its bf16 layers: gate_up_proj [E, 2I, H], down_proj [E, H, I]), one shared expert
    # and its [1, H] sigmoid gate.  All BF16.
    H, E = cfg["hidden_size"], cfg["num_experts"]
    I, S = cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    m = p + "mlp."
    t = [(m + "gate.weight", "BF16", (E, H))]
    if fused:
        t += [(m + "experts.gate_up_proj", "BF16", (E, 2 * I, H)),
              (m + "experts.down_proj", "BF16", (E, H, I))]
    else:
        for e in range(E):
            x = f"{m}experts.{e}."
            t += [(x + "gate_proj.weight", "BF16", (I, H)), (x + "up_proj.weight", "BF16", (I, H)),
                  (x + "down_proj.weight", "BF16", (H, I))]
    t += [(m + "shared_expert.gate_proj.weight", "BF16", (S, H)),
          (m + "shared_expert.up_proj.weight", "BF16", (S, H)),
          (m + "shared_expert.down_proj.weight", "BF16", (H, S)),
          (m + "shared_expert_gate.weight", "BF16", (1, H))]
    return t


def _qwen_hybrid_layer(p: str, li: int, cfg: dict, split: bool, small_dtype: str,
                       fused: bool) -> list[tuple]:
    H = cfg["hidden_size"]
    if "layer_types" in cfg:
        full = cfg["layer_types"][li] == "full_attention"
    else:
        full = (li + 1) % cfg.get("full_attention_interval", 4) == 0
    t = (_qwen_full_attention(p, cfg) if full
         else _qwen_gated_deltanet(p, cfg, split, small_dtype))
    t += _qwen_moe_block(p, cfg, fused)
    t += [(p + "input_layernorm.weight", "BF16", (H,)),
          (p + "post_attention_layernorm.weight", "BF16", (H,))]
    return t


def _qwen_mtp(cfg: dict) -> list[Tensor]:
    # The multi-token-prediction module both releases store under `mtp.` (vLLM
    # qwen3_next_mtp.py; Qwen3.5 has mtp_num_hidden_layers 1): fc [H, 2H] over the normed
    # embedding and hidden state, pre_fc_norm_embedding / pre_fc_norm_hidden, one decoder layer
    # with gated full attention and a per-expert MoE block (Qwen3.5 too: its MTP experts are not
    # fused), and a final norm.  All BF16.  Tagged ("mtp_apart",): kept unchanged in a cut copy.
    H = cfg["hidden_size"]
    t = [("mtp.fc.weight", "BF16", (H, 2 * H)),
         ("mtp.pre_fc_norm_embedding.weight", "BF16", (H,)),
         ("mtp.pre_fc_norm_hidden.weight", "BF16", (H,))]
    mcfg = dict(cfg, layer_types=["full_attention"])
    t += _qwen_hybrid_layer("mtp.layers.0.", 0, mcfg, False, "BF16", fused=False)
    t += [("mtp.norm.weight", "BF16", (H,))]
    return [(n, d, s, ("mtp_apart",)) for n, d, s in t]


def build_qwen3_next(cfg: dict) -> list[Tensor]:
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    out: list[Tensor] = [("model.embed_tokens.weight", "BF16", (V, H), ("model",))]
    for li in range(L):
        out += [(n, d, s, ("layer", li)) for n, d, s in
                _qwen_hybrid_layer(f"model.layers.{li}.", li, cfg, False, "BF16", fused=False)]
    out += [("model.norm.weight", "BF16", (H,), ("model",)),
            ("lm_head.weight", "BF16", (V, H), ("model",))]
    return out + _qwen_mtp(cfg)


def shard_qwen3_next(tensors: list[Tensor], n_shards: int) -> list[int]:
    # The dump: embed_tokens in shard 1, model.norm and lm_head in 40, every mtp.* tensor (1,553)
    # in 41, the decoder layers across 1-40 ("Multi Files").  Everything but the MTP module is
    # filled into shards 1-40 in model order with about equal bytes (the per-tensor split inside
    # 1-40 is not published).
    main = [t for t in tensors if t[3][0] != "mtp_apart"]
    fill = iter(shard_balanced(main, n_shards - 1))
    return [n_shards - 1 if t[3][0] == "mtp_apart" else next(fill) for t in tensors]


def build_qwen3_5_moe(cfg: dict) -> list[Tensor]:
    tc = cfg["text_config"]
    H, V, L = tc["hidden_size"], tc["vocab_size"], tc["num_hidden_layers"]
    p = "model.language_model."
    out: list[Tensor] = [(p + "embed_tokens.weight", "BF16", (V, H), ("model",))]
    for li in range(L):
        out += [(n, d, s, ("layer", li)) for n, d, s in
                _qwen_hybrid_layer(f"{p}layers.{li}.", li, tc, True, "F32", fused=True)]
    out += [(p + "norm.weight", "BF16", (H,), ("model",)),
            ("lm_head.weight", "BF16", (V, H), ("model",))]
    # The vision tower (Qwen3_VisionTransformer in vLLM qwen3_vl.py; the dump lists 333 vision
    # tensors, all BF16): Conv3d patch embedding with bias, a learned position table, `depth`
    # blocks of LayerNorms, fused qkv, proj and a two-layer MLP with biases, and the patch merger
    # over spatial_merge_size^2 patches.  No deepstack mergers (deepstack_visual_indexes []).
    vc = cfg["vision_config"]
    Hv, Iv = vc["hidden_size"], vc["intermediate_size"]
    M = Hv * vc["spatial_merge_size"] ** 2
    ps, tps = vc["patch_size"], vc["temporal_patch_size"]
    v = "model.visual."
    vt = ("vision",)
    out += [(v + "patch_embed.proj.weight", "BF16", (Hv, vc["in_channels"], tps, ps, ps), vt),
            (v + "patch_embed.proj.bias", "BF16", (Hv,), vt),
            (v + "pos_embed.weight", "BF16", (vc["num_position_embeddings"], Hv), vt)]
    for b in range(vc["depth"]):
        k = f"{v}blocks.{b}."
        out += [(k + "norm1.weight", "BF16", (Hv,), vt), (k + "norm1.bias", "BF16", (Hv,), vt),
                (k + "norm2.weight", "BF16", (Hv,), vt), (k + "norm2.bias", "BF16", (Hv,), vt),
                (k + "attn.qkv.weight", "BF16", (3 * Hv, Hv), vt),
                (k + "attn.qkv.bias", "BF16", (3 * Hv,), vt),
                (k + "attn.proj.weight", "BF16", (Hv, Hv), vt),
                (k + "attn.proj.bias", "BF16", (Hv,), vt),
                (k + "mlp.linear_fc1.weight", "BF16", (Iv, Hv), vt),
                (k + "mlp.linear_fc1.bias", "BF16", (Iv,), vt),
                (k + "mlp.linear_fc2.weight", "BF16", (Hv, Iv), vt),
                (k + "mlp.linear_fc2.bias", "BF16", (Hv,), vt)]
    out += [(v + "merger.norm.weight", "BF16", (Hv,), vt),
            (v + "merger.norm.bias", "BF16", (Hv,), vt),
            (v + "merger.linear_fc1.weight", "BF16", (M, M), vt),
            (v + "merger.linear_fc1.bias", "BF16", (M,), vt),
            (v + "merger.linear_fc2.weight", "BF16", (vc["out_hidden_size"], M), vt),
            (v + "merger.linear_fc2.bias", "BF16", (vc["out_hidden_size"],), vt)]
    return out + _qwen_mtp(tc)


def shard_size_sorted(tensors: list[Tensor], n_shards: int, limit: int = 5 * 2**30) -> list[int]:
    """Qwen3.5-35B-A3B's layout: tensors taken largest first (model order among equal sizes)
    and packed greedily into shards of at most `limit` bytes.  With 5 GiB it reproduces every
    per-tensor-family shard the public dump of the release lists (README.md): the 40 fused
    gate_up_proj in shards 1-8, embed_tokens and lm_head with 6 down_proj in 9, 10 down_proj in
    each of 10-12, the last 4 with the 8-33 MB tensors (in_proj_qkv/_z, out_proj, q/o_proj, the
    vision MLPs, the merger, mtp.fc and the MTP q/o_proj) and 5 of the 27 vision qkv in 13,
    everything smaller in 14.  Which layer's tensor lands where among equal sizes is not
    published."""
    order = sorted(range(len(tensors)), key=lambda i: -nbytes(tensors[i][1], tensors[i][2]))
    out = [0] * len(tensors)
    shard, used = 0, 0
    for i in order:
        n = nbytes(tensors[i][1], tensors[i][2])
        if used and used + n > limit:
            shard, used = shard + 1, 0
        out[i] = shard
        used += n
    if shard != n_shards - 1:
        raise AssertionError(f"size-sorted packing gave {shard + 1} shards, expected {n_shards}")
    return out


def cut_qwen3_5_moe(cfg: dict, n: int) -> None:
    tc = cfg["text_config"]
    tc["num_hidden_layers"] = n
    tc["layer_types"] = tc["layer_types"][:n]


def _names_qwen3_5(i: int, n: int) -> str:
    # Qwen3.5's shard names (the dump): model.safetensors-00001-of-00014.safetensors ...
    return f"model.safetensors-{i + 1:05d}-of-{n:05d}.safetensors"


# ---------------------------------------------------------------------------------------
# Llama-4-Scout-17B-16E (meta-llama/Llama-4-Scout-17B-16E)
#
# Names as vLLM mllama4.py / llama4.py load them and transformers' Llama4ForConditionalGeneration
# saves them (vision_model.*, multi_modal_projector.*, language_model.*), every tensor BF16: the
# Instruct release declares 108,641,793,536 parameters, all BF16 (HF model API
# safetensors.parameters.BF16), which the generator reproduces exactly.  Tensor order is the
# model's state_dict order (vision tower, projector, text model), the order save_pretrained
# fills shards in.
# ---------------------------------------------------------------------------------------

def build_llama4(cfg: dict) -> list[Tensor]:
    vc, tc = cfg["vision_config"], cfg["text_config"]
    out: list[Tensor] = []
    Hv, Iv, P = vc["hidden_size"], vc["intermediate_size"], vc["patch_size"]
    side = vc["image_size"] // P
    v, vt = "vision_model.", ("vision",)
    out += [(v + "class_embedding", "BF16", (Hv,), vt),
            (v + "positional_embedding_vlm", "BF16", (side * side + 1, Hv), vt),
            (v + "patch_embedding.linear.weight", "BF16", (Hv, vc["num_channels"] * P * P), vt),
            (v + "layernorm_pre.weight", "BF16", (Hv,), vt),
            (v + "layernorm_pre.bias", "BF16", (Hv,), vt),
            (v + "layernorm_post.weight", "BF16", (Hv,), vt),
            (v + "layernorm_post.bias", "BF16", (Hv,), vt)]
    for li in range(vc["num_hidden_layers"]):
        k = f"{v}model.layers.{li}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out += [(f"{k}self_attn.{proj}.weight", "BF16", (Hv, Hv), vt),
                    (f"{k}self_attn.{proj}.bias", "BF16", (Hv,), vt)]
        out += [(k + "mlp.fc1.weight", "BF16", (Iv, Hv), vt),
                (k + "mlp.fc1.bias", "BF16", (Iv,), vt),
                (k + "mlp.fc2.weight", "BF16", (Hv, Iv), vt),
                (k + "mlp.fc2.bias", "BF16", (Hv,), vt),
                (k + "input_layernorm.weight", "BF16", (Hv,), vt),
                (k + "input_layernorm.bias", "BF16", (Hv,), vt),
                (k + "post_attention_layernorm.weight", "BF16", (Hv,), vt),
                (k + "post_attention_layernorm.bias", "BF16", (Hv,), vt)]
    # Pixel-shuffle adapter (no biases: multi_modal_projector_bias false) and the projector.
    pin, pout = vc["projector_input_dim"], vc["projector_output_dim"]
    assert not vc.get("multi_modal_projector_bias", False)
    out += [(v + "vision_adapter.mlp.fc1.weight", "BF16", (pin, Iv), vt),
            (v + "vision_adapter.mlp.fc2.weight", "BF16", (pout, pin), vt)]
    H, V, L = tc["hidden_size"], tc["vocab_size"], tc["num_hidden_layers"]
    out += [("multi_modal_projector.linear_1.weight", "BF16", (H, vc["vision_output_dim"]),
             ("proj",))]
    p = "language_model.model."
    out += [(p + "embed_tokens.weight", "BF16", (V, H), ("model",))]
    nh, kv, hd = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    E, I, D = tc["num_local_experts"], tc["intermediate_size"], tc["intermediate_size_mlp"]
    step = tc.get("interleave_moe_layer_step", 1)
    moe_layers = set(tc.get("moe_layers", range(step - 1, L, step)))
    for li in range(L):
        k = f"{p}layers.{li}."
        # Llama4TextDecoderLayer: self_attn (the q/k norm is a weightless L2 norm), then
        # feed_forward (Llama4TextMoe: experts fused input-major, router, shared_expert; or a
        # dense MLP of intermediate_size_mlp), then the two RMSNorms.
        t = [(k + "self_attn.q_proj.weight", "BF16", (nh * hd, H)),
             (k + "self_attn.k_proj.weight", "BF16", (kv * hd, H)),
             (k + "self_attn.v_proj.weight", "BF16", (kv * hd, H)),
             (k + "self_attn.o_proj.weight", "BF16", (H, nh * hd))]
        f = k + "feed_forward."
        if li in moe_layers:
            t += [(f + "experts.gate_up_proj", "BF16", (E, H, 2 * I)),
                  (f + "experts.down_proj", "BF16", (E, I, H)),
                  (f + "router.weight", "BF16", (E, H)),
                  (f + "shared_expert.gate_proj.weight", "BF16", (I, H)),
                  (f + "shared_expert.up_proj.weight", "BF16", (I, H)),
                  (f + "shared_expert.down_proj.weight", "BF16", (H, I))]
        else:
            t += [(f + "gate_proj.weight", "BF16", (D, H)), (f + "up_proj.weight", "BF16", (D, H)),
                  (f + "down_proj.weight", "BF16", (H, D))]
        t += [(k + "input_layernorm.weight", "BF16", (H,)),
              (k + "post_attention_layernorm.weight", "BF16", (H,))]
        out += [(n, d, s, ("layer", li)) for n, d, s in t]
    out += [(p + "norm.weight", "BF16", (H,), ("model",)),
            ("language_model.lm_head.weight", "BF16", (V, H), ("model",))]
    return out


def shard_in_order(tensors: list[Tensor], n_shards: int, limit: int = 5 * 10**9) -> list[int]:
    """save_pretrained's split (huggingface_hub split_torch_state_dict_into_shards, the default
    max_shard_size "5GB" = 5e9 bytes): tensors in state_dict order, a new shard when the next
    one would take the current one past the limit.  For Llama-4-Scout this puts the vision tower,
    projector, embeddings and layer 0's attention in shard 1, the rest of layer L and layer
    L+1's attention in shard L+2, the rest of layer 47 and the final norm in 49 and lm_head
    alone in 50: the 50 file sizes of the release (README.md) follow byte for byte."""
    out, shard, used = [], 0, 0
    for t in tensors:
        n = nbytes(t[1], t[2])
        if used and used + n > limit:
            shard, used = shard + 1, 0
        out.append(shard)
        used += n
    if shard != n_shards - 1:
        raise AssertionError(f"in-order split gave {shard + 1} shards, expected {n_shards}")
    return out


def cut_llama4(cfg: dict, n: int) -> None:
    tc = cfg["text_config"]
    tc["num_hidden_layers"] = n
    if "moe_layers" in tc:
        tc["moe_layers"] = [x for x in tc["moe_layers"] if x < n]


# ---------------------------------------------------------------------------------------
# Shard assignment where the release's assignment is not published
# ---------------------------------------------------------------------------------------

def shard_balanced(tensors: list[Tensor], n_shards: int) -> list[int]:
    """Fill the release's shard count in tensor order with about equal bytes each: a tensor
    goes to the shard its byte midpoint falls in.  Order-preserving, whole tensors."""
    sizes = [nbytes(t[1], t[2]) for t in tensors]
    total = sum(sizes)
    out, cum = [], 0
    for s in sizes:
        out.append(min(n_shards - 1, (2 * cum + s) * n_shards // (2 * total)))
        cum += s
    return out


# ---------------------------------------------------------------------------------------
# DeepSeek-V4-Flash (deepseek-ai/DeepSeek-V4-Flash)
#
# DeepSeek's own names (no "model." prefix), as vLLM's _make_deepseek_v4_weights_mapper maps
# them and DeepSeek's reference inference/model.py declares them (Block, Attention, Compressor,
# Indexer, Gate, Expert, MoE, ParallelHead, MTPBlock).  Every quantized linear is
# `<module>.weight` plus `<module>.scale`: fp8 e4m3 with F8_E8M0 128 x 128 block scales, the
# routed experts packed FP4 (I8 [out, in/2], "packed I8 storage with ue8m0 scales", ROCm/ATOM
# issue 642) with F8_E8M0 scales per 32.  Checked against the released index as a third-party
# crate freezes it for the -0731 revision (same backbone): 6 model-level tensors, 1,565 /
# 1,576 / 1,569 tensors in a ratio-0 / ratio-4 / ratio-128 layer, and one layer per shard,
# whose sizes fix tid2eid as I64 (layer 0: 3,566,321,192 bytes = 3,566,148,952 of data + header).
# The 46 shard names (model-000NN-of-00046: embeddings, 43 layers, head, MTP) follow a user
# report of `model-00042-of-00046.safetensors`; the MTP block's tensors follow MTPBlock and are
# not verified.
# ---------------------------------------------------------------------------------------

def _dsv4_block(p: str, li: int, cfg: dict, ratio: int, hashed: bool) -> list[tuple]:
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, hd = cfg["num_attention_heads"], cfg["head_dim"]
    ql, ol, og = cfg["q_lora_rank"], cfg["o_lora_rank"], cfg["o_groups"]
    E, I, k = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["num_experts_per_tok"]
    hc = cfg["hc_mult"]
    mix = (2 + hc) * hc

    def fp8(name, rows, cols):
        return [(name + ".weight", "F8_E4M3", (rows, cols)),
                (name + ".scale", "F8_E8M0", (cdiv(rows, 128), cdiv(cols, 128)))]

    def fp4(name, rows, cols):
        return [(name + ".weight", "I8", (rows, cols // 2)),
                (name + ".scale", "F8_E8M0", (rows, cols // 32))]

    def compressor(c, r, width):
        w = (2 if r == 4 else 1) * width
        return [(c + "ape", "F32", (r, w)), (c + "wkv.weight", "BF16", (w, H)),
                (c + "wgate.weight", "BF16", (w, H)), (c + "norm.weight", "BF16", (width,))]

    t = [(p + "attn_norm.weight", "BF16", (H,)), (p + "ffn_norm.weight", "BF16", (H,))]
    for sub in ("attn", "ffn"):
        t += [(p + f"hc_{sub}_fn", "F32", (mix, hc * H)), (p + f"hc_{sub}_base", "F32", (mix,)),
              (p + f"hc_{sub}_scale", "F32", (3,))]
    a = p + "attn."
    t += fp8(a + "wq_a", ql, H) + [(a + "q_norm.weight", "BF16", (ql,))]
    t += fp8(a + "wq_b", nh * hd, ql) + fp8(a + "wkv", hd, H)
    t += [(a + "kv_norm.weight", "BF16", (hd,))]
    t += fp8(a + "wo_a", og * ol, nh * hd // og) + fp8(a + "wo_b", H, og * ol)
    t += [(a + "attn_sink", "F32", (nh,))]
    if ratio:
        t += compressor(a + "compressor.", ratio, hd)
    if ratio == 4:
        ih, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
        t += fp8(a + "indexer.wq_b", ih * ihd, ql)
        t += [(a + "indexer.weights_proj.weight", "BF16", (ih, H))]
        t += compressor(a + "indexer.compressor.", ratio, ihd)
    f = p + "ffn."
    t += [(f + "gate.weight", "BF16", (E, H))]
    t += [(f + "gate.tid2eid", "I64", (V, k))] if hashed else [(f + "gate.bias", "F32", (E,))]
    S = cfg["n_shared_experts"] * I
    t += fp8(f + "shared_experts.w1", S, H) + fp8(f + "shared_experts.w2", H, S)
    t += fp8(f + "shared_experts.w3", S, H)
    for e in range(E):
        x = f"{f}experts.{e}."
        t += fp4(x + "w1", I, H) + fp4(x + "w2", H, I) + fp4(x + "w3", I, H)
    return t


def build_deepseek_v4(cfg: dict) -> list[Tensor]:
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hc = cfg["hc_mult"]
    ratios = cfg["compress_ratios"]
    n_hash = cfg["num_hash_layers"]
    out: list[Tensor] = [("embed.weight", "BF16", (V, H), ("model",))]
    for li in range(L):
        out += [(n, d, s, ("layer", li)) for n, d, s in
                _dsv4_block(f"layers.{li}.", li, cfg, ratios[li], li < n_hash)]
    out += [("head.weight", "BF16", (V, H), ("model",)), ("norm.weight", "BF16", (H,), ("model",)),
            ("hc_head_fn", "F32", (hc, hc * H), ("model",)),
            ("hc_head_base", "F32", (hc,), ("model",)), ("hc_head_scale", "F32", (1,), ("model",))]
    for m in range(cfg.get("num_nextn_predict_layers", 0)):
        # MTPBlock(layer_id = L + m): a full block (its ratio the list's entry past the layers,
        # score-routed) plus e_proj / h_proj (fp8), enorm / hnorm / norm and its own hc head;
        # it shares the model's embedding and head.
        p = f"mtp.{m}."
        t = _dsv4_block(p, L + m, cfg, ratios[L + m], False)
        for proj in ("e_proj", "h_proj"):
            t += [(p + proj + ".weight", "F8_E4M3", (H, H)),
                  (p + proj + ".scale", "F8_E8M0", (cdiv(H, 128), cdiv(H, 128)))]
        t += [(p + n + ".weight", "BF16", (H,)) for n in ("enorm", "hnorm", "norm")]
        t += [(p + "hc_head_fn", "F32", (hc, hc * H)), (p + "hc_head_base", "F32", (hc,)),
              (p + "hc_head_scale", "F32", (1,))]
        out += [(n, d, s, ("mtp_block",)) for n, d, s in t]
    return out


def shard_deepseek_v4(tensors: list[Tensor], n_shards: int) -> list[int]:
    """Embeddings in the first shard, then one decoder layer per shard, the head with the final
    norm and hc head, and the MTP block last (-0731's index: 1 tensor in shard 1, a layer's
    1,565-1,576 in each of the next 43, 5 in the 45th)."""
    n_layers = 1 + max(t[3][1] for t in tensors if t[3][0] == "layer")
    out = []
    for t in tensors:
        kind = t[3][0]
        if kind == "layer":
            out.append(1 + t[3][1])
        elif kind == "mtp_block":
            out.append(n_layers + 2)
        else:
            out.append(0 if t[0] == "embed.weight" else n_layers + 1)
    if max(out) >= n_shards:
        raise ValueError("more groups than shards")
    return out


def cut_deepseek_v4(cfg: dict, n: int) -> None:
    L = cfg["num_hidden_layers"]
    cfg["num_hidden_layers"] = n
    # One ratio per layer, then the MTP block's.
    cfg["compress_ratios"] = cfg["compress_ratios"][:n] + cfg["compress_ratios"][L:]
    cfg["num_hash_layers"] = min(cfg["num_hash_layers"], n)


# ---------------------------------------------------------------------------------------
# Releases
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Release:
    key: str
    hf_repo: str
    n_shards: int
    name_fmt: Callable[[int, int], str]           # (0-based index, n_shards) -> file name
    build: Callable[[dict], list[Tensor]]
    assign: Callable[[list[Tensor], int], list[int]]
    cut: Callable[[dict, int], None]
    published: str                                # published totals, for --list / README
    # The shards' headers carry `__metadata__` {"format": "pt"} (torch's save_file); DeepSeek-V4's
    # do not (its shard sizes are matched exactly only without it).
    st_metadata: bool = True


def _names_1based(width: int, total_width: int):
    return lambda i, n: f"model-{i + 1:0{width}d}-of-{n:0{total_width}d}.safetensors"


def _names_0based(i: int, n: int) -> str:
    # gpt-oss: zero-based, "of" the last index: model-00000-of-00002 ... model-00002-of-00002
    return f"model-{i:05d}-of-{n - 1:05d}.safetensors"


RELEASES: dict[str, Release] = {r.key: r for r in [
    Release("kimi-k3", "moonshotai/Kimi-K3", 96, _names_1based(5, 6),
            build_kimi_k3, shard_kimi_k3, cut_kimi_k3,
            "497,220 tensors, 1,560,860,324,864 bytes, 96 shards"),
    Release("kimi-k2-thinking", "moonshotai/Kimi-K2-Thinking", 62, _names_1based(5, 6),
            build_kimi_k2_thinking, shard_layer_per_file, cut_plain,
            "62 shards (no published total found)"),
    Release("kimi-k2.5", "moonshotai/Kimi-K2.5", 64, _names_1based(5, 6),
            build_kimi_k25, shard_layer_per_file, cut_text_config,
            "208,550 tensors, 554.27 GiB of tensors, 64 shards (public header dump)"),
    Release("deepseek-v3", "deepseek-ai/DeepSeek-V3", 163, _names_1based(5, 6),
            build_deepseek_v3, shard_balanced, cut_deepseek_v3,
            "163 shards; R1 (same layout): 91,991 tensors, 641.29 GiB"),
    Release("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", 16, _names_1based(5, 5),
            build_qwen3_moe, shard_balanced, cut_qwen3_moe,
            "total_size 61,064,245,248, 16 shards"),
    Release("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", 19, _names_1based(5, 5),
            build_mixtral, shard_balanced, cut_plain,
            "total_size 93,405,585,408, 19 shards"),
    Release("gpt-oss-20b", "openai/gpt-oss-20b", 3, _names_0based,
            build_gpt_oss, shard_gpt_oss_20b, cut_gpt_oss,
            "total_size 13,761,264,768, 3 shards (00000-00002 of 00002)"),
    Release("gpt-oss-120b", "openai/gpt-oss-120b", 15, _names_0based,
            build_gpt_oss, shard_balanced, cut_gpt_oss,
            "tensor bytes 65,248,815,744, 15 shards (00000-00014 of 00014)"),
    # Shard counts and names assumed (not verified here); names, dtypes and shapes as above.
    Release("deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", 4, _names_1based(5, 6),
            build_deepseek_v2, shard_balanced, cut_plain,
            "shard count assumed; bf16 weights 29.26 GiB (vLLM logged 29.30 GiB)"),
    Release("qwen1.5-moe-a2.7b", "Qwen/Qwen1.5-MoE-A2.7B", 8, _names_1based(5, 5),
            build_qwen2_moe, shard_balanced, cut_plain,
            "shard count assumed; 14.3B parameters (model card)"),
    # Three shards, model-0000N-of-00003 (tinygrad examples/olmoe.py fetches exactly these);
    # which layers each holds is assumed (balanced by bytes).
    Release("olmoe-1b-7b", "allenai/OLMoE-1B-7B-0924", 3, _names_1based(5, 5),
            build_olmoe, shard_balanced, cut_plain,
            "3 shards (tinygrad's OLMoE example); layer placement assumed; 6.92B parameters"),
    Release("glm-4.5-air", "zai-org/GLM-4.5-Air", 47, _names_1based(5, 5),
            build_glm4_moe, shard_balanced, cut_deepseek_v3,
            "shard count assumed; MTP layer as vLLM glm4_moe_mtp.py reads it"),
    Release("deepseek-v4-flash", "deepseek-ai/DeepSeek-V4-Flash", 46, _names_1based(5, 5),
            build_deepseek_v4, shard_deepseek_v4, cut_deepseek_v4,
            "46 shards; -0731 (same backbone): 1,565 / 1,576 / 1,569 tensors per ratio-0 / 4 / "
            "128 layer, 6 model-level, its 45 backbone shards' sizes",
            st_metadata=False),
    Release("minimax-m2", "MiniMaxAI/MiniMax-M2", 130, _names_1based(5, 5),
            build_minimax_m2, shard_balanced, cut_plain,
            "shard count assumed; MTP modules not written"),
    # Names, dtypes, shapes, shard names and the shards of each tensor family from public header
    # dumps (README.md); the split of the decoder layers over shards 1-40 is not published.
    Release("qwen3-next-80b-a3b", "Qwen/Qwen3-Next-80B-A3B-Instruct", 41, _names_1based(5, 5),
            build_qwen3_next, shard_qwen3_next, cut_plain,
            "75,944 tensors, 81,324,862,720 parameters, 151.48 GiB of tensors, 41 shards "
            "(public header dump)"),
    Release("qwen3.5-35b-a3b", "Qwen/Qwen3.5-35B-A3B", 14, _names_qwen3_5,
            build_qwen3_5_moe, shard_size_sorted, cut_qwen3_5_moe,
            "1,811 tensors, 35,951,822,704 parameters, 66.97 GiB of tensors, 14 shards "
            "(public header dump)"),
    Release("llama-4-scout-17b-16e", "meta-llama/Llama-4-Scout-17B-16E", 50, _names_1based(5, 5),
            build_llama4, shard_in_order, cut_llama4,
            "108,641,793,536 BF16 parameters, 50 shards of 217,283,738,720 bytes "
            "(Llama-4-Scout-17B-16E-Instruct file listing)"),
]}

# Where the public header dumps put each family of tensors (README.md): a regular expression
# over the names and the 1-based shard all of them are in, or 0 where the dump says "Multi
# Files" (they span several).  Checked by --summary on the full model.
_Q35_14 = [r"model\.language_model\.layers\.\d+\.linear_attn\.(A_log|conv1d\.weight|dt_bias|"
           r"in_proj_[ab]\.weight|norm\.weight)",
           r"model\.language_model\.layers\.\d+\.(input_layernorm|post_attention_layernorm)"
           r"\.weight",
           r"model\.language_model\.layers\.\d+\.mlp\.(gate|shared_expert\.\w+|"
           r"shared_expert_gate)\.weight",
           r"model\.language_model\.layers\.\d+\.self_attn\.(k_norm|k_proj|q_norm|v_proj)"
           r"\.weight",
           r"model\.language_model\.norm\.weight",
           r"model\.visual\.blocks\.\d+\.(attn\.proj\.(bias|weight)|attn\.qkv\.bias|"
           r"mlp\.linear_fc[12]\.bias|norm[12]\.(bias|weight))",
           r"model\.visual\.merger\.(linear_fc[12]\.bias|norm\.(bias|weight))",
           r"model\.visual\.(patch_embed\.proj\.(bias|weight)|pos_embed\.weight)",
           r"mtp\.(layers\.0\.(input_layernorm|post_attention_layernorm|mlp\..*|"
           r"self_attn\.(k_norm|k_proj|q_norm|v_proj)\.weight)|norm\.weight|"
           r"pre_fc_norm_\w+\.weight)"]
_Q35_13 = [r"model\.language_model\.layers\.\d+\.linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
           r"\.weight",
           r"model\.language_model\.layers\.\d+\.self_attn\.(o_proj|q_proj)\.weight",
           r"model\.visual\.blocks\.\d+\.mlp\.linear_fc[12]\.weight",
           r"model\.visual\.merger\.linear_fc[12]\.weight",
           r"mtp\.(fc|layers\.0\.self_attn\.(o_proj|q_proj))\.weight"]
PUBLISHED_PLACEMENTS: dict[str, list[tuple[str, int]]] = {
    "qwen3-next-80b-a3b": [(r"model\.embed_tokens\.weight", 1), (r"lm_head\.weight", 40),
                           (r"model\.norm\.weight", 40), (r"mtp\..*", 41),
                           (r"model\.layers\..*", 0)],
    "qwen3.5-35b-a3b": [(r"lm_head\.weight", 9), (r"model\.language_model\.embed_tokens\.weight", 9),
                        (r"model\.language_model\.layers\.\d+\.mlp\.experts\.(gate_up|down)_proj",
                         0),
                        (r"model\.visual\.blocks\.\d+\.attn\.qkv\.weight", 0)]
                       + [(x, 14) for x in _Q35_14] + [(x, 13) for x in _Q35_13],
}


def check_placements(rel: Release, plan: Plan) -> tuple[int, list[str]]:
    """(number of tensor families checked, what differs) against PUBLISHED_PLACEMENTS."""
    import re
    rules = PUBLISHED_PLACEMENTS.get(rel.key, [])
    bad = []
    for pattern, want in rules:
        rx = re.compile(pattern)
        shards = {s + 1 for t, s in zip(plan.tensors, plan.shard_of) if rx.fullmatch(t[0])}
        if not shards:
            bad.append(f"{pattern}: no tensor matches")
        elif want and shards != {want}:
            bad.append(f"{pattern}: shards {sorted(shards)}, published {want}")
        elif not want and len(shards) < 2:
            bad.append(f"{pattern}: one shard {sorted(shards)}, published several")
    return len(rules), bad


# File sizes of the released shards, where a public listing gives them: the Hugging Face file
# listing of meta-llama/Llama-4-Scout-17B-16E-Instruct at revision 92f3b159 (a public checkpoint
# manifest, README.md), the same tensors as the base release.  A copy's file is 8 + header +
# data bytes, so equal sizes mean equal data bytes and an equal header length in every shard.
PUBLISHED_FILE_SIZES: dict[str, list[int]] = {
    "llama-4-scout-17b-16e": [3938735392] + [4404205216] * 9 + [4404205208]
                             + [4404205232] * 37 + [4278385928, 2068971664],
}


@dataclass
class Plan:
    config: dict
    tensors: list[Tensor]          # after the cut, names final
    shard_of: list[int]            # 0-based shard index per tensor
    shard_names: list[str]         # all of the release's shard names
    st_metadata: bool = True       # Release.st_metadata


def make_plan(rel: Release, layers: int | None) -> Plan:
    cfg = load_config(rel.key)
    full = rel.build(cfg)
    shard_of = rel.assign(full, rel.n_shards)
    used = set(shard_of)
    if len(used) != rel.n_shards:
        raise AssertionError(f"{rel.key}: {rel.n_shards - len(used)} shards got no tensors")
    names = [rel.name_fmt(i, rel.n_shards) for i in range(rel.n_shards)]
    if layers is None:
        return Plan(cfg, full, shard_of, names, rel.st_metadata)

    text = cfg.get("text_config", cfg)
    n_full = text["num_hidden_layers"]
    if not 1 <= layers <= n_full:
        raise SystemExit(f"--layers must be between 1 and {n_full} for {rel.key}")
    kept, kept_shard = [], []
    for t, s in zip(full, shard_of):
        kind = t[3][0]
        if kind == "layer":
            if t[3][1] >= layers:
                continue
        elif kind == "mtp_block":
            pass
        elif kind == "mtp":
            # The MTP layer is stored after the last decoder layer: model.layers.N.* once
            # the model is cut to N layers.
            old = f"model.layers.{t[3][1]}."
            new_index = layers + (t[3][1] - n_full)
            assert t[0].startswith(old)
            t = (f"model.layers.{new_index}." + t[0][len(old):], t[1], t[2], ("mtp", new_index))
        kept.append(t)
        kept_shard.append(s)
    rel.cut(cfg, layers)
    return Plan(cfg, kept, kept_shard, names, rel.st_metadata)


def parameters(plan: Plan) -> int:
    n = 0
    for t in plan.tensors:
        k = 1
        for d in t[2]:
            k *= d
        n += k
    return n


def summarize(plan: Plan) -> tuple[int, int, int]:
    total = sum(nbytes(t[1], t[2]) for t in plan.tensors)
    return len(plan.tensors), total, len(set(plan.shard_of))


def file_sizes(plan: Plan) -> dict[int, int]:
    """0-based shard index -> size of the file the copy writes (8 + header + data)."""
    by_shard: dict[int, list[Tensor]] = {}
    for t, s in zip(plan.tensors, plan.shard_of):
        by_shard.setdefault(s, []).append(t)
    out = {}
    for s, entries in by_shard.items():
        head, data = _shard_header(entries, plan.st_metadata)
        out[s] = len(head) + data
    return out


def _shard_header(entries: list[Tensor], metadata: bool = True) -> tuple[bytes, int]:
    """safetensors header bytes (length prefix included) and data-region size."""
    entries = sorted(entries, key=lambda t: (-_ST_DTYPE_ORDER[t[1]], t[0]))
    header: dict = {"__metadata__": {"format": "pt"}} if metadata else {}
    off = 0
    for name, dtype, shape, _ in entries:
        n = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    js = json.dumps(header, separators=(",", ":")).encode("utf-8")
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js, off


def write_copy(plan: Plan, out_dir: Path) -> None:
    if out_dir.exists():
        if not out_dir.is_dir() or any(out_dir.iterdir()):
            raise SystemExit(f"{out_dir} exists and is not an empty directory")
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        raise SystemExit(f"{tmp} exists (left by an interrupted run?); remove it first")
    tmp.mkdir(parents=True)
    try:
        _write_into(plan, tmp)
    except BaseException:
        shutil.rmtree(tmp)          # only the directory this call created
        raise
    if out_dir.exists():
        out_dir.rmdir()
    os.rename(tmp, out_dir)


def _write_into(plan: Plan, tmp: Path) -> None:
    with open(tmp / "config.json", "w", encoding="utf-8") as f:
        json.dump(plan.config, f, indent=2)
        f.write("\n")

    by_shard: dict[int, list[Tensor]] = {}
    for t, s in zip(plan.tensors, plan.shard_of):
        by_shard.setdefault(s, []).append(t)
    weight_map: dict[str, str] = {}
    total = 0
    for s in sorted(by_shard):
        fname = plan.shard_names[s]
        head, data = _shard_header(by_shard[s], plan.st_metadata)
        with open(tmp / fname, "wb") as f:
            f.write(head)
            f.truncate(len(head) + data)   # data region: a sparse hole
        total += data
        for t in by_shard[s]:
            weight_map[t[0]] = fname
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(tmp / "model.safetensors.index.json", "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Write header-exact copies of released MoE checkpoints "
                    "(real config.json, real shard names and headers, sparse data).")
    ap.add_argument("release", nargs="?", help="release name (see --list)")
    ap.add_argument("out_dir", nargs="?", help="output directory (must not exist or be empty)")
    ap.add_argument("--layers", type=int, help="keep only the first N decoder layers")
    ap.add_argument("--list", action="store_true", help="list the releases")
    ap.add_argument("--summary", action="store_true",
                    help="print tensor count, total bytes and shard count; write nothing")
    a = ap.parse_args(argv)

    if a.list:
        for r in RELEASES.values():
            print(f"{r.key:18} {r.hf_repo:30} published: {r.published}")
        return 0
    if not a.release:
        ap.error("RELEASE is required (or --list)")
    rel = RELEASES.get(a.release)
    if rel is None:
        ap.error(f"unknown release {a.release!r}; known: {', '.join(RELEASES)}")
    if a.summary == bool(a.out_dir):
        ap.error("give either OUT_DIR or --summary")

    plan = make_plan(rel, a.layers)
    n_tensors, n_bytes, n_shards = summarize(plan)
    if a.summary:
        print(f"release:  {rel.key} ({rel.hf_repo})"
              + (f", cut to {a.layers} layers" if a.layers else ""))
        print(f"tensors:  {n_tensors}")
        print(f"bytes:    {n_bytes} ({n_bytes / 2**30:.2f} GiB)")
        print(f"parameters: {parameters(plan)}")
        print(f"shards:   {n_shards} of {rel.n_shards}")
        print(f"published: {rel.published}")
        if a.layers is None and rel.key in PUBLISHED_PLACEMENTS:
            n_rules, bad = check_placements(rel, plan)
            print(f"placements: {n_rules - len(bad)} of {n_rules} tensor families in the "
                  f"published shards")
            for b in bad:
                print(f"  {b}")
        want = PUBLISHED_FILE_SIZES.get(rel.key)
        if want is not None and a.layers is None:
            got = file_sizes(plan)
            same = [i for i, w in enumerate(want) if got.get(i) == w]
            print(f"file sizes: {len(same)} of {len(want)} equal to the published listing")
            for i, w in enumerate(want):
                if got.get(i) != w:
                    print(f"  {plan.shard_names[i]}: {got.get(i)} bytes, published {w}")
        return 0
    write_copy(plan, Path(a.out_dir))
    print(f"wrote {a.out_dir}: {n_tensors} tensors, {n_bytes} bytes in {n_shards} shards")
    return 0


if __name__ == "__main__":
    sys.exit(main())
