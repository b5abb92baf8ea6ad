// moeshard._core.Runtime: `moeshard run` on NumPy arrays. The plan and weight source are
// resolved once (cli::PrepareRun, as the CLI does); the first call starts the rank set on local
// threads (a RankPool: each rank creates its ShardedJob, generating dummy weights or reading
// the checkpoint), and every call runs the MoE layers on the given tokens on those same ranks and
// weights and returns rank 0's gathered outputs. The GIL is released while the ranks run;
// progress reaches Python through a callable, called with the GIL held, at most once per 5%.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/run_api.h"
#include "errors.h"
#include "moeshard/base/numeric.h"
#include "moeshard/comm/launcher.h"
#include "moeshard/runtime/moe_runtime.h"
#include "moeshard/runtime/sharded_job.h"

namespace py = pybind11;

namespace moeshard::python {
namespace {

std::string ShapeText(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + "]";
}

std::string DtypeText(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// Checks `a` is [rows, cols] (cols < 0: [rows]) of one of `kinds` ('f' float, 'i' int, 'u'
// uint) and itemsize, naming the argument and what was expected.
void CheckArray(const py::array& a, const char* name, int64_t rows, int64_t cols,
                const std::string& expected_dtype, bool dtype_ok) {
  const bool shape_ok = cols < 0 ? (a.ndim() == 1 && a.shape(0) == rows)
                                 : (a.ndim() == 2 && a.shape(0) == rows && a.shape(1) == cols);
  if (shape_ok && dtype_ok) return;
  const std::string want = cols < 0
                               ? "[" + std::to_string(rows) + "]"
                               : "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  throw Error(std::string("Runtime.moe: '") + name + "': expected " + expected_dtype + " " + want +
              ", got " + DtypeText(a) + " " + ShapeText(a));
}

bool IsDtype(const py::array& a, char kind, int itemsize) {
  return a.dtype().kind() == kind && a.itemsize() == itemsize;
}

std::vector<int32_t> IntValues(const py::array& a, const char* name, int64_t limit,
                               const char* what) {
  std::vector<int32_t> out(static_cast<size_t>(a.size()));
  auto check = [&](int64_t v, size_t i) {
    if (v < 0 || v >= limit) {
      throw Error(std::string("Runtime.moe: '") + name + "': expected " + what + " in [0, " +
                  std::to_string(limit) + "), got " + std::to_string(v) + " at flat index " +
                  std::to_string(i));
    }
    out[i] = static_cast<int32_t>(v);
  };
  if (a.itemsize() == 8) {
    auto c = py::array_t<int64_t, py::array::c_style>::ensure(a);
    for (size_t i = 0; i < out.size(); ++i) check(c.data()[i], i);
  } else {
    auto c = py::array_t<int32_t, py::array::c_style>::ensure(a);
    for (size_t i = 0; i < out.size(); ++i) check(c.data()[i], i);
  }
  return out;
}

// Progress of the loaders of every rank, reported to a Python callable (done_bytes, total).
class Progress {
 public:
  Progress(py::object callback, int64_t total) : callback_(std::move(callback)), total_(total) {}

  void Add(int64_t n) {
    const int64_t done = done_.fetch_add(n) + n;
    const int64_t step = total_ > 0 ? done * 20 / total_ : 0;
    std::lock_guard<std::mutex> lock(mu_);
    if (step <= last_step_ || failed_) return;
    last_step_ = step;
    Call(done);
  }

  // After the run, with the GIL held: the final report, then any error the callable raised.
  void Finish() {
    if (!failed_ && last_step_ < 20) {
      try {
        callback_(done_.load(), total_);
      } catch (py::error_already_set& e) {
        error_ = std::make_shared<py::error_already_set>(std::move(e));
      }
    }
    if (error_) throw *error_;
  }

 private:
  void Call(int64_t done) {  // mu_ held, GIL not
    py::gil_scoped_acquire gil;
    try {
      callback_(done, total_);
    } catch (py::error_already_set& e) {
      failed_ = true;
      error_ = std::make_shared<py::error_already_set>(std::move(e));
    }
  }

