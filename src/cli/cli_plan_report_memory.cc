// The plan report's memory-terms section: which engine's KV rule the plan follows, and every
// non-weight term of the worst rank with its bytes, whether the engine subtracts it before
// sizing the KV cache, and where its number comes from (data/engines/memory_terms.json).
#include <fmt/format.h>

#include "cli/plan_report.h"
#include "moeshard/base/units.h"

namespace moeshard::cli {

namespace {

const char* RuleText(EngineRule rule) {
  switch (rule) {
    case EngineRule::kVllm:
      return "KV = utilization x total - weights - profile activation peak - non-torch "
             "memory, in whole blocks, the smallest count over ranks";
    case EngineRule::kSglang:
      return "KV = mem_fraction_static x (total - CUDA context - NCCL) - weights (free after "
             "loading minus (1 - fraction) of free before loading; no activation profile)";
    case EngineRule::kTrtllm:
      return "KV = free_gpu_memory_fraction x (memory free after the profiling forward)";
  }
  return "";
}

}  // namespace

std::string RenderMemoryTerms(const MemoryPlan& mem, bool md) {
  if (mem.ranks.empty()) return "";
  const RankMemory& w = mem.ranks[mem.worst_rank];
  std::string out = fmt::format(
      "{}engine {} ({} of {} GiB, {} tokens per block, profile forward {} tokens, "
      "max_num_seqs {}{}): {}\n",
      md ? "\n" : "\n", mem.engine.Label(), FormatFraction(mem.options.gpu_memory_utilization),
      FormatGiB(mem.options.gpu.bytes), mem.engine.block_size, mem.options.max_num_batched_tokens,
      mem.options.engine_max_num_seqs,
      mem.options.all2all_backend.empty() ? "" : ", all2all " + mem.options.all2all_backend,
      RuleText(mem.engine.rule));
  out += fmt::format("engine KV tokens per rank: {}", FormatCount(mem.engine_kv_tokens));
  if (w.engine_kv_tokens != w.kv_tokens) {
    // vLLM's log divides a hybrid model's blocks by its layer groups (memory.cc).
    out += fmt::format(
        " (as {} logs it: blocks over its layer groups; rank {} holds {} tokens of context)",
        mem.engine.Label(), w.rank, FormatCount(w.kv_tokens));
  }
  out += "\n";
  Table t({"term (rank " + std::to_string(w.rank) + ")", "GiB", "in KV budget", "source"},
          {true, false, true, true});
  for (const MemoryTerm& term : w.terms) {
    t.Row({term.name, FormatGiB(term.bytes), term.in_kv_budget ? "yes" : "no (outside fraction)",
           term.source});
  }
  out += md ? "\n" + t.Markdown() : t.Text();
  return out;
}

}  // namespace moeshard::cli
