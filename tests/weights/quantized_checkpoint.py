#!/usr/bin/env python3
"""Writes a checkpoint of quantized linears in a released layout by hand (stdlib only), with the
dequantized value of every quantized linear, for the loader cross-check in
quantized_checkpoint_test.cc.

usage: quantized_checkpoint.py LAYOUT SPEC_JSON OUT_DIR EXPECTED_FILE

LAYOUT is one of awq, gptq, gptq_v2, gptq-act, ct-int4-asym, ct-nvfp4, modelopt-nvfp4, ct-fp8-channel,
modelopt-fp8, deepseek-v4. SPEC_JSON holds
{"group": g, "plain": [{"name", "dtype", "shape"}, ...], "linears": [{"module", "out", "in"}]}:
the unquantized tensors moeshard expects (filled with a byte pattern) and the quantized linears
[out, in] by module name, with their weight format where a layout has two (DeepSeek-V4); OUT_DIR gets model.safetensors. Each linear's stored tensors are written here from this script's own
reading of each layout (names, dtypes, shapes, packing), and EXPECTED_FILE (safetensors) holds
its dequantized values, F32 [out, in], under the module name. Layouts (sources):
  awq            AutoAWQ GEMM: qweight I32 [in, out/8] with output column order[i] of each eight
                 in nibble i, order 0,2,4,6,1,3,5,7; qzeros I32 [in/g, out/8] likewise; scales
                 F16 [in/g, out]; w = (q - z) * s
  gptq, gptq_v2  AutoGPTQ: qweight I32 [in/8, out], input row 8k+j in nibble j; qzeros I32
                 [in/g, out/8], output 8k+j in nibble j, storing z - 1 (gptq) or z (gptq_v2);
                 scales F16 [in/g, out]; g_idx I32 [in] = i / g
  gptq-act       gptq with act-order (desc_act): g_idx a shuffled assignment of g channels to
                 each group; w = (q - z[g_idx[i]]) * s[g_idx[i]]
  ct-int4-asym   compressed-tensors pack-quantized: weight_packed I32 [out, in/8] (input 8k+j in
                 nibble j), weight_zero_point I32 [ceil(out/8), in/g] (output 8k+j in nibble j),
                 weight_scale BF16 [out, in/g], weight_shape I64 [2]; w = (q - z) * s
  ct-nvfp4       compressed-tensors nvfp4-pack-quantized: weight_packed U8 [out, in/2] (even
                 column low nibble), weight_scale F8_E4M3 [out, in/16], weight_global_scale F32
                 [1] dividing: w = e2m1(q) * e4m3(s) / global
  modelopt-nvfp4 ModelOpt: weight U8 [out, in/2], weight_scale F8_E4M3 [out, in/16],
                 weight_scale_2 F32 [] multiplying, input_scale F32 []
  ct-fp8-channel compressed-tensors float-quantized, strategy channel: weight F8_E4M3 [out, in],
                 weight_scale F32 [out, 1]; w = e4m3(q) * s[row]
  modelopt-fp8   ModelOpt FP8: weight F8_E4M3 [out, in], weight_scale F32 [] (one per tensor),
                 input_scale F32 []
  deepseek-v4    DeepSeek-V4's release: fp8 linears weight F8_E4M3 [out, in] with scale F8_E8M0
                 [out/128, in/128] (w = e4m3(q) * 2^(e - 127)); MXFP4 experts weight I8
                 [out, in/2] (even column low nibble) with scale F8_E8M0 [out, in/32]
Values come from a generator seeded by the module name; every value is exact in F32.
"""
import json
import os
import random
import struct
import sys

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1,
               "I32": 4, "I64": 8}
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1(code):
    v = E2M1[code & 7]
    return -v if code & 8 else v


def e4m3(code):
    sign, exp, man = code >> 7, (code >> 3) & 15, code & 7
    v = (man / 8.0) * 2.0 ** -6 if exp == 0 else (1 + man / 8.0) * 2.0 ** (exp - 7)
    return -v if sign else v


def f16_bytes(v):
    return struct.pack("<e", v)


def bf16_bytes(v):
    return struct.pack("<f", v)[2:]  # exact: every scale here has <= 7 mantissa bits


