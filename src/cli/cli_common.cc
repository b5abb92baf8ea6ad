#include "cli/cli_common.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace moeshard::cli {

std::vector<std::string> NormalizeArgs(int argc, char** argv) {
  static const std::pair<const char*, const char*> kAliases[] = {
      {"-tp", "--tensor-parallel-size"},
      {"-dp", "--data-parallel-size"},
      {"-pp", "--pipeline-parallel-size"},
      {"-ep", "--enable-expert-parallel"},
  };
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    for (const auto& [short_name, long_name] : kAliases) {
      const std::string s = short_name;
      if (a == s) {
        a = long_name;
      } else if (a.rfind(s + "=", 0) == 0) {
        a = std::string(long_name) + a.substr(s.size());
      }
    }
    out.push_back(a);
  }
  return out;
}

void AddModelFlag(CLI::App* app, std::string* model, bool required) {
  auto* opt = app->add_option("-m,--model", *model,
                              "preset name (kimi-k3, deepseek-v3, qwen3-235b-a22b, ...), a "
                              "config.json, or a checkpoint directory");
  if (required) opt->required();
}

namespace {

// --num-redundant-experts: a count or auto (stored as kRedundantExpertsAuto). Negative counts
// pass on to the planner, which names the range; words stop here with what is accepted.
std::string RedundantExpertsValue(const std::string& value) {
  if (value == "auto") return std::to_string(kRedundantExpertsAuto);
  const size_t first = value.starts_with('-') ? 1 : 0;
  if (value.size() == first || value.find_first_not_of("0123456789", first) != std::string::npos) {
    throw CLI::ValidationError("'" + value +
                               "' is not a slot count: expected a non-negative integer (extra "
                               "expert slots) or auto (the fewest that make the slots divide by "
                               "the MoE EP size)");
  }
  return value;
}

}  // namespace

void AddPlanFlags(CLI::App* app, PlanFlags* f) {
  AddModelFlag(app, &f->model);
  app->add_option("--tensor-parallel-size,--tp", f->tp, "attention tensor parallel size (-tp)")
      ->check(CLI::PositiveNumber);
  app->add_option("--data-parallel-size,--dp", f->dp, "data parallel size (-dp)")
      ->check(CLI::PositiveNumber);
  app->add_option("--pipeline-parallel-size,--pp", f->pp, "pipeline parallel size (-pp)")
      ->check(CLI::PositiveNumber);
  app->add_option("--pcp", f->pcp, "prefill context parallel size")->check(CLI::PositiveNumber);
  app->add_flag("--enable-expert-parallel", f->ep,
                "expert parallelism (-ep): MoE EP = dp*pcp*tp, MoE TP = 1 (vLLM semantics)");
  app->add_option("--moe-tp", f->moe_tp,
                  "hybrid: MoE tensor parallel size (moe_tp*moe_ep = dp*pcp*tp)");
  app->add_option("--moe-ep", f->moe_ep, "hybrid: MoE expert parallel size");
  app->add_option("--moe-backend", f->backend,
                  "MoE kernel backend: auto, marlin, flashinfer-cutlass, flashinfer-trtllm, "
                  "deepgemm-megamoe, deepgemm-mxfp4, block-fp8, flashinfer-fp8, triton, aiter-ck, "
                  "aiter-mxfp4, cpu, cpu-amx, moeshard-cpu");
  app->add_option("--padding-policy", f->padding,
                  "backend (default), model-floor, or legacy-tp (pre-fix engines, to diagnose)");
  app->add_option("--expert-placement-strategy,--expert-placement", f->placement,
                  "linear, round-robin, or eplb (balanced by a measured load: --expert-load)");
  app->add_option("--expert-load", f->expert_load,
                  "tokens per expert per MoE layer (JSON, docs/eplb.md): "
                  "eplb places by it; every placement reports the per-rank imbalance");
  app->add_option("--num-redundant-experts", f->num_redundant_experts,
                  "EPLB redundant expert slots (slots = experts + redundant), or auto: the "
                  "fewest that make the slots divide by the MoE EP size")
      ->transform(RedundantExpertsValue, "COUNT|auto");
  app->add_option("--shared-experts", f->shared_experts, "sharded (TP) or replicated");
  app->add_option("--latent-proj", f->latent_proj, "latent MoE projections: replicated or sharded");
}

