#!/usr/bin/env python3
"""One MoE family end to end against its public modeling code, with only the standard library.

Writes a tiny Hugging Face checkpoint of FAMILY (config.json, two safetensors shards and
model.safetensors.index.json; every tensor the release holds, under its released name, with
random bf16 values), runs `moeshard run --checkpoint` on it with moeshard's own router on 1, 2
and 4 local ranks (TP, EP, a moe_tp x moe_ep hybrid, DP with replicated shared experts), and
compares every MoE layer's output with a float64 reference computed here from the checkpoint
read back from disk, following the family's modeling code (transformers modeling_*.py, vLLM).

What is compared. `moeshard run --output` writes, per MoE layer, the residual stream after that
layer's MoE sub-layer, the attention and dense layers skipped:
    y = x + MoE(RMSNorm_post_attention(x))
and feeds y to the next MoE layer. The reference computes the same from the same input: the
first layer from the bf16 input file, each later one from moeshard's output of the layer before
it, so every layer is checked on its own and errors do not compound.

Tolerances. Both sides use the checkpoint's bf16 weights exactly. moeshard computes in fp32
except at two points of the routed experts: their input is rounded to bf16 (Llama-4: the input
times its routing weight), and so is the SwiGLU activation silu(gate x) * up x before the down
projection; the router, the norm, the shared expert and its gate, and the weighted sum stay fp32
(src/runtime/moe_runtime.cc, the kernels' Activate). Each layer is compared twice, relative to
the largest |y_ref - x| (the MoE sub-layer's output), over all tokens and elements:
  - with the float64 reference of the modeling code: each of those roundings errs by up to 2^-8
    (half an ulp of bf16's 8-bit significand) and they add up as random sums, seen up to 7e-3
    over 15 seeds x 8 families (3.4e-3 with the default seed): TOLERANCE = 2^-6;
  - with the same reference rounding to bf16 at those two points ("bf16 points"): what is left
    is fp32 summation order (~2e-7) and, now and then, an fp32 value that lands on the other side
    of a bf16 rounding boundary (one element one ulp off, seen up to 4e-5): TOLERANCE_BF16 =
    2^-11, six times below the first comparison's error, so it sees any other deviation from the
    modeling code down to a small fraction of bf16 noise.
A wrong routing rule, weight, gate or norm moves the output by 10% or more (see --mutate).

Ties. A token whose k-th and (k+1)-th expert (or kept and dropped group) score within
PREPARE_MARGIN of the largest score in the float64 reference is redrawn before the run, and a
margin below RUN_MARGIN on the inputs moeshard's layers actually received fails the test loudly
(fp32 scores differ from float64 ones by ~1e-6 of the largest).

DeepSeek-V4 (deepseek_v4) is written as its release stores it: fp8 e4m3 linears with E8M0
128 x 128 block scales, MXFP4 routed experts (I8 [out, in/2] + E8M0 per 32), bf16 router and
norms, fp32 mHC / bias tensors, I64 tid2eid; the reference dequantizes them exactly (code value
x 2^(e - 127)), and the input file carries token_ids (I64 [T]) for its hash-routed layer.

usage: hf_reference_test.py MOESHARD_BIN WORKDIR FAMILY [--seed N] [--mutate WHAT]
  FAMILY: olmoe deepseek_v2 qwen2_moe glm4_moe minimax_m2 llama4 qwen3_next qwen3_5_moe
  deepseek_v4
  --seed N draws another checkpoint and input (default 0).
  --mutate WHAT breaks the reference on purpose, and the test must then fail: flip-renormalize,
  no-scaling, no-correction-bias, no-shared-gate, no-shared-expert, plain-norm,
  weight-on-output, wrong-groups, and for deepseek_v4 no-sqrt (softplus scores), no-hash (the
  hash layer routed by score), no-clamp (plain SwiGLU) (the reference is the same on every
  topology, so a mutated run tries the 1-rank one only).
"""
import array
import json
import math
import os
import random
import struct
import subprocess
import sys
import time
from collections import namedtuple

TOLERANCE = 2.0**-6
TOLERANCE_BF16 = 2.0**-11
PREPARE_MARGIN = 1e-2
RUN_MARGIN = 1e-4
NUM_TOKENS = 7  # uneven over 2 DP ranks and over 2 and 4 TP ranks

TOPOLOGIES = [
    ("1 rank", []),
    ("TP2 (moe_tp 2)", ["-tp", "2"]),
    ("TP2 EP2", ["-tp", "2", "-ep"]),
    ("TP4 EP4", ["-tp", "4", "-ep"]),
    ("TP4 moe_tp 2 x moe_ep 2", ["-tp", "4", "--moe-tp", "2", "--moe-ep", "2"]),
    ("DP2 TP2 EP4, shared repl.",
     ["-dp", "2", "-tp", "2", "-ep", "--shared-experts", "replicated"]),
]

MUTATIONS = ("flip-renormalize", "no-scaling", "no-correction-bias", "no-shared-gate",
             "no-shared-expert", "plain-norm", "weight-on-output", "wrong-groups",
             "no-sqrt", "no-hash", "no-clamp")
MUTATE = None  # set from --mutate


# ------------------------------------------------------------------------------------------------
# bf16, safetensors, checkpoints

