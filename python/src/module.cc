// moeshard._core: the planner behind `moeshard plan`, `sweep` and `check`, callable from Python.
//
// Each entry point fills the CLI's flag structs from keyword arguments, calls the same library
// functions as the CLI (src/cli/plan_api.h) and returns the CLI's JSON document as a string (the
// package, python/moeshard/__init__.py, turns it into objects). A moeshard Status error becomes
// moeshard.Error (a ValueError) with the message the CLI prints after "error: "; every other C++
// exception is turned into a Python exception by pybind11, so none reaches std::terminate.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "cli/plan_api.h"
#include "errors.h"
#include "plan/ownership.h"

namespace py = pybind11;

namespace moeshard::python {

// python/src/runtime.cc: moeshard._core.Runtime.
void BindRuntime(py::module_& m);

namespace {

template <typename T>
constexpr const char* TypeName() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_same_v<T, std::string>) return "str";
  if constexpr (std::is_floating_point_v<T>) return "float";
  return "int";
}

// kw[key] into `out` when given and not None; a value of another type is a TypeError naming it
// (not pybind11's "Unable to cast").
template <typename T>
void Get(const py::dict& kw, const char* key, T& out) {
  if (!kw.contains(key) || kw[key].is_none()) return;
  const py::object value = kw[key];
  // No silent bool -> int or float -> int: tp=True or tp=2.5 is a mistake.
  const bool is_bool = py::isinstance<py::bool_>(value);
  const bool ok = std::is_same_v<T, bool> ? is_bool
                  : std::is_same_v<T, std::string>
                      ? py::isinstance<py::str>(value)
                      : (PyIndex_Check(value.ptr()) && !is_bool) ||
                            (std::is_floating_point_v<T> && py::isinstance<py::float_>(value));
  if (!ok) {
    throw py::type_error(std::string("'") + key + "': expected " + TypeName<T>() + ", got " +
                         py::str(value.get_type().attr("__name__")).cast<std::string>() + " " +
                         py::repr(value).cast<std::string>());
  }
  out = value.cast<T>();
}

// num_redundant_experts: an int or "auto".
int64_t RedundantExperts(const py::object& value) {
  if (py::isinstance<py::str>(value)) {
    const std::string s = value.cast<std::string>();
    if (s == "auto") return kRedundantExpertsAuto;
    throw Error("'--num-redundant-experts " + s + "': expected a non-negative integer or auto");
  }
  int64_t n = 0;
  Get(py::dict(py::arg("num_redundant_experts") = value), "num_redundant_experts", n);
  return n;
}

// max_model_len: None (the model's maximum), an int, or a string the CLI accepts ("128k", "auto").
std::string MaxModelLen(const py::object& value) {
  if (value.is_none()) return "";
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  int64_t n = 0;
  Get(py::dict(py::arg("max_model_len") = value), "max_model_len", n);
  return std::to_string(n);
}

cli::PlanFlags PlanFlagsOf(const std::string& model, const py::kwargs& kw) {
  cli::PlanFlags f;
  f.model = model;
  auto get = [&](const char* key, auto& out) { Get(kw, key, out); };
  get("tp", f.tp);
  get("dp", f.dp);
  get("pp", f.pp);
  get("pcp", f.pcp);
  get("ep", f.ep);
  get("moe_tp", f.moe_tp);
  get("moe_ep", f.moe_ep);
  get("backend", f.backend);
  get("padding_policy", f.padding);
  get("expert_placement", f.placement);
  if (kw.contains("num_redundant_experts")) {
    f.num_redundant_experts = RedundantExperts(kw["num_redundant_experts"]);
  }
  get("shared_experts", f.shared_experts);
  get("latent_proj", f.latent_proj);
  get("expert_load", f.expert_load);
  ThrowIfError(cli::ValidatePlanFlags(f));
  return f;
}

