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

With MOESHARD and WORKDIR it also writes a copy cut to 4 layers and checks that moeshard
refuses it with the reason (its `.scale` leaves and E8M0 fp8 scales are a format moeshard lacks)
rather than misreading it: `plan --model DIR` and `build --checkpoint DIR` name it; and that
`inspect DIR` places every other tensor of the decoder layers and the model level by the
deepseek_v4 descriptor's names: the only unplaced ones are the `.scale` leaves, the routed
experts' packed `.weight`s (moeshard's mxfp4 leaf is `weight_packed`) and the MTP block.

usage: deepseek_v4_shard_sizes.py [MOESHARD WORKDIR]   (exit 0 and "...: ok" when all holds)
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

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
    if len(sys.argv) == 3:
        return check_refused(sys.argv[1], Path(sys.argv[2]) / "deepseek-v4-flash-cut")
    return 0


REASON = "cannot be loaded or sized from their headers yet"


def check_refused(moeshard: str, out: Path) -> int:
    if out.exists():
        shutil.rmtree(out)
    h.write_copy(h.make_plan(h.RELEASES["deepseek-v4-flash"], 4), out)
    for cmd in ([moeshard, "plan", "--model", str(out), "-tp", "8", "-ep"],
                [moeshard, "build", "--model", str(out), "--checkpoint", str(out), "-tp", "2",
                 "-ep", "--rank", "0", "--no-progress"]):
        p = subprocess.run(cmd, capture_output=True, text=True)
        text = p.stdout + p.stderr
        if p.returncode == 0 or REASON not in text or "E8M0" not in text:
            print(f"{' '.join(cmd)}: exit {p.returncode}, expected a refusal naming the reason\n"
                  f"{text[-2000:]}")
            return 1
    p = subprocess.run([moeshard, "inspect", str(out), "--format", "json"], capture_output=True,
                       text=True)
    if p.returncode != 0:
        print(f"inspect: exit {p.returncode}\n{p.stderr[-2000:]}")
        return 1
    unplaced = json.loads(p.stdout)["family"]["unplaced"]
    allowed = re.compile(r"^(mtp\.\d+\..*|layers\.\d+\..*\.scale|"
                         r"layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight)$")
    wrong = [n for n in unplaced if not allowed.match(n)]
    scales = sum(1 for n in unplaced if n.endswith(".scale") and not n.startswith("mtp."))
    if wrong or scales == 0:
        print(f"inspect: {len(wrong)} tensors unplaced other than scales, packed experts and MTP "
              f"(first: {wrong[:5]}), {scales} scales")
        return 1
    print("refused with the reason: ok (inspect places every other tensor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
