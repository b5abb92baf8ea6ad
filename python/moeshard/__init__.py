"""moeshard from Python: the sharding planner behind the ``moeshard`` CLI.

``plan``, ``sweep`` and ``check`` take the CLI's flags as keyword arguments (``--tensor-parallel-size``
is ``tp``, ``--padding-policy`` is ``padding_policy``, ...) and compute exactly what the CLI
computes: ``plan(...).to_dict()`` equals ``json.loads`` of ``moeshard plan --format json``, and
``sweep(...)`` the rows of ``moeshard sweep --format json``. A bad argument raises
``moeshard.Error`` (a ``ValueError``) whose message is the one the CLI prints after ``error:``.
"""
import json as _json
import logging as _logging
import os as _os

from ._core import Error  # noqa: F401  (a ValueError; re-exported)
from . import _core

__all__ = ["Error", "Plan", "Rank", "Findings", "Runtime", "plan", "sweep", "check", "ownership",
           "check_against"]

#: Where progress of long builds goes when no ``progress=`` callable is given (INFO records).
logger = _logging.getLogger("moeshard")


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
        self._plan_options = {}
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
        if name in ("_data", "_plan_options"):
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
         gpu_memory_utilization=None, kv_cache_dtype="auto", max_model_len=None,
         max_num_seqs=None, concurrent_seqs=None, max_num_batched_tokens=None, overhead_gib=0.0,
         engine="vllm", all2all_backend=None, cuda_graph_gib=0.0, interconnect="auto",
         tensors=False):
    """``moeshard plan``: the plan of one topology.

    model: a preset name (``"kimi-k3"``), a config.json, or a checkpoint directory.
    tp, dp, pp, pcp, ep: ``-tp``, ``-dp``, ``-pp``, ``--pcp``, ``-ep`` (vLLM semantics).
    moe_tp, moe_ep: the hybrid MoE split (``--moe-tp``, ``--moe-ep``).
    backend, padding_policy, expert_placement, num_redundant_experts (an int or ``"auto"``),
    shared_experts, latent_proj: ``--moe-backend`` and the CLI flags of the same names.
    gpu, gpu_memory (GiB, instead of gpu), gpu_memory_utilization, kv_cache_dtype,
    max_model_len (an int, ``"128k"``, ``"auto"``; None: the model's maximum), max_num_seqs
    (vLLM's scheduler bound, which sizes the sampler profile; None: the engine's),
    concurrent_seqs (full-length sequences that must fit; None: 1),
    max_num_batched_tokens, overhead_gib: the memory flags (None: the engine's default).
    engine (``"vllm"``, ``"sglang@0.4"``, ...), all2all_backend, cuda_graph_gib, interconnect
    (``"auto"``, ``"nvlink"``, ``"pcie"``): ``--engine``, ``--all2all-backend``,
    ``--cuda-graph-gib``, ``--interconnect`` (docs/engine-memory.md).
    tensors: list every tensor of every rank (``--tensors``).
    Returns a ``Plan``; raises ``moeshard.Error`` where the CLI prints an error.
    """
    text = _core.plan_json(model, tensors=tensors, **_options(
        tp=tp, dp=dp, pp=pp, pcp=pcp, ep=ep, moe_tp=moe_tp, moe_ep=moe_ep, backend=backend,
        padding_policy=padding_policy, expert_placement=expert_placement,
        num_redundant_experts=num_redundant_experts, shared_experts=shared_experts,
        latent_proj=latent_proj, gpu=gpu, gpu_memory=gpu_memory,
        gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype,
        max_model_len=max_model_len, max_num_seqs=max_num_seqs, concurrent_seqs=concurrent_seqs,
        max_num_batched_tokens=max_num_batched_tokens, overhead_gib=overhead_gib,
        engine=engine, all2all_backend=all2all_backend, cuda_graph_gib=cuda_graph_gib,
        interconnect=interconnect))
    p = Plan(_json.loads(text))
    p._plan_options = dict(
        model=model, tp=tp, dp=dp, pp=pp, pcp=pcp, ep=ep, moe_tp=moe_tp, moe_ep=moe_ep, backend=backend,
        padding_policy=padding_policy, expert_placement=expert_placement,
        num_redundant_experts=num_redundant_experts, shared_experts=shared_experts,
        latent_proj=latent_proj)
    return p


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


_PLAN_KEYS = ("tp", "dp", "pp", "pcp", "ep", "moe_tp", "moe_ep", "backend", "padding_policy",
              "expert_placement", "num_redundant_experts", "shared_experts", "latent_proj")


