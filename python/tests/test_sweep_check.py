"""moeshard.sweep against `moeshard sweep --format json`, moeshard.check against the violations
`moeshard check` prints."""
import pytest

import moeshard


@pytest.mark.parametrize("model,kwargs,flags", [
    ("kimi-k3", dict(gpus=[8, 16, 32]), ["--gpus", "8,16,32"]),
    ("deepseek-v3", dict(gpus=[8, 16], gpu="h100", fits_only=True, sort="kv"),
     ["--gpus", "8,16", "--gpu", "h100", "--fits-only", "--sort", "kv"]),
    ("qwen3-30b-a3b", dict(gpus="2,4", with_pp=True, strategy="EP"),
     ["--gpus", "2,4", "--with-pp", "--strategy", "EP"]),
])
def test_sweep_equals_cli_json(cli, model, kwargs, flags):
    out = cli("sweep", "-m", model, "--format", "json", *flags)
    assert out.rc == 0, out.stderr
    rows = moeshard.sweep(model, **kwargs)
    assert rows == out.json()
    assert rows and all(isinstance(r, dict) for r in rows)


def test_sweep_errors_have_the_cli_message(cli):
    out = cli("sweep", "-m", "kimi-k3", "--gpus", "8,x")
    with pytest.raises(moeshard.Error) as e:
        moeshard.sweep("kimi-k3", gpus="8,x")
    assert str(e.value) == out.error()
    out = cli("sweep", "-m", "kimi-k3", "--sort", "colour")
    with pytest.raises(moeshard.Error) as e:
        moeshard.sweep("kimi-k3", sort="colour")
    assert str(e.value) == out.error()


def cli_violations(cli, *flags):
    """The violation lines `moeshard check` prints ("  [invariant] topology: detail")."""
    out = cli("check", *flags)
    assert out.rc in (0, 1), out.stderr
    return out, [line for line in out.stdout.splitlines() if line.startswith("  [")]


@pytest.mark.parametrize("model,kwargs,flags", [
    ("qwen3-30b-a3b", dict(max_gpus=16), ["--max-gpus", "16"]),
    ("kimi-k3", dict(max_gpus=32, with_pp=True), ["--max-gpus", "32", "--with-pp"]),
    ("qwen3-30b-a3b", dict(max_gpus=16, padding_policy="legacy-tp"),
     ["--max-gpus", "16", "--padding-policy", "legacy-tp"]),
    ("kimi-k3", dict(max_gpus=16, padding_policy="legacy-tp"),
     ["--max-gpus", "16", "--padding-policy", "legacy-tp"]),
    ("tiny-kimi-k3", dict(max_gpus=8, padding_policy="legacy-tp"),
     ["--max-gpus", "8", "--padding-policy", "legacy-tp"]),
])
def test_check_equals_cli(cli, model, kwargs, flags):
    out, expected = cli_violations(cli, "-m", model, *flags)
    got = moeshard.check(model, **kwargs)
    assert [f"  [{v['invariant']}] {v['topology']}: {v['detail']}" for v in got] == expected
    assert (out.rc == 0) == (got == [])


def test_check_finds_the_legacy_tp_padding_bug():
    # Pre-fix engines padded the per-rank intermediate to a power of two: waste violations.
    violations = moeshard.check("kimi-k3", max_gpus=16, padding_policy="legacy-tp")
    assert violations and {v["invariant"] for v in violations} == {"waste"}
    assert moeshard.check("kimi-k3", max_gpus=16) == []


def test_check_errors_have_the_cli_message(cli):
    out = cli("check", "-m", "kimi-k3", "--max-gpus", "0")
    with pytest.raises(moeshard.Error) as e:
        moeshard.check("kimi-k3", max_gpus=0)
    assert str(e.value) == out.error()
