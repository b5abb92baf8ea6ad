#!/usr/bin/env python3
"""Regenerates the committed seed corpora of the weights fuzz targets (stdlib only).

Usage: python3 src/weights/fuzz/make_seed_corpus.py   (from the repository root)
Valid files come first in each family, then one malformed file per validation rule.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
        "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
        "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
        "I64": 64, "U64": 64}


def raw(header, data=b""):
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header)) + header + data


def st(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape); returns a valid file with patterned data."""
    h, data = {}, b""
    if metadata is not None:
        h["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        size = n * BITS[dtype] // 8
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + size]}
        data += bytes((len(data) + i) * 37 % 251 for i in range(size))
    text = json.dumps(h, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return raw(text, data)


def header_seeds():
    out = {}
    out["valid_single_f32"] = st([("w", "F32", [2, 3])])
    out["valid_every_dtype"] = st([(f"t.{d}", d, [2, 4]) for d in BITS])
    out["valid_metadata"] = st([("a", "BF16", [4])], {"format": "pt", "x": ""})
    out["valid_scalar_and_empty"] = st([("s", "F64", []), ("z", "I32", [0, 7]), ("u", "U8", [3])])
    out["valid_empty"] = raw("{}      ")
    out["valid_moe_names"] = st([
        ("model.layers.0.mlp.experts.0.gate_proj.weight", "F8_E4M3", [4, 4]),
        ("model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv", "F32", [1, 1]),
        ("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", [2, 4, 1, 16]),
        ("model.layers.0.mlp.experts.gate_up_proj_scales", "U8", [2, 4, 1]),
    ])
    out["valid_unpadded_misaligned"] = st([("a", "U8", [3]), ("b", "F32", [2])], pad=False)
    out["valid_whitespace"] = raw(" \n{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}\t ", b"\x07")
    e = lambda dt, shape, b, en: {"dtype": dt, "shape": shape, "data_offsets": [b, en]}
    j = lambda d: json.dumps(d, separators=(",", ":"))
    out["bad_short"] = b"\x01\x00\x00"
    out["bad_huge_n"] = struct.pack("<Q", 100_000_001) + b"{}"
    out["bad_n_past_end"] = struct.pack("<Q", 40) + b"{}"
    out["bad_utf8"] = raw(b'{"\xff":1}')
    out["bad_bom"] = raw(b"\xef\xbb\xbf{}")
    out["bad_nul_pad"] = raw(b"{}\x00\x00\x00\x00\x00\x00")
    out["bad_array"] = raw("[]")
    out["bad_trailing"] = raw("{} x")
    out["bad_dtype"] = raw(j({"w": e("F17", [1], 0, 1)}), b"\x00")
    out["bad_extra_field"] = raw('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":0}}', b"\x00")
    out["bad_missing_field"] = raw('{"w":{"dtype":"U8","shape":[1]}}', b"\x00")
    out["bad_negative"] = raw(j({"w": e("U8", [-1], 0, 0)}))
    out["bad_fraction"] = raw('{"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}', b"\x00")
    out["bad_2p48"] = raw(j({"w": e("U8", [2**48 + 1], 0, 0)}))
    out["bad_rank9"] = raw(j({"w": e("U8", [1] * 9, 0, 1)}), b"\x00")
    out["bad_offsets_len"] = raw('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}', b"\x00")
    out["bad_end_lt_begin"] = raw(j({"w": e("U8", [0], 4, 0)}), b"\x00" * 4)
    out["bad_dup_tensor"] = raw('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\x00\x00")
    out["bad_dup_field"] = raw('{"w":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00")
    out["bad_dup_metadata"] = raw('{"__metadata__":{"a":"1","a":"2"}}')
    out["bad_metadata_value"] = raw('{"__metadata__":{"a":1}}')
    out["bad_gap"] = raw(j({"a": e("U8", [4], 0, 4), "b": e("U8", [4], 5, 9)}), b"\x00" * 9)
    out["bad_overlap"] = raw(j({"a": e("U8", [4], 0, 4), "b": e("U8", [4], 2, 6)}), b"\x00" * 6)
    out["bad_first_not_zero"] = raw(j({"a": e("U8", [4], 2, 6)}), b"\x00" * 6)
    out["bad_elem_overflow"] = raw(j({"w": e("U8", [2**48, 2**48], 0, 0)}))
    out["bad_bits_overflow"] = raw(j({"w": e("F64", [2**48, 2**14], 0, 0)}))
    out["bad_partial_byte"] = raw(j({"w": e("F4", [3], 0, 2)}), b"\x00" * 2)
    out["bad_size_mismatch"] = raw(j({"w": e("BF16", [2, 2], 0, 6)}), b"\x00" * 6)
    out["bad_trailing_data"] = raw(j({"w": e("U8", [4], 0, 4)}), b"\x00" * 5)
    out["bad_truncated_data"] = raw(j({"w": e("U8", [4], 0, 4)}), b"\x00" * 3)
    return out


def index_seeds():
    wm = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
          "model.layers.0.mlp.experts.0.down_proj.weight": "model-00002-of-00002.safetensors"}
    out = {}
    out["valid_index"] = json.dumps({"metadata": {"total_size": 1234}, "weight_map": wm}, indent=2)
    out["valid_no_metadata"] = json.dumps({"weight_map": wm})
    out["valid_extra_keys"] = json.dumps({"metadata": {"total_size": 1, "total_parameters": 5,
                                                       "nested": {"a": [1, 2.5, None]}},
                                          "weight_map": {}, "other": True})
    out["bad_traversal"] = json.dumps({"weight_map": {"a": "../model.safetensors"}})
    out["bad_absolute"] = json.dumps({"weight_map": {"a": "/etc/passwd"}})
    out["bad_subdir"] = json.dumps({"weight_map": {"a": "sub/model.safetensors"}})
    out["bad_backslash"] = json.dumps({"weight_map": {"a": "..\\x.safetensors"}})
    out["bad_dup_tensor"] = '{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}'
    out["bad_dup_top"] = '{"weight_map": {}, "weight_map": {}}'
    out["bad_not_string"] = json.dumps({"weight_map": {"a": 3}})
    out["bad_missing_map"] = json.dumps({"metadata": {}})
    out["bad_total_negative"] = json.dumps({"metadata": {"total_size": -1}, "weight_map": {}})
    out["bad_total_float"] = json.dumps({"metadata": {"total_size": 1.5}, "weight_map": {}})
    out["bad_deep"] = '{"metadata": ' + "[" * 40 + "]" * 40 + ', "weight_map": {}}'
    out["bad_trailing"] = '{"weight_map": {}} {}'
    return {k: v.encode() for k, v in out.items()}


def main():
    for family, seeds in (("safetensors_header", header_seeds()),
                          ("checkpoint_index", index_seeds())):
        d = os.path.join(HERE, "corpus", family)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
