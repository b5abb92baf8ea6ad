#!/usr/bin/env python3
"""An independent safetensors writer and strict reader (Python stdlib only: struct, json).

Written from the format description, not from moeshard's code, so the C++ reader and writer can
be checked against a second implementation:

  make OUT_DIR         hand-builds reference files and OUT_DIR/manifest.json describing them
  verify FILE...        validates each FILE with the reference rules plus moeshard's extra ones
                       (duplicate keys, numbers in [0, 2^48], rank <= 8) and prints one JSON
                       line per file: {"file", "ok": true, "description"} or
                       {"file", "ok": false, "error"}

A description: {"metadata": {...}, "header_bytes": N, "tensors": [{"name", "dtype", "shape",
"data_offsets", "hex"}, ...]} with tensors in data order.
"""
import json
import os
import struct
import sys

BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
        "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
        "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
        "I64": 64, "U64": 64}
MAX_HEADER = 100_000_000
MAX_NUMBER = 2 ** 48


class Invalid(Exception):
    pass


def pattern(seed, n):
    return bytes((seed * 131 + i * 7 + (i >> 3)) & 0xFF for i in range(n))


def nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return n * BITS[dtype] // 8


def build(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, data)] in data order -> file bytes."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        assert len(data) == nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def reject_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise Invalid(f"duplicate key {k!r}")
        seen[k] = v
    return seen


def reject_constant(name):
    raise Invalid(f"non-standard JSON constant {name}")


def check_text(s):
    """Strings must be encodable UTF-8 (json.loads lets lone surrogate escapes through)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid(f"string {s!r} is not valid Unicode")


def is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_NUMBER


def verify(blob):
    if len(blob) < 8:
        raise Invalid("file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER:
        raise Invalid("header too large")
    if 8 + n > len(blob):
        raise Invalid("header length past end of file")
    try:
        text = blob[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise Invalid(f"header not UTF-8: {e}")
    try:
        header = json.loads(text, object_pairs_hook=reject_duplicates,
                            parse_constant=reject_constant)
    except (ValueError, RecursionError) as e:
        raise Invalid(f"header not JSON: {e}")
    if not isinstance(header, dict):
        raise Invalid("header not an object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise Invalid("__metadata__ not string->string")
        for k, v in metadata.items():
            check_text(k)
            check_text(v)
    entries = []
    for name, info in header.items():
        check_text(name)
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise Invalid(f"{name!r}: entry must have exactly dtype, shape, data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in BITS:
            raise Invalid(f"{name!r}: unknown dtype")
        if not isinstance(shape, list) or len(shape) > 8 or not all(map(is_count, shape)):
            raise Invalid(f"{name!r}: bad shape")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(is_count, offsets)):
            raise Invalid(f"{name!r}: bad data_offsets")
        entries.append((offsets[0], offsets[1], name, dtype, shape))
    entries.sort()
    data = blob[8 + n:]
    pos = 0
    out = []
    for begin, end, name, dtype, shape in entries:
        if begin != pos or end < begin:
            raise Invalid(f"{name!r}: offsets not contiguous")
        count = 1
        for d in shape:
            count *= d
        bits = count * BITS[dtype]
        if count >= 2 ** 63 or bits >= 2 ** 63:
            raise Invalid(f"{name!r}: size overflows 64 bits")
        if bits % 8 != 0 or bits // 8 != end - begin:
            raise Invalid(f"{name!r}: size does not match offsets")
        out.append({"name": name, "dtype": dtype, "shape": shape, "data_offsets": [begin, end],
                    "hex": data[begin:end].hex()})
        pos = end
    if pos != len(data):
        raise Invalid("data buffer does not end at the last tensor")
    return {"metadata": metadata or {}, "header_bytes": n, "tensors": out}


def make(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    files = {}
    every = [(f"dtype.{d}", d, [3, 8], pattern(i, nbytes(d, [3, 8])))
             for i, d in enumerate(BITS)]
    every.append(("scalar", "F32", [], pattern(90, 4)))
    every.append(("empty", "BF16", [0, 5], b""))
    every.append(('quote"and\\slash/\u00e9\u4e2d\x07', "U8", [2], pattern(91, 2)))
    files["reference.safetensors"] = build(every, {"format": "pt", "note": "hand-built \u00e9"})
    files["misaligned.safetensors"] = build(
        [("odd", "U8", [3], pattern(1, 3)), ("f32", "F32", [2, 3], pattern(2, 24)),
         ("f64", "F64", [3], pattern(3, 24))], pad=False)
    files["mxfp4.safetensors"] = build([
        ("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", [4, 8, 2, 16],
         pattern(4, 4 * 8 * 2 * 16)),
        ("model.layers.0.mlp.experts.gate_up_proj_scales", "F8_E8M0", [4, 8, 2],
         pattern(5, 4 * 8 * 2)),
        ("model.layers.0.mlp.experts.0.down_proj.weight", "F8_E4M3", [8, 16], pattern(6, 128)),
        ("model.layers.0.mlp.experts.0.down_proj.weight_scale_inv", "F32", [1, 1], pattern(7, 4)),
        ("fp4", "F4", [6, 4], pattern(8, 12))])
    shard1 = build([("embed", "BF16", [4, 4], pattern(10, 32)),
                    ("layers.0.w", "F32", [2, 2], pattern(11, 16))])
    shard2 = build([("layers.1.w", "F32", [2, 2], pattern(12, 16))])
    os.makedirs(os.path.join(out_dir, "sharded"), exist_ok=True)
    files["sharded/model-00001-of-00002.safetensors"] = shard1
    files["sharded/model-00002-of-00002.safetensors"] = shard2
    files["sharded/unreferenced.safetensors"] = b"garbage, not referenced by the index"
    index = {"metadata": {"total_size": 64},
             "weight_map": {"embed": "model-00001-of-00002.safetensors",
                            "layers.0.w": "model-00001-of-00002.safetensors",
                            "layers.1.w": "model-00002-of-00002.safetensors"}}
    files["sharded/model.safetensors.index.json"] = json.dumps(index, indent=2).encode()
    manifest = {}
    for rel, blob in files.items():
        with open(os.path.join(out_dir, rel), "wb") as f:
            f.write(blob)
        if rel.endswith(".safetensors") and "unreferenced" not in rel:
            manifest[rel] = verify(blob)
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, ensure_ascii=False, indent=1)


def main(argv):
    if len(argv) == 3 and argv[1] == "make":
        make(argv[2])
        return 0
    if len(argv) >= 3 and argv[1] == "verify":
        for path in argv[2:]:
            with open(path, "rb") as f:
                blob = f.read()
            try:
                line = {"file": path, "ok": True, "description": verify(blob)}
            except Invalid as e:
                line = {"file": path, "ok": False, "error": str(e)}
            print(json.dumps(line, ensure_ascii=False))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
