#!/usr/bin/env python3
"""`moeshard run --input/--output` end to end, with only the standard library.

Writes hidden states (BF16 [T, H]) and a routing (topk_ids I32 + topk_weights F32 [T, k]) as
safetensors, runs the same layers on 1 rank and on DP2 x TP2 EP4 (the file's rows split over
the DP ranks, 7 tokens: uneven), reads both outputs and checks:
  - same tensors, shapes [T, H] F32, one per layer;
  - the sharded output equals the 1-rank output within 2e-3 (+ 1e-3 x max |ref|);
  - the routing bypass is used: the same hidden states without topk give another output;
  - the first layer output is not the input (the layer did something).
usage: run_io_test.py MOESHARD_BIN WORKDIR
"""
import json, math, os, random, struct, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from st_io import bf16, read_st, write_st  # noqa: E402


def run(binary, args):
    r = subprocess.run([binary, "run", "--model", "tiny-mixtral", "--layers", "2", "--iters", "1",
                        "--warmup", "0"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("moeshard run failed (%d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
    return r.stdout

def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    T, H, E, k = 7, 128, 8, 2
    rng = random.Random(5)
    hidden = b"".join(bf16(rng.uniform(-1, 1)) for _ in range(T * H))
    ids, wts = [], []
    for t in range(T):
        chosen = rng.sample(range(E), k)
        ids += chosen
        wts += [0.75, 0.25]
    inp = os.path.join(work, "in.safetensors")
    write_st(inp, {"hidden_states": ("BF16", [T, H], hidden),
                   "topk_ids": ("I32", [T, k], struct.pack("<%di" % (T * k), *ids)),
                   "topk_weights": ("F32", [T, k], struct.pack("<%df" % (T * k), *wts))})
    plain = os.path.join(work, "plain.safetensors")
    write_st(plain, {"hidden_states": ("BF16", [T, H], hidden)})
    outs = {}
    for tag, args in [("one", []), ("sharded", ["-dp", "2", "-tp", "2", "-ep"])]:
        outs[tag] = os.path.join(work, tag + ".safetensors")
        run(binary, args + ["--input", inp, "--output", outs[tag]])
    outs["norouting"] = os.path.join(work, "norouting.safetensors")
    run(binary, ["--input", plain, "--output", outs["norouting"]])
    one, sharded, norouting = (read_st(outs[t]) for t in ("one", "sharded", "norouting"))
    assert sorted(one) == sorted(sharded) == ["layers.0.hidden_states", "layers.1.hidden_states"], sorted(one)
    for name in one:
        shape, ref = one[name]
        assert shape == [T, H] and sharded[name][0] == [T, H], (shape, sharded[name][0])
        ref_max = max(abs(v) for v in ref)
        err = max(abs(a - b) for a, b in zip(sharded[name][1], ref))
        assert err <= 2e-3 + 1e-3 * ref_max, "%s: sharded vs 1 rank max error %g" % (name, err)
        print("%s: max |sharded - 1 rank| = %.3g (max |ref| %.3g)" % (name, err, ref_max))
    diff = max(abs(a - b) for a, b in zip(one["layers.1.hidden_states"][1],
                                          norouting["layers.1.hidden_states"][1]))
    assert diff > 1e-3, "the given topk made no difference (%g): routing bypass not used" % diff
    x0 = [struct.unpack("<f", struct.pack("<I", struct.unpack("<H", hidden[2*i:2*i+2])[0] << 16))[0]
          for i in range(T * H)]
    moved = max(abs(a - b) for a, b in zip(one["layers.0.hidden_states"][1], x0))
    assert moved > 1e-3, "layer 0 left the input unchanged"
    print("ok: routing bypass changes the output by %.3g; layer 0 moves the input by %.3g" % (diff, moved))

if __name__ == "__main__":
    main()