def words(values):
    """Eight 4-bit values -> one little-endian int32 word, value j in nibble j."""
    w = 0
    for j, v in enumerate(values):
        w |= (v & 15) << (4 * j)
    return struct.pack("<I", w)


def pattern(name, n):
    s = sum(name.encode())
    return bytes((s + 7 * k + (k >> 8)) & 0xFF for k in range(n))


def quantized(layout, module, out, inn, g, fmt):
    """{name: (dtype, shape, bytes)} of one linear, and its dequantized rows."""
    rng = random.Random(module)
    t = {}
    if layout == "deepseek-v4" and fmt == "fp8-block":
        q = [[rng.randrange(0x7F) | (rng.randrange(2) << 7) for _ in range(inn)] for _ in range(out)]
        rb, cb = (out + 127) // 128, (inn + 127) // 128
        e = [[rng.randrange(118, 128) for _ in range(cb)] for _ in range(rb)]
        deq = [[e4m3(q[o][i]) * 2.0 ** (e[o // 128][i // 128] - 127) for i in range(inn)]
               for o in range(out)]
        t[module + ".weight"] = ("F8_E4M3", [out, inn], bytes(c for r in q for c in r))
        t[module + ".scale"] = ("F8_E8M0", [rb, cb], bytes(c for r in e for c in r))
        return t, deq
    if layout == "deepseek-v4":  # mxfp4 experts
        q = [[rng.randrange(16) for _ in range(inn)] for _ in range(out)]
        e = [[rng.randrange(118, 128) for _ in range(inn // 32)] for _ in range(out)]
        deq = [[e2m1(q[o][i]) * 2.0 ** (e[o][i // 32] - 127) for i in range(inn)] for o in range(out)]
        packed = bytes(q[o][i] | (q[o][i + 1] << 4) for o in range(out) for i in range(0, inn, 2))
        t[module + ".weight"] = ("I8", [out, inn // 2], packed)
        t[module + ".scale"] = ("F8_E8M0", [out, inn // 32], bytes(c for r in e for c in r))
        return t, deq
    if layout in ("ct-nvfp4", "modelopt-nvfp4"):
        q = [[rng.randrange(16) for _ in range(inn)] for _ in range(out)]
        s = [[0x30 + rng.randrange(16) for _ in range(inn // 16)] for _ in range(out)]
        glob = 2.0 ** rng.randrange(3, 7)  # a power of two: its reciprocal is exact
        mult = 1.0 / glob if layout == "ct-nvfp4" else glob / 256.0
        deq = [[e2m1(q[o][i]) * e4m3(s[o][i // 16]) * mult for i in range(inn)] for o in range(out)]
        packed = bytes(q[o][i] | (q[o][i + 1] << 4) for o in range(out) for i in range(0, inn, 2))
        leaf = "weight_packed" if layout == "ct-nvfp4" else "weight"
        t[module + "." + leaf] = ("U8", [out, inn // 2], packed)
        t[module + ".weight_scale"] = ("F8_E4M3", [out, inn // 16], bytes(c for r in s for c in r))
        if layout == "ct-nvfp4":
            t[module + ".weight_global_scale"] = ("F32", [1], struct.pack("<f", glob))
        else:
            t[module + ".weight_scale_2"] = ("F32", [], struct.pack("<f", mult))
            t[module + ".input_scale"] = ("F32", [], struct.pack("<f", 1.0))
        return t, deq
    if layout in ("ct-fp8-channel", "modelopt-fp8"):
        # e4m3 codes below the NaN codes, either sign; scales k / 1024.
        q = [[rng.randrange(0x7F) | (rng.randrange(2) << 7) for _ in range(inn)] for _ in range(out)]
        per_row = layout == "ct-fp8-channel"
        one = rng.randrange(1, 64) / 1024.0
        s = [rng.randrange(1, 64) / 1024.0 if per_row else one for _ in range(out)]
        deq = [[e4m3(q[o][i]) * s[o] for i in range(inn)] for o in range(out)]
        t[module + ".weight"] = ("F8_E4M3", [out, inn], bytes(c for r in q for c in r))
        if per_row:
            t[module + ".weight_scale"] = ("F32", [out, 1], struct.pack("<%df" % out, *s))
        else:
            t[module + ".weight_scale"] = ("F32", [], struct.pack("<f", one))
            t[module + ".input_scale"] = ("F32", [], struct.pack("<f", 1.0))
        return t, deq
    groups = inn // g
    q = [[rng.randrange(16) for _ in range(inn)] for _ in range(out)]
    z = [[rng.randrange(1, 16) for _ in range(groups)] for _ in range(out)]  # GPTQ v1 stores z - 1
    s = [[rng.randrange(1, 64) / 1024.0 for _ in range(groups)] for _ in range(out)]
    # Act-order: GPTQ visits the input channels in a data-dependent order and gives the n-th
    # visited channel group n // g, so g_idx is a shuffled assignment with g channels a group.
    gidx = [i // g for i in range(inn)]
    if layout == "gptq-act":
        order = list(range(inn))
        rng.shuffle(order)
        for n, i in enumerate(order):
            gidx[i] = n // g
        layout = "gptq"
    deq = [[(q[o][i] - z[o][gidx[i]]) * s[o][gidx[i]] for i in range(inn)] for o in range(out)]
    if layout == "awq":
        t[module + ".qweight"] = ("I32", [inn, out // 8], b"".join(
            words([q[k * 8 + AWQ_ORDER[j]][i] for j in range(8)])
            for i in range(inn) for k in range(out // 8)))
        t[module + ".qzeros"] = ("I32", [groups, out // 8], b"".join(
            words([z[k * 8 + AWQ_ORDER[j]][gi] for j in range(8)])
            for gi in range(groups) for k in range(out // 8)))
        t[module + ".scales"] = ("F16", [groups, out], b"".join(
            f16_bytes(s[o][gi]) for gi in range(groups) for o in range(out)))
    elif layout in ("gptq", "gptq_v2"):
        off = 1 if layout == "gptq" else 0
        t[module + ".qweight"] = ("I32", [inn // 8, out], b"".join(
            words([q[o][k * 8 + j] for j in range(8)]) for k in range(inn // 8) for o in range(out)))
        t[module + ".qzeros"] = ("I32", [groups, out // 8], b"".join(
            words([z[k * 8 + j][gi] - off for j in range(8)])
            for gi in range(groups) for k in range(out // 8)))
        t[module + ".scales"] = ("F16", [groups, out], b"".join(
            f16_bytes(s[o][gi]) for gi in range(groups) for o in range(out)))
        t[module + ".g_idx"] = ("I32", [inn], b"".join(struct.pack("<i", v) for v in gidx))
    elif layout == "ct-int4-asym":
        t[module + ".weight_packed"] = ("I32", [out, inn // 8], b"".join(
            words([q[o][k * 8 + j] for j in range(8)]) for o in range(out) for k in range(inn // 8)))
        rows8 = (out + 7) // 8
        t[module + ".weight_zero_point"] = ("I32", [rows8, groups], b"".join(
            words([z[k * 8 + j][gi] if k * 8 + j < out else 0 for j in range(8)])
            for k in range(rows8) for gi in range(groups)))
        t[module + ".weight_scale"] = ("BF16", [out, groups], b"".join(
            bf16_bytes(s[o][gi]) for o in range(out) for gi in range(groups)))
        t[module + ".weight_shape"] = ("I64", [2], struct.pack("<qq", out, inn))
    else:
        sys.exit("unknown layout " + layout)
    return t, deq


def write(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        if len(data) != n:
            sys.exit("%s: %d bytes for %s %s" % (name, len(data), dtype, shape))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        blobs.append(data)
        off += n
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    layout, spec_path, out_dir, expected_path = sys.argv[1:5]
    spec = json.load(open(spec_path))
    os.makedirs(out_dir, exist_ok=True)
    tensors, expected = {}, {}
    for p in spec["plain"]:
        n = DTYPE_BYTES[p["dtype"]]
        for d in p["shape"]:
            n *= d
        tensors[p["name"]] = (p["dtype"], p["shape"], pattern(p["name"], n))
    for lin in spec["linears"]:
        t, deq = quantized(layout, lin["module"], lin["out"], lin["in"], spec["group"],
                           lin.get("format"))
        tensors.update(t)
        expected[lin["module"]] = ("F32", [lin["out"], lin["in"]],
                                   b"".join(struct.pack("<%df" % len(r), *r) for r in deq))
    write(os.path.join(out_dir, "model.safetensors"), tensors)
    write(expected_path, expected)


if __name__ == "__main__":
    main()
