"""moeshard.Runtime: the sharded MoE layers on NumPy arrays, against the single-rank run, the
runtime's own single-rank reference (verify, as `moeshard run --verify`), `moeshard run
--output` on the same input, and bad input raising moeshard.Error."""
import logging
import re
import struct

import numpy as np
import pytest

import moeshard
from conftest import SOURCE_DIR

MODEL = "tiny-qwen3-moe"


def inputs(rt, tokens=7, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (tokens, rt.hidden_size)).astype(np.float32)


def close(a, b, tol=2e-2):
    return np.max(np.abs(a - b)) <= tol * (1 + np.max(np.abs(b)))


@pytest.mark.parametrize("topology", [dict(tp=2), dict(tp=2, ep=True), dict(dp=2, ep=True),
                                      dict(tp=4, moe_tp=2, moe_ep=2)],
                         ids=["TP2", "TP2 EP", "DP2 EP", "hybrid"])
def test_sharded_equals_single_rank(topology):
    one = moeshard.Runtime(MODEL, layers=2)
    many = moeshard.Runtime(MODEL, layers=2, **topology)
    assert many.world == 2 * (2 if topology.get("moe_tp") else 1)
    assert many.layers == one.layers and len(one.layers) == 2
    x = inputs(one)
    ref = one.moe(x)
    out = many.moe(x, verify=True)
    assert out.shape == x.shape and out.dtype == np.float32
    assert close(out, ref)
    assert not np.allclose(out, x)  # the layers did something
    assert many.verification["passes"], many.verification["summary"]
    both = many.moe(x, all_layers=True)
    assert both.shape == (2, *x.shape) and np.array_equal(both[-1], out)


def test_routing_given_and_bf16():
    rt = moeshard.Runtime(MODEL, tp=2, ep=True, layers=1)
    x = inputs(rt, tokens=5)
    k, e = rt.top_k, rt.num_experts
    ids = np.stack([np.arange(k) + t for t in range(5)]).astype(np.int64) % e
    weights = np.full((5, k), 1.0 / k, np.float32)
    routed = rt.moe(x, topk_ids=ids, topk_weights=weights)
    assert not close(routed, rt.moe(x), tol=1e-4)  # a different routing, a different output
    assert close(routed, moeshard.Runtime(MODEL, layers=1).moe(x, topk_ids=ids.astype(np.int32),
                                                               topk_weights=weights))
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # x truncated to bf16
    out = rt.moe(bits)
    assert out.dtype == np.uint16 and out.shape == x.shape
    as_float = (out.astype(np.uint32) << 16).view(np.float32)
    assert close(as_float, rt.moe((bits.astype(np.uint32) << 16).view(np.float32)))