def round_bf16(values):
    """The bf16 bit patterns of `values` (round to nearest even) and the floats they hold."""
    words = array.array("I", array.array("f", values).tobytes())
    bits = array.array("H", (((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF for w in words))
    return bits, bf16_values(bits)


def bf16_values(bits):
    return list(array.array("f", array.array("I", (b << 16 for b in bits)).tobytes()))


# Byte codes (fp8, E8M0 scales, packed E2M1 pairs): the values are the bytes, 0..255.
CODE_DTYPES = ("F8_E4M3", "F8_E8M0", "I8", "U8")
INT_DTYPES = {"I64": "q", "I32": "i"}
ELEMENT_BYTES = {"BF16": 2, "F32": 4, "I64": 8, "I32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1,
                 "U8": 1}


def encode(dtype, values):
    """(bytes, the values as stored) of `values` in `dtype` (BF16, F32; I64 / I32 integers;
    byte codes)."""
    if dtype in CODE_DTYPES:
        return bytes(values), list(values)
    if dtype in INT_DTYPES:
        a = array.array(INT_DTYPES[dtype], values)
        return a.tobytes(), list(a)
    if dtype == "BF16":
        bits, held = round_bf16(values)
        return bits.tobytes(), held
    if dtype == "F32":
        a = array.array("f", values)
        return a.tobytes(), list(a)
    raise ValueError("unsupported dtype " + dtype)


def decode(dtype, data):
    if dtype in CODE_DTYPES:
        return list(data)
    if dtype in INT_DTYPES:
        return list(array.array(INT_DTYPES[dtype], data))
    if dtype == "BF16":
        return bf16_values(array.array("H", data))
    if dtype == "F32":
        return list(array.array("f", data))
    raise ValueError("unsupported dtype " + dtype)


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, values)}."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dtype, shape, values = tensors[name]
        data = encode(dtype, values)[0]
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    """{name: (dtype, shape, values)}."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for name, info in json.loads(raw[8:8 + n]).items():
        if name == "__metadata__":
            continue
        begin, end = (8 + n + o for o in info["data_offsets"])
        out[name] = (info["dtype"], info["shape"], decode(info["dtype"], raw[begin:end]))
    return out


def write_checkpoint(directory, config, tensors):
    """config.json, two shards (tensors alternate between them by name) and their index."""
    os.makedirs(directory, exist_ok=True)
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    shards, weight_map, total = ({}, {}), {}, 0
    for i, name in enumerate(sorted(tensors)):
        shards[i % 2][name] = tensors[name]
        weight_map[name] = files[i % 2]
        dtype, shape, _ = tensors[name]
        total += math.prod(shape) * ELEMENT_BYTES[dtype]
    for file, shard in zip(files, shards):
        write_safetensors(os.path.join(directory, file), shard)
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


class Checkpoint:
    """A checkpoint directory read back through its index: tensors by name, as nested lists."""

    def __init__(self, directory):
        with open(os.path.join(directory, "model.safetensors.index.json")) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        self.tensors = {}
        for file in files:
            self.tensors.update(read_safetensors(os.path.join(directory, file)))

    def __getitem__(self, name):
        """The tensor as nested lists ([rows][cols], [E][rows][cols]) or a flat list (1-D)."""
        _, shape, values = self.tensors[name]
        return reshape(values, shape)


def reshape(flat, shape):
    if len(shape) == 1:
        return flat
    step = len(flat) // shape[0]
    return [reshape(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def transpose(m):
    return [list(col) for col in zip(*m)]


# ------------------------------------------------------------------------------------------------
# The tensors of a checkpoint, by name, with the range of their random values

Spec = namedtuple("Spec", "name dtype shape center spread")


def linear(name, rows, cols, dtype="BF16"):
    """A [rows, cols] weight, uniform in +-sqrt(3 / cols): unit-variance outputs for unit inputs."""
    return Spec(name, dtype, [rows, cols], 0.0, math.sqrt(3.0 / cols))


def vector(name, n, center=0.0, spread=0.5, dtype="BF16"):
    return Spec(name, dtype, [n], center, spread)


def norm(name, n, plus_one=False):
    """An RMSNorm weight: around 1, or around 0 where the norm scales by (1 + w)."""
    return vector(name, n, 0.0 if plus_one else 1.0, 0.5)


def swiglu(module, width, hidden, names=("gate_proj", "up_proj", "down_proj")):
    gate, up, down = names
    return [linear("%s.%s.weight" % (module, gate), width, hidden),
            linear("%s.%s.weight" % (module, up), width, hidden),
            linear("%s.%s.weight" % (module, down), hidden, width)]


def gqa(p, c, qkv_bias=False, qk_norm=None, q_gate=False, plus_one=False):
    """self_attn of a GQA layer. qk_norm: None, "head" ([head_dim]) or "full" (the projection)."""
    H, hd = c["hidden_size"], c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [linear(p + "q_proj.weight", 2 * q if q_gate else q, H),
           linear(p + "k_proj.weight", kv, H), linear(p + "v_proj.weight", kv, H),
           linear(p + "o_proj.weight", H, q)]
    if qkv_bias:
        out += [vector(p + "q_proj.bias", q), vector(p + "k_proj.bias", kv),
                vector(p + "v_proj.bias", kv)]
    if qk_norm == "head":
        out += [norm(p + "q_norm.weight", hd, plus_one), norm(p + "k_norm.weight", hd, plus_one)]
    elif qk_norm == "full":
        out += [norm(p + "q_norm.weight", q), norm(p + "k_norm.weight", kv)]
    return out


def gated_deltanet(p, c, split):
    """linear_attn of a Qwen3-Next (in_proj_qkvz, in_proj_ba) or Qwen3.5 (split) layer."""
    H, nk, nv = c["hidden_size"], c["linear_num_key_heads"], c["linear_num_value_heads"]
    kd, vd = nk * c["linear_key_head_dim"], nv * c["linear_value_head_dim"]
    if split:
        out = [linear(p + "in_proj_qkv.weight", 2 * kd + vd, H),
               linear(p + "in_proj_z.weight", vd, H), linear(p + "in_proj_b.weight", nv, H),
               linear(p + "in_proj_a.weight", nv, H)]
    else:
        out = [linear(p + "in_proj_qkvz.weight", 2 * kd + 2 * vd, H),
               linear(p + "in_proj_ba.weight", 2 * nv, H)]
    # A_log and the gated norm (a plain weight) as the releases store them: BF16 in
    # Qwen3-Next-80B-A3B, F32 in Qwen3.5-35B-A3B (public header dumps of both,
    # tests/checkpoints/README.md).
    small = "F32" if split else "BF16"
    conv = [2 * kd + vd, 1, c["linear_conv_kernel_dim"]]
    return out + [Spec(p + "conv1d.weight", "BF16", conv, 0.0, 0.5), vector(p + "dt_bias", nv),
                  vector(p + "A_log", nv, dtype=small),
                  vector(p + "norm.weight", c["linear_value_head_dim"], 1.0, 0.5, dtype=small),
                  linear(p + "out_proj.weight", H, vd)]


def stacked(name, n, rows, cols, fan_in):
    """n [rows, cols] matrices in one tensor (fused experts), each scaled like linear()."""
    return Spec(name, "BF16", [n, rows, cols], 0.0, math.sqrt(3.0 / fan_in))


def random_tensors(specs, rng):
    """{name: (dtype, shape, values)}, the values uniform in center +- spread."""
    out = {}
    for s in specs:
        assert s.name not in out, "tensor listed twice: " + s.name
        values = [s.center + rng.uniform(-s.spread, s.spread) for _ in range(math.prod(s.shape))]
        out[s.name] = (s.dtype, s.shape, encode(s.dtype, values)[1])
    return out


# ------------------------------------------------------------------------------------------------
# Routing, after each family's router (float64; every selection reports its margin)

def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def softmax(v):
    m = max(v)
    e = [math.exp(a - m) for a in v]
    s = sum(e)
    return [a / s for a in e]


def top(scores, k, among=None):
    """The k best of `among` (default: all) by descending score, and the gap between the k-th and
    the best one left out, relative to the largest |score| (inf when none is left out)."""
    order = sorted(range(len(scores)) if among is None else among, key=lambda e: (-scores[e], e))
    if len(order) == k:
        return order, math.inf
    return order[:k], (scores[order[k - 1]] - scores[order[k]]) / max(abs(s) for s in scores)


def mutated_renormalize(renormalize):
    """The family's renormalisation, the other way round under --mutate flip-renormalize."""
    return renormalize != (MUTATE == "flip-renormalize")


def group_members(groups, size):
    return [g * size + i for g in sorted(groups) for i in range(size)]


def softmax_topk(logits, k, renormalize):
    """Qwen2MoeSparseMoeBlock / OlmoeSparseMoeBlock / Qwen3NextSparseMoeBlock /
    Qwen3_5MoeTopKRouter: softmax over all experts in fp32, top-k, renormalised if asked."""
    p = softmax(logits)
    ids, margin = top(p, k)
    w = [p[e] for e in ids]
    if mutated_renormalize(renormalize):
        w = [v / sum(w) for v in w]
    return ids, w, margin


