"""Minimal safetensors I/O and bf16 packing for the `moeshard run --input/--output` tests
(standard library only).

write_st(path, {name: (dtype, shape, bytes)}) writes one file; read_st(path) returns
{name: (shape, F32 values)} of a moeshard output file (every tensor F32); bf16(x) is x rounded
to nearest even, as the 2 bytes of a BF16 value.
"""
import json
import struct


def write_st(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        assert info["dtype"] == "F32", (name, info["dtype"])
        data = raw[8 + n + b:8 + n + e]
        out[name] = (info["shape"], struct.unpack("<%df" % (len(data) // 4), data))
    return out


def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return struct.pack("<H", u)
