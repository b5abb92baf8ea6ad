#!/usr/bin/env python3
"""moeshard against a header-exact copy of a released checkpoint (header_copy.py).

usage: check_release.py MOESHARD RELEASE WORKDIR [--layers N] [--kimi-k3-tp8-ep8]

Writes the copy into WORKDIR/RELEASE (cut to N layers, or all of them), then checks, as a user
would run them:
  * `moeshard inspect DIR` validates every shard, and its family descriptor places every tensor
    (a multi-token-prediction layer is reported as such, not as unplaced);
  * `moeshard plan --model DIR` over several topologies: every tensor placed, the
    multi-token-prediction tensors reported as such (counted here from the names), on every rank
    the weights sized from the headers equal the plan from the directory's config.json, and where
    the release has a vision tower, rank 0's vision bytes equal those computed here from the
    headers with the engines' split rules (VISION_RULES);
  * a plan that does not fit exits 3 with its verdict (and advice where a change fits), never
    a crash;
  * `moeshard build --no-fill` maps every tensor the plan needs on every rank of a topology,
    its allocation equal to the plan, no checkpoint tensor left unplaced.
With --kimi-k3-tp8-ep8 (Kimi-K3, all layers): rank 0 of TP8 EP8 is computed here from the
headers with the engines' split rules (SGLang models/kimi_k3.py, vLLM models/kimi_k3/nvidia,
kimi_k25_vit.py), independently of moeshard, and must equal moeshard's plan byte for byte.
Exit 0 when everything holds; the first failure is printed.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Topologies per release: attention TP must divide the heads, and without EP the per-rank
# expert width must stay a whole number of quantization groups, except MXFP4's uneven block
# shards (gpt-oss at TP4/TP8 without EP: docs/uneven-shards.md).
TOPOLOGIES = {
    "kimi-k3": [["-tp", "8", "-ep"], ["-tp", "4"], ["-tp", "2", "-dp", "2", "-ep"],
                ["-tp", "4", "-pp", "2", "-ep"]],
    "kimi-k2-thinking": [["-tp", "8", "-ep"], ["-tp", "4"], ["-tp", "4", "-pp", "2", "-ep"]],
    "kimi-k2.5": [["-tp", "8", "-ep"], ["-tp", "4"], ["-tp", "2", "-pp", "2"]],
    "deepseek-v3": [["-tp", "8", "-ep"], ["-tp", "4"], ["-tp", "4", "-pp", "2", "-ep"]],
    "qwen3-30b-a3b": [["-tp", "4", "-ep"], ["-tp", "4"], ["-tp", "2", "-pp", "2"]],
    "mixtral-8x7b": [["-tp", "8"], ["-tp", "2", "-ep"], ["-tp", "2", "-pp", "2"]],
    "gpt-oss-20b": [["-tp", "8", "-ep"], ["-tp", "2"], ["-tp", "2", "-pp", "2", "-ep"],
                    ["-tp", "4"]],
    "gpt-oss-120b": [["-tp", "8", "-ep"], ["-tp", "2"], ["-tp", "4", "-pp", "2", "-ep"],
                     ["-tp", "4"], ["-tp", "8"]],
    "deepseek-v2-lite": [["-tp", "8", "-ep"], ["-tp", "2"], ["-tp", "2", "-pp", "2", "-ep"]],
    "qwen1.5-moe-a2.7b": [["-tp", "4", "-ep"], ["-tp", "4"], ["-tp", "2", "-pp", "2"]],
    "glm-4.5-air": [["-tp", "8", "-ep"], ["-tp", "4"], ["-tp", "4", "-pp", "2", "-ep"]],
    "minimax-m2": [["-tp", "8", "-ep"], ["-tp", "4", "-ep"], ["-tp", "4", "-pp", "2", "-ep"]],
    "olmoe-1b-7b": [["-tp", "8", "-ep"], ["-tp", "4"], ["-tp", "2", "-pp", "2", "-ep"]],
    "deepseek-v4-flash": [["-tp", "8", "-ep"], ["-tp", "4"], ["-tp", "4", "-pp", "2", "-ep"]],
    "qwen3-next-80b-a3b": [["-tp", "8", "-ep"], ["-tp", "4"], ["-tp", "2", "-pp", "2", "-ep"]],
    "qwen3.5-35b-a3b": [["-tp", "8", "-ep"], ["-tp", "4"], ["-tp", "2", "-pp", "2", "-ep"]],
    "llama-4-scout-17b-16e": [["-tp", "8", "-ep"], ["-tp", "4"], ["-tp", "2", "-pp", "2", "-ep"]],
}

# The text model's decoder layers, by checkpoint prefix (a vision tower's own "layers." do not
# count: Llama-4's vision_model.model.layers.N).
TEXT_LAYER_PREFIXES = ("model.layers.", "language_model.model.layers.",
                       "model.language_model.layers.")


def expected_mtp(names, num_layers):
    """Multi-token-prediction tensors in a checkpoint, counted here from the names alone:
    decoder-layer indices past num_hidden_layers (DeepSeek-V3, GLM-4.5) and Qwen's mtp.*."""
    n = 0
    for name in names:
        if name.startswith("mtp."):
            n += 1
            continue
        for p in TEXT_LAYER_PREFIXES:
            if name.startswith(p):
                if int(name[len(p):].split(".")[0]) >= num_layers:
                    n += 1
                break
    return n