def deepseek_v2_gate(logits, c):
    """modeling_deepseek.py (DeepSeek-V2) MoEGate, softmax scores: `greedy` top-k, or
    `group_limited_greedy` (groups ranked by their best expert, top-k within the topk_group kept
    ones); weights renormalised (top_k > 1 and norm_topk_prob), else times routed_scaling_factor."""
    k, p = c["num_experts_per_tok"], softmax(logits)
    margins, among = [], None
    if c.get("topk_method", "greedy") == "group_limited_greedy":
        size = len(p) // c["n_group"]
        group_score = [max(p[g * size:(g + 1) * size]) for g in range(c["n_group"])]
        if MUTATE == "wrong-groups":  # DeepSeek-V3's sum of the top two instead of the best one
            group_score = [sum(sorted(p[g * size:(g + 1) * size])[-2:])
                           for g in range(c["n_group"])]
        groups, m = top(group_score, c["topk_group"])
        margins.append(m)
        among = group_members(groups, size)
    ids, m = top(p, k, among)
    margins.append(m)
    w = [p[e] for e in ids]
    if mutated_renormalize(k > 1 and c.get("norm_topk_prob", False)):
        w = [v / (sum(w) + 1e-20) for v in w]
    elif MUTATE != "no-scaling":
        w = [v * c.get("routed_scaling_factor", 1.0) for v in w]
    return ids, w, min(margins)


def sigmoid_biased_topk(logits, bias, k, renormalize, scale=1.0, n_group=1, topk_group=1):
    """Glm4MoeMoE.route_tokens_to_experts (noaux_tc) and, with one group and no scale,
    MiniMaxM2SparseMoeBlock.route_tokens_to_experts: sigmoid scores; experts chosen by score +
    e_score_correction_bias (groups ranked by the sum of their two best biased scores); weights
    the unbiased scores, renormalised (+1e-20), times routed_scaling_factor."""
    s = [sigmoid(v) for v in logits]
    b = list(s) if MUTATE == "no-correction-bias" else [a + c for a, c in zip(s, bias)]
    margins, among = [], None
    if n_group > 1:
        size = len(s) // n_group
        group_score = [sum(sorted(b[g * size:(g + 1) * size])[-2:]) for g in range(n_group)]
        groups, m = top(group_score, topk_group)
        margins.append(m)
        among = group_members(groups, size)
    ids, m = top(b, k, among)
    margins.append(m)
    # transformers fills the dropped groups' scores with 0.0 (vLLM with -inf): the same choice
    # as long as every chosen biased score is positive.
    assert all(b[e] > 0 for e in ids), "a chosen biased score <= 0: 0.0 and -inf masks differ"
    w = [s[e] for e in ids]
    if mutated_renormalize(renormalize):
        w = [v / (sum(w) + 1e-20) for v in w]
    if MUTATE != "no-scaling":
        w = [v * scale for v in w]
    return ids, w, min(margins)


def llama4_router(logits, k):
    """Llama4Router: top-k of the raw logits, the weight sigmoid(logit) of each kept one."""
    ids, margin = top(logits, k)
    return ids, [sigmoid(logits[e]) for e in ids], margin


# ------------------------------------------------------------------------------------------------
# Families: config.json, tensors, and the MoE block's parts by name

Mlp = namedtuple("Mlp", "gate up down")  # [I][H], [I][H], [H][I]

H, V, HEADS, KV_HEADS, HEAD_DIM = 64, 64, 8, 4, 8
E, K, I, DENSE_I = 16, 4, 32, 64


class Family:
    """A model family as its release stores it and its modeling code computes its MoE block."""

    model = "model."  # the text model's tensors: embed_tokens, layers, norm
    lm_head = "lm_head.weight"
    norm_plus_one = False  # RMSNorm scales by (1 + w): Qwen3NextRMSNorm, Qwen3_5MoeRMSNorm
    weight_on_input = False  # Llama4TextMoe: routed_in = hidden_states * router_scores

    def __init__(self):
        self.config = self.make_config()
        self.text = self.config.get("text_config", self.config)

    def layer(self, l):
        return "%slayers.%d." % (self.model, l)

    def moe(self, l):
        return self.layer(l) + "mlp."

    def pre_moe_norm(self, l):
        return self.layer(l) + "post_attention_layernorm.weight"

    def router(self, l):
        return self.moe(l) + "gate.weight"

    def shared_module(self, l):
        return None  # the shared expert's module, or None

    def shared_gate(self, l):
        return None  # the [1, H] sigmoid gate of the shared expert's output, or None

    def expert_names(self):
        return ("gate_proj", "up_proj", "down_proj")

    def tensors(self):
        """Every tensor of the checkpoint."""
        out = [linear(self.model + "embed_tokens.weight", V, H), linear(self.lm_head, V, H),
               norm(self.model + "norm.weight", H, self.norm_plus_one)]
        moe = set(self.moe_layers())
        for l in range(self.text["num_hidden_layers"]):
            out += [norm(self.layer(l) + "input_layernorm.weight", H, self.norm_plus_one),
                    norm(self.pre_moe_norm(l), H, self.norm_plus_one)]
            out += self.attention(l)
            out += self.moe_tensors(l) if l in moe else self.dense_mlp(l)
        return out

    def dense_mlp(self, l):
        return swiglu(self.layer(l) + "mlp", DENSE_I, H)

    def moe_tensors(self, l):
        out = [linear(self.router(l), self.num_experts(), H, self.router_dtype())]
        out += self.routed_expert_tensors(l)
        if self.shared_module(l):
            out += swiglu(self.shared_module(l), self.shared_width(), H)
        if self.shared_gate(l):
            out.append(linear(self.shared_gate(l), 1, H))
        return out

    def routed_expert_tensors(self, l):
        out = []
        for e in range(self.num_experts()):
            out += swiglu("%sexperts.%d" % (self.moe(l), e), I, H, self.expert_names())
        return out

    def experts(self, ck, l):
        """Each routed expert's Mlp, from the checkpoint as the family stores it."""
        g, u, d = self.expert_names()
        base = self.moe(l) + "experts."
        return [Mlp(ck["%s%d.%s.weight" % (base, e, g)], ck["%s%d.%s.weight" % (base, e, u)],
                    ck["%s%d.%s.weight" % (base, e, d)]) for e in range(self.num_experts())]

    def router_dtype(self):
        return "BF16"

    def num_experts(self):
        return E

    def shared_width(self):
        return 0

    def correction_bias(self, l):
        return None

    def route(self, logits, bias):
        raise NotImplementedError

    # What only DeepSeek-V4 has: token ids in the input, hash-routed layers, a clamped SwiGLU,
    # quantized tensors.
    token_ids = False

    def hash_table(self, ck, l):
        return None  # layer l's [vocab][top_k] experts by token id, or None

    def swiglu_limit(self):
        return None

    def shared_mlp(self, ck, l):
        return Mlp(*(ck["%s.%s.weight" % (self.shared_module(l), n)]
                     for n in ("gate_proj", "up_proj", "down_proj")))

    def make_tensors(self, rng):
        return random_tensors(self.tensors(), rng)