Result<PlanOptions> ToPlanOptions(const PlanFlags& f) {
  PlanOptions o;
  o.topology = Topology{.tp = f.tp,
                        .dp = f.dp,
                        .pp = f.pp,
                        .pcp = f.pcp,
                        .enable_ep = f.ep,
                        .moe_tp = f.moe_tp,
                        .moe_ep = f.moe_ep};
  o.backend = f.backend;
  MOESHARD_ASSIGN_OR_RETURN(o.padding, ParsePaddingPolicy(f.padding));
  MOESHARD_ASSIGN_OR_RETURN(o.placement, ParseExpertPlacement(f.placement));
  o.num_redundant_experts = f.num_redundant_experts;
  if (!f.expert_load.empty()) {
    std::ifstream in(f.expert_load, std::ios::binary);
    if (!in) {
      return InvalidArgumentError(
          fmt::format("plan: '--expert-load {}': cannot open the file (its format: docs/eplb.md; "
                      "`moeshard run --expert-load-out FILE` records one)",
                      f.expert_load));
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    MOESHARD_ASSIGN_OR_RETURN(o.expert_load, ParseExpertLoad(text, f.expert_load));
  }
  if (f.shared_experts == "sharded") {
    o.shared_experts = SharedExpertsMode::kSharded;
  } else if (f.shared_experts == "replicated") {
    o.shared_experts = SharedExpertsMode::kReplicated;
  } else {
    return InvalidArgumentError(fmt::format(
        "plan: '--shared-experts {}': expected sharded or replicated", f.shared_experts));
  }
  if (f.latent_proj == "replicated") {
    o.latent_proj = LatentProjMode::kReplicated;
  } else if (f.latent_proj == "sharded") {
    o.latent_proj = LatentProjMode::kSharded;
  } else {
    return InvalidArgumentError(
        fmt::format("plan: '--latent-proj {}': expected replicated or sharded", f.latent_proj));
  }
  return o;
}

int ReportError(const std::string& command, const Status& status) {
  std::fprintf(stderr, "moeshard %s: error: %s\n", command.c_str(), status.message().c_str());
  return 1;
}

Table::Table(std::vector<std::string> header, std::vector<bool> left)
    : header_(std::move(header)), left_(std::move(left)) {
  left_.resize(header_.size(), false);
}

void Table::Row(std::vector<std::string> cells) {
  cells.resize(header_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::Text(const std::string& indent) const {
  std::vector<size_t> w(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    w[c] = header_[c].size();
    for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s = indent;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c) s += "  ";
      s += left_[c] ? fmt::format("{:<{}}", cells[c], w[c]) : fmt::format("{:>{}}", cells[c], w[c]);
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  std::string out = line(header_);
  std::vector<std::string> rule;
  for (size_t c = 0; c < w.size(); ++c) rule.emplace_back(w[c], '-');
  out += line(rule);
  for (const auto& r : rows_) out += line(r);
  return out;
}

std::string Table::Markdown() const {
  std::string out = "|";
  for (const auto& h : header_) out += " " + h + " |";
  out += "\n|";
  for (size_t c = 0; c < header_.size(); ++c) out += left_[c] ? " --- |" : " ---: |";
  out += "\n";
  for (const auto& r : rows_) {
    out += "|";
    for (const auto& cell : r) out += " " + cell + " |";
    out += "\n";
  }
  return out;
}

std::string FormatRanges(const std::vector<int64_t>& v) {
  std::string out;
  size_t i = 0;
  while (i < v.size()) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? std::to_string(v[i]) : fmt::format("{}-{}", v[i], v[j]);
    i = j + 1;
  }
  return out;
}

std::string FormatShape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      // Name the likely cause: a directory that does not exist, or one we may not write to.
      const std::filesystem::path dir = std::filesystem::path(path).parent_path();
      std::error_code ec;
      if (!dir.empty() && !std::filesystem::is_directory(dir, ec)) {
        return NotFoundError(fmt::format(
            "write: '{}': the directory '{}' does not exist (create it first, or give a path in "
            "an existing directory)",
            path, dir.string()));
      }
      return NotFoundError(
          fmt::format("write: '{}': cannot create the file '{}' (is the directory writable?): {}",
                      path, tmp, std::strerror(errno)));
    }
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return DataLossError(fmt::format("write: '{}': write failed (disk full?)", tmp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return DataLossError(fmt::format("write: '{}': rename failed: {}", path, ec.message()));
  }
  return Status::Ok();
}

}  // namespace moeshard::cli