# Vision tower and projector, per release: the checkpoint prefixes, the name suffixes the
# engines split over TP (only when TP divides the vision heads; vLLM's default encoder mode),
# the ones split whatever the heads, and the config key of the head count. Written from the
# engines' code (vLLM kimi_k25_vit.py, qwen3_vl.py, mllama4.py), independently of moeshard.
VISION_RULES = {
    "kimi-k3": (("vision_tower.", "mm_projector."),
                ("wqkv.weight", "wqkv.bias", "wo.weight", "mlp.fc0.weight", "mlp.fc0.bias",
                 "mlp.fc1.weight"), (), "vt_num_attention_heads"),
    "kimi-k2.5": (("vision_tower.", "mm_projector."),
                  ("wqkv.weight", "wqkv.bias", "wo.weight", "mlp.fc0.weight", "mlp.fc0.bias",
                   "mlp.fc1.weight"), (), "vt_num_attention_heads"),
    "qwen3.5-35b-a3b": (("model.visual.",),
                        ("attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                         "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight",
                         "merger.linear_fc1.weight", "merger.linear_fc1.bias",
                         "merger.linear_fc2.weight"), (), "num_heads"),
    "llama-4-scout-17b-16e": (("vision_model.", "multi_modal_projector."),
                              ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                               "v_proj.weight", "v_proj.bias", "o_proj.weight",
                               "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight",
                               "patch_embedding.linear.weight"),
                              ("multi_modal_projector.linear_1.weight",), "num_attention_heads"),
}


def vision_rank_bytes(release, headers, cfg, tp):
    """Bytes of the vision tower and projector on one rank of TP `tp`, from the headers."""
    prefixes, by_heads, always, heads_key = VISION_RULES[release]
    heads = cfg["vision_config"][heads_key]
    total = 0
    for name, (_, _, nbytes) in headers.items():
        if not name.startswith(prefixes):
            continue
        split = (name in always) or (heads % tp == 0 and name.endswith(by_heads))
        if split and nbytes % tp:
            raise Fail(f"{name}: {nbytes} bytes do not split {tp} ways")
        total += nbytes // tp if split else nbytes
    return total


class Fail(Exception):
    pass