def ownership(model, **options):
    """``moeshard plan --ownership FILE``: what every rank holds, as the map's dict (schema
    ``moeshard-ownership``, docs/ownership.md): per rank its coordinates, expert slots and
    tensors (checkpoint slice, logical, local and padded shapes, dtype, padding). ``options``:
    plan()'s keywords (topology, backend, padding and memory)."""
    return _json.loads(_core.ownership_json(model, **_options(**options)))


class Findings(list):
    """What ``check_against`` found: a list of findings, each a dict {rule, tensor, ranks,
    expected, actual} (empty when the dump matches the plan), with the rest of ``moeshard check
    --against DUMP --format json``'s report as attributes (model, topology, backend,
    padding_policy, rank_records, params_matched, coverage_checked, coverage_undeclared,
    unknown_params, absent_tensors, ok); ``to_dict()`` is that whole document."""

    def __init__(self, data):
        super().__init__(data["findings"])
        self._data = data

    def __getattr__(self, name):
        if name == "_data":
            raise AttributeError(name)
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(f"Findings has no attribute '{name}' (keys: {sorted(self._data)})")

    def to_dict(self):
        return _json.loads(_json.dumps(self._data))

    def lines(self):
        """The lines the CLI prints for the findings: "[rule] tensor, rank R: expected E, got A"."""
        return [f"[{d['rule']}] {d['tensor']}, rank {d['ranks']}: expected {d['expected']}, "
                f"got {d['actual']}" for d in self]


def _param_record(name, value):
    """One dump param from (shape, dtype), a dict, or an object with .shape and .dtype (a torch
    tensor or parameter, a NumPy array)."""
    if isinstance(value, dict):
        record = dict(value)
        record.setdefault("name", name)
    elif hasattr(value, "shape") and hasattr(value, "dtype"):
        record = {"name": name, "shape": list(value.shape), "dtype": str(value.dtype)}
    else:
        try:
            shape, dtype = value
        except (TypeError, ValueError):
            raise Error(f"check_against: parameter '{name}': expected (shape, dtype), a dict "
                        f"with shape and dtype, or a tensor; got {value!r}")
        record = {"name": name, "shape": list(shape), "dtype": str(dtype)}
    record["shape"] = [int(d) for d in record.get("shape", [])]
    if "dtype" in record:
        record["dtype"] = str(record["dtype"])
    return record


def _dump_document(named_params_by_rank):
    """The engine-dump document (docs/ownership.md) of check_against's first argument."""
    if isinstance(named_params_by_rank, dict) and "ranks" in named_params_by_rank:
        return named_params_by_rank  # already a dump
    if isinstance(named_params_by_rank, dict):
        items = sorted(named_params_by_rank.items())
    else:
        items = list(enumerate(named_params_by_rank))
    ranks = []
    for rank, params in items:
        if isinstance(params, dict):
            records = [_param_record(n, v) for n, v in params.items()]
        else:
            records = [_param_record(p["name"], p) if isinstance(p, dict) else
                       _param_record(p[0], p[1]) for p in params]
        ranks.append({"rank": int(rank), "params": records})
    return {"format": "moeshard-engine-dump", "version": 1, "world": len(ranks),
            "engine": "python", "ranks": ranks}


def check_against(named_params_by_rank, model, **options):
    """``moeshard check --against DUMP``: an engine's per-rank parameters compared with the plan
    of the same topology (docs/ownership.md has the rules: world, missing, dtype, shape,
    padding, slice, data, coverage).

    named_params_by_rank: one entry per rank, in rank order (a list) or by rank (a dict
    {rank: ...}); each entry maps parameter names to (shape, dtype), to a dict with shape,
    dtype and optionally slices and padding, or to a tensor (``dict(model.named_parameters())``).
    Also accepted: the dump's JSON object ({"world", "ranks": [...]}) or a path to a dump file
    or folder (what scripts/dump_named_parameters.py writes).
    model: a preset, config.json or checkpoint directory; or a Plan (its model and topology are
    used, and ``options`` must then be empty).
    options: plan()'s topology, backend and padding keywords.
    Returns ``Findings`` (a list; empty when the parameters match the plan).
    """
    if isinstance(model, Plan):
        if options:
            raise TypeError("check_against(): with a Plan, give no other keyword arguments "
                            f"(got {sorted(options)})")
        model, options = model._plan_options["model"], dict(model._plan_options)
        del options["model"]
    if isinstance(named_params_by_rank, (str, _os.PathLike)):
        text = _core.check_against_json(model, path=_os.fspath(named_params_by_rank),
                                        **_options(**options))
    else:
        dump = _json.dumps(_dump_document(named_params_by_rank))
        text = _core.check_against_json(model, dump=dump, **_options(**options))
    return Findings(_json.loads(text))