  py::object callback_;
  const int64_t total_;
  std::atomic<int64_t> done_{0};
  std::mutex mu_;
  int64_t last_step_ = -1;
  bool failed_ = false;
  std::shared_ptr<py::error_already_set> error_;
};

// The ranks of a Runtime, kept alive between calls: one local launcher, run on a thread of its
// own, whose rank threads create their ShardedJob once (loading the weights) and then serve one
// run per request. A rank's failure ends the pool (every rank returns; the launcher reports the
// first failure) and the next request starts a new one.
class RankPool {
 public:
  RankPool(const ShardedJobSpec& build, int world) : build_(build), world_(world) {
    thread_ = std::thread([this] { Serve(); });
  }

  ~RankPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Runs `run` on every rank (the first request waits for the loading). Rank 0's result, or the
  // pool's failure; after a failure alive() is false.
  Result<ShardedJobResult> Run(const ShardedJobSpec& run) {
    std::unique_lock<std::mutex> lock(mu_);
    if (ended_) return status_;
    request_ = &run;
    pending_ = world_;
    ++generation_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return pending_ == 0 || ended_; });
    request_ = nullptr;
    if (pending_ != 0) return status_;
    return std::move(result_);
  }

  bool alive() {
    std::lock_guard<std::mutex> lock(mu_);
    return !ended_;
  }

 private:
  void Serve() {
    Result<std::unique_ptr<Launcher>> launcher = CreateLauncher({.comm = "local", .world = world_});
    Status status = launcher.status();
    if (status.ok()) {
      if (build_.kernel_threads <= 0) build_.kernel_threads = (*launcher)->DefaultThreadsPerRank();
      status = (*launcher)->Run([this](Communicator& w) -> Status {
        Status s = ServeRank(w);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(mu_);
          failed_ = true;
          cv_.notify_all();
        }
        return s;
      });
    }
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status.ok() ? Status(InternalError("Runtime: the ranks stopped")) : status;
    ended_ = true;
    cv_.notify_all();
  }

  Status ServeRank(Communicator& w) {
    MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<ShardedJob> job, ShardedJob::Create(build_, w));
    int64_t seen = 0;
    for (;;) {
      const ShardedJobSpec* request = nullptr;  // read under mu_; the caller keeps it alive
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || failed_ || generation_ > seen; });
        if (stop_) return Status::Ok();
        if (failed_) return AbortedError("Runtime: another rank failed");
        seen = generation_;
        request = request_;
      }
      MOESHARD_ASSIGN_OR_RETURN(ShardedJobResult r, job->Run(*request));
      std::lock_guard<std::mutex> lock(mu_);
      if (w.rank() == 0) result_ = std::move(r);
      if (--pending_ == 0) cv_.notify_all();
    }
  }

  ShardedJobSpec build_;  // kernel_threads 0: the launcher's default
  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  const ShardedJobSpec* request_ = nullptr;
  int64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  bool failed_ = false;
  bool ended_ = false;
  Status status_;
  ShardedJobResult result_;
  std::thread thread_;  // last: started when every field above exists
};

class Runtime {
 public:
  Runtime(const cli::PlanFlags& flags, const std::string& load_format,
          const std::string& checkpoint, uint64_t seed, int64_t layers, int threads)
      : num_layers_(layers), threads_(threads) {
    setup_ = ValueOrThrow(cli::PrepareRun(flags, load_format, checkpoint, seed, /*verify=*/true));
    if (layers < -1) {
      throw Error("Runtime: 'layers " + std::to_string(layers) +
                  "': expected a positive number of MoE layers (or None: all)");
    }
  }

  const ShardPlan& plan() const { return setup_.plan; }

  std::vector<int64_t> Layers() const {
    const RankPlan& r0 = setup_.plan.ranks.front();
    std::vector<int64_t> moe = MoeLayersOf(setup_.plan.model, r0.layers);
    if (num_layers_ >= 0 && num_layers_ < static_cast<int64_t>(moe.size())) moe.resize(num_layers_);
    return moe;
  }

  // The weight bytes every rank's loader fills for the layers built (the progress total).
  int64_t LoadBytes() const {
    int64_t total = 0;
    for (const RankPlan& r : setup_.plan.ranks) {
      for (const auto& [category, bytes] :
           PlannedBytesByCategory(r, LayersToBuild(setup_.plan, r, num_layers_))) {
        total += bytes;
      }
    }
    return total;
  }

  py::tuple Moe(const py::object& x, const py::object& topk_ids, const py::object& topk_weights,
                const py::object& token_ids, bool all_layers, bool verify,
                const py::object& progress);

