"""moeshard.ownership against `moeshard plan --ownership FILE`, and moeshard.check_against
against `moeshard check --against DUMP --format json`: several presets, the four historical
engine bugs of tests/cli (dumps made by tests/cli/make_engine_dump.py) and their fixed layouts,
the same dumps given as Python dicts, and the CLI's error messages."""
import json
import subprocess
import sys

import pytest

import moeshard
from conftest import CLI, SOURCE_DIR

MAKE_DUMP = SOURCE_DIR / "tests" / "cli" / "make_engine_dump.py"


@pytest.mark.parametrize("model,kwargs,flags", [
    ("tiny-kimi-k3", dict(tp=2, dp=2, ep=True), ["-tp", "2", "-dp", "2", "-ep"]),
    ("qwen3-30b-a3b", dict(tp=4, padding_policy="model-floor"),
     ["-tp", "4", "--padding-policy", "model-floor"]),
    ("gpt-oss-20b", dict(dp=2, ep=True), ["-dp", "2", "-ep"]),
    ("deepseek-v3", dict(tp=8, dp=2, moe_tp=2, moe_ep=8, engine="sglang"),
     ["-tp", "8", "-dp", "2", "--moe-tp", "2", "--moe-ep", "8", "--engine", "sglang"]),
])
def test_ownership_equals_cli_file(cli, tmp_path, model, kwargs, flags):
    path = tmp_path / "own.json"
    out = cli("plan", "-m", model, *flags, "--ownership", str(path), "--format", "json")
    assert out.rc in (0, 3), out.stderr
    got = moeshard.ownership(model, **kwargs)
    assert got == json.loads(path.read_text())
    assert got["format"] == "moeshard-ownership" and len(got["ranks"]) == got["topology"]["world"]


def test_ownership_errors_have_the_cli_message(cli, tmp_path):
    out = cli("plan", "-m", "kimi-k3", "-tp", "3", "--ownership", str(tmp_path / "x.json"))
    with pytest.raises(moeshard.Error) as e:
        moeshard.ownership("kimi-k3", tp=3)
    assert str(e.value) == out.error()


def make_dump(tmp_path, name, plan_flags, *options):
    folder = tmp_path / name
    subprocess.run([sys.executable, str(MAKE_DUMP), CLI, str(folder), *options, "--",
                    *plan_flags], check=True, capture_output=True, text=True)
    return folder


def read_dump(folder):
    """The dump folder as check_against's Python input: a list per rank of param dicts."""
    ranks = {}
    for f in sorted(folder.glob("*.json")):
        record = json.loads(f.read_text())
        ranks[record["rank"]] = record["params"]
    return [ranks[r] for r in sorted(ranks)]


# (name, the buggy engine's layout as plan flags, make_engine_dump options, the topology
# checked as kwargs and flags, the rules the bug breaks)
BUGS = [
    ("pr51131", ["--model", "kimi-k3", "-tp", "16", "-ep", "--padding-policy", "legacy-tp"], [],
     dict(tp=16, ep=True), ["-tp", "16", "-ep"], {"shape", "padding"}),
    ("pr50928", ["--model", "kimi-k3", "-tp", "8"], ["--replicate", "4"],
     dict(tp=8, dp=4), ["-tp", "8", "--dp", "4"], {"slice", "shape", "padding", "coverage"}),
    ("pr50583", ["--model", "kimi-k3", "-tp", "32", "--moe-backend", "marlin",
                 "--padding-policy", "model-floor"], [],
     dict(tp=32, backend="marlin"), ["-tp", "32", "--moe-backend", "marlin"],
     {"shape", "padding"}),
    ("pr51130", ["--model", "gpt-oss-20b", "--dp", "2", "-ep"], ["--wrap-expert-end"],
     dict(dp=2, ep=True), ["--dp", "2", "-ep"], {"slice", "data", "coverage"}),
]