namespace moeshard::cli {

void AddMemoryFlags(CLI::App* app, MemoryFlags* f) {
  std::string gpus;
  for (const GpuSpec& g : GpuCatalog()) gpus += (gpus.empty() ? "" : ", ") + g.name;
  app->add_option("--gpu", f->gpu, "GPU: " + gpus);
  app->add_option("--gpu-memory", f->gpu_memory_gib, "GPU memory in GiB (instead of --gpu)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            char* end = nullptr;
            const double gib = std::strtod(v.c_str(), &end);
            if (end != v.c_str() && *end == '\0' && gib > 0) return "";
            return "expected a positive size in GiB (e.g. 79.18 for an H100), got '" + v + "'";
          },
          "GIB > 0"));
  app->add_option("--gpu-memory-utilization,--mem-fraction-static,--free-gpu-memory-fraction",
                  f->utilization,
                  "the engine's memory fraction (vLLM: of total memory; SGLang: "
                  "mem_fraction_static of the memory free before loading; TRT-LLM: of the memory "
                  "free after profiling); "
                  "default: the engine's own")
      ->check(CLI::Range(0.01, 1.0));
  app->add_option("--engine", f->engine,
                  "whose KV rule and defaults to follow: vllm (default), sglang, trtllm, with "
                  "@version where defaults changed (vllm@0.25); data/engines/memory_terms.json");
  app->add_option("--all2all-backend", f->all2all_backend,
                  "expert-parallel all-to-all (vLLM's names): naive, allgather_reducescatter, "
                  "pplx, deepep_high_throughput, deepep_low_latency; sizes its buffers");
  app->add_option("--cuda-graph-gib", f->cuda_graph_gib,
                  "CUDA graph pool per GPU in GiB (a row of the memory table; vLLM keeps it "
                  "outside its fraction)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--interconnect", f->interconnect,
                  "how the GPUs of a server are joined: auto (the --gpu entry's: NVLink for the "
                  "H100, H200, B200, GB300 and A100 SXM boards, PCIe for the rest and for "
                  "--gpu-memory), nvlink, pcie; picks vLLM's non-torch memory rows");
  app->add_option("--kv-cache-dtype", f->kv_cache_dtype, "auto, bf16, fp8 (fp8_e4m3, fp8_e5m2)");
  app->add_option("--max-model-len", f->max_model_len,
                  "context length: 131072, 128k (=128000), 128K (=131072), 1M, or auto");
  app->add_option("--max-num-seqs", f->max_num_seqs,
                  "the engine's max_num_seqs (vLLM's flag: the scheduler's bound and the rows of "
                  "its sampler profile; default: the engine's, 1024 on >= 70 GiB GPUs but A100, "
                  "else 256); it does not ask that many sequences to fit (--concurrent-seqs)")
      ->check(CLI::PositiveNumber);
  app->add_option("--concurrent-seqs", f->concurrent_seqs,
                  "sequences of --max-model-len tokens each DP rank must hold at once for the "
                  "plan to fit (default 1, the check vLLM makes at startup)")
      ->check(CLI::PositiveNumber);
  app->add_option("--max-num-batched-tokens", f->max_num_batched_tokens,
                  "tokens of the engine's profile forward (sizes the activation peak); default: "
                  "the engine's for the GPU (vLLM 8192 on >= 70 GiB GPUs but A100, else 2048)")
      ->check(CLI::PositiveNumber);
  app->add_option("--overhead-gib", f->overhead_gib,
                  "extra overhead per GPU in GiB, a row beside the sourced terms (CUDA context, "
                  "NCCL, all-to-all buffers are their own rows)")
      ->check(CLI::NonNegativeNumber);
}

void FollowGpu(const MemoryOptions& memory, PlanOptions* plan) {
  plan->native_fp8 = memory.gpu.NativeFp8();
  plan->gpu_sm = memory.gpu.sm;
}

Result<MemoryOptions> ToMemoryOptions(const MemoryFlags& f) {
  MemoryOptions o;
  if (f.gpu_memory_gib > 0) {
    o.gpu = GpuSpec{"custom", fmt::format("{:g} GiB GPU", f.gpu_memory_gib),
                    static_cast<int64_t>(f.gpu_memory_gib * static_cast<double>(int64_t{1} << 30)),
                    "--gpu-memory"};
  } else {
    MOESHARD_ASSIGN_OR_RETURN(o.gpu, FindGpu(f.gpu));
  }
  if (f.interconnect == "nvlink" || f.interconnect == "pcie") {
    o.gpu.nvlink = f.interconnect == "nvlink";
  } else if (f.interconnect != "auto") {
    return InvalidArgumentError(fmt::format(
        "'--interconnect {}': expected auto, nvlink or pcie (how the GPUs of one server are "
        "joined; auto takes the --gpu entry's)",
        f.interconnect));
  }
  o.gpu_memory_utilization = f.utilization;
  MOESHARD_ASSIGN_OR_RETURN(o.kv_cache_dtype, ParseKvCacheDtype(f.kv_cache_dtype));
  if (!f.max_model_len.empty()) {
    MOESHARD_ASSIGN_OR_RETURN(o.max_model_len, ParseMaxModelLen(f.max_model_len));
  }
  o.max_num_seqs = f.concurrent_seqs;
  // vLLM's flag of the same name bounds the scheduler and sizes the sampler's dummy run.
  o.engine_max_num_seqs = f.max_num_seqs;
  o.max_num_batched_tokens = f.max_num_batched_tokens;
  o.overhead_bytes = static_cast<int64_t>(f.overhead_gib * static_cast<double>(int64_t{1} << 30));
  o.cuda_graph_bytes =
      static_cast<int64_t>(f.cuda_graph_gib * static_cast<double>(int64_t{1} << 30));
  MOESHARD_ASSIGN_OR_RETURN(const EngineProfile engine, FindEngine(f.engine));
  o.engine = f.engine;
  if (!f.all2all_backend.empty()) {
    MOESHARD_RETURN_IF_ERROR(
        All2AllBufferTerm(All2AllParams{.backend = f.all2all_backend}).status());
  }
  o.all2all_backend = f.all2all_backend;
  // A fraction that does not depend on the topology is resolved here (sweep prints it).
  if (o.gpu_memory_utilization <= 0 && !engine.FractionDependsOnTopology()) {
    o.gpu_memory_utilization = engine.memory_fraction;
  }
  return o;
}

}  // namespace moeshard::cli