def _progress_sink(progress):
    """The callable (done_bytes, total_bytes) the C++ side reports loading to: the user's, or
    INFO records on the "moeshard" logger."""
    if progress is not None:
        if not callable(progress):
            raise TypeError(f"progress: expected a callable (done_bytes, total_bytes), got "
                            f"{progress!r}")
        return progress

    def log(done, total):
        percent = 100.0 * done / total if total else 100.0
        logger.info("loading weights: %.0f%% (%.1f of %.1f MiB)", percent, done / 2**20,
                    total / 2**20)
    return log


class Runtime:
    """``moeshard run`` on NumPy arrays: the sharded MoE layers of a plan, on local ranks.

    model: a preset, config.json or checkpoint directory. tp, dp, ep, moe_tp, moe_ep, backend
    (default ``"auto"``: moeshard's CPU kernels), ...: plan()'s topology keywords.
    load_format: ``"auto"`` (dummy weights without a checkpoint, else the checkpoint's format),
    ``"dummy"``, ``"safetensors"`` or ``"presharded"``; checkpoint: its directory. seed: the
    dummy weights' seed. layers: run the first N MoE layers (None: all). threads: kernel threads
    per rank (None: cores / ranks). progress: a callable (done_bytes, total_bytes) told how
    loading goes; without one, progress goes to the "moeshard" logger at INFO.

    The plan is built here; the first ``moe`` call starts the rank set on local threads (dummy
    weights are generated, a checkpoint is read) and keeps it: later calls run on the same ranks
    and weights (buffers grow when a call has more tokens). Calls run with the GIL released.
    """

    def __init__(self, model, load_format="auto", checkpoint=None, seed=0, layers=None,
                 threads=None, progress=None, **options):
        self._core = _core.Runtime(str(model), load_format=load_format,
                                   checkpoint="" if checkpoint is None else _os.fspath(checkpoint),
                                   seed=seed, layers=-1 if layers is None else layers,
                                   threads=0 if threads is None else threads,
                                   **_options(**options))
        self._progress = progress
        self.verification = None
        self.expert_load = None

    @property
    def layers(self):
        """The decoder layer indices of the MoE layers run, in order."""
        return self._core.layers()

    world = property(lambda self: self._core.world(), doc="ranks of the plan")
    topology = property(lambda self: self._core.label(), doc="the topology label, e.g. 'TP2 EP2'")
    backend = property(lambda self: self._core.backend(), doc="the plan's MoE backend")
    hidden_size = property(lambda self: self._core.hidden_size())
    top_k = property(lambda self: self._core.top_k())
    num_experts = property(lambda self: self._core.num_experts())

    def moe(self, x, topk_ids=None, topk_weights=None, token_ids=None, all_layers=False,
            verify=False):
        """Runs the MoE layers on x, [T, hidden_size] float32 (or bf16 bits as uint16): for each
        layer y = x + MoE(RMSNorm_post_attention(x)) (include/moeshard/runtime/moe_runtime.h),
        layer l's y feeding layer l + 1. topk_ids ([T, top_k] int32/int64 global expert ids) and
        topk_weights ([T, top_k] float32, used as given) bypass the router in every layer;
        token_ids ([T]) feed hash-routed layers. Returns the last layer's output (float32 for
        float32 input, bf16 bits for uint16), or with all_layers every layer's, [L, T, H].
        verify: also run the single-rank reference and store its comparison in
        ``self.verification`` (max_abs_err, limit, passes, summary, ...). The call's expert
        load goes to ``self.expert_load``: ``{"layers": [[tokens per logical expert] per MoE
        layer], "slot_experts": [...], "slot_tokens": [[rows per slot] per layer]}``, what
        ``moeshard run --expert-load-out`` writes: ``json.dump`` it to a file for
        ``plan(..., expert_placement="eplb", expert_load=path)`` (docs/eplb.md)."""
        out, layers, stats, load = self._core.moe(x, topk_ids=topk_ids, topk_weights=topk_weights,
                                            token_ids=token_ids, all_layers=all_layers,
                                            verify=verify,
                                            progress=_progress_sink(self._progress))
        self.verification = stats
        self.expert_load = load
        return out

    def __repr__(self):
        return (f"<moeshard.Runtime {self.topology} on {self.world} local ranks, backend "
                f"{self.backend}, MoE layers {self.layers}>")
