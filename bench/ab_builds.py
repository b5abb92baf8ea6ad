#!/usr/bin/env python3
"""A/B of two moeshard builds on the same kernel cases, in alternating processes.

Every (shape, format, token count) runs `moeshard bench kernels` once per round in each build,
one case per process; which build goes first alternates from round to round and case to case.
The table reports each build's median time and the median of the per-round B / A time ratios
(below 1: build B is faster). This host's bandwidth drifts by tens of percent between minutes,
so only ratios of neighbouring runs say which build is faster; `bench kernels --versus` does the
same for two instruction-set variants of one build inside one process. Run a binary against a
copy of itself (A/A) before reading a small difference: on the project's VM that gave 1.06
(1.03-1.44 over 5 rounds, docs/PERFORMANCE.md), so B / A within about 0.94-1.06 says nothing.
Python 3 standard library only.

  bench/ab_builds.py --a /tmp/moeshard-before --b build/src/cli/moeshard \\
      --shapes qwen3-30b-a3b --formats fp8 int4 --tokens 128 512 --rounds 5 --json ab.json
"""

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ggml"))
from compare import (add_run_args, cpu_model, fmt_ms, load_average, run_one,  # noqa: E402
                     write_json_atomic)

SHAPES = ["qwen3-30b-a3b", "kimi-k2-32e", "kimi-k3-latent-64e"]
FORMATS = ["bf16", "bf16-rg", "fp8", "mxfp4", "int4", "int4-zp", "nvfp4"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="build A: a moeshard binary (the baseline)")
    p.add_argument("--b", required=True, help="build B: a moeshard binary (the change)")
    p.add_argument("--shapes", nargs="+", default=["qwen3-30b-a3b"], choices=SHAPES,
                   metavar="SHAPE", help="shapes (default: qwen3-30b-a3b; of %s)" % " ".join(SHAPES))
    p.add_argument("--formats", nargs="+", default=["bf16-rg", "mxfp4"], choices=FORMATS,
                   metavar="FORMAT", help="formats (default: %%(default)s; of %s)" % " ".join(FORMATS))
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 8, 32, 128, 512],
                   help="token counts (default: %(default)s)")
    p.add_argument("--isa", default=None, help="--isa for both builds (default: their auto)")
    add_run_args(p, min_time=0.3, rounds=5)
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds: expected at least 1, got %d" % a.rounds)
    if any(t < 1 for t in a.tokens):
        p.error("--tokens: expected positive token counts, got %s" % a.tokens)
    for name, path in (("--a", a.a), ("--b", a.b)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            p.error("%s: '%s' is not an executable file (a moeshard binary)" % (name, path))
    return a


def bench_cmd(a, binary, shape, fmt, tokens, json_path):
    cmd = [binary, "bench", "kernels", "--shapes", shape, "--formats", fmt, "--tokens", str(tokens),
           "--threads", str(a.threads), "--min-time", str(a.min_time), "--json", json_path]
    return cmd + (["--isa", a.isa] if a.isa else [])


def run_cases(a, cases, work):
    """Per case: the rounds' times of both builds, errors and the command lines."""
    per_case = {c: {"rounds": [], "errors": [], "commands": {}} for c in cases}
    isa = {}
    for r in range(a.rounds):
        for i, case in enumerate(cases):
            shape, fmt, tokens = case
            paths = {who: os.path.join(work, "%s-%s-%s-%d.json" % (who, shape, fmt, tokens))
                     for who in ("a", "b")}
            cmds = {who: bench_cmd(a, getattr(a, who), shape, fmt, tokens, paths[who])
                    for who in ("a", "b")}
            per_case[case]["commands"] = {k: " ".join(shlex.quote(x) for x in v)
                                          for k, v in cmds.items()}
            order = ["a", "b"] if (r + i) % 2 == 0 else ["b", "a"]
            got = {}
            for who in order:
                data, why = run_one(cmds[who], paths[who], a.timeout)
                if why:
                    per_case[case]["errors"].append("round %d build %s: %s" % (r + 1, who.upper(), why))
                    continue
                got[who] = data["results"][0]["seconds"]
                isa[who] = data.get("machine", {}).get("isa", "unknown")
            if len(got) == 2:
                per_case[case]["rounds"].append({"order": order, "a_seconds": got["a"],
                                                 "b_seconds": got["b"], "ratio": got["b"] / got["a"]})
                print("round %d %s %s tokens %d: A %.3f ms, B %.3f ms, B / A %.3f"
                      % (r + 1, shape, fmt, tokens, got["a"] * 1e3, got["b"] * 1e3,
                         got["b"] / got["a"]), file=sys.stderr, flush=True)
    return per_case, isa


def main(argv):
    a = parse_args(argv)
    cases = [(s, f, t) for s in a.shapes for f in a.formats for t in a.tokens]
    load_before = load_average()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="moeshard-ab-") as work:
        per_case, isa = run_cases(a, cases, work)
    results = []
    for (shape, fmt, tokens), c in per_case.items():
        ok = c["rounds"]
        results.append({
            "shape": shape, "format": fmt, "tokens": tokens,
            "a_seconds": statistics.median(x["a_seconds"] for x in ok) if ok else None,
            "b_seconds": statistics.median(x["b_seconds"] for x in ok) if ok else None,
            "ratio_b_over_a": statistics.median(x["ratio"] for x in ok) if ok else None,
            "ratio_min": min(x["ratio"] for x in ok) if ok else None,
            "ratio_max": max(x["ratio"] for x in ok) if ok else None,
            "rounds": ok, "errors": c["errors"], "commands": c["commands"]})
    out = ["# moeshard build A against build B: `bench kernels`, alternating processes", "",
           "- CPU: %s; threads: %d; --isa %s (ran: A %s, B %s)" % (
               cpu_model(), a.threads, a.isa or "auto", isa.get("a", "?"), isa.get("b", "?")),
           "- A: %s" % os.path.abspath(a.a), "- B: %s" % os.path.abspath(a.b),
           "- %d round(s), one case per process, --min-time %g s; load average before: %s, "
           "after: %s; %.0f s in all" % (a.rounds, a.min_time, load_before, load_average(),
                                         time.time() - started), "",
           "| shape | format | tokens | A ms (median) | B ms (median) | B / A (median of rounds) "
           "| B / A (min - max) |", "|---|---|--:|--:|--:|--:|--:|"]
    for x in results:
        ratio = x["ratio_b_over_a"]
        out.append("| %s | %s | %d | %s | %s | %s | %s |" % (
            x["shape"], x["format"], x["tokens"], fmt_ms(x["a_seconds"]), fmt_ms(x["b_seconds"]),
            "%.3f (%d rounds)" % (ratio, len(x["rounds"])) if ratio is not None else "failed",
            "%.2f - %.2f" % (x["ratio_min"], x["ratio_max"]) if ratio is not None else "-"))
    out += ["", "B / A below 1: build B is faster."]
    for x in results:
        for e in x["errors"]:
            out.append("- %s %s tokens %d: %s" % (x["shape"], x["format"], x["tokens"],
                                                  e.replace("\n", " | ")))
    print("\n".join(out))
    if a.json:
        write_json_atomic(a.json, {"cpu": cpu_model(), "settings": vars(a), "isa": isa,
                                   "results": results})
        print("\nwrote %s" % a.json)
    return 0 if all(x["ratio_b_over_a"] is not None for x in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
