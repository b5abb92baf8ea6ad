"""moeshard from Python: the sharding planner behind the ``moeshard`` CLI.

``plan``, ``sweep`` and ``check`` take the CLI's flags as keyword arguments (``--tensor-parallel-size``
is ``tp``, ``--padding-policy`` is ``padding_policy``, ...) and compute exactly what the CLI
computes: ``plan(...).to_dict()`` equals ``json.loads`` of ``moeshard plan --format json``, and
``sweep(...)`` the rows of ``moeshard sweep --format json``. A bad argument raises
``moeshard.Error`` (a ``ValueError``) whose message is the one the CLI prints after ``error:``.
"""
import json as _json

from ._core import Error  # noqa: F401  (a ValueError; re-exported)
from . import _core

__all__ = ["Error", "Plan", "Rank", "plan", "sweep", "check"]


def _options(**kwargs):
    """The keyword arguments the C++ side reads; None means the CLI's default."""
    return {k: v for k, v in kwargs.items() if v is not None}


class Rank:
    """One rank of a plan: its coordinates, per-category bytes, experts and (with tensors=True)
    tensors. Every key of the CLI's JSON rank object is also an attribute (``rank.tp_rank``)."""

    def __init__(self, data):
        self._data = data

    def __getattr__(self, name):
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(f"Rank has no attribute '{name}' (keys: {sorted(self._data)})")

    @property
    def tensors(self):
        """The rank's tensors (name, category, dtype, logical/local/padded shapes, checkpoint
        slice); needs ``plan(..., tensors=True)``."""
        if "tensors" not in self._data:
            raise Error("tensors: this plan was built without them; call "
                        "moeshard.plan(..., tensors=True)")
        return self._data["tensors"]

    @property
    def weight_bytes(self):
        return self._data["bytes"]["weights_total"]

    def to_dict(self):
        return _json.loads(_json.dumps(self._data))

    def __repr__(self):
        return f"<moeshard.Rank {self.rank}: {self.weight_bytes / 2**30:.2f} GiB weights>"


class Plan:
    """The ShardPlan of one topology with its memory plan, as ``moeshard plan`` reports it."""

    def __init__(self, data):
        self._data = data
        self.ranks = [Rank(r) for r in data["ranks"]]

    @property
    def fits(self):
        """Whether every rank's weights, KV cache and activations fit the GPU budget."""
        return self._data["memory"]["fits"]

    @property
    def failure(self):
        """Why it does not fit ('' when it fits)."""
        return self._data["memory"]["failure"]

    @property
    def advice(self):
        """The smallest change that fits, as CLI flags ('' when it fits or none was found)."""
        return self._data["advice"]

    @property
    def bytes(self):
        """Per-category bytes of the worst rank (the one the fit verdict is about)."""
        return self.ranks[self._data["memory"]["worst_rank"]].bytes

    @property
    def tensors(self):
        """{rank: [tensor, ...]} for every rank; needs ``plan(..., tensors=True)``."""
        return {r.rank: r.tensors for r in self.ranks}

    def __getattr__(self, name):
        # model, topology, backend, memory, params, routed_experts, notes, padding_policy, ...
        if name == "_data":
            raise AttributeError(name)
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(f"Plan has no attribute '{name}' (keys: {sorted(self._data)})")

    def to_dict(self):
        """A fresh copy of ``moeshard plan --format json``'s document."""
        return _json.loads(_json.dumps(self._data))

    def __repr__(self):
        verdict = "fits" if self.fits else "does not fit"
        return (f"<moeshard.Plan {self.model['name']} {self.topology['label']} "
                f"on {self.topology['world']} ranks: {verdict}>")


def plan(model, tp=1, dp=1, pp=1, pcp=1, ep=False, moe_tp=None, moe_ep=None, backend="auto",
         padding_policy="backend", expert_placement="linear", num_redundant_experts=0,
         shared_experts="sharded", latent_proj="replicated", gpu="h200", gpu_memory=None,
         gpu_memory_utilization=None, kv_cache_dtype="auto", max_model_len=None, max_num_seqs=1,
         max_num_batched_tokens=None, overhead_gib=0.0, engine="vllm", all2all_backend=None,
         cuda_graph_gib=0.0, tensors=False):
    """``moeshard plan``: the plan of one topology.

    model: a preset name (``"kimi-k3"``), a config.json, or a checkpoint directory.
    tp, dp, pp, pcp, ep: ``-tp``, ``-dp``, ``-pp``, ``--pcp``, ``-ep`` (vLLM semantics).
    moe_tp, moe_ep: the hybrid MoE split (``--moe-tp``, ``--moe-ep``).
    backend, padding_policy, expert_placement, num_redundant_experts (an int or ``"auto"``),
    shared_experts, latent_proj: ``--moe-backend`` and the CLI flags of the same names.
    gpu, gpu_memory (GiB, instead of gpu), gpu_memory_utilization, kv_cache_dtype,
    max_model_len (an int, ``"128k"``, ``"auto"``; None: the model's maximum), max_num_seqs,
    max_num_batched_tokens, overhead_gib: the memory flags (None: the engine's default).
    engine (``"vllm"``, ``"sglang@0.4"``, ...), all2all_backend, cuda_graph_gib: ``--engine``,
    ``--all2all-backend``, ``--cuda-graph-gib`` (docs/engine-memory.md).
    tensors: list every tensor of every rank (``--tensors``).
    Returns a ``Plan``; raises ``moeshard.Error`` where the CLI prints an error.
    """
    text = _core.plan_json(model, tensors=tensors, **_options(
        tp=tp, dp=dp, pp=pp, pcp=pcp, ep=ep, moe_tp=moe_tp, moe_ep=moe_ep, backend=backend,
        padding_policy=padding_policy, expert_placement=expert_placement,
        num_redundant_experts=num_redundant_experts, shared_experts=shared_experts,
        latent_proj=latent_proj, gpu=gpu, gpu_memory=gpu_memory,
        gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype,
        max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, overhead_gib=overhead_gib,
        engine=engine, all2all_backend=all2all_backend, cuda_graph_gib=cuda_graph_gib))
    return Plan(_json.loads(text))


def sweep(model, gpus=(8, 16, 32, 64), with_pp=False, fits_only=False, strategy=None,
          sort="gpus", **options):
    """``moeshard sweep``: one dict per valid topology for the GPU counts (the rows of
    ``--format json``: strategy, topology, gpus, backend, weights_per_gpu, routed_per_gpu,
    routed_padding_per_gpu, intermediate_raw/padded_local, kv_tokens, max_model_len, fits), so
    ``pandas.DataFrame(rows)`` works. ``options`` are plan()'s topology, backend and memory
    keywords (tp, dp, ... are ignored by the grid except as the CLI uses them)."""
    gpu_list = gpus if isinstance(gpus, str) else ",".join(str(int(g)) for g in gpus)
    text = _core.sweep_json(model, gpus=gpu_list, with_pp=with_pp, fits_only=fits_only,
                            sort=sort, **_options(strategy=strategy, **options))
    return _json.loads(text)


def check(model, max_gpus=64, with_pp=False, **options):
    """``moeshard check``: the partition contract's violations over the grid of topologies
    (GPU counts 1, 2, 4, ... up to max_gpus), one dict {invariant, topology, detail} each;
    empty when the contract holds. ``options``: backend, padding_policy, ... as in plan()."""
    return _json.loads(_core.check_json(model, max_gpus=max_gpus, with_pp=with_pp,
                                        **_options(**options)))
