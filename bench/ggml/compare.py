#!/usr/bin/env python3
"""Compare `moeshard bench kernels` with ggml's CPU backend (ggml_moe_bench) on the same MoE work.

For every (shape, format pair, token count) the two benchmarks run in alternating processes, one
case per process, for --rounds rounds (which one goes first alternates from round to round and case
to case), and a markdown table reports the median times and the median of the per-round
moeshard / ggml time ratios (below 1: moeshard is faster). Python 3 standard library only.

  bench/ggml/compare.py --moeshard build/src/cli/moeshard --ggml build-ggml/bin/ggml_moe_bench \
      --shapes qwen3-30b-a3b --formats bf16 mxfp4 --tokens 1 32 --isa avx2 --threads 2 \
      --rounds 3 --json compare.json

See bench/ggml/README.md for what is and is not like-for-like.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

SHAPES = ["qwen3-30b-a3b", "kimi-k2-32e", "kimi-k3-latent-64e"]

# moeshard format (as its JSON names it) -> (moeshard --formats value, ggml --format value)
FORMAT_PAIRS = {
    "bf16": ("bf16", "bf16"),
    "mxfp4": ("mxfp4", "mxfp4"),
    "int4": ("int4", "q4_0"),
    "fp8-block": ("fp8", "q8_0"),
    # AWQ/GPTQ int4 (fp16 scale and zero point per 128) against ggml's nearest, q4_1 (fp16 scale
    # and minimum per 32); NVFP4 against NVFP4. Not in the default set.
    "int4-zp": ("int4-zp", "q4_1"),
    "nvfp4": ("nvfp4", "nvfp4"),
    # bf16 in the row-group layout, which `moeshard run` uses on AVX-512 BF16 CPUs; not in the
    # default set (elsewhere it runs the portable row-group kernels, not what `run` would use).
    "bf16-rg": ("bf16-rg", "bf16"),
}
DEFAULT_FORMATS = ["bf16", "mxfp4", "int4", "fp8-block"]
FORMAT_ALIASES = {"fp8": "fp8-block", "q4_0": "int4", "q8_0": "fp8-block", "q4_1": "int4-zp"}

NOTES = [
    "fp8-block (moeshard: e4m3 values, one fp32 scale per 128x128 block, ~1.0 byte/weight) and "
    "q8_0 (ggml: int8 values, one fp16 scale per 32, 1.0625 bytes/weight) are different 8-bit "
    "formats; that pair compares the nearest 8-bit formats, not the same one.",
    "int4 (moeshard: symmetric 4-bit, one bf16 scale per 32) and q4_0 (ggml: 4-bit with offset 8, "
    "one fp16 scale per 32) have the same bytes per weight but different scale types and packing.",
    "int4-zp (moeshard: AWQ/GPTQ 4-bit codes, one fp16 scale and one 8-bit zero point per 128, "
    "~0.52 bytes/weight) and q4_1 (ggml: 4-bit codes, one fp16 scale and one fp16 minimum per "
    "32, 0.625 bytes/weight) are both asymmetric 4-bit formats, not the same one.",
    "nvfp4: the same values and block scales on both sides (E2M1, one E4M3 scale per 16; "
    "moeshard also keeps the checkpoint's per-tensor global scale, ggml has none).",
    "ggml rounds activations to q8_0 (8-bit) for its q4_0, q8_0, mxfp4 and nvfp4 dot products, "
    "to q8_1 for q4_1 and to bf16 for bf16; moeshard keeps bf16 inputs (16-bit integer inputs "
    "for 4-bit decode) unless --int8-activations.",
    "Times exclude routing in both: ggml's routing is computed on the host and uploaded "
    "untimed; only ggml_backend_graph_compute is timed.",
]


def cpu_model():
    """The first processor of /proc/cpuinfo as `moeshard bench` names it: "<model name> (family F
    model M)" on x86 (a VM's bare "AMD EPYC" does not say which generation), "Arm (implementer I
    part P)" on Arm, else lscpu's model name or "unknown"."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the end of the first processor's block
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name")
    if name:
        if "cpu family" in fields and "model" in fields:
            return "%s (family %s model %s)" % (name, fields["cpu family"], fields["model"])
        return name
    if "CPU implementer" in fields and "CPU part" in fields:
        return "Arm (implementer %s part %s)" % (fields["CPU implementer"], fields["CPU part"])
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def add_run_args(p, min_time, rounds):
    """The options of an alternating-process run (shared with bench/ab_builds.py)."""
    p.add_argument("--threads", type=int, default=2, help="threads for both (default: %(default)s)")
    p.add_argument("--min-time", type=float, default=min_time,
                   help="seconds per case per process (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=rounds,
                   help="alternating rounds (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per process (default: %(default)s)")
    p.add_argument("--json", default=None, help="also write the results as JSON to this file")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--moeshard", default=os.path.join(REPO_ROOT, "build", "src", "cli", "moeshard"),
                   help="moeshard binary (default: %(default)s)")
    p.add_argument("--ggml", default=os.path.join(REPO_ROOT, "build-ggml", "bin", "ggml_moe_bench"),
                   help="ggml_moe_bench binary (default: %(default)s)")
    p.add_argument("--shapes", nargs="+", default=SHAPES, choices=SHAPES, metavar="SHAPE",
                   help="shapes (default: all: %s)" % " ".join(SHAPES))
    p.add_argument("--formats", nargs="+", default=DEFAULT_FORMATS, metavar="FORMAT",
                   help="moeshard formats, each paired with a ggml type: bf16/bf16, mxfp4/mxfp4, "
                        "int4/q4_0, fp8-block/q8_0, and, not by default, int4-zp/q4_1, "
                        "nvfp4/nvfp4 and bf16-rg/bf16 (moeshard's row-group layout; default: %s)"
                        % " ".join(DEFAULT_FORMATS))
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 8, 32, 128, 512],
                   help="token counts (default: %(default)s)")
    p.add_argument("--isa", default=None,
                   help="moeshard --isa (e.g. avx2, to match an AVX2-only ggml build); default: "
                        "moeshard's auto")
    p.add_argument("--int8-activations", action="store_true",
                   help="moeshard --int8-activations: MXFP4 and int4 inputs quantized to int8 per "
                        "group, as ggml's q8_0 activations are (like-for-like numerics)")
    add_run_args(p, min_time=0.5, rounds=3)
    a = p.parse_args(argv)
    formats = []
    for f in a.formats:
        f = FORMAT_ALIASES.get(f, f)
        if f not in FORMAT_PAIRS:
            p.error("--formats: expected one of %s, got '%s'" % (", ".join(FORMAT_PAIRS), f))
        if f not in formats:
            formats.append(f)
    a.formats = formats
    if a.rounds < 1:
        p.error("--rounds: expected at least 1")
    if any(t < 1 for t in a.tokens):
        p.error("--tokens: expected positive token counts")
    for name, path in (("--moeshard", a.moeshard), ("--ggml", a.ggml)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            p.error("%s: '%s' is not an executable file" % (name, path))
    return a


def moeshard_cmd(a, shape, fmt, tokens, json_path):
    cmd = [a.moeshard, "bench", "kernels", "--shapes", shape, "--formats", FORMAT_PAIRS[fmt][0],
           "--tokens", str(tokens), "--threads", str(a.threads), "--min-time", str(a.min_time)]
    if a.isa:
        cmd += ["--isa", a.isa]
    if a.int8_activations:
        cmd.append("--int8-activations")
    return cmd + ["--json", json_path]


def ggml_cmd(a, shape, fmt, tokens, json_path):
    return [a.ggml, "--shape", shape, "--format", FORMAT_PAIRS[fmt][1], "--tokens", str(tokens),
            "--threads", str(a.threads), "--min-time", str(a.min_time), "--json", json_path]


def run_one(cmd, json_path, timeout):
    """Runs one benchmark process; returns (parsed JSON, None) or (None, why)."""
    try:
        os.remove(json_path)
    except FileNotFoundError:
        pass
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, "timed out after %.0f s" % timeout
    except OSError as e:
        return None, "cannot run: %s" % e
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
    if proc.returncode != 0:
        return None, "exit status %d: %s" % (proc.returncode, tail)
    try:
        with open(json_path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return None, "no JSON (%s): %s" % (e, tail)
    if not data.get("results"):
        why = "; ".join(data.get("skipped", [])) or tail
        return None, "no result: %s" % why
    return data, None


def fmt_ms(s):
    return "%.3f" % (s * 1e3) if s is not None else "-"


def write_json_atomic(path, obj):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".compare-", suffix=".json.tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def main(argv):
    a = parse_args(argv)
    cases = [(s, f, t) for s in a.shapes for f in a.formats for t in a.tokens]
    work = tempfile.mkdtemp(prefix="moeshard-ggml-compare-")
    load_before = load_average()
    started = time.time()
    per_case = {c: {"rounds": [], "errors": [], "commands": {}} for c in cases}
    machine = {"cpu": cpu_model(), "threads": a.threads, "isa_requested": a.isa or "auto"}
    n_runs = len(cases) * a.rounds
    done = 0
    for r in range(a.rounds):
        for i, case in enumerate(cases):
            shape, fmt, tokens = case
            tag = "%s-%s-%d" % (shape, fmt, tokens)
            mj = os.path.join(work, "moeshard-%s.json" % tag)
            gj = os.path.join(work, "ggml-%s.json" % tag)
            cmds = {"moeshard": moeshard_cmd(a, shape, fmt, tokens, mj),
                    "ggml": ggml_cmd(a, shape, fmt, tokens, gj)}
            per_case[case]["commands"] = {k: " ".join(shlex.quote(x) for x in v)
                                          for k, v in cmds.items()}
            order = ["ggml", "moeshard"] if (r + i) % 2 == 0 else ["moeshard", "ggml"]
            got = {}
            for who in order:
                data, why = run_one(cmds[who], mj if who == "moeshard" else gj, a.timeout)
                if why:
                    per_case[case]["errors"].append("round %d %s: %s" % (r + 1, who, why))
                    continue
                res = data["results"][0]
                got[who] = res
                m = data.get("machine", {})
                if who == "moeshard":
                    machine["moeshard_isa"] = m.get("isa", "unknown")
                else:
                    machine["ggml_commit"] = m.get("ggml_commit", "unknown")
                    machine["ggml_cpu_features"] = [k for k, v in m.get("cpu_features", {}).items() if v]
                    machine["ggml_openmp"] = m.get("openmp")
            done += 1
            if len(got) == 2:
                g, ms = got["ggml"]["seconds"], got["moeshard"]["seconds"]
                per_case[case]["rounds"].append({
                    "order": order, "ggml_seconds": g, "moeshard_seconds": ms,
                    "ratio": ms / g if g > 0 else None,
                    "ggml_repetitions": got["ggml"].get("repetitions"),
                    "moeshard_repetitions": got["moeshard"].get("repetitions"),
                    "ggml_repack": got["ggml"].get("repack"),
                    "ggml_buffer_types": got["ggml"].get("buffer_types")})
                print("[%d/%d] round %d %s %s/%s tokens %d: ggml %.3f ms, moeshard %.3f ms, ratio %.3f"
                      % (done, n_runs, r + 1, shape, fmt, FORMAT_PAIRS[fmt][1], tokens, g * 1e3,
                         ms * 1e3, ms / g), file=sys.stderr, flush=True)
            else:
                print("[%d/%d] round %d %s %s tokens %d: %s" % (done, n_runs, r + 1, shape, fmt,
                      tokens, per_case[case]["errors"][-1]), file=sys.stderr, flush=True)
    load_after = load_average()

    results = []
    for case in cases:
        shape, fmt, tokens = case
        rounds = per_case[case]["rounds"]
        ok = [x for x in rounds if x["ratio"] is not None]
        results.append({
            "shape": shape, "moeshard_format": fmt, "ggml_format": FORMAT_PAIRS[fmt][1],
            "tokens": tokens,
            "ggml_seconds": statistics.median(x["ggml_seconds"] for x in ok) if ok else None,
            "moeshard_seconds": statistics.median(x["moeshard_seconds"] for x in ok) if ok else None,
            "ratio_moeshard_over_ggml": statistics.median(x["ratio"] for x in ok) if ok else None,
            "ratio_min": min(x["ratio"] for x in ok) if ok else None,
            "ratio_max": max(x["ratio"] for x in ok) if ok else None,
            "ggml_repack": any(x["ggml_repack"] for x in ok) if ok else None,
            "rounds": rounds, "errors": per_case[case]["errors"],
            "commands": per_case[case]["commands"]})

    out = []
    out.append("# moeshard vs ggml (CPU backend): routed experts of one MoE layer")
    out.append("")
    out.append("- CPU: %s; threads: %d (each process, caller included)" % (machine["cpu"], a.threads))
    out.append("- moeshard --isa: %s (ran: %s)%s" % (a.isa or "auto (not passed)",
                                                    machine.get("moeshard_isa", "unknown"),
                                                    "; int8 activations" if a.int8_activations
                                                    else ""))
    out.append("- ggml commit: %s; ggml CPU features as built: %s; threads: %s"
               % (machine.get("ggml_commit", "unknown"),
                  " ".join(machine.get("ggml_cpu_features", [])) or "none of AVX2/AVX512",
                  "OpenMP" if machine.get("ggml_openmp") else "ggml threadpool"))
    out.append("- %d round(s), alternating processes, one case per process, --min-time %g s; "
               "load average before: %s, after: %s; %.0f s in all"
               % (a.rounds, a.min_time, load_before, load_after, time.time() - started))
    try:
        busy = float(load_before.split()[0]) >= 1.0
    except ValueError:
        busy = False
    if busy:
        out.append("- WARNING: the machine was not idle (1-minute load average %s before the "
                   "first run); with threads = cores, other processes stall both benchmarks' "
                   "barriers and the times are not trustworthy" % load_before.split()[0])
    out.append("")
    out.append("| shape | format (moeshard / ggml) | tokens | ggml ms (median) | moeshard ms (median) "
               "| moeshard / ggml (median of per-round ratios) | (min - max) | ggml repack |")
    out.append("|---|---|--:|--:|--:|--:|--:|---|")
    # Rounds this far apart say the host stalled one of them (with two rounds the median is
    # their mean): such a case is marked and should be run again.
    spread_limit = 1.3
    spread = 0
    for x in results:
        ratio = x["ratio_moeshard_over_ggml"]
        repack = "-" if x["ggml_repack"] is None else ("yes" if x["ggml_repack"] else "no")
        apart = ratio is not None and x["ratio_max"] > spread_limit * x["ratio_min"]
        spread += apart
        out.append("| %s | %s / %s | %d | %s | %s | %s | %s | %s |" % (
            x["shape"], x["moeshard_format"], x["ggml_format"], x["tokens"],
            fmt_ms(x["ggml_seconds"]), fmt_ms(x["moeshard_seconds"]),
            "%.3f (%d rounds)" % (ratio, len(x["rounds"])) if ratio is not None else "skipped",
            "%.2f - %.2f%s" % (x["ratio_min"], x["ratio_max"], " *" if apart else "")
            if ratio is not None else "-", repack))
    out.append("")
    out.append("moeshard / ggml below 1: moeshard is faster.")
    if spread:
        out.append("* %d case(s) whose rounds differ by more than %gx: a stall of the host in "
                   "one of them is likely; run those cases again (--shapes/--formats/--tokens) "
                   "or with more --rounds." % (spread, spread_limit))
    out.append("")
    out.append("Notes:")
    for n in NOTES:
        if "fp8-block" in n and "fp8-block" not in a.formats:
            continue
        if n.startswith("int4 (") and "int4" not in a.formats:
            continue
        if n.startswith("int4-zp") and "int4-zp" not in a.formats:
            continue
        if n.startswith("nvfp4") and "nvfp4" not in a.formats:
            continue
        out.append("- " + n)
    errors = [(x, e) for x in results for e in x["errors"]]
    if errors:
        out.append("")
        out.append("Skipped or failed runs:")
        for x, e in errors:
            out.append("- %s %s/%s tokens %d, %s" % (x["shape"], x["moeshard_format"],
                                                     x["ggml_format"], x["tokens"], e.replace("\n", " | ")))
    out.append("")
    out.append("Commands (each run once per round; the order alternates):")
    out.append("")
    out.append("```")
    for x in results:
        out.append(x["commands"]["ggml"])
        out.append(x["commands"]["moeshard"])
    out.append("```")
    print("\n".join(out))

    if a.json:
        machine.update({"loadavg_before": load_before, "loadavg_after": load_after})
        write_json_atomic(a.json, {
            "machine": machine,
            "settings": {"shapes": a.shapes, "formats": a.formats, "tokens": a.tokens,
                         "isa": a.isa, "int8_activations": a.int8_activations,
                         "threads": a.threads, "min_time": a.min_time,
                         "rounds": a.rounds, "moeshard": os.path.abspath(a.moeshard),
                         "ggml": os.path.abspath(a.ggml)},
            "notes": NOTES, "results": results})
        print("\nwrote %s" % a.json)
    for name in os.listdir(work):
        try:
            os.remove(os.path.join(work, name))
        except OSError:
            pass
    try:
        os.rmdir(work)
    except OSError:
        pass
    return 0 if all(x["ratio_moeshard_over_ggml"] is not None for x in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
