"""pytest helpers for an engine's test suite: the partition contract as assertions.

    import pytest
    from moeshard.testing import assert_matches_plan, topologies

    @pytest.mark.parametrize("topology", **topologies("qwen3-30b-a3b", max_gpus=8))
    def test_weights_match_plan(topology):
        params = build_engine_and_dump_named_parameters(**topology)   # the engine's own code
        assert_matches_plan(params, "qwen3-30b-a3b", **topology)

``topologies`` returns the keyword arguments of ``pytest.mark.parametrize`` (argvalues: one dict
of plan() keywords per topology of ``moeshard check``'s grid; ids: their labels), or, called with
``as_params=False``, the plain list of dicts. ``assert_matches_plan`` raises AssertionError
listing every difference (rule, tensor, ranks, expected, actual) the way ``moeshard check
--against`` prints them.
"""
import json as _json

import moeshard
from . import _core

__all__ = ["assert_matches_plan", "topologies", "topology_kwargs"]


def assert_matches_plan(named_params_by_rank, model, **topology):
    """Asserts an engine's per-rank parameters match moeshard's plan of `model` on `topology`
    (plan()'s keywords: tp, dp, ep, moe_tp, moe_ep, backend, padding_policy, ...).
    named_params_by_rank: as moeshard.check_against takes it (a list per rank of
    {name: (shape, dtype)} or of tensors, a dump object, or a dump path). Returns the Findings
    (empty) when they match; raises AssertionError with every finding otherwise."""
    findings = moeshard.check_against(named_params_by_rank, model, **topology)
    if findings:
        lines = "\n".join("  " + line for line in findings.lines())
        raise AssertionError(
            f"{len(findings)} difference{'s' if len(findings) != 1 else ''} from moeshard's plan "
            f"of {findings.model} {findings.topology} (backend {findings.backend}, padding policy "
            f"{findings.padding_policy}):\n{lines}")
    return findings


def topology_kwargs(point):
    """plan() keywords of one grid point ({tp, dp, pp, pcp, moe_tp, moe_ep, ...}): plain TP,
    ``ep=True`` for full expert parallelism, else the explicit moe_tp x moe_ep hybrid."""
    kw = {k: point[k] for k in ("tp", "dp", "pp", "pcp") if point[k] != 1}
    group = point["tp"] * point["dp"] * point["pcp"]
    if point["moe_ep"] == 1:
        pass  # MoE split like attention TP (the vLLM default without -ep)
    elif point["moe_ep"] == group and point["moe_tp"] == 1:
        kw["ep"] = True
    else:
        kw["moe_tp"], kw["moe_ep"] = point["moe_tp"], point["moe_ep"]
    return kw


def topologies(model, max_gpus=8, with_pp=False, strategy=None, as_params=True, **options):
    """The topologies of ``moeshard check``'s grid for `model` (GPU counts 1, 2, 4, ... up to
    max_gpus; pipeline strategies with with_pp), each as plan() keywords, options (backend,
    padding_policy, ...) included. strategy: only strategies whose name contains it.
    engine: as plan()'s; under vllm (the default) hybrids (MoE TP x EP) are left out, since
    vLLM cannot run them. as_params: return ``dict(argnames="topology", argvalues=[...],
    ids=[labels])`` for
    ``pytest.mark.parametrize(**...)``; else the list of keyword dicts."""
    layout = {k: v for k, v in options.items() if v is not None and k != "engine"}
    grid = _json.loads(_core.grid_json(model, max_gpus=max_gpus, with_pp=with_pp, **layout))
    points, seen = [], set()
    for p in grid:  # one entry per topology (TP1 is in every strategy's grid)
        if (strategy is None or strategy in p["strategy"]) and p["topology"] not in seen:
            seen.add(p["topology"])
            points.append(p)
    values = [dict(topology_kwargs(p), **options) for p in points]
    # vLLM (the default engine) cannot run MoE TP and EP together: its suites get the others.
    if str(options.get("engine") or "vllm").startswith("vllm"):
        keep = [not ((v.get("moe_tp") or 1) > 1 and (v.get("moe_ep") or 1) > 1) for v in values]
        points = [p for p, k in zip(points, keep) if k]
        values = [v for v, k in zip(values, keep) if k]
    if not as_params:
        return values
    return dict(argnames="topology", argvalues=values, ids=[p["topology"] for p in points])