def test_matches_moeshard_run_output(cli, tmp_path):
    # The same tokens through `moeshard run --input/--output` (f32) and the Runtime.
    rt = moeshard.Runtime(MODEL, tp=2, ep=True)
    x = inputs(rt, tokens=6, seed=3)
    header = {"hidden_states": {"dtype": "F32", "shape": list(x.shape),
                                "data_offsets": [0, x.nbytes]}}
    text = __import__("json").dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (tmp_path / "in.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + x.tobytes())
    out = cli("run", "-m", MODEL, "-tp", "2", "-ep", "--dtype", "f32", "--iters", "1",
              "--input", str(tmp_path / "in.safetensors"), "--output", str(tmp_path / "o.st"))
    assert out.rc == 0, out.stdout + out.stderr
    raw = (tmp_path / "o.st").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    info = __import__("json").loads(raw[8:8 + n])
    last = "layers.%d.hidden_states" % rt.layers[-1]
    b, e = info[last]["data_offsets"]
    expected = np.frombuffer(raw[8 + n + b:8 + n + e], np.float32).reshape(x.shape)
    np.testing.assert_array_equal(rt.moe(x), expected)


@pytest.mark.parametrize("bad,message", [
    (lambda x: x.astype(np.float64), "'x': expected float32 or bfloat16 bits (uint16) [7, "),
    (lambda x: x[:, :-1], "got float32 [7, "),
    (lambda x: x[0], "got float32 ["),
    (lambda x: x[:0], "expected at least one token"),
])
def test_bad_input_raises_error(bad, message):
    rt = moeshard.Runtime(MODEL, layers=1)
    with pytest.raises(moeshard.Error) as e:
        rt.moe(bad(inputs(rt)))
    assert message in str(e.value)


def test_bad_routing_raises_error():
    rt = moeshard.Runtime(MODEL, layers=1)
    x = inputs(rt, tokens=2)
    k = rt.top_k
    w = np.ones((2, k), np.float32)
    with pytest.raises(moeshard.Error, match="expected both or neither"):
        rt.moe(x, topk_ids=np.zeros((2, k), np.int32))
    with pytest.raises(moeshard.Error, match=r"'topk_ids': expected an expert id in \[0, "):
        rt.moe(x, topk_ids=np.full((2, k), rt.num_experts, np.int32), topk_weights=w)
    with pytest.raises(moeshard.Error, match="'topk_weights': expected float32"):
        rt.moe(x, topk_ids=np.zeros((2, k), np.int32), topk_weights=w.astype(np.float64))
    with pytest.raises(moeshard.Error, match="'topk_ids': expected int32 or int64"):
        rt.moe(x, topk_ids=np.zeros((2, k + 1), np.int32), topk_weights=w)


def test_construction_errors_have_the_cli_message(cli):
    out = cli("run", "-m", MODEL, "-tp", "3")
    with pytest.raises(moeshard.Error) as e:
        moeshard.Runtime(MODEL, tp=3)
    assert str(e.value) == out.error()
    out = cli("run", "-m", MODEL, "--load-format", "safetensors")
    with pytest.raises(moeshard.Error) as e:
        moeshard.Runtime(MODEL, load_format="safetensors")
    assert str(e.value) == out.error()
    out = cli("run", "-m", MODEL, "-pp", "2", "--iters", "1")
    rt = moeshard.Runtime(MODEL, pp=2)
    with pytest.raises(moeshard.Error) as e:
        rt.moe(np.zeros((1, rt.hidden_size), np.float32))

    def unranked(message):  # "[rank r/n] ..." names whichever rank failed first
        return re.sub(r"^\[rank \d+/\d+\] ", "", message)
    assert out.rc == 1 and unranked(str(e.value)) == unranked(out.error())
    assert "'-pp 2'" in str(e.value)


def test_progress_callback_and_logging(caplog):
    calls = []
    rt = moeshard.Runtime(MODEL, tp=2, layers=1, progress=lambda d, t: calls.append((d, t)))
    rt.moe(inputs(rt))
    assert calls, "no progress reported"
    done = [d for d, _ in calls]
    total = calls[0][1]
    assert total > 0 and all(t == total for _, t in calls)
    assert done == sorted(done) and done[-1] == total
    assert len(calls) <= 22
    # Without a callable: INFO records on the "moeshard" logger, nothing on stdout.
    quiet = moeshard.Runtime(MODEL, layers=1)
    with caplog.at_level(logging.INFO, logger="moeshard"):
        quiet.moe(inputs(quiet))
    records = [r for r in caplog.records if r.name == "moeshard"]
    assert records and "100%" in records[-1].getMessage()


def test_weights_are_loaded_once():
    """The ranks and their weights stay alive between calls: only the first call loads (the
    progress callable hears of it once), later calls with more tokens than the first, with
    given routing, or verified, run on the same weights and agree with a fresh Runtime."""
    calls = []
    rt = moeshard.Runtime(MODEL, tp=2, ep=True, layers=2,
                          progress=lambda d, t: calls.append((d, t)))
    x = inputs(rt, tokens=3)
    first = rt.moe(x)
    loaded = len(calls)
    assert loaded > 0 and calls[-1][0] == calls[-1][1]
    assert np.array_equal(rt.moe(x), first)
    big = inputs(rt, tokens=40, seed=1)  # more rows than the runtime's first buffers
    out = rt.moe(big, verify=True)
    assert rt.verification["passes"], rt.verification["summary"]
    assert len(calls) == loaded, "a later call loaded the weights again"
    assert np.array_equal(out, moeshard.Runtime(MODEL, tp=2, ep=True, layers=2).moe(big))
    assert np.array_equal(rt.moe(x), first)


def test_expert_load_counts_the_given_routing():
    rt = moeshard.Runtime(MODEL, dp=2, ep=True, layers=2)
    T, k, e = 6, rt.top_k, rt.num_experts
    ids = np.stack([(np.arange(k) * 3 + t) % e for t in range(T)]).astype(np.int64)
    rt.moe(inputs(rt, tokens=T), topk_ids=ids, topk_weights=np.full((T, k), 1.0 / k, np.float32))
    want = np.bincount(ids.ravel(), minlength=e).tolist()
    assert rt.expert_load["layers"] == [want, want]
    assert sorted(rt.expert_load["slot_experts"]) == list(range(e))
    assert [sum(row) for row in rt.expert_load["slot_tokens"]] == [T * k, T * k]


def test_a_failed_call_does_not_break_the_runtime():
    rt = moeshard.Runtime(MODEL, tp=2, layers=1)
    x = inputs(rt, tokens=4)
    good = rt.moe(x)
    with pytest.raises(moeshard.Error, match="token_ids"):
        rt.moe(x, token_ids=np.zeros(3, np.int64))
    assert np.array_equal(rt.moe(x), good)


def test_progress_callback_error_propagates():
    def boom(done, total):
        raise RuntimeError("callback failed")
    rt = moeshard.Runtime(MODEL, layers=1, progress=boom)
    with pytest.raises(RuntimeError, match="callback failed"):
        rt.moe(inputs(rt))


def test_odd_arrays_and_arguments_raise_python_errors(tmp_path):
    rt = moeshard.Runtime(MODEL, layers=1)
    x = inputs(rt, tokens=4)
    # Fortran order and a strided view are copied, not misread.
    np.testing.assert_array_equal(rt.moe(np.asfortranarray(x)), rt.moe(x))
    wide = np.zeros((4, 2 * rt.hidden_size), np.float32)
    wide[:, ::2] = x
    np.testing.assert_array_equal(rt.moe(wide[:, ::2]), rt.moe(x))
    with pytest.raises(moeshard.Error, match="got float32 \\[1, 4, "):
        rt.moe(x[None])
    with pytest.raises(moeshard.Error, match="got float64"):
        rt.moe(x.tolist())  # a list becomes a float64 array
    with pytest.raises(moeshard.Error, match="'token_ids': expected a token id in"):
        rt.moe(x, token_ids=np.full(4, 10**6, np.int64))
    with pytest.raises(moeshard.Error, match="does-not-exist"):
        moeshard.Runtime(MODEL, checkpoint=tmp_path / "does-not-exist").moe(x)
    with pytest.raises(TypeError, match="'tp': expected int, got str"):
        moeshard.Runtime(MODEL, tp="2")
    with pytest.raises(TypeError, match="'ep': expected bool"):
        moeshard.plan(MODEL, ep=1)
    assert moeshard.plan(MODEL, tp=np.int64(2)).topology["tp"] == 2