 private:
  // The pool, started on first use (or again after a failure), with `progress` told how the
  // loading goes.
  RankPool& Pool(const py::object& progress);

  cli::RunSetup setup_;
  int64_t num_layers_;
  int threads_;
  std::unique_ptr<Progress> loading_;  // the pool's loading progress, while it is reported
  std::unique_ptr<RankPool> pool_;     // last: its ranks use the fields above
};

struct Inputs {
  std::vector<float> hidden;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<int32_t> tokens;
  bool bf16 = false;
};

Inputs ReadInputs(const ModelConfig& m, const py::array& x, const py::object& topk_ids,
                  const py::object& topk_weights, const py::object& token_ids) {
  Inputs in;
  const int64_t H = m.hidden_size, T = x.ndim() >= 1 ? x.shape(0) : 0;
  const bool f32 = IsDtype(x, 'f', 4);
  in.bf16 = IsDtype(x, 'u', 2);
  CheckArray(x, "x", T, H, "float32 or bfloat16 bits (uint16)", f32 || in.bf16);
  in.hidden.resize(static_cast<size_t>(T * H));
  if (f32) {
    auto c = py::array_t<float, py::array::c_style>::ensure(x);
    std::memcpy(in.hidden.data(), c.data(), in.hidden.size() * sizeof(float));
  } else {
    auto c = py::array_t<uint16_t, py::array::c_style>::ensure(x);
    for (size_t i = 0; i < in.hidden.size(); ++i) in.hidden[i] = Bf16ToFloat(bf16_t{c.data()[i]});
  }
  if (topk_ids.is_none() != topk_weights.is_none()) {
    throw Error("Runtime.moe: 'topk_ids/topk_weights': expected both or neither (routing bypass)");
  }
  const int64_t K = m.num_experts_per_tok;
  if (!topk_ids.is_none()) {
    const py::array ids = py::array::ensure(topk_ids);
    const py::array w = py::array::ensure(topk_weights);
    if (!ids || !w) throw Error("Runtime.moe: 'topk_ids/topk_weights': expected NumPy arrays");
    CheckArray(ids, "topk_ids", T, K, "int32 or int64",
               IsDtype(ids, 'i', 4) || IsDtype(ids, 'i', 8));
    CheckArray(w, "topk_weights", T, K, "float32", IsDtype(w, 'f', 4));
    in.ids = IntValues(ids, "topk_ids", m.num_experts, "an expert id");
    auto c = py::array_t<float, py::array::c_style>::ensure(w);
    in.weights.assign(c.data(), c.data() + c.size());
  }
  if (!token_ids.is_none()) {
    const py::array tok = py::array::ensure(token_ids);
    if (!tok) throw Error("Runtime.moe: 'token_ids': expected a NumPy array");
    CheckArray(tok, "token_ids", T, -1, "int32 or int64",
               IsDtype(tok, 'i', 4) || IsDtype(tok, 'i', 8));
    in.tokens = IntValues(tok, "token_ids", m.vocab_size, "a token id");
  }
  return in;
}

py::dict ErrorDict(const ErrorStats& e, const Tolerance& tol) {
  py::dict d;
  d["count"] = e.count;
  d["max_abs_err"] = e.max_abs_err;
  d["mean_abs_err"] = e.mean_abs_err();
  d["max_abs_ref"] = e.max_abs_ref;
  d["limit"] = e.limit(tol);
  d["nonfinite"] = e.num_nonfinite;
  d["passes"] = e.Passes(tol);
  d["summary"] = e.Summary(tol);
  return d;
}

RankPool& Runtime::Pool(const py::object& progress) {
  if (pool_ != nullptr && pool_->alive()) return *pool_;
  pool_.reset();
  ShardedJobSpec build;
  build.plan = &setup_.plan;
  build.load = setup_.load;
  build.reference_load = setup_.reference_load;
  build.num_layers = num_layers_;
  build.kernel_threads = threads_;
  loading_.reset();
  if (!progress.is_none()) {
    loading_ = std::make_unique<Progress>(progress, LoadBytes());
    build.load.progress = [p = loading_.get()](int64_t n) { p->Add(n); };
  }
  pool_ = std::make_unique<RankPool>(build, static_cast<int>(setup_.plan.topology.world));
  return *pool_;
}