def run(cmd, expect_rc=0):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != expect_rc:
        raise Fail(f"{' '.join(cmd)}: exit {p.returncode}, expected {expect_rc}\n"
                   f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def check_inspect(m, d):
    p = run([m, "inspect", d, "--summary", "--format", "json"])
    j = json.loads(p.stdout)
    fam = j.get("family")
    if not fam or fam.get("error"):
        raise Fail(f"inspect {d}: the family descriptor did not read config.json: {fam}")
    if fam["unplaced"]:
        raise Fail(f"inspect {d}: {len(fam['unplaced'])} tensors not in the {fam['family']} "
                   f"descriptor, e.g. {fam['unplaced'][:3]}")
    return fam


def check_plan(m, d, topo, mtp_tensors):
    p = run([m, "plan", "--model", d, *topo, "--gpu-memory", "100000", "--format", "json"])
    j = json.loads(p.stdout)
    c = j["checkpoint"]
    if c["unplaced"]:
        raise Fail(f"plan {topo}: {len(c['unplaced'])} unplaced, e.g. {c['unplaced'][:3]}")
    if c["placed_bytes"] + c["mtp"]["bytes"] != c["bytes"]:
        raise Fail(f"plan {topo}: placed {c['placed_bytes']} + mtp {c['mtp']['bytes']} != "
                   f"{c['bytes']} checkpoint bytes")
    if c["mtp"]["tensors"] != mtp_tensors:
        raise Fail(f"plan {topo}: moeshard reports {c['mtp']['tensors']} multi-token "
                   f"prediction tensors, the checkpoint names {mtp_tensors}")
    for r in c["ranks"]:
        if r["weights_from_headers"] != r["weights_from_config"]:
            raise Fail(f"plan {topo} rank {r['rank']}: weights from the headers "
                       f"{r['weights_from_headers']} != from config.json "
                       f"{r['weights_from_config']} ({r['by_category']})")
    return j


def check_does_not_fit(m, d):
    # One 2 GiB GPU holds none of these models, not even cut to 4 layers (OLMoE's cut copy is
    # 3.7 GiB): exit 3 with the verdict, no crash.
    p = run([m, "plan", "--model", d, "--gpu-memory", "2"], expect_rc=3)
    if "does not fit" not in p.stderr:
        raise Fail(f"plan on 2 GiB: no verdict in stderr:\n{p.stderr}")
    # A topology that fails on the default H200 with advice (the search re-plans other worlds).
    p = subprocess.run([m, "plan", "--model", d, "-tp", "2", "-ep"], capture_output=True,
                       text=True)
    if p.returncode not in (0, 3):
        raise Fail(f"plan -tp 2 -ep: exit {p.returncode} (a crash?)\n{p.stderr[-2000:]}")
    if p.returncode == 3 and "smallest change that fits:" not in p.stderr:
        raise Fail(f"plan -tp 2 -ep does not fit but gives no advice:\n{p.stderr[-2000:]}")


def check_build(m, d, topo, ranks):
    for r in ranks:
        p = run([m, "build", "--model", d, *topo, "--checkpoint", d, "--no-fill", "--rank",
                 str(r), "--format", "json", "--no-progress"])
        j = json.loads(p.stdout)
        if not j["equal"]:
            raise Fail(f"build {topo} rank {r}: allocation differs from the plan: {j['ranks']}")
        if j["unplaced_tensors"]:
            raise Fail(f"build {topo} rank {r}: {len(j['unplaced_tensors'])} not placed, e.g. "
                       f"{j['unplaced_tensors'][:3]}")


# ---- Kimi-K3 TP8 EP8, rank 0, from the headers with the engines' split rules ----------------

DTYPE_BYTES = {"BF16": 2, "F32": 4, "U8": 1, "I32": 4, "I64": 8, "F8_E4M3": 1}


def read_headers(d):
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for fn in files:
        with open(os.path.join(d, fn), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n))
        h.pop("__metadata__", None)
        for name, t in h.items():
            out[name] = (t["dtype"], t["shape"], t["data_offsets"][1] - t["data_offsets"][0])
    return out


