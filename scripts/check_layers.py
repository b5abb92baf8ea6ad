#!/usr/bin/env python3
"""Fails when an include crosses the layer graph upward, or a third-party or backend header
appears where STYLE.md forbids it.

The layer graph (STYLE.md "Layout shows the architecture", README "Layout"):

    base -> config -> plan -> weights
    base -> kernels
    base -> comm
    weights, kernels, comm -> runtime -> cli

A file belongs to the layer of its folder: `src/<layer>/...` or `include/moeshard/<layer>/...`.
It may include headers of its own layer and of the layers below it, as
`moeshard/<layer>/x.h` (public) or `<layer>/x.h` (private, under src/). Tests beside the sources
follow the same rule; `tests/` (cross-layer by design) and `bench/` are not checked.

Other rules:
  - `<mpi.h>`, `<nccl.h>`, `<cuda_runtime.h>` (and other CUDA headers) only inside their
    backend's folder (`src/comm/mpi*`, `src/comm/nccl*`, `src/kernels/cuda/`).
  - Public headers (`include/moeshard/`) include no third-party header (nlohmann, fmt, CLI11,
    hwy, gtest, benchmark): the public API exposes moeshard and standard types only. Existing
    exceptions are listed in PUBLIC_THIRD_PARTY_ALLOWED with the reason; the list may only shrink.

Usage: scripts/check_layers.py [ROOT]   (exit 0 clean, 1 with one line per violation)
"""
import pathlib
import re
import sys

# Each layer and the layers it may include (itself implied).
LAYERS = {
    "base": set(),
    "config": {"base"},
    "plan": {"config", "base"},
    "weights": {"plan", "config", "base"},
    "kernels": {"base"},
    "comm": {"base"},
    "runtime": {"weights", "plan", "config", "kernels", "comm", "base"},
    "cli": {"runtime", "weights", "plan", "config", "kernels", "comm", "base"},
}

BACKEND_HEADERS = {
    "mpi.h": ("src/comm/mpi",),
    "nccl.h": ("src/comm/nccl",),
    "cuda_runtime.h": ("src/kernels/cuda/", "src/comm/nccl"),
    "cuda.h": ("src/kernels/cuda/",),
    "cublas_v2.h": ("src/kernels/cuda/",),
}

THIRD_PARTY_PREFIXES = ("nlohmann/", "fmt/", "CLI/", "hwy/", "gtest/", "gmock/", "benchmark/")

# Public headers that still include a third-party header, and why. Shrink, never grow.
PUBLIC_THIRD_PARTY_ALLOWED = {}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


def layer_of(rel: str):
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[:2] == ["include", "moeshard"] and len(parts) > 3:
        return parts[2]
    return None


def included_layer(header: str):
    parts = header.split("/")
    if parts[0] == "moeshard" and len(parts) > 2:
        return parts[1]
    if parts[0] in LAYERS and len(parts) > 1:
        return parts[0]
    return None


def check_file(root: pathlib.Path, path: pathlib.Path):
    rel = path.relative_to(root).as_posix()
    layer = layer_of(rel)
    text = path.read_text(encoding="utf-8", errors="replace")
    problems = []
    for m in INCLUDE.finditer(text):
        header = m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        where = f"{rel}:{line}"
        target = included_layer(header)
        if layer in LAYERS and target in LAYERS and target != layer \
                and target not in LAYERS[layer]:
            allowed = ", ".join(sorted(LAYERS[layer])) or "nothing"
            problems.append(
                f"{where}: layer '{layer}' includes '{header}' of layer '{target}'; "
                f"'{layer}' may include only {allowed} (move the code down, or pass the value in)")
        base = header.rsplit("/", 1)[-1]
        if base in BACKEND_HEADERS and header == base:
            homes = BACKEND_HEADERS[base]
            if not rel.startswith(homes):
                problems.append(f"{where}: <{header}> outside its backend folder "
                                f"({' or '.join(homes)}); wrap it behind the backend's interface")
        if rel.startswith("include/moeshard/") and header.startswith(THIRD_PARTY_PREFIXES):
            if header not in PUBLIC_THIRD_PARTY_ALLOWED.get(rel, {}):
                problems.append(f"{where}: public header includes third-party '{header}'; the "
                                f"public API exposes moeshard and standard types only (move it "
                                f"into the .cc or a private header under src/)")
    return problems


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parent.parent)
    files = sorted(p for d in ("src", "include") for p in (root / d).rglob("*")
                   if p.suffix in (".h", ".cc", ".cu", ".cuh") and p.is_file())
    if not files:
        print(f"check_layers: no sources under {root}/src or {root}/include", file=sys.stderr)
        return 2
    problems = [p for f in files for p in check_file(root, f)]
    for p in problems:
        print(p)
    print(f"check_layers: {len(files)} files, {len(problems)} violation(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
