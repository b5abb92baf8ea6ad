#!/usr/bin/env python3
"""Independent structural check of a checkpoint directory written by header_copy.py
(or of any sharded safetensors checkpoint): reads only the files, not the generator.

For every *.safetensors file: the 8-byte little-endian header length, a JSON header that
parses, header length a multiple of 8, known dtypes, data_offsets contiguous from 0 in
file order and matching dtype x shape, and file size == 8 + header_len + last end.
For model.safetensors.index.json: it names exactly the files present, every tensor in the
headers appears once with the right file, and total_size is the sum of the tensor bytes.
Also reports how much disk the copy really occupies (sparse data).

Usage: check_copy.py DIR [DIR ...]      exit status 0 when every directory passes.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
         "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def check_dir(d: Path) -> list[str]:
    errs: list[str] = []
    files = sorted(p.name for p in d.glob("*.safetensors"))
    if not (d / "config.json").is_file():
        errs.append("config.json missing")
    else:
        json.loads((d / "config.json").read_text())
    seen: dict[str, str] = {}
    tensor_bytes = 0
    disk = 0
    for fn in files:
        p = d / fn
        size = p.stat().st_size
        disk += p.stat().st_blocks * 512
        with open(p, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            raw = f.read(hlen)
        if hlen % 8:
            errs.append(f"{fn}: header length {hlen} not a multiple of 8")
        hdr = json.loads(raw.decode("utf-8"))
        hdr.pop("__metadata__", None)
        end = 0
        for name, info in hdr.items():          # JSON object order == file order
            dt, shape, (a, b) = info["dtype"], info["shape"], info["data_offsets"]
            if dt not in SIZES:
                errs.append(f"{fn}: {name}: unknown dtype {dt}")
                continue
            n = SIZES[dt]
            for s in shape:
                n *= s
            if a != end:
                errs.append(f"{fn}: {name}: starts at {a}, expected {end}")
            if b - a != n:
                errs.append(f"{fn}: {name}: {b - a} bytes for {dt}{shape} ({n} expected)")
            end = b
            if name in seen:
                errs.append(f"{name} in both {seen[name]} and {fn}")
            seen[name] = fn
            tensor_bytes += n
        if size != 8 + hlen + end:
            errs.append(f"{fn}: size {size} != 8 + {hlen} + {end}")
    idx_path = d / "model.safetensors.index.json"
    if not idx_path.is_file():
        errs.append("model.safetensors.index.json missing")
    else:
        idx = json.loads(idx_path.read_text())
        wm = idx["weight_map"]
        if set(wm.values()) != set(files):
            errs.append(f"index names {sorted(set(wm.values()) ^ set(files))} "
                        "not matching the files present")
        if wm != seen:
            missing = set(seen) - set(wm)
            extra = set(wm) - set(seen)
            wrong = [k for k in set(wm) & set(seen) if wm[k] != seen[k]]
            errs.append(f"index vs headers: {len(missing)} missing, {len(extra)} extra, "
                        f"{len(wrong)} in the wrong file")
        if idx["metadata"]["total_size"] != tensor_bytes:
            errs.append(f"total_size {idx['metadata']['total_size']} != {tensor_bytes}")
    print(f"{d}: {len(files)} shards, {len(seen)} tensors, {tensor_bytes} bytes, "
          f"{disk / 2**20:.1f} MiB on disk: {'OK' if not errs else 'FAIL'}")
    return errs


def main(argv: list[str]) -> int:
    bad = 0
    for a in argv:
        errs = check_dir(Path(a))
        for e in errs[:20]:
            print("  " + e)
        bad += bool(errs)
    return 1 if bad or not argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