def kimi_k3_rank0_tp8_ep8(headers):
    """Bytes rank 0 holds per category. TP 8 splits attention (column: dim 0, row: dim 1); EP 8
    gives rank 0 experts 0-111 whole; 12 vision heads do not divide by 8, so vLLM runs the tower
    data-parallel (replicated)."""
    tp, experts_per_rank = 8, 896 // 8
    column = ("q_proj.", "k_proj.", "v_proj.", "q_conv1d.", "k_conv1d.", "v_conv1d.",
              "dt_bias", "f_b_proj.", "b_proj.", "g_proj.", "q_b_proj.", "kv_b_proj.",
              "shared_experts.gate_proj.", "shared_experts.up_proj.", "mlp.gate_proj.",
              "mlp.up_proj.", "embed_tokens.", "lm_head.")
    row = ("o_proj.", "shared_experts.down_proj.", "mlp.down_proj.")
    cats = {}

    def add(cat, b):
        cats[cat] = cats.get(cat, 0) + b

    for name, (dtype, shape, nbytes) in headers.items():
        if name.startswith(("vision_tower.", "mm_projector.")):
            add("vision", nbytes)
            continue
        if ".experts." in name and "shared_experts" not in name:
            e = int(name.split(".experts.")[1].split(".")[0])
            if e < experts_per_rank:
                add("routed_experts", nbytes)
            continue
        if name.endswith("self_attn.A_log"):
            # [128] stored; the first 96 heads are read and split by TP.
            add("attention", 96 // tp * DTYPE_BYTES[dtype])
            continue
        split = 1
        leaf = name.split("language_model.")[-1]
        if any(k in leaf for k in column) or any(k in leaf for k in row):
            split = tp
        if "embed_tokens" in name:
            cat = "embedding"
        elif "lm_head" in name:
            cat = "lm_head"
        elif ".mlp." in name:
            cat = "dense_mlp"
        elif "shared_experts" in name:
            cat = "shared_experts"
        elif "routed_expert_" in name:
            cat = "latent_proj"
        elif "block_sparse_moe.gate" in name:
            cat = "router"
        elif "self_attn." in name:
            cat = "attention"
        else:
            cat = "norms"  # layer norms, attention residuals, final norms
        if nbytes % split:
            raise Fail(f"{name}: {nbytes} bytes do not split {split} ways")
        add(cat, nbytes // split)
    return cats


def check_kimi_k3_rank(m, d):
    want = kimi_k3_rank0_tp8_ep8(read_headers(d))
    p = run([m, "plan", "--model", d, "-tp", "8", "-ep", "--gpu-memory", "100000", "--format",
             "json"])
    j = json.loads(p.stdout)
    got = {k: v for k, v in j["ranks"][0]["bytes"].items()
           if k in want or (k in ("embedding", "attention", "dense_mlp", "router",
                                  "shared_experts", "latent_proj", "routed_experts", "norms",
                                  "lm_head", "vision") and v)}
    if got != want:
        diff = {k: (want.get(k), got.get(k)) for k in set(want) | set(got)
                if want.get(k) != got.get(k)}
        raise Fail(f"Kimi-K3 TP8 EP8 rank 0: (split rules here, moeshard) differ: {diff}")
    total = sum(want.values())
    if j["ranks"][0]["bytes"]["weights_total"] != total:
        raise Fail(f"Kimi-K3 TP8 EP8 rank 0: total {j['ranks'][0]['bytes']['weights_total']} "
                   f"!= {total}")
    print(f"kimi-k3 TP8 EP8 rank 0: {total} bytes ({total / 2**30:.2f} GiB), by category "
          f"{want}: equal")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("moeshard")
    ap.add_argument("release")
    ap.add_argument("workdir")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--kimi-k3-tp8-ep8", action="store_true")
    a = ap.parse_args()
    d = os.path.join(a.workdir, a.release + (f"-{a.layers}l" if a.layers else ""))
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(d + ".tmp", ignore_errors=True)
    os.makedirs(a.workdir, exist_ok=True)
    cmd = [sys.executable, os.path.join(HERE, "header_copy.py"), a.release, d]
    if a.layers:
        cmd += ["--layers", str(a.layers)]
    try:
        run(cmd)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        text = cfg.get("text_config", cfg)
        headers = read_headers(d)
        mtp = expected_mtp(headers, text["num_hidden_layers"])
        if text.get("num_nextn_predict_layers", 0) and not mtp:
            raise Fail("the config has num_nextn_predict_layers but the copy no MTP layer")
        m = a.moeshard
        fam = check_inspect(m, d)
        for topo in TOPOLOGIES[a.release]:
            j = check_plan(m, d, topo, mtp)
            if a.release in VISION_RULES:
                tp = int(topo[topo.index("-tp") + 1])
                want = vision_rank_bytes(a.release, headers, cfg, tp)
                got = j["ranks"][0]["bytes"].get("vision", 0)
                if got != want:
                    raise Fail(f"plan {topo} rank 0: vision {got} bytes, {want} by the engines' "
                               f"split rules")
        check_does_not_fit(m, d)
        topo = TOPOLOGIES[a.release][0]
        world = 1
        for flag, v in zip(topo, topo[1:] + [""]):
            if flag in ("-tp", "-dp", "-pp"):
                world *= int(v)
        check_build(m, d, topo, [0, world - 1])
        if a.kimi_k3_tp8_ep8:
            check_kimi_k3_rank(m, d)
    except Fail as e:
        print(f"{a.release}: FAILED: {e}")
        return 1
    finally:
        shutil.rmtree(d, ignore_errors=True)
    extra = ", vision bytes by the engines' rules" if a.release in VISION_RULES else ""
    print(f"{a.release}{f' ({a.layers} layers)' if a.layers else ''}: inspect ({fam['family']}), "
          f"plan over {len(TOPOLOGIES[a.release])} topologies (every tensor placed, headers == "
          f"config, {mtp} MTP tensors{extra}), does-not-fit exit 3, build --no-fill: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