@pytest.mark.parametrize("bug", BUGS, ids=[b[0] for b in BUGS])
def test_historical_bugs_equal_cli(cli, tmp_path, bug):
    name, layout, options, kwargs, flags, rules = bug
    model = layout[1]
    buggy = make_dump(tmp_path, name, layout, *options)
    out = cli("check", "-m", model, *flags, "--against", str(buggy), "--format", "json")
    assert out.rc == 1, out.stderr
    expected = out.json()
    by_path = moeshard.check_against(buggy, model, **kwargs)
    assert by_path.to_dict() == expected
    assert {f["rule"] for f in by_path} == rules and not by_path.ok
    # The fixed engine's layout (the plan of the checked topology) passes.
    fixed = make_dump(tmp_path, name + "_fixed", [*layout[:2], *flags])
    ok = moeshard.check_against(fixed, model, **kwargs)
    assert ok == [] and ok.ok
    if name in ("pr50928", "pr50583"):
        return  # 32-rank dumps of Kimi-K3: ~10 s a comparison; the rest is checked below
    assert ok.to_dict() == cli("check", "-m", model, *flags, "--against", str(fixed),
                               "--format", "json").json()
    # The same dump as Python objects (what an engine's test has in memory).
    by_list = moeshard.check_against(read_dump(buggy), model, **kwargs)
    assert list(by_list) == expected["findings"]
    # The CLI's text lines are the findings' lines.
    text = cli("check", "-m", model, *flags, "--against", str(buggy))
    assert ["  " + line for line in by_list.lines()] == [
        line for line in text.stdout.splitlines() if line.startswith("  [")]


def test_shape_dtype_tuples_and_plan_argument():
    # A hand-made dump: every rank's routed experts from the ownership map as (shape, dtype).
    own = moeshard.ownership("tiny-qwen3-moe", tp=2)
    torch_names = {"BF16": "bfloat16", "F32": "float32"}

    def params(rank, pad=0):
        out = {}
        for t in rank["tensors"]:
            for layer in t.get("layers") or [None]:
                name = t["name"] if layer is None else t["name"].replace("{layer}", str(layer))
                shape = list(t["padded_shape"])
                if pad and t["category"] == "routed_experts":
                    shape[1] += pad
                out[name] = (shape, torch_names.get(t["dtype"], t["dtype"]))
        return out

    good = [params(r) for r in own["ranks"]]
    assert moeshard.check_against(good, "tiny-qwen3-moe", tp=2) == []
    p = moeshard.plan("tiny-qwen3-moe", tp=2)
    assert moeshard.check_against(good, p) == []
    bad = [params(r, pad=16) for r in own["ranks"]]
    findings = moeshard.check_against(bad, p)
    assert findings and {f["rule"] for f in findings} == {"shape"}
    assert findings[0]["ranks"] == "0-1"
    # As a dict by rank, too.
    assert moeshard.check_against(dict(enumerate(bad)), p) == findings


def test_check_against_errors(cli, tmp_path):
    with pytest.raises(moeshard.Error, match="expected \\(shape, dtype\\)"):
        moeshard.check_against([{"x": 3}], "tiny-qwen3-moe")
    out = cli("check", "-m", "tiny-qwen3-moe", "--against", str(tmp_path / "none"))
    with pytest.raises(moeshard.Error) as e:
        moeshard.check_against(tmp_path / "none", "tiny-qwen3-moe")
    assert str(e.value) == out.error()
    out = cli("check", "-m", "no-such-model", "--against", str(tmp_path / "none"))
    with pytest.raises(moeshard.Error) as e:
        moeshard.check_against([], "no-such-model")
    assert str(e.value) == out.error()
    with pytest.raises(TypeError):
        moeshard.check_against([], moeshard.plan("tiny-qwen3-moe"), tp=2)


def test_malformed_dumps_raise_error():
    with pytest.raises(moeshard.Error, match="named_params_by_rank"):
        moeshard.check_against({"world": 1, "ranks": [{"rank": 0, "params": [{"shape": 3}]}]},
                               "tiny-qwen3-moe")
    with pytest.raises(TypeError, match="'max_gpus'|incompatible"):
        moeshard.check("tiny-qwen3-moe", max_gpus="8")
