#include "moeshard/plan/engine_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "moeshard/base/math.h"
#include "moeshard/base/units.h"

namespace moeshard {
namespace internal {
const char* EngineDataJson();  // generated from data/engines/memory_terms.json
}  // namespace internal

namespace {

using nlohmann::json;

const json& Data() {
  static const json data = json::parse(internal::EngineDataJson());
  return data;
}

// "0.10" -> {0, 10}; a missing part is 0.
std::vector<int64_t> VersionParts(const std::string& v) {
  std::vector<int64_t> parts;
  int64_t cur = 0;
  bool any = false;
  for (char c : v) {
    if (c == '.') {
      parts.push_back(cur);
      cur = 0;
      any = false;
    } else if (c >= '0' && c <= '9') {
      cur = cur * 10 + (c - '0');
      any = true;
    } else {
      return {};
    }
  }
  if (any) parts.push_back(cur);
  return parts;
}

bool VersionLess(const std::string& a, const std::string& b) {
  std::vector<int64_t> x = VersionParts(a), y = VersionParts(b);
  const size_t n = std::max(x.size(), y.size());
  x.resize(n, 0);
  y.resize(n, 0);
  return x < y;
}

ReservedMemRule ReservedMemOf(const json& r) {
  if (r.at("kind").get<std::string>() != "sglang_reserved_mem") {
    throw std::runtime_error("memory_fraction_rule: unknown kind " + r.at("kind").dump());
  }
  ReservedMemRule m;
  for (const json& row : r.at("by_gpu_mib")) {
    m.by_gpu.push_back({row[0].get<int64_t>(), row[1].get<int64_t>(), row[2].get<int64_t>(),
                        row[3].get<int64_t>()});
  }
  m.base_mib = r.at("base_mib").get<double>();
  m.prefill_mib_per_token = r.at("prefill_mib_per_token").get<double>();
  m.min_prefill_tokens = r.at("min_prefill_tokens").get<int64_t>();
  m.graph_mib_per_bs = r.at("graph_mib_per_bs").get<double>();
  m.tp_pp_mib_per_8 = r.at("tp_pp_mib_per_8").get<double>();
  m.dp_attention_mib_per_bs_dp = r.at("dp_attention_mib_per_bs_dp").get<double>();
  m.dp_attention_large_bs = r.at("dp_attention_large_bs").get<int64_t>();
  m.dp_attention_large_mib_per_bs_dp = r.at("dp_attention_large_mib_per_bs_dp").get<double>();
  m.floor_mib = r.at("floor_mib").get<double>();
  m.floor_above_gpu_mib = r.at("floor_above_gpu_mib").get<double>();
  return m;
}

// SGLang 0.5: round((gpu_mem - reserved_mem) / gpu_mem, 3), gpu_mem in MiB (the source line of
// the sglang@0.5 row in memory_terms.json spells out every term).
double ReservedMemFraction(const ReservedMemRule& m, const FractionInputs& in) {
  const double gpu_mib = static_cast<double>(in.gpu_bytes) / static_cast<double>(kMiB);
  ReservedMemRule::Row row = m.by_gpu.front();
  for (const ReservedMemRule::Row& r : m.by_gpu) {
    if (gpu_mib >= static_cast<double>(r.min_gpu_mib)) row = r;
  }
  const auto bs = static_cast<double>(in.tp < 4 ? row.graph_bs_small_tp : row.graph_bs_large_tp);
  const auto dp = static_cast<double>(in.dp);
  double reserved = m.base_mib;
  reserved += static_cast<double>(std::max(row.chunked_prefill, m.min_prefill_tokens)) *
              m.prefill_mib_per_token;
  reserved += bs * m.graph_mib_per_bs;
  reserved += static_cast<double>(in.tp * in.pp) / 8 * m.tp_pp_mib_per_8;
  if (in.dp > 1) {
    reserved += bs * dp * m.dp_attention_mib_per_bs_dp;
    if (bs > static_cast<double>(m.dp_attention_large_bs)) {
      reserved += bs * dp * m.dp_attention_large_mib_per_bs_dp;
    }
  }
  if (gpu_mib > m.floor_above_gpu_mib) reserved = std::max(reserved, m.floor_mib);
  return std::round((gpu_mib - reserved) / gpu_mib * 1000) / 1000;
}

EngineProfile ProfileOf(const json& e) {
  EngineProfile p;
  p.name = e.at("name").get<std::string>();
  p.version = e.at("version").get<std::string>();
  const std::string rule = e.at("rule").get<std::string>();
  p.rule = rule == "sglang"   ? EngineRule::kSglang
           : rule == "trtllm" ? EngineRule::kTrtllm
                              : EngineRule::kVllm;
  p.memory_fraction = e.value("memory_fraction", 0.9);
  if (e.contains("memory_fraction_by_tp")) {
    for (const json& row : e["memory_fraction_by_tp"]) {
      p.memory_fraction_by_tp.emplace_back(row[0].get<int64_t>(), row[1].get<double>());
    }
  }
  if (e.contains("memory_fraction_rule")) p.reserved_mem = ReservedMemOf(e["memory_fraction_rule"]);
  p.block_size = e.at("block_size").get<int64_t>();
  p.max_num_batched_tokens_large = e.at("max_num_batched_tokens_large_gpu").get<int64_t>();
  p.max_num_batched_tokens_small = e.at("max_num_batched_tokens_small_gpu").get<int64_t>();
  p.max_num_seqs_large = e.at("max_num_seqs_large_gpu").get<int64_t>();
  p.max_num_seqs_small = e.at("max_num_seqs_small_gpu").get<int64_t>();
  p.large_gpu_min_gib = e.at("large_gpu_min_gib").get<double>();
  p.default_all2all_backend = e.at("default_all2all_backend").get<std::string>();
  p.rejects_moe_tp_with_moe_ep = e.at("rejects_moe_tp_with_moe_ep").get<bool>();
  p.sampler_bytes_per_logit = e.at("sampler_bytes_per_logit").get<int64_t>();
  const std::string report = e.value("kv_token_report", "capacity");
  if (report != "capacity" && report != "vllm_groups") {
    throw std::runtime_error(
        fmt::format("engine {}@{}: kv_token_report '{}': expected capacity or vllm_groups", p.name,
                    p.version, report));
  }
  p.kv_token_report =
      report == "vllm_groups" ? KvTokenReport::kVllmGroups : KvTokenReport::kCapacity;
  for (const json& s : e.at("sources")) p.sources.push_back(s.get<std::string>());
  return p;
}

// The row of a by-size table ([[size, MiB], ...] ascending) for `size`: the last row whose size
// is <= it.
int64_t RowMiB(const json& rows, int64_t size) {
  int64_t mib = rows.front()[1].get<int64_t>();
  for (const json& r : rows) {
    if (r[0].get<int64_t>() <= size) mib = r[1].get<int64_t>();
  }
  return mib;
}

}  // namespace

double EngineProfile::DefaultFraction(const FractionInputs& in) const {
  if (reserved_mem) return ReservedMemFraction(*reserved_mem, in);
  for (const auto& [min_tp, fraction] : memory_fraction_by_tp) {
    if (in.tp >= min_tp) return fraction;
  }
  return memory_fraction;
}

std::vector<std::string> EngineNames() {
  std::vector<std::string> names;
  for (const json& e : Data().at("engines")) names.push_back(ProfileOf(e).Label());
  return names;
}

Result<EngineProfile> FindEngine(const std::string& spec) {
  const size_t at = spec.find('@');
  const std::string name = spec.substr(0, at);
  const std::string version = at == std::string::npos ? "" : spec.substr(at + 1);
  std::string known;
  for (const std::string& n : EngineNames()) known += (known.empty() ? "" : ", ") + n;
  if (at != std::string::npos && VersionParts(version).empty()) {
    return InvalidArgumentError(fmt::format(
        "plan: '--engine {}': expected a version of digits and dots after '@' (known: {})", spec,
        known));
  }
  std::vector<EngineProfile> rows;
  for (const json& e : Data().at("engines")) {
    EngineProfile p = ProfileOf(e);
    if (p.name == name) rows.push_back(std::move(p));
  }
  if (rows.empty()) {
    return InvalidArgumentError(
        fmt::format("plan: '--engine {}': unknown engine (known: {})", spec, known));
  }
  std::sort(rows.begin(), rows.end(), [](const EngineProfile& a, const EngineProfile& b) {
    return VersionLess(a.version, b.version);
  });
  if (version.empty()) return rows.front();
  const EngineProfile* best = nullptr;
  for (const EngineProfile& p : rows) {
    if (!VersionLess(version, p.version)) best = &p;
  }
  if (best == nullptr) {
    return InvalidArgumentError(
        fmt::format("plan: '--engine {}': older than the first profiled version {} (known: {})",
                    spec, rows.front().Label(), known));
  }
  EngineProfile p = *best;
  p.version = version;  // report the version asked for; the row is the newest not after it
  return p;
}

std::vector<std::string> All2AllBackendNames() {
  std::vector<std::string> names;
  for (const json& a : Data().at("all2all")) names.push_back(a.at("name").get<std::string>());
  return names;
}

Result<MemoryTerm> All2AllBufferTerm(const All2AllParams& p) {
  const json* row = nullptr;
  for (const json& a : Data().at("all2all")) {
    if (a.at("name").get<std::string>() == p.backend) row = &a;
  }
  if (row == nullptr) {
    std::string known;
    for (const std::string& n : All2AllBackendNames()) known += (known.empty() ? "" : ", ") + n;
    return InvalidArgumentError(fmt::format(
        "plan: '--all2all-backend {}': expected one of {} (vLLM's spelling)", p.backend, known));
  }
  MemoryTerm t;
  t.name = "all2all:" + p.backend;
  t.source = row->at("source").get<std::string>();
  const int64_t tokens = p.max_tokens_per_rank, h = p.hidden;
  const int64_t local_experts = CeilDiv(p.num_experts, std::max<int64_t>(1, p.ep_size));
  if (p.backend == "deepep_high_throughput") {
    t.bytes = row->at("nvl_mib").get<int64_t>() * kMiB;
    if (p.internode) t.bytes += row->at("rdma_mib_internode").get<int64_t>() * kMiB;
  } else if (p.backend == "deepep_low_latency") {
    // DeepEP LowLatencyLayout, two symmetric buffers of (send + receive + signalling).
    const int64_t dispatch_msg = 16 + std::max(2 * h, h + h / 128 * 4);
    const int64_t combine_msg = 2 * h;
    const int64_t send = std::max(tokens * dispatch_msg, p.num_experts * tokens * combine_msg);
    const int64_t recv =
        std::max(p.num_experts * tokens * dispatch_msg, p.num_experts * tokens * combine_msg);
    const int64_t signal = RoundUp(p.num_experts * 4, 128);
    t.bytes = RoundUp(2 * (send + recv + signal), 128);
  } else if (p.backend == "pplx") {
    t.bytes = tokens * h * p.act_bytes + local_experts * tokens * p.dp_size * h * p.act_bytes;
  } else {
    t.bytes = 0;  // all-gather backends: an activation the profile run counts
  }
  (void)p.top_k;
  return t;
}

MemoryTerm NcclTerm(int64_t group_size) {
  const json& n = Data().at("nccl");
  return MemoryTerm{"nccl", RowMiB(n.at("rows"), group_size) * kMiB,
                    n.at("source").get<std::string>(), true};
}

MemoryTerm CudaContextTerm() {
  const json& c = Data().at("cuda_context");
  return MemoryTerm{"cuda_context", c.at("mib").get<int64_t>() * kMiB,
                    c.at("source").get<std::string>(), true};
}

MemoryTerm NonTorchProfileTerm(int64_t tp, bool nvlink) {
  const json& n = Data().at("non_torch_profile");
  const char* rows = nvlink ? "nvlink_rows" : "rows";
  const char* source = nvlink ? "nvlink_source" : "source";
  return MemoryTerm{"non_torch_profile", RowMiB(n.at(rows), tp) * kMiB,
                    n.at(source).get<std::string>(), true};
}

}  // namespace moeshard