class Olmoe(Family):
    # transformers modeling_olmoe.py: OlmoeSparseMoeBlock (softmax top-k, norm_topk_prob false by
    # default, no shared expert), q_norm / k_norm over the whole projection.
    def make_config(self):
        return {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_act": "silu",
                "hidden_size": H, "intermediate_size": I, "max_position_embeddings": 4096,
                "norm_topk_prob": False, "num_attention_heads": HEADS, "num_experts": E,
                "num_experts_per_tok": K, "num_hidden_layers": 2, "num_key_value_heads": KV_HEADS,
                "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "vocab_size": V}

    def moe_layers(self):
        return list(range(self.text["num_hidden_layers"]))

    def attention(self, l):
        return gqa(self.layer(l) + "self_attn.", self.text, qk_norm="full")

    def route(self, logits, bias):
        return softmax_topk(logits, self.text["num_experts_per_tok"], self.text["norm_topk_prob"])


class DeepseekV2(Family):
    # modeling_deepseek.py (DeepSeek-V2): MLA without q LoRA (V2-Lite), first_k_dense_replace dense
    # layers, MoEGate group_limited_greedy, n_shared_experts shared experts (ungated).
    def make_config(self):
        return {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": H,
                "intermediate_size": DENSE_I, "kv_lora_rank": 16, "max_position_embeddings": 4096,
                "moe_intermediate_size": I, "moe_layer_freq": 1, "n_group": 4,
                "n_routed_experts": E, "n_shared_experts": 2, "norm_topk_prob": False,
                "num_attention_heads": HEADS, "num_experts_per_tok": K, "num_hidden_layers": 3,
                "num_key_value_heads": HEADS, "q_lora_rank": None, "qk_nope_head_dim": 8,
                "qk_rope_head_dim": 4, "rms_norm_eps": 1e-06, "routed_scaling_factor": 16.0,
                "scoring_func": "softmax", "tie_word_embeddings": False, "topk_group": 2,
                "topk_method": "group_limited_greedy", "torch_dtype": "bfloat16",
                "v_head_dim": 8, "vocab_size": V}

    def moe_layers(self):
        c = self.text
        return [l for l in range(c["num_hidden_layers"])
                if l >= c["first_k_dense_replace"] and l % c["moe_layer_freq"] == 0]

    def attention(self, l):
        c, p = self.text, self.layer(l) + "self_attn."
        nh, r = c["num_attention_heads"], c["kv_lora_rank"]
        qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        return [linear(p + "q_proj.weight", nh * qk, H),
                linear(p + "kv_a_proj_with_mqa.weight", r + c["qk_rope_head_dim"], H),
                norm(p + "kv_a_layernorm.weight", r),
                linear(p + "kv_b_proj.weight", nh * (c["qk_nope_head_dim"] + c["v_head_dim"]), r),
                linear(p + "o_proj.weight", H, nh * c["v_head_dim"])]

    def shared_module(self, l):
        return self.moe(l) + "shared_experts"

    def shared_width(self):
        return self.text["n_shared_experts"] * self.text["moe_intermediate_size"]

    def route(self, logits, bias):
        return deepseek_v2_gate(logits, self.text)


class Qwen2Moe(Family):
    # transformers modeling_qwen2_moe.py: q/k/v biases, Qwen2MoeSparseMoeBlock (softmax top-k,
    # norm_topk_prob), shared_expert scaled by sigmoid(shared_expert_gate(x)).
    def make_config(self):
        return {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                "decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": H,
                "intermediate_size": DENSE_I, "max_position_embeddings": 4096,
                "moe_intermediate_size": I, "norm_topk_prob": False, "num_attention_heads": HEADS,
                "num_experts": E, "num_experts_per_tok": K, "num_hidden_layers": 2,
                "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-06,
                "shared_expert_intermediate_size": 2 * DENSE_I, "tie_word_embeddings": False,
                "torch_dtype": "bfloat16", "vocab_size": V}

    def moe_layers(self):
        step = self.text["decoder_sparse_step"]
        return [l for l in range(self.text["num_hidden_layers"]) if (l + 1) % step == 0]

    def attention(self, l):
        return gqa(self.layer(l) + "self_attn.", self.text, qkv_bias=True)

    def shared_module(self, l):
        return self.moe(l) + "shared_expert"

    def shared_gate(self, l):
        return self.moe(l) + "shared_expert_gate.weight"

    def shared_width(self):
        return self.text["shared_expert_intermediate_size"]

    def route(self, logits, bias):
        return softmax_topk(logits, self.text["num_experts_per_tok"],
                            self.text.get("norm_topk_prob", False))


class Glm4Moe(Family):
    # transformers modeling_glm4_moe.py: q/k/v biases and q/k norms over head_dim, dense first
    # layers, Glm4MoeTopkRouter (gate.weight, gate.e_score_correction_bias) with noaux_tc grouped
    # top-k, shared_experts (ungated).
    def make_config(self):
        return {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
                "attention_bias": True, "first_k_dense_replace": 1, "head_dim": HEAD_DIM,
                "hidden_act": "silu", "hidden_size": H, "intermediate_size": DENSE_I,
                "max_position_embeddings": 4096, "moe_intermediate_size": I, "n_group": 4,
                "n_routed_experts": E, "n_shared_experts": 1, "norm_topk_prob": True,
                "num_attention_heads": HEADS, "num_experts_per_tok": K, "num_hidden_layers": 3,
                "num_key_value_heads": KV_HEADS, "num_nextn_predict_layers": 0,
                "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "routed_scaling_factor": 2.5,
                "tie_word_embeddings": False, "topk_group": 2, "torch_dtype": "bfloat16",
                "use_qk_norm": True, "vocab_size": V}

    def moe_layers(self):
        return list(range(self.text["first_k_dense_replace"], self.text["num_hidden_layers"]))

    def attention(self, l):
        return gqa(self.layer(l) + "self_attn.", self.text, qkv_bias=True, qk_norm="head")

    def moe_tensors(self, l):
        return super().moe_tensors(l) + [vector(self.correction_bias(l), E, 0.0, 0.15, "F32")]

    def correction_bias(self, l):
        return self.moe(l) + "gate.e_score_correction_bias"

    def shared_module(self, l):
        return self.moe(l) + "shared_experts"

    def shared_width(self):
        return self.text["n_shared_experts"] * self.text["moe_intermediate_size"]

    def route(self, logits, bias):
        c = self.text
        return sigmoid_biased_topk(logits, bias, c["num_experts_per_tok"], c["norm_topk_prob"],
                                   c["routed_scaling_factor"], c["n_group"], c["topk_group"])


class MinimaxM2(Family):
    # transformers modeling_minimax_m2.py: q/k norms over the whole projection, every layer MoE,
    # block_sparse_moe.gate (F32 in the release) and block_sparse_moe.e_score_correction_bias,
    # sigmoid scores, biased top-k, renormalised; experts w1 (gate), w3 (up), w2 (down).
    def make_config(self):
        return {"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
                "head_dim": HEAD_DIM, "hidden_act": "silu", "hidden_size": H,
                "intermediate_size": I, "max_position_embeddings": 4096,
                "num_attention_heads": HEADS, "num_experts_per_tok": K, "num_hidden_layers": 2,
                "num_key_value_heads": KV_HEADS, "num_local_experts": E,
                "qk_norm_type": "per_layer", "rms_norm_eps": 1e-06, "scoring_func": "sigmoid",
                "shared_intermediate_size": 0, "tie_word_embeddings": False,
                "torch_dtype": "bfloat16", "use_qk_norm": True, "use_routing_bias": True,
                "vocab_size": V}

    def moe(self, l):
        return self.layer(l) + "block_sparse_moe."

    def moe_layers(self):
        return list(range(self.text["num_hidden_layers"]))

    def attention(self, l):
        return gqa(self.layer(l) + "self_attn.", self.text, qk_norm="full")

    def router_dtype(self):
        return "F32"

    def expert_names(self):
        return ("w1", "w3", "w2")

    def moe_tensors(self, l):
        return super().moe_tensors(l) + [vector(self.correction_bias(l), E, 0.0, 0.15, "F32")]

    def correction_bias(self, l):
        return self.moe(l) + "e_score_correction_bias"

    def route(self, logits, bias):
        return sigmoid_biased_topk(logits, bias, self.text["num_experts_per_tok"], True)


class Llama4(Family):
    # transformers modeling_llama4.py: Llama4TextMoe on layers interleave_moe_layer_step - 1, 2
    # step - 1, ...: Llama4Router (top-k logits, sigmoid), the expert input scaled by the router
    # score, Llama4TextExperts fused input-major (gate_up_proj [E, H, 2I]: bmm(x, gate_up_proj),
    # chunk(2) gate then up; down_proj [E, I, H]), plus shared_expert (ungated).
    model = "language_model.model."
    lm_head = "language_model.lm_head.weight"
    weight_on_input = True

    def make_config(self):
        return {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                "text_config": {"model_type": "llama4_text", "head_dim": HEAD_DIM,
                                "hidden_act": "silu", "hidden_size": H,
                                "interleave_moe_layer_step": 2, "intermediate_size": I,
                                "intermediate_size_mlp": DENSE_I, "max_position_embeddings": 4096,
                                "num_attention_heads": HEADS, "num_experts_per_tok": 1,
                                "num_hidden_layers": 4, "num_key_value_heads": KV_HEADS,
                                "num_local_experts": 8, "rms_norm_eps": 1e-05,
                                "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                                "use_qk_norm": True, "vocab_size": V},
                "tie_word_embeddings": False}

    def moe(self, l):
        return self.layer(l) + "feed_forward."

    def moe_layers(self):
        step = self.text["interleave_moe_layer_step"]
        return list(range(step - 1, self.text["num_hidden_layers"], step))

    def attention(self, l):
        return gqa(self.layer(l) + "self_attn.", self.text)  # its q/k norm has no weight

    def dense_mlp(self, l):
        return swiglu(self.moe(l).rstrip("."), self.text["intermediate_size_mlp"], H)

    def router(self, l):
        return self.moe(l) + "router.weight"

    def num_experts(self):
        return self.text["num_local_experts"]

    def routed_expert_tensors(self, l):
        n, w = self.num_experts(), self.text["intermediate_size"]
        return [stacked(self.moe(l) + "experts.gate_up_proj", n, H, 2 * w, fan_in=H),
                stacked(self.moe(l) + "experts.down_proj", n, w, H, fan_in=w)]

    def experts(self, ck, l):
        w = self.text["intermediate_size"]
        out = []
        for gate_up, down in zip(ck[self.moe(l) + "experts.gate_up_proj"],
                                 ck[self.moe(l) + "experts.down_proj"]):
            gu = transpose(gate_up)  # [2I][H]
            out.append(Mlp(gu[:w], gu[w:], transpose(down)))
        return out

    def shared_module(self, l):
        return self.moe(l) + "shared_expert"

    def shared_width(self):
        return self.text["intermediate_size"]

    def route(self, logits, bias):
        return llama4_router(logits, self.text["num_experts_per_tok"])


class Qwen3Next(Family):
    # transformers modeling_qwen3_next.py: Gated DeltaNet layers and every
    # full_attention_interval-th a gated full attention layer, (1 + w) RMSNorms,
    # Qwen3NextSparseMoeBlock (softmax top-k renormalised: norm_topk_prob defaults to true in
    # Qwen3NextConfig, and this config leaves it out), shared_expert behind shared_expert_gate.
    norm_plus_one = True

    def make_config(self):
        return {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
                "decoder_sparse_step": 1, "full_attention_interval": 2, "head_dim": HEAD_DIM,
                "hidden_act": "silu", "hidden_size": H, "intermediate_size": DENSE_I,
                "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8, "linear_num_key_heads": 4,
                "linear_num_value_heads": 8, "linear_value_head_dim": 8,
                "max_position_embeddings": 4096, "moe_intermediate_size": I,
                "num_attention_heads": HEADS, "num_experts": E, "num_experts_per_tok": K,
                "num_hidden_layers": 2, "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-06,
                "shared_expert_intermediate_size": I, "tie_word_embeddings": False,
                "torch_dtype": "bfloat16", "vocab_size": V}

    def moe_layers(self):
        return list(range(self.text["num_hidden_layers"]))

    def full_attention(self, l):
        return (l + 1) % self.text["full_attention_interval"] == 0

    def attention(self, l):
        if self.full_attention(l):
            return gqa(self.layer(l) + "self_attn.", self.text, qk_norm="head", q_gate=True,
                       plus_one=True)
        return gated_deltanet(self.layer(l) + "linear_attn.", self.text, split=False)

    def shared_module(self, l):
        return self.moe(l) + "shared_expert"

    def shared_gate(self, l):
        return self.moe(l) + "shared_expert_gate.weight"

    def shared_width(self):
        return self.text["shared_expert_intermediate_size"]

    def route(self, logits, bias):
        return softmax_topk(logits, self.text["num_experts_per_tok"],
                            self.text.get("norm_topk_prob", True))


class Qwen35Moe(Qwen3Next):
    # transformers modeling_qwen3_5_moe.py / vLLM qwen3_5_moe.py: Qwen3-Next's text model under
    # model.language_model. (lm_head.weight at the top), layer_types, split DeltaNet projections,
    # Qwen3_5MoeTopKRouter (always renormalised), experts fused out-major as the bf16 release
    # stores them (mlp.experts.gate_up_proj [E, 2I, H], gate rows then up; down_proj [E, H, I]).
    model = "model.language_model."

    def make_config(self):
        text = Qwen3Next.make_config(self)
        for key in ("architectures", "decoder_sparse_step", "intermediate_size"):
            del text[key]
        text["model_type"] = "qwen3_5_moe_text"
        text["layer_types"] = ["linear_attention", "full_attention"]
        return {"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                "model_type": "qwen3_5_moe", "text_config": text, "tie_word_embeddings": False}

    def full_attention(self, l):
        return self.text["layer_types"][l] == "full_attention"

    def attention(self, l):
        if self.full_attention(l):
            return super().attention(l)
        return gated_deltanet(self.layer(l) + "linear_attn.", self.text, split=True)

    def routed_expert_tensors(self, l):
        w = self.text["moe_intermediate_size"]
        return [stacked(self.moe(l) + "experts.gate_up_proj", E, 2 * w, H, fan_in=H),
                stacked(self.moe(l) + "experts.down_proj", E, H, w, fan_in=w)]

    def experts(self, ck, l):
        w = self.text["moe_intermediate_size"]
        return [Mlp(gate_up[:w], gate_up[w:], down)
                for gate_up, down in zip(ck[self.moe(l) + "experts.gate_up_proj"],
                                         ck[self.moe(l) + "experts.down_proj"])]

    def route(self, logits, bias):
        return softmax_topk(logits, self.text["num_experts_per_tok"], True)


# ------------------------------------------------------------------------------------------------
# DeepSeek-V4's quantized storage: fp8 e4m3 linears with one E8M0 scale per 128 x 128 block, and
# MXFP4 routed experts (E2M1 codes two a byte, the even column in the low nibble, one E8M0 scale
# per 32 values of a row); dequantized value = code's value x 2^(e - 127).

def e4m3_value(code):
    """float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    if e == 0xF and m == 7:
        return math.nan
    return sign * (m / 8.0 * 2.0**-6 if e == 0 else (1 + m / 8.0) * 2.0**(e - 7))


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E4M3_POSITIVE = [e4m3_value(c) for c in range(0x7F)]  # codes 0..126, increasing, max 448


def e2m1_value(code):
    return (-1.0 if code & 8 else 1.0) * E2M1_VALUES[code & 7]


def nearest_code(v, table):
    """The index of the nearest magnitude in the increasing `table` (ties to the lower)."""
    i = min(range(len(table)), key=lambda j: (abs(abs(v) - table[j]), j))
    return i


def e8m0_for(amax, largest):
    """The E8M0 exponent byte of the smallest power of two s with amax / s <= largest."""
    if amax == 0:
        return 127
    return min(254, max(1, 127 + math.ceil(math.log2(amax / largest))))


def fp8_linear(name, rows, cols, rng):
    """A [rows, cols] weight uniform in +-sqrt(3 / cols), stored fp8 e4m3 + E8M0 128 x 128 block
    scales: {name.weight, name.scale}."""
    spread = math.sqrt(3.0 / cols)
    w = [[rng.uniform(-spread, spread) for _ in range(cols)] for _ in range(rows)]
    br, bc = -(-rows // 128), -(-cols // 128)
    scales = [[e8m0_for(max(abs(w[r][c]) for r in range(i * 128, min(rows, i * 128 + 128))
                              for c in range(j * 128, min(cols, j * 128 + 128))), 448.0)
               for j in range(bc)] for i in range(br)]
    codes = []
    for r in range(rows):
        for c in range(cols):
            v = w[r][c] / 2.0**(scales[r // 128][c // 128] - 127)
            i = nearest_e4m3(v)
            codes.append(i | (0x80 if v < 0 and i else 0))
    return {name + ".weight": ("F8_E4M3", [rows, cols], codes),
            name + ".scale": ("F8_E8M0", [br, bc], [e for row in scales for e in row])}


def nearest_e4m3(v):
    import bisect
    a = abs(v)
    i = bisect.bisect_left(E4M3_POSITIVE, a)
    if i >= len(E4M3_POSITIVE):
        return len(E4M3_POSITIVE) - 1
    if i > 0 and a - E4M3_POSITIVE[i - 1] <= E4M3_POSITIVE[i] - a:
        return i - 1
    return i


def mxfp4_linear(name, rows, cols, rng):
    """A [rows, cols] weight uniform in +-sqrt(3 / cols), stored MXFP4 as the release does: I8
    [rows, cols / 2] (column 2j in the low nibble, 2j + 1 in the high one) + F8_E8M0
    [rows, cols / 32]."""
    spread = math.sqrt(3.0 / cols)
    packed, scales = [], []
    for _ in range(rows):
        row = [rng.uniform(-spread, spread) for _ in range(cols)]
        codes = []
        for g in range(0, cols, 32):
            e = e8m0_for(max(abs(v) for v in row[g:g + 32]), 6.0)
            scales.append(e)
            for v in row[g:g + 32]:
                i = nearest_code(v / 2.0**(e - 127), E2M1_VALUES)
                codes.append(i | (8 if v < 0 and i else 0))
        packed += [codes[c] | (codes[c + 1] << 4) for c in range(0, cols, 2)]
    return {name + ".weight": ("I8", [rows, cols // 2], packed),
            name + ".scale": ("F8_E8M0", [rows, cols // 32], scales)}


def dequantize(ck, name):
    """Module `name`'s weight as nested lists [rows][cols] of floats: bf16 / F32 as stored, fp8
    or MXFP4 (an I8 weight) times its E8M0 scales."""
    dtype, shape, codes = ck.tensors[name + ".weight"]
    if dtype in ("BF16", "F32"):
        return ck[name + ".weight"]
    _, sshape, s = ck.tensors[name + ".scale"]
    if dtype == "F8_E4M3":
        rows, cols = shape
        return [[e4m3_value(codes[r * cols + c]) * 2.0**(s[(r // 128) * sshape[1] + c // 128] - 127)
                 for c in range(cols)] for r in range(rows)]
    assert dtype == "I8", name + ": unexpected weight dtype " + dtype
    rows, cols = shape[0], 2 * shape[1]
    out = []
    for r in range(rows):
        row = []
        for c in range(cols):
            byte = codes[r * shape[1] + c // 2]
            row.append(e2m1_value(byte >> 4 if c % 2 else byte & 0xF)
                       * 2.0**(s[r * sshape[1] + c // 32] - 127))
        out.append(row)
    return out


class DeepseekV4(Family):
    # vLLM deepseek_v4.py DeepseekV4MoE (with fused_topk_bias_router.py's
    # _topk_softplus_sqrt_torch): every layer MoE; NormGateLinear = ffn_norm then the bf16 router
    # ffn.gate (fp32 logits); scores sqrt(softplus(logit)); the first num_hash_layers layers take
    # their experts from ffn.gate.tid2eid[token id], the others the top-k of score + ffn.gate.bias
    # (noaux_tc); weights the unbiased scores of the chosen experts, / max(sum, 1e-20)
    # (norm_topk_prob), x routed_scaling_factor; experts and shared_experts (ungated) are
    # DeepseekV4MLP / FusedMoE with SiluAndMulWithClamp(swiglu_limit). DeepSeek's own tensor names
    # (no "model." prefix), fp8 block-scaled linears, MXFP4 routed experts, fp32 mHC tensors.
    # moeshard's layer output is x + MoE(ffn_norm(x)) on the plain [T, H] stream (the mHC
    # mixing around it is not run; moe_runtime.cc), which is what is compared.
    model = ""
    lm_head = "head.weight"
    token_ids = True

    def make_config(self):
        # tiny-deepseek-v4 (models/tiny-deepseek-v4.json) scaled to this test's widths: one hash
        # layer then two score layers, swiglu_limit low enough that the clamp acts. The fp8
        # linears that TP splits keep whole 128-row (or column) scale blocks per rank up to TP4
        # (the planner refuses a block straddling ranks): heads * head_dim, o_groups *
        # o_lora_rank and the shared experts' width (8 x moe_intermediate_size) are 512; MXFP4
        # experts split by moe_tp 2 keep whole 32-groups.
        return {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
                "compress_ratios": [0, 4, 128], "expert_dtype": "fp4", "hc_eps": 1e-06,
                "hc_mult": 4, "hc_sinkhorn_iters": 20, "head_dim": 64, "hidden_act": "silu",
                "hidden_size": H, "index_head_dim": 16, "index_n_heads": 4, "index_topk": 8,
                "max_position_embeddings": 4096, "moe_intermediate_size": 2 * I,
                "n_routed_experts": E, "n_shared_experts": 8, "norm_topk_prob": True,
                "num_attention_heads": HEADS, "num_experts_per_tok": K, "num_hash_layers": 1,
                "num_hidden_layers": 3, "num_key_value_heads": 1, "num_nextn_predict_layers": 0,
                "o_groups": 4, "o_lora_rank": 128, "q_lora_rank": 32, "qk_rope_head_dim": 8,
                "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                        "quant_method": "fp8", "scale_fmt": "ue8m0",
                                        "weight_block_size": [128, 128]},
                "rms_norm_eps": 1e-06, "routed_scaling_factor": 1.5,
                "scoring_func": "sqrtsoftplus", "sliding_window": 16, "swiglu_limit": 1.0,
                "tie_word_embeddings": False, "topk_method": "noaux_tc",
                "torch_dtype": "bfloat16", "vocab_size": V}

    def moe(self, l):
        return self.layer(l) + "ffn."

    def moe_layers(self):
        return list(range(self.text["num_hidden_layers"]))

    def hashed(self, l):
        return l < self.text["num_hash_layers"]

    def pre_moe_norm(self, l):
        return self.layer(l) + "ffn_norm.weight"

    def shared_module(self, l):
        return self.moe(l) + "shared_experts"

    def width(self):
        return self.text["moe_intermediate_size"]

    def correction_bias(self, l):
        return None if self.hashed(l) else self.moe(l) + "gate.bias"

    def swiglu_limit(self):
        return self.text["swiglu_limit"]

    def make_tensors(self, rng):
        """Every tensor of the checkpoint, quantized as the release stores them."""
        c, hc = self.text, self.text["hc_mult"]
        hd, nh, q = c["head_dim"], c["num_attention_heads"], c["q_lora_rank"]
        ihd, ih = c["index_head_dim"], c["index_n_heads"]
        specs = [linear("embed.weight", V, H), linear(self.lm_head, V, H), norm("norm.weight", H),
                 Spec("hc_head_fn", "F32", [hc, hc * H], 0.0, 0.1),
                 vector("hc_head_base", hc, dtype="F32"), vector("hc_head_scale", 1, dtype="F32")]
        fp8, fp4 = [], []  # (name, rows, cols)
        mix = (2 + hc) * hc
        for l in self.moe_layers():
            p, r = self.layer(l), c["compress_ratios"][l]
            specs += [norm(p + "attn_norm.weight", H), norm(self.pre_moe_norm(l), H)]
            for sub in ("attn", "ffn"):
                specs += [Spec(p + "hc_%s_fn" % sub, "F32", [mix, hc * H], 0.0, 0.1),
                          vector(p + "hc_%s_base" % sub, mix, dtype="F32"),
                          vector(p + "hc_%s_scale" % sub, 3, dtype="F32")]
            a = p + "attn."
            fp8 += [(a + "wq_a", q, H), (a + "wq_b", nh * hd, q), (a + "wkv", hd, H),
                    (a + "wo_a", c["o_groups"] * c["o_lora_rank"], nh * hd // c["o_groups"]),
                    (a + "wo_b", H, c["o_groups"] * c["o_lora_rank"])]
            specs += [norm(a + "q_norm.weight", q), norm(a + "kv_norm.weight", hd),
                      vector(a + "attn_sink", nh, dtype="F32")]

            def compressor(cp, dim):
                w = (2 if r == 4 else 1) * dim
                return [Spec(cp + "ape", "F32", [r, w], 0.0, 0.5), linear(cp + "wkv.weight", w, H),
                        linear(cp + "wgate.weight", w, H), norm(cp + "norm.weight", dim)]
            if r:
                specs += compressor(a + "compressor.", hd)
            if r == 4:
                fp8.append((a + "indexer.wq_b", ih * ihd, q))
                specs += [linear(a + "indexer.weights_proj.weight", ih, H)]
                specs += compressor(a + "indexer.compressor.", ihd)
            m = self.moe(l)
            specs.append(linear(m + "gate.weight", E, H))
            if not self.hashed(l):
                specs.append(vector(m + "gate.bias", E, 0.0, 0.15, "F32"))
            s = self.shared_module(l) + "."
            S = c["n_shared_experts"] * self.width()
            fp8 += [(s + "w1", S, H), (s + "w3", S, H), (s + "w2", H, S)]
            for e in range(E):
                x = "%sexperts.%d." % (m, e)
                fp4 += [(x + "w1", self.width(), H), (x + "w3", self.width(), H),
                        (x + "w2", H, self.width())]
        out = random_tensors(specs, rng)
        for l in self.moe_layers():
            if self.hashed(l):  # each token's top_k distinct experts, as I64 like the release
                table = [e for _ in range(V) for e in rng.sample(range(E), K)]
                out[self.moe(l) + "gate.tid2eid"] = ("I64", [V, K], table)
        for name, rows, cols in fp8:
            out.update(fp8_linear(name, rows, cols, rng))
        for name, rows, cols in fp4:
            out.update(mxfp4_linear(name, rows, cols, rng))
        return out

    def hash_table(self, ck, l):
        return ck[self.moe(l) + "gate.tid2eid"] if self.hashed(l) else None

    def experts(self, ck, l):
        base = self.moe(l) + "experts."
        return [Mlp(*(dequantize(ck, "%s%d.%s" % (base, e, n)) for n in ("w1", "w3", "w2")))
                for e in range(E)]

    def shared_mlp(self, ck, l):
        return Mlp(*(dequantize(ck, "%s.%s" % (self.shared_module(l), n))
                     for n in ("w1", "w3", "w2")))

    def scores(self, logits):
        if MUTATE == "no-sqrt":
            return [softplus(v) for v in logits]
        return [math.sqrt(softplus(v)) for v in logits]

    def weights(self, s, ids):
        """The unbiased scores of `ids`, / max(sum, 1e-20), x routed_scaling_factor."""
        w = [s[e] for e in ids]
        if mutated_renormalize(self.text["norm_topk_prob"]):
            w = [v / max(sum(w), 1e-20) for v in w]
        if MUTATE != "no-scaling":
            w = [v * self.text["routed_scaling_factor"] for v in w]
        return w

    def route(self, logits, bias):
        s = self.scores(logits)
        # bias is None on a hash layer routed by score (--mutate no-hash)
        if bias is None or MUTATE == "no-correction-bias":
            b = list(s)
        else:
            b = [a + c for a, c in zip(s, bias)]
        ids, margin = top(b, self.text["num_experts_per_tok"])
        return ids, self.weights(s, ids), margin

    def hash_route(self, logits, experts):
        return list(experts), self.weights(self.scores(logits), experts), math.inf


def softplus(v):
    """torch.nn.functional.softplus (beta 1, linear above threshold 20)."""
    return v if v > 20 else math.log1p(math.exp(v))


FAMILIES = {"olmoe": Olmoe, "deepseek_v2": DeepseekV2, "qwen2_moe": Qwen2Moe, "glm4_moe": Glm4Moe,
            "minimax_m2": MinimaxM2, "llama4": Llama4, "qwen3_next": Qwen3Next,
            "qwen3_5_moe": Qwen35Moe, "deepseek_v4": DeepseekV4}


# ------------------------------------------------------------------------------------------------
# The float64 reference of one MoE sub-layer

def matvec(m, x):
    return [sum(a * b for a, b in zip(row, x)) for row in m]


def silu(v):
    return v * sigmoid(v)


def mlp(m, x, rounded=lambda h: h, limit=None):
    """SwiGLU: down(rounded(silu(gate x) * up x)); with `limit` DeepSeek-V4's clamped SwiGLU,
    silu(min(gate x, limit)) * clamp(up x, -limit, limit) (vLLM SiluAndMulWithClamp)."""
    g, u = matvec(m.gate, x), matvec(m.up, x)
    if limit is not None and MUTATE != "no-clamp":
        g = [min(v, limit) for v in g]
        u = [min(max(v, -limit), limit) for v in u]
    h = [silu(a) * b for a, b in zip(g, u)]
    return matvec(m.down, rounded(h))


def rms_norm(x, w, eps, plus_one):
    inv = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    offset = 1.0 if plus_one and MUTATE != "plain-norm" else 0.0
    return [v * inv * (offset + g) for v, g in zip(x, w)]


class MoeLayer:
    """Layer l's MoE sub-layer, y = x + MoE(RMSNorm(x)), from the checkpoint as stored."""

    def __init__(self, family, ck, l):
        self.family = family
        self.norm = ck[family.pre_moe_norm(l)]
        self.router = ck[family.router(l)]
        bias = family.correction_bias(l)
        self.bias = ck[bias] if bias else None
        self.experts = family.experts(ck, l)
        shared = family.shared_module(l)
        self.shared = family.shared_mlp(ck, l) if shared else None
        self.shared_cache = {}
        self.hash = family.hash_table(ck, l)
        self.limit = family.swiglu_limit()
        gate = family.shared_gate(l)
        self.shared_gate = ck[gate][0] if gate else None

    def __call__(self, x, token_id=None, bf16_points=False):
        """(y, routing margin) for one token's hidden state x (and its id, for DeepSeek-V4's
        hash-routed layers). bf16_points: round the routed experts' input and their SwiGLU
        activation to bf16, as moeshard does."""
        f = self.family
        rounded = (lambda v: round_bf16(v)[1]) if bf16_points else (lambda v: v)
        xn = rms_norm(x, self.norm, f.text["rms_norm_eps"], f.norm_plus_one)
        logits = matvec(self.router, xn)
        if self.hash is not None and MUTATE != "no-hash":
            ids, weights, margin = f.hash_route(logits, self.hash[token_id])
        else:
            ids, weights, margin = f.route(logits, self.bias)
        out = [0.0] * len(x)
        for e, w in zip(ids, weights):
            xe = xn
            if f.weight_on_input and MUTATE != "weight-on-output":
                xe, w = [v * w for v in xn], 1.0
            y = mlp(self.experts[e], rounded(xe), rounded, self.limit)
            out = [o + w * v for o, v in zip(out, y)]
        if self.shared and MUTATE != "no-shared-expert":
            key = tuple(xn)  # the bf16-points call of the same token computes it again
            if key not in self.shared_cache:
                self.shared_cache = {key: mlp(self.shared, xn, limit=self.limit)}
            s = self.shared_cache[key]
            g = 1.0
            if self.shared_gate and MUTATE != "no-shared-gate":
                g = sigmoid(sum(a * b for a, b in zip(self.shared_gate, xn)))
            out = [o + g * v for o, v in zip(out, s)]
        return [a + b for a, b in zip(x, out)], margin


# ------------------------------------------------------------------------------------------------
# The test

def draw_inputs(family, layers, rng):
    """NUM_TOKENS bf16 hidden states (and, for a family that routes by token id, their token
    ids; else None) whose routing, through the float64 chain of `layers`, keeps PREPARE_MARGIN
    at every layer (a token too close to a tie is drawn again)."""
    tokens, ids, redrawn = [], [], 0
    while len(tokens) < NUM_TOKENS:
        x = round_bf16([rng.uniform(-1, 1) for _ in range(H)])[1]
        tid = rng.randrange(family.text["vocab_size"]) if family.token_ids else None
        y, ok = x, True
        for layer in layers:
            y, margin = layer(y, tid)
            ok &= margin >= PREPARE_MARGIN
        if ok:
            tokens.append(x)
            ids.append(tid)
        else:
            redrawn += 1
            assert redrawn < 20 * NUM_TOKENS, "no token routes clear of ties"
    return tokens, ids if family.token_ids else None, redrawn


def run_moeshard(binary, ckpt, topology, inp, out):
    cmd = [binary, "run", "--model", ckpt, "--checkpoint", ckpt, "--input", inp, "--output", out,
           "--iters", "1", "--warmup", "0"] + topology
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("FAILED: %s exited %d:\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    return {name: values for name, (_, _, values) in read_safetensors(out).items()}


def take_option(args, flag, default):
    """The value after `flag` in args (removing both), or default."""
    if flag not in args:
        return default
    i = args.index(flag)
    value = args[i + 1]
    del args[i:i + 2]
    return value


def main():
    global MUTATE
    args = sys.argv[1:]
    mutation = take_option(args, "--mutate", None)
    seed = int(take_option(args, "--seed", "0"))
    if len(args) != 3 or args[2] not in FAMILIES or mutation not in (None,) + MUTATIONS:
        sys.exit(__doc__)
    binary, work, name = args
    start = time.time()
    os.makedirs(work, exist_ok=True)
    family = FAMILIES[name]()
    rng = random.Random("moeshard hf reference %s %d" % (name, seed))
    ckpt = os.path.join(work, name + "_checkpoint")
    write_checkpoint(ckpt, family.config, family.make_tensors(rng))

    ck = Checkpoint(ckpt)
    moe_layers = family.moe_layers()
    layers = [MoeLayer(family, ck, l) for l in moe_layers]
    tokens, token_ids, redrawn = draw_inputs(family, layers, rng)
    MUTATE = mutation  # after drawing: a mutated run sees the same checkpoint and input
    inp = os.path.join(work, name + "_input.safetensors")
    hidden = [v for t in tokens for v in t]
    inputs = {"hidden_states": ("BF16", [NUM_TOKENS, H], hidden)}
    if token_ids is not None:  # `run --input` reads them for the hash-routed layers
        inputs["token_ids"] = ("I64", [NUM_TOKENS], token_ids)
    write_safetensors(inp, inputs)
    print("%s: %d tensors, MoE layers %s, %d tokens (%d redrawn near a routing tie)"
          % (name, len(ck.tensors), moe_layers, NUM_TOKENS, redrawn))

    failed = []
    for label, topology in TOPOLOGIES[:1] if MUTATE else TOPOLOGIES:
        out = os.path.join(work, name + "_output.safetensors")
        got = run_moeshard(binary, ckpt, topology, inp, out)
        want_names = ["layers.%d.hidden_states" % l for l in moe_layers]
        if sorted(got) != sorted(want_names):
            sys.exit("FAILED: %s: outputs %s, expected %s" % (label, sorted(got), want_names))
        xs = tokens
        for l, layer, out_name in zip(moe_layers, layers, want_names):
            ys = [got[out_name][t * H:(t + 1) * H] for t in range(NUM_TOKENS)]
            err = err_bf16 = scale = 0.0
            for t, (x, y) in enumerate(zip(xs, ys)):
                tid = token_ids[t] if token_ids else None
                ref, margin = layer(x, tid)
                if margin < RUN_MARGIN:
                    sys.exit("FAILED: %s layer %d token %d: routing within %.2g of a tie on the "
                             "input moeshard's layer received; try another --seed"
                             % (label, l, t, margin))
                ref_bf16 = layer(x, tid, bf16_points=True)[0]
                err = max(err, max(abs(a - b) for a, b in zip(y, ref)))
                err_bf16 = max(err_bf16, max(abs(a - b) for a, b in zip(y, ref_bf16)))
                scale = max(scale, max(abs(a - b) for a, b in zip(ref, x)))
            ok = err <= TOLERANCE * scale and err_bf16 <= TOLERANCE_BF16 * scale
            print("  %-26s layer %d: max |moeshard - ref| / max |MoE(x)| = %.1e, "
                  "with bf16 points %.1e%s"
                  % (label, l, err / scale, err_bf16 / scale, "" if ok else "  FAILED"))
            if not ok:
                failed.append("%s layer %d" % (label, l))
            xs = ys  # the next layer's input: what moeshard's next layer received
    print("%s: %.1f s" % (name, time.time() - start))
    if failed:
        sys.exit("FAILED (tolerances %.1e and, with bf16 points, %.1e x max |MoE(x)|): %s"
                 % (TOLERANCE, TOLERANCE_BF16, ", ".join(failed)))
    print("ok")


if __name__ == "__main__":
    main()
