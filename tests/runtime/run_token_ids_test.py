#!/usr/bin/env python3
"""`moeshard run --input` with token ids, for DeepSeek-V4's hash-routed layers.

tiny-deepseek-v4 routes layers 0-1 by token id (ffn.gate.tid2eid) and layer 2 by score. With
the same hidden states (BF16 [T, H]) this checks, with only the standard library:
  - token_ids I64 and I32 [T] give the same outputs (both spellings are read);
  - one rank and TP2 x EP (the file's rows split over attention-TP chunks) agree within 2e-3
    (+ 1e-3 x max |ref|);
  - other token ids change layer 0's output (the ids are used), the same ids do not;
  - an id outside [0, vocab_size) and a [T + 1] tensor are refused, naming token_ids.
usage: run_token_ids_test.py MOESHARD_BIN WORKDIR
"""
import json, os, random, struct, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from st_io import bf16, read_st, write_st  # noqa: E402


def run(binary, args, expect_ok=True):
    r = subprocess.run([binary, "run", "--model", "tiny-deepseek-v4", "--layers", "3", "--iters", "1",
                        "--warmup", "0"] + args, capture_output=True, text=True)
    if expect_ok and r.returncode != 0:
        sys.exit("moeshard run failed (%d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
    return r

def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    T, H, V = 9, 256, 1024
    rng = random.Random(11)
    hidden = b"".join(bf16(rng.uniform(-1, 1)) for _ in range(T * H))
    ids = [rng.randrange(V) for _ in range(T)]
    other = [(i * 37 + 5) % V for i in ids]
    def inp(name, tokens, dtype="I64"):
        path = os.path.join(work, name + ".safetensors")
        fmt = "<%dq" if dtype == "I64" else "<%di"
        write_st(path, {"hidden_states": ("BF16", [T, H], hidden),
                        "token_ids": (dtype, [len(tokens)], struct.pack(fmt % len(tokens), *tokens))})
        return path
    outs = {}
    for tag, path, args in [("one", inp("ids64", ids), []),
                            ("one32", inp("ids32", ids, "I32"), []),
                            ("sharded", inp("ids64", ids), ["-tp", "2", "-ep"]),
                            ("other", inp("other", other), [])]:
        outs[tag] = os.path.join(work, tag + ".out.safetensors")
        run(binary, args + ["--input", path, "--output", outs[tag]])
    one, one32, sharded, oth = ({k: v for k, (_, v) in read_st(outs[t]).items()}
                                for t in ("one", "one32", "sharded", "other"))
    assert one == one32, "I32 and I64 token ids gave different outputs"
    for name in one:
        ref, got = one[name], sharded[name]
        err = max(abs(a - b) for a, b in zip(ref, got))
        lim = 2e-3 + 1e-3 * max(abs(a) for a in ref)
        assert err <= lim, (name, err, lim)
    d0 = max(abs(a - b) for a, b in zip(one["layers.0.hidden_states"], oth["layers.0.hidden_states"]))
    assert d0 > 1e-3, "other token ids left layer 0 unchanged: the hash table is not used (%g)" % d0
    bad = run(binary, ["--input", inp("bad", ids[:-1] + [V])], expect_ok=False)
    assert bad.returncode != 0 and "token_ids[%d]" % (T - 1) in bad.stdout + bad.stderr, bad.stderr
    long = run(binary, ["--input", inp("long", ids + [0])], expect_ok=False)
    assert long.returncode != 0 and "token_ids" in long.stdout + long.stderr, long.stderr
    print("token ids: ok (I32 = I64, TP2 x EP = 1 rank, other ids change layer 0 by %.3g, bad ids refused)" % d0)

if __name__ == "__main__":
    main()
