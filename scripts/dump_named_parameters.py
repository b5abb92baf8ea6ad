#!/usr/bin/env python3
"""Writes one rank's parameter list in the dump format `moeshard check --against` reads.

Run it on every rank of an engine after its weights are loaded (docs/ownership.md):

    from dump_named_parameters import dump_module
    dump_module(model, rank=rank, world=world, out_dir="dump/", engine="vllm 0.11",
                ownership=loader_records)   # optional: {name: {"slices": [...], "padding": [...]}}

then `moeshard check --model M -tp .. --against dump/`. Each rank writes dump/rank-NNNNN.json
(through a temporary file and a rename). Without `ownership` the dump carries names, shapes and
dtypes only: moeshard checks shapes and dtypes, and coverage where slices are declared.

The format helpers (param_record, rank_record, write_rank_record, dtype_name) need no torch.
"""
import json
import os
import sys

FORMAT = "moeshard-engine-dump"
VERSION = 1


def dtype_name(dtype):
    """'bfloat16' for torch.bfloat16 or the string 'torch.bfloat16'; other strings unchanged."""
    name = str(dtype)
    return name[len("torch."):] if name.startswith("torch.") else name


def param_record(name, shape, dtype, slices=None, padding=None):
    """One parameter. slices: [{"dim", "begin", "end"}] or [{"dim": 0, "experts": [...]}] in
    the checkpoint tensor's coordinates; padding: per dim, the allocated entries that are
    padding (zero tail), not data."""
    rec = {"name": str(name), "shape": [int(d) for d in shape], "dtype": dtype_name(dtype)}
    if slices is not None:
        rec["slices"] = [dict(s) for s in slices]
    if padding is not None:
        if len(padding) != len(rec["shape"]):
            raise ValueError("%s: padding %s needs one entry per dim of shape %s"
                             % (name, list(padding), rec["shape"]))
        rec["padding"] = [int(p) for p in padding]
    return rec


def rank_record(rank, world, params, engine=""):
    if not 0 <= int(rank) < int(world):
        raise ValueError("rank %s: expected 0 <= rank < world %s" % (rank, world))
    return {"format": FORMAT, "version": VERSION, "engine": engine, "world": int(world),
            "rank": int(rank), "params": list(params)}


def write_rank_record(record, out_dir):
    """Writes out_dir/rank-NNNNN.json atomically; returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "rank-%05d.json" % record["rank"])
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(record, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, path)
    return path


def records_from_named_parameters(named_parameters, ownership=None):
    """(name, tensor) pairs (anything with .shape and .dtype) to parameter records."""
    ownership = ownership or {}
    out = []
    for name, p in named_parameters:
        own = ownership.get(name, {})
        out.append(param_record(name, tuple(p.shape), p.dtype, own.get("slices"),
                                own.get("padding")))
    return out


def dump_module(module, rank, world, out_dir, engine="", ownership=None):
    """module: a torch.nn.Module (or anything with named_parameters())."""
    params = records_from_named_parameters(module.named_parameters(), ownership)
    return write_rank_record(rank_record(rank, world, params, engine), out_dir)


def main(argv):
    import torch  # only the command line needs torch
    if len(argv) != 5:
        print("usage: dump_named_parameters.py CHECKPOINT.pt RANK WORLD OUT_DIR", file=sys.stderr)
        return 2
    module = torch.load(argv[1], weights_only=False)
    print(dump_module(module, int(argv[2]), int(argv[3]), argv[4]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
