#!/usr/bin/env python3
"""The DeepSeek-V4-Flash header copy (header_copy.py) against the released shard sizes.

DeepSeek-V4-Flash-0731 keeps the DeepSeek-V4-Flash backbone (its DSpark draft replaces the MTP
block in the last shards), one decoder layer per shard. A third-party crate that freezes the
release's LFS identities (deepseek-ai/DeepSeek-V4-Flash-0731 at revision
7872f01b1d1fe23eabc4c98b48bffcef5a386062: 72,317 tensors in 48 shards) lists each shard's byte
size and tensor count; the copy's first 45 shards (embeddings, layers 0-42, head) must have
exactly those sizes, header included: every tensor name, dtype and shape in them, as a
safetensors header serialises them, is then the release's (a wrong dtype, a missing norm, an
extra scale or a misspelled name changes the size).

The copy itself (inspect, plan over topologies with every tensor placed, build --no-fill) is
checked by check_release.py like every other release.

usage: deepseek_v4_shard_sizes.py   (exit 0 and "shard sizes: ok" when all holds)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import header_copy as h  # noqa: E402

# (bytes, tensors) of model-00001..00045-of-00048.safetensors of -0731.
PUBLISHED = [(1_059_061_856, 1)] + [
    (3_566_321_192, 1_565), (3_566_321_192, 1_565), (3_596_229_272, 1_576),
    (3_568_768_976, 1_569), (3_590_024_776, 1_576), (3_568_768_976, 1_569),
    (3_590_024_776, 1_576), (3_568_768_976, 1_569), (3_590_024_776, 1_576),
    (3_568_768_976, 1_569), (3_590_026_352, 1_576), (3_568_770_544, 1_569),
    (3_590_026_352, 1_576), (3_568_770_544, 1_569), (3_590_026_352, 1_576),
    (3_568_770_544, 1_569), (3_590_026_352, 1_576), (3_568_770_544, 1_569),
    (3_590_026_352, 1_576), (3_568_770_544, 1_569), (3_590_026_352, 1_576),
    (3_568_770_544, 1_569), (3_590_026_352, 1_576), (3_568_770_544, 1_569),
    (3_590_026_352, 1_576), (3_568_770_544, 1_569), (3_590_026_352, 1_576),
    (3_568_770_544, 1_569), (3_590_026_352, 1_576), (3_568_770_544, 1_569),
    (3_590_026_352, 1_576), (3_568_770_544, 1_569), (3_590_026_352, 1_576),
    (3_568_770_544, 1_569), (3_590_026_352, 1_576), (3_568_770_544, 1_569),
    (3_590_026_352, 1_576), (3_568_770_544, 1_569), (3_590_026_352, 1_576),
    (3_568_770_544, 1_569), (3_590_026_352, 1_576), (3_568_770_544, 1_569),
    (3_590_026_352, 1_576), (1_059_332_516, 5)]


def main() -> int:
    plan = h.make_plan(h.RELEASES["deepseek-v4-flash"], None)
    by_shard: dict[int, list] = {}
    for t, s in zip(plan.tensors, plan.shard_of):
        by_shard.setdefault(s, []).append(t)
    bad = 0
    for s, (size, count) in enumerate(PUBLISHED):
        head, data = h._shard_header(by_shard[s], plan.st_metadata)
        got = (len(head) + data, len(by_shard[s]))
        if got != (size, count):
            print(f"{plan.shard_names[s]}: {got[0]} bytes in {got[1]} tensors, released "
                  f"{size} in {count}")
            bad += 1
    if bad:
        print(f"shard sizes: {bad} of {len(PUBLISHED)} differ")
        return 1
    print(f"shard sizes: ok ({len(PUBLISHED)} shards equal the release's, byte for byte)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