py::tuple Runtime::Moe(const py::object& x_object, const py::object& topk_ids,
                       const py::object& topk_weights, const py::object& token_ids, bool all_layers,
                       bool verify, const py::object& progress) {
  const ModelConfig& m = setup_.plan.model;
  const py::array x = py::array::ensure(x_object);
  if (!x) throw Error("Runtime.moe: 'x': expected a NumPy array [T, hidden_size]");
  Inputs in = ReadInputs(m, x, topk_ids, topk_weights, token_ids);
  const int64_t T = static_cast<int64_t>(in.hidden.size()) / m.hidden_size;
  if (T < 1) throw Error("Runtime.moe: 'x': expected at least one token, got [0, H]");
  ShardedJobSpec spec;
  spec.inputs = &in.hidden;
  if (!in.ids.empty()) {
    spec.topk_ids = &in.ids;
    spec.topk_weights = &in.weights;
  }
  if (!in.tokens.empty()) spec.token_ids = &in.tokens;
  spec.io_dtype = in.bf16 ? DType::kBF16 : DType::kF32;
  spec.warmup = 0;
  spec.iters = 1;
  spec.verify = verify;
  spec.collect_outputs = true;
  spec.record_expert_load = true;
  RankPool& pool = Pool(progress);
  Result<ShardedJobResult> run = InternalError("Runtime: not run");
  {
    py::gil_scoped_release release;
    run = pool.Run(spec);
  }
  if (loading_) {  // the first run after starting the pool waited for the loading
    std::unique_ptr<Progress> done = std::move(loading_);
    done->Finish();
  }
  if (!run.ok()) throw Error(run.status().message());
  const ShardedJobResult& result = *run;
  const int64_t L = static_cast<int64_t>(result.layers.size()), H = m.hidden_size;
  const float* src = result.outputs.data() + (all_layers ? 0 : (L - 1) * T * H);
  std::vector<py::ssize_t> shape = {T, H};
  if (all_layers) shape.insert(shape.begin(), L);
  const size_t n = static_cast<size_t>((all_layers ? L : 1) * T * H);
  py::array out;
  if (in.bf16) {
    py::array_t<uint16_t> a(shape);
    for (size_t i = 0; i < n; ++i) a.mutable_data()[i] = FloatToBf16(src[i]).bits;
    out = a;
  } else {
    py::array_t<float> a(shape);
    std::memcpy(a.mutable_data(), src, n * sizeof(float));
    out = a;
  }
  py::object stats = verify ? py::object(ErrorDict(result.error, spec.tolerance)) : py::none();
  py::dict load;  // `moeshard run --expert-load-out`'s content (docs/eplb.md)
  load["layers"] = result.expert_tokens;
  load["slot_experts"] = result.slot_experts;
  load["slot_tokens"] = result.slot_tokens;
  return py::make_tuple(out, result.layers, stats, load);
}

}  // namespace

void BindRuntime(py::module_& m) {
  py::class_<Runtime>(m, "Runtime")
      .def(py::init([](const std::string& model, const std::string& load_format,
                       const std::string& checkpoint, uint64_t seed, int64_t layers, int threads,
                       const py::kwargs& kw) {
             return std::make_unique<Runtime>(PlanFlagsFromKwargs(model, kw, "Runtime"),
                                              load_format, checkpoint, seed, layers, threads);
           }),
           py::arg("model"), py::arg("load_format"), py::arg("checkpoint"), py::arg("seed"),
           py::arg("layers"), py::arg("threads"))
      .def("layers", &Runtime::Layers)
      .def("load_bytes", &Runtime::LoadBytes)
      .def("world", [](const Runtime& r) { return r.plan().topology.world; })
      .def("label", [](const Runtime& r) { return r.plan().topology.Label(); })
      .def("backend", [](const Runtime& r) { return r.plan().backend.name; })
      .def("hidden_size", [](const Runtime& r) { return r.plan().model.hidden_size; })
      .def("top_k", [](const Runtime& r) { return r.plan().model.num_experts_per_tok; })
      .def("num_experts", [](const Runtime& r) { return r.plan().model.num_experts; })
      .def("moe", &Runtime::Moe, py::arg("x"), py::arg("topk_ids"), py::arg("topk_weights"),
           py::arg("token_ids"), py::arg("all_layers"), py::arg("verify"), py::arg("progress"));
}

}  // namespace moeshard::python
