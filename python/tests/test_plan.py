"""moeshard.plan against `moeshard plan --format json`: every preset, three topologies each,
and the CLI's error messages for bad input."""
import pytest

import moeshard
from conftest import PRESETS

# (keyword arguments, the same as CLI flags). Where a preset cannot take a topology, both sides
# must fail with the same message.
TOPOLOGIES = [
    (dict(), []),
    (dict(tp=2, dp=2, ep=True, gpu="h100"), ["-tp", "2", "-dp", "2", "-ep", "--gpu", "h100"]),
    (dict(tp=4, kv_cache_dtype="fp8", max_model_len="32k", padding_policy="model-floor"),
     ["-tp", "4", "--kv-cache-dtype", "fp8", "--max-model-len", "32k",
      "--padding-policy", "model-floor"]),
]


def same_as_cli(cli, model, kwargs, flags, tensors=False):
    out = cli("plan", "-m", model, "--format", "json", *flags, *(["--tensors"] if tensors else []))
    if out.rc in (0, 3):  # 3: planned, does not fit
        p = moeshard.plan(model, tensors=tensors, **kwargs)
        assert p.to_dict() == out.json()
        assert p.fits == (out.rc == 0)
        return p
    with pytest.raises(moeshard.Error) as e:
        moeshard.plan(model, tensors=tensors, **kwargs)
    assert str(e.value) == out.error()
    return None


@pytest.mark.parametrize("model", PRESETS)
@pytest.mark.parametrize("topology", range(len(TOPOLOGIES)))
def test_plan_equals_cli_json(cli, model, topology):
    kwargs, flags = TOPOLOGIES[topology]
    same_as_cli(cli, model, kwargs, flags)


def test_max_num_seqs_and_concurrent_seqs_equal_cli(cli):
    # vLLM's max_num_seqs sizes the sampler profile only; concurrent_seqs is the fit.
    common = dict(gpu="h100", backend="marlin", gpu_memory_utilization=0.96, max_model_len=98304)
    flags = ["--gpu", "h100", "--moe-backend", "marlin", "--gpu-memory-utilization", "0.96",
             "--max-model-len", "98304"]
    p = same_as_cli(cli, "gpt-oss-120b", dict(common, max_num_seqs=6),
                    flags + ["--max-num-seqs", "6"])
    assert p.fits and p.to_dict()["memory"]["engine_max_num_seqs"] == 6
    q = same_as_cli(cli, "gpt-oss-120b", dict(common, max_num_seqs=6, concurrent_seqs=6),
                    flags + ["--max-num-seqs", "6", "--concurrent-seqs", "6"])
    assert not q.fits and q.to_dict()["memory"]["concurrent_seqs"] == 6


def test_interconnect_equals_cli(cli):
    # H200s are NVLink boards; interconnect="pcie" takes vLLM's PCIe non-torch row instead.
    nvlink = same_as_cli(cli, "qwen3-235b-a22b", dict(tp=8), ["-tp", "8"])
    pcie = same_as_cli(cli, "qwen3-235b-a22b", dict(tp=8, interconnect="pcie"),
                       ["-tp", "8", "--interconnect", "pcie"])
    assert nvlink.to_dict()["memory"]["interconnect"] == "nvlink"
    assert pcie.to_dict()["memory"]["interconnect"] == "pcie"
    assert pcie.ranks[0].kv_tokens > nvlink.ranks[0].kv_tokens


@pytest.mark.parametrize("model", ["tiny-kimi-k3", "tiny-qwen3-moe", "qwen3-30b-a3b"])
def test_plan_with_tensors_equals_cli_tensors(cli, model):
    p = same_as_cli(cli, model, dict(tp=2, dp=2, ep=True), ["-tp", "2", "-dp", "2", "-ep"],
                    tensors=True)
    assert p is not None
    some = p.ranks[0].tensors[0]
    for key in ("name", "dtype", "logical_shape", "local_shape", "padded_shape", "shard"):
        assert key in some


def test_plan_object(cli):
    p = moeshard.plan("kimi-k3", tp=8, dp=4, ep=True, gpu="h200")
    assert p.fits and p.failure == "" and p.advice == ""
    assert len(p.ranks) == 32 == p.topology["world"]
    assert p.bytes["routed_experts"] > 0
    assert p.ranks[3].rank == 3
    with pytest.raises(moeshard.Error, match="tensors=True"):
        p.ranks[0].tensors
    small = moeshard.plan("kimi-k3", tp=8, gpu="h100")
    assert not small.fits
    assert small.advice == "-pp 4 (32 GPUs)"
    assert "exceed" in small.failure


def test_hybrid_and_redundant_experts_equal_cli(cli):
    same_as_cli(cli, "deepseek-v3", dict(tp=8, dp=2, moe_tp=2, moe_ep=8),
                ["-tp", "8", "-dp", "2", "--moe-tp", "2", "--moe-ep", "8"])
    same_as_cli(cli, "kimi-k3", dict(tp=8, dp=3, ep=True, num_redundant_experts="auto"),
                ["-tp", "8", "-dp", "3", "-ep", "--num-redundant-experts", "auto"])


@pytest.mark.parametrize("kwargs,flags", [
    (dict(), ["-m", "no-such-model"]),                      # unknown preset
    (dict(tp=3), ["-m", "kimi-k3", "-tp", "3"]),            # tp that does not divide
    (dict(padding_policy="sideways"), ["-m", "kimi-k3", "--padding-policy", "sideways"]),
    (dict(tp=2, moe_tp=3, moe_ep=3), ["-m", "kimi-k3", "-tp", "2", "--moe-tp", "3",
                                       "--moe-ep", "3"]),  # infeasible hybrid
    (dict(backend="warp-drive"), ["-m", "kimi-k3", "--moe-backend", "warp-drive"]),
    (dict(gpu="h9000"), ["-m", "kimi-k3", "--gpu", "h9000"]),
    (dict(max_model_len="lots"), ["-m", "kimi-k3", "--max-model-len", "lots"]),
    (dict(interconnect="nvswitch"), ["-m", "kimi-k3", "--interconnect", "nvswitch"]),
])
def test_errors_have_the_cli_message(cli, kwargs, flags):
    out = cli("plan", *flags, "--format", "json")
    assert out.rc == 1 and out.error()
    model = kwargs.pop("model", flags[1])
    with pytest.raises(moeshard.Error) as e:
        moeshard.plan(model, **kwargs)
    assert str(e.value) == out.error()
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("kwargs,message", [
    (dict(tp=0), "'--tensor-parallel-size 0': expected a positive integer"),
    (dict(dp=-1), "'--data-parallel-size -1': expected a positive integer"),
    (dict(gpu_memory_utilization=1.5), "'--gpu-memory-utilization 1.5': expected a fraction"),
    (dict(num_redundant_experts="many"), "'--num-redundant-experts many': expected"),
])
def test_values_cli11_rejects_raise_error(kwargs, message):
    with pytest.raises(moeshard.Error) as e:
        moeshard.plan("kimi-k3", **kwargs)
    assert str(e.value).startswith(message)


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="tensor_parallel"):
        moeshard.plan("kimi-k3", tensor_parallel=2)
