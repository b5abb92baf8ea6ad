"""moeshard.testing: assert_matches_plan (passing and failing) and topologies (the grid of
`moeshard check`, as parametrize arguments an engine's suite uses)."""
import pytest

import moeshard
from moeshard.testing import assert_matches_plan, topologies

MODEL = "tiny-qwen3-moe"


def engine_params(model, bug=False, **topology):
    """A stand-in engine: every rank's parameters as {name: (shape, dtype)}, built from the
    ownership map; with bug, the old power-of-two padding of the per-rank intermediate."""
    own = moeshard.ownership(model, **topology)
    ranks = []
    for rank in own["ranks"]:
        params = {}
        for t in rank["tensors"]:
            shape = list(t["padded_shape"])
            if bug and t["category"] == "routed_experts" and len(shape) == 3:
                shape[1] = 1 << (shape[1] - 1).bit_length() if shape[1] & (shape[1] - 1) \
                    else shape[1] * 2
            for layer in t.get("layers") or [None]:
                name = t["name"] if layer is None else t["name"].replace("{layer}", str(layer))
                params[name] = (shape, t["dtype"])
        ranks.append(params)
    return ranks


GRID = topologies(MODEL, max_gpus=4)


def test_grid_is_check_grid_and_each_point_plans():
    assert GRID["argnames"] == "topology"
    labels = GRID["ids"]
    assert len(labels) == len(GRID["argvalues"]) >= 4
    assert len(set(labels)) == len(labels)
    # Each point's keywords give the plan of that label.
    for kw, label in zip(GRID["argvalues"], labels):
        assert moeshard.plan(MODEL, **kw).topology["label"] == label
    assert any(kw.get("ep") for kw in GRID["argvalues"])
    only_ep = topologies(MODEL, max_gpus=4, strategy="EP", as_params=False)
    assert only_ep[0] == {}  # TP1: one GPU, in every strategy
    assert len(only_ep) > 1 and all("ep" in kw or "moe_ep" in kw for kw in only_ep[1:])
    # Under vLLM (the default engine) hybrids are left out; other engines keep them, and plan.
    assert not any(kw.get("moe_tp", 1) > 1 and kw.get("moe_ep", 1) > 1 for kw in GRID["argvalues"])
    sglang = topologies(MODEL, max_gpus=4, engine="sglang", as_params=False)
    hybrids = [kw for kw in sglang if kw.get("moe_tp", 1) > 1 and kw.get("moe_ep", 1) > 1]
    assert hybrids and len(sglang) > len(GRID["argvalues"])
    for kw in hybrids:
        moeshard.plan(MODEL, **kw)


@pytest.mark.parametrize(**GRID)
def test_engine_matches_plan_on_every_topology(topology):
    findings = assert_matches_plan(engine_params(MODEL, **topology), MODEL, **topology)
    assert findings == [] and findings.params_matched > 0


def test_failing_engine_raises_assertion_with_findings():
    topology = dict(tp=2, ep=True)
    with pytest.raises(AssertionError) as e:
        assert_matches_plan(engine_params(MODEL, bug=True, **topology), MODEL, **topology)
    message = str(e.value)
    assert "from moeshard's plan of" in message and "TP2 EP2" in message
    assert "[shape]" in message and "w13_weight" in message and "expected [" in message


def test_topologies_errors_are_moeshard_errors():
    with pytest.raises(moeshard.Error, match="max-gpus 0"):
        topologies(MODEL, max_gpus=0)
