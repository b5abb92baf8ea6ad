#!/usr/bin/env python3
"""bench/ab_builds.py end to end: the same moeshard binary as build A and build B on one small
case, one round. The table and the JSON must hold both builds' times and their ratio, the
command lines of the two builds must name the same case (they differ only in the binary and the
JSON path), the CPU must be named as `moeshard bench kernels` names it, and a bad binary path
must be refused with its name. No bound on the ratio itself:
one binary against itself under the test suite's parallel load is a timing, not a fact.

    ab_builds_test.py MOESHARD WORKDIR
"""
import json
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "ab_builds.py")


def main(moeshard, work):
    os.makedirs(work, exist_ok=True)
    out_json = os.path.join(work, "ab.json")
    if os.path.exists(out_json):
        os.remove(out_json)
    cmd = [sys.executable, SCRIPT, "--a", moeshard, "--b", moeshard, "--formats", "mxfp4",
           "--tokens", "1", "--rounds", "1", "--min-time", "0.01", "--json", out_json]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit("FAIL: ab_builds.py exited %d\n%s" % (p.returncode, out))
    if "| qwen3-30b-a3b | mxfp4 | 1 |" not in p.stdout or "(1 rounds)" not in p.stdout:
        sys.exit("FAIL: no table row for the case\n" + out)
    with open(out_json) as f:
        data = json.load(f)
    (r,) = data["results"]
    if r["a_seconds"] <= 0 or r["b_seconds"] <= 0 or len(r["rounds"]) != 1:
        sys.exit("FAIL: times missing in the JSON: %s" % r)
    if abs(r["ratio_b_over_a"] - r["b_seconds"] / r["a_seconds"]) > 1e-12:
        sys.exit("FAIL: ratio %s is not B / A" % r["ratio_b_over_a"])
    (rnd,) = r["rounds"]
    if (rnd["a_seconds"], rnd["b_seconds"]) != (r["a_seconds"], r["b_seconds"]):
        sys.exit("FAIL: the medians of one round are not its times: %s" % r)
    # Each command line without its binary and its --json path (shlex: the paths may hold spaces).
    case_args = {}
    for who in "ab":
        argv = shlex.split(r["commands"][who])
        j = argv.index("--json")
        case_args[who] = " ".join(argv[1:j] + argv[j + 2:])
    if case_args["a"] != case_args["b"] or "--shapes qwen3-30b-a3b --formats mxfp4 --tokens 1" \
            not in case_args["a"]:
        sys.exit("FAIL: builds A and B did not run the same case: %s" % r["commands"])
    # The CPU as the table names it: the same words `moeshard bench kernels` records (both read
    # /proc/cpuinfo; on x86 with the family and model, which a VM's bare brand does not say).
    bench_json = os.path.join(work, "bench.json")
    subprocess.run([moeshard, "bench", "kernels", "--shapes", "qwen3-30b-a3b", "--formats",
                    "mxfp4", "--tokens", "1", "--min-time", "0.01", "--json", bench_json],
                   capture_output=True, text=True, timeout=300, check=True)
    with open(bench_json) as f:
        bench_cpu = json.load(f)["machine"]["cpu"]
    if data["cpu"] != bench_cpu or data["cpu"] not in p.stdout:
        sys.exit("FAIL: the CPU is %r here, %r in moeshard's JSON" % (data["cpu"], bench_cpu))
    bad = subprocess.run([sys.executable, SCRIPT, "--a", os.path.join(work, "missing"), "--b",
                          moeshard], capture_output=True, text=True, timeout=60)
    if bad.returncode == 0 or "--a:" not in bad.stderr or "missing" not in bad.stderr:
        sys.exit("FAIL: a missing binary was not refused by name\n" + bad.stderr)
    print("ok: B / A = %.3f" % r["ratio_b_over_a"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
