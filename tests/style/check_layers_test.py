#!/usr/bin/env python3
"""The layering check must fail on each kind of violation it exists for (a check that cannot
fail is a defect): it runs scripts/check_layers.py on small trees written here."""
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "check_layers.py"


def run(files):
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        for rel, text in files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        r = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
        return r.returncode, r.stdout


CLEAN = {
    "src/plan/a.cc": '#include "moeshard/config/model_config.h"\n#include "base/check.h"\n',
    "src/runtime/b.cc": '#include "moeshard/kernels/routing.h"\n#include "weights/x.h"\n',
    "src/comm/mpi/c.cc": "#include <mpi.h>\n",
    "include/moeshard/plan/d.h": '#include <vector>\n#include "moeshard/base/status.h"\n',
}
CASES = [
    ("upward public include", {"src/plan/e.cc": '#include "moeshard/runtime/moe_runtime.h"\n'},
     "layer 'plan' includes 'moeshard/runtime/moe_runtime.h' of layer 'runtime'"),
    ("upward private include", {"src/kernels/f.cc": '#include "config/presets.h"\n'},
     "layer 'kernels' includes 'config/presets.h' of layer 'config'"),
    ("sideways include", {"src/comm/g.cc": '#include "moeshard/kernels/routing.h"\n'},
     "layer 'comm' includes"),
    ("backend header outside its folder", {"src/runtime/h.cc": "#include <mpi.h>\n"},
     "<mpi.h> outside its backend folder"),
    ("third-party type in the public API",
     {"include/moeshard/weights/i.h": "#include <nlohmann/json.hpp>\n"},
     "public header includes third-party 'nlohmann/json.hpp'"),
]


def main():
    failures = 0
    rc, out = run(CLEAN)
    if rc != 0:
        print(f"FAIL clean tree rejected (rc {rc}):\n{out}")
        failures += 1
    for name, extra, expected in CASES:
        rc, out = run({**CLEAN, **extra})
        if rc != 1 or expected not in out:
            print(f"FAIL {name}: rc {rc}, expected a line with {expected!r}, got:\n{out}")
            failures += 1
        else:
            print(f"ok   {name}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