cli::MemoryFlags MemoryFlagsOf(const py::kwargs& kw) {
  cli::MemoryFlags f;
  auto get = [&](const char* key, auto& out) { Get(kw, key, out); };
  get("gpu", f.gpu);
  get("gpu_memory", f.gpu_memory_gib);
  get("gpu_memory_utilization", f.utilization);
  get("kv_cache_dtype", f.kv_cache_dtype);
  if (kw.contains("max_model_len")) f.max_model_len = MaxModelLen(kw["max_model_len"]);
  get("max_num_seqs", f.max_num_seqs);
  get("concurrent_seqs", f.concurrent_seqs);
  get("max_num_batched_tokens", f.max_num_batched_tokens);
  get("overhead_gib", f.overhead_gib);
  get("engine", f.engine);
  get("all2all_backend", f.all2all_backend);
  get("cuda_graph_gib", f.cuda_graph_gib);
  get("interconnect", f.interconnect);
  ThrowIfError(cli::ValidateMemoryFlags(f));
  return f;
}

// Keyword arguments each entry point accepts; anything else is a TypeError naming it.
void RejectUnknown(const py::kwargs& kw, std::initializer_list<const char*> groups_allowed,
                   const char* function) {
  for (const auto& item : kw) {
    const std::string key = item.first.cast<std::string>();
    bool known = false;
    for (const char* allowed : groups_allowed) known = known || key == allowed;
    if (!known) {
      throw py::type_error(std::string(function) + "() got an unexpected keyword argument '" + key +
                           "'");
    }
  }
}

#define MOESHARD_PLAN_KEYS                                                        \
  "tp", "dp", "pp", "pcp", "ep", "moe_tp", "moe_ep", "backend", "padding_policy", \
      "expert_placement", "num_redundant_experts", "shared_experts", "latent_proj", "expert_load"
#define MOESHARD_MEMORY_KEYS                                                                 \
  "gpu", "gpu_memory", "gpu_memory_utilization", "kv_cache_dtype", "max_model_len",          \
      "max_num_seqs", "concurrent_seqs", "max_num_batched_tokens", "overhead_gib", "engine", \
      "all2all_backend", "cuda_graph_gib", "interconnect"

std::string PlanJson(const std::string& model, bool tensors, const py::kwargs& kw) {
  RejectUnknown(kw, {MOESHARD_PLAN_KEYS, MOESHARD_MEMORY_KEYS}, "plan");
  const cli::PlanFlags plan = PlanFlagsOf(model, kw);
  const cli::MemoryFlags memory = MemoryFlagsOf(kw);
  py::gil_scoped_release release;
  const cli::PlanOutcome outcome = ValueOrThrow(cli::ComputePlan(plan, memory));
  return cli::PlanOutcomeToJson(outcome, tensors).dump();
}

std::string SweepJson(const std::string& model, const std::string& gpus, const py::kwargs& kw) {
  RejectUnknown(
      kw, {MOESHARD_PLAN_KEYS, MOESHARD_MEMORY_KEYS, "with_pp", "fits_only", "strategy", "sort"},
      "sweep");
  const cli::PlanFlags plan = PlanFlagsOf(model, kw);
  const cli::MemoryFlags memory = MemoryFlagsOf(kw);
  cli::SweepOptions options;
  options.gpus = gpus;
  Get(kw, "with_pp", options.pp);
  Get(kw, "fits_only", options.fits_only);
  Get(kw, "strategy", options.strategy);
  Get(kw, "sort", options.sort);
  py::gil_scoped_release release;
  const cli::SweepSetup setup = ValueOrThrow(cli::PrepareSweep(plan, memory, options));
  return cli::SweepRowsToJson(cli::ComputeSweepRows(setup, options)).dump();
}

std::string CheckJson(const std::string& model, int64_t max_gpus, bool with_pp,
                      const py::kwargs& kw) {
  RejectUnknown(kw, {MOESHARD_PLAN_KEYS}, "check");
  const cli::PlanFlags plan = PlanFlagsOf(model, kw);
  py::gil_scoped_release release;
  const cli::CheckOutcome outcome = ValueOrThrow(cli::ComputeCheck(plan, max_gpus, with_pp));
  return cli::ViolationsToJson(outcome.violations).dump();
}

// The grid `moeshard check` walks, one {strategy, gpus, topology, tp, dp, pp, pcp, moe_tp,
// moe_ep, ep} per valid topology (moeshard.testing.topologies).
std::string GridJson(const std::string& model, int64_t max_gpus, bool with_pp,
                     const py::kwargs& kw) {
  RejectUnknown(kw, {MOESHARD_PLAN_KEYS}, "topologies");
  const cli::PlanFlags plan = PlanFlagsOf(model, kw);
  py::gil_scoped_release release;
  const cli::CheckOutcome outcome = ValueOrThrow(cli::ComputeCheck(plan, max_gpus, with_pp));
  nlohmann::json j = nlohmann::json::array();
  for (const GridPoint& p : outcome.grid) {
    const ResolvedTopology& t = p.plan.topology;
    j.push_back({{"strategy", p.strategy},
                 {"gpus", p.gpus},
                 {"topology", t.Label()},
                 {"tp", t.tp},
                 {"dp", t.dp},
                 {"pp", t.pp},
                 {"pcp", t.pcp},
                 {"moe_tp", t.moe_tp},
                 {"moe_ep", t.moe_ep}});
  }
  return j.dump();
}

// `moeshard plan --ownership FILE`'s document (the plan of the same flags, memory flags included).
std::string OwnershipJson(const std::string& model, const py::kwargs& kw) {
  RejectUnknown(kw, {MOESHARD_PLAN_KEYS, MOESHARD_MEMORY_KEYS}, "ownership");
  const cli::PlanFlags plan = PlanFlagsOf(model, kw);
  const cli::MemoryFlags memory = MemoryFlagsOf(kw);
  py::gil_scoped_release release;
  const cli::PlanOutcome outcome = ValueOrThrow(cli::ComputePlan(plan, memory));
  return OwnershipMapJson(outcome.plan);
}

// `moeshard check --against DUMP --format json`: the dump as the text of one dump file (`dump`,
// named `source` in errors) or a file or folder path (`path`).
std::string CheckAgainstJson(const std::string& model, const std::string& dump_text,
                             const std::string& path, const py::kwargs& kw) {
  RejectUnknown(kw, {MOESHARD_PLAN_KEYS}, "check_against");
  const cli::PlanFlags plan = PlanFlagsOf(model, kw);
  py::gil_scoped_release release;
  cli::AgainstOutcome outcome = ValueOrThrow(cli::PrepareCheckAgainst(plan));
  EngineDump dump;
  if (!path.empty()) {
    ThrowIfError(cli::ReadEngineDump(path, dump));
  } else {
    ThrowIfError(ParseEngineDump(dump_text, "named_params_by_rank", dump));
  }
  cli::CompareDump(dump, outcome);
  return cli::AgainstOutcomeToJson(outcome).dump();
}

}  // namespace

cli::PlanFlags PlanFlagsFromKwargs(const std::string& model, const py::kwargs& kw,
                                   const char* function) {
  RejectUnknown(kw, {MOESHARD_PLAN_KEYS}, function);
  return PlanFlagsOf(model, kw);
}

}  // namespace moeshard::python

PYBIND11_MODULE(_core, m) {
  using namespace moeshard::python;
  m.doc() = "moeshard's planner (the C++ behind `moeshard plan`, `sweep` and `check`)";
  py::register_exception<Error>(m, "Error", PyExc_ValueError);
  m.def("plan_json", &PlanJson, py::arg("model"), py::arg("tensors") = false,
        "`moeshard plan --format json` for the keyword arguments, as a JSON string");
  m.def("sweep_json", &SweepJson, py::arg("model"), py::arg("gpus") = "8,16,32,64",
        "`moeshard sweep --format json` for the keyword arguments, as a JSON string");
  m.def("check_json", &CheckJson, py::arg("model"), py::arg("max_gpus") = 64,
        py::arg("with_pp") = false,
        "the violations `moeshard check` lists, as a JSON array of {invariant, topology, detail}");
  m.def("ownership_json", &OwnershipJson, py::arg("model"),
        "`moeshard plan --ownership FILE`'s document for the keyword arguments, as a JSON string");
  m.def("check_against_json", &CheckAgainstJson, py::arg("model"), py::arg("dump") = "",
        py::arg("path") = "",
        "`moeshard check --against DUMP --format json` for a dump's text or path, as a JSON "
        "string");
  m.def("grid_json", &GridJson, py::arg("model"), py::arg("max_gpus") = 64,
        py::arg("with_pp") = false,
        "the topologies `moeshard check` walks, as a JSON array (moeshard.testing.topologies)");
  BindRuntime(m);
}
