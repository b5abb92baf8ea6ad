#include "plan/plan_json.h"

namespace moeshard {

using nlohmann::json;

json DimLayoutToJson(const DimLayout& d) {
  json j{{"logical", d.logical},  {"divisor", d.divisor}, {"raw_local", d.raw_local},
         {"floor", d.floor},      {"align", d.align},     {"padded_local", d.padded_local},
         {"padding", d.padding()}};
  if (d.uneven) {
    // Uneven block shards: each part's checkpoint slice [begin, end); the rest is zero padding.
    json slices = json::array();
    for (int64_t r = 0; r < d.divisor; ++r) slices.push_back({d.SliceBegin(r), d.SliceEnd(r)});
    j["uneven"] = true;
    j["slices"] = std::move(slices);
  }
  return j;
}

json TensorShardToJson(const TensorShard& t) {
  json j{{"name", t.name},
         {"category", TensorCategoryName(t.category)},
         {"role", TensorRoleName(t.role)},
         {"dtype", std::string(DTypeName(t.dtype))},
         {"logical_shape", t.logical_shape},
         {"local_shape", t.local_shape},
         {"padded_shape", t.padded_shape},
         {"count", t.count()},
         {"bytes", t.bytes},
         {"padding_bytes", t.padding_bytes}};
  if (t.shard_dim >= 0) {
    j["shard"] = {{"dim", t.shard_dim}, {"begin", t.shard_begin}, {"end", t.shard_end}};
    if (t.sections > 1) j["shard"]["sections"] = t.sections;
    if (!t.section_sizes.empty()) j["shard"]["section_sizes"] = t.section_sizes;
    if (t.split_extent > 0) j["shard"]["split_extent"] = t.split_extent;
  }
  if (!t.layers.empty()) j["layers"] = t.layers.vec();
  return j;
}

json ShardPlanToJson(const ShardPlan& plan, bool include_tensors) {
  const ModelConfig& m = plan.model;
  const ResolvedTopology& t = plan.topology;
  json j;
  j["model"] = {{"name", m.name},
                {"family", std::string(m.family_name())},
                {"num_layers", m.num_layers},
                {"num_moe_layers", m.num_moe_layers()},
                {"hidden_size", m.hidden_size},
                {"num_experts", m.num_experts},
                {"num_experts_per_tok", m.num_experts_per_tok},
                {"moe_intermediate_size", m.moe_intermediate_size},
                {"routed_expert_hidden_size", m.routed_expert_hidden_size},
                {"quantization", std::string(WeightFormatName(m.quant.scheme.format))}};
  j["topology"] = {{"tp", t.tp},         {"dp", t.dp},
                   {"pp", t.pp},         {"pcp", t.pcp},
                   {"group", t.group},   {"moe_tp", t.moe_tp},
                   {"moe_ep", t.moe_ep}, {"world", t.world},
                   {"label", t.Label()}, {"expert_parallel", t.expert_parallel()}};
  j["backend"] = {
      {"name", plan.backend.name},
      {"intermediate_align", plan.backend.IntermediateAlignFor(plan.intermediate.raw_local)},
      {"hidden_align", plan.backend.hidden_align},
      {"source", plan.backend.source}};
  j["padding_policy"] = PaddingPolicyName(plan.options.padding);
  j["routed_experts"] = {{"format", std::string(WeightFormatName(plan.expert_scheme.format))},
                         {"group", plan.expert_scheme.group},
                         {"block_rows", plan.expert_scheme.block_rows},
                         {"placement", ExpertPlacementName(plan.options.placement)},
                         {"num_experts", m.num_experts},
                         {"num_slots", plan.num_slots},
                         {"intermediate", DimLayoutToJson(plan.intermediate)},
                         {"hidden", DimLayoutToJson(plan.hidden)}};
  if (!plan.load_imbalance_placed.empty()) {
    j["routed_experts"]["load_imbalance"] = {{"linear", plan.load_imbalance_linear},
                                             {"placed", plan.load_imbalance_placed}};
  }
  json ranks = json::array();
  for (const RankPlan& r : plan.ranks) {
    const RankCoords& c = r.coords;
    json rj{{"rank", c.rank},
            {"pp_stage", c.pp_stage},
            {"dp_rank", c.dp_rank},
            {"pcp_rank", c.pcp_rank},
            {"tp_rank", c.tp_rank},
            {"moe_tp_rank", c.moe_tp_rank},
            {"moe_ep_rank", c.moe_ep_rank},
            {"num_expert_slots", r.expert_slots.size()},
            {"experts", r.expert_slots}};
    json bytes;
    for (TensorCategory cat : kAllCategories) bytes[TensorCategoryName(cat)] = r.BytesOf(cat);
    bytes["routed_experts_padding"] = r.PaddingBytesOf(TensorCategory::kRoutedExperts);
    bytes["weights_total"] = r.WeightBytes();
    rj["bytes"] = bytes;
    if (include_tensors) {
      json tensors = json::array();
      for (const TensorShard& s : r.tensors) tensors.push_back(TensorShardToJson(s));
      rj["tensors"] = tensors;
    }
    ranks.push_back(rj);
  }
  j["ranks"] = ranks;
  j["notes"] = plan.notes;
  return j;
}

}  // namespace moeshard

namespace moeshard {

void AddMemoryToJson(const MemoryPlan& mp, json& j) {
  const MemoryOptions& o = mp.options;
  j["memory"] = {{"gpu", o.gpu.name},
                 {"gpu_bytes", o.gpu.bytes},
                 {"interconnect", o.gpu.nvlink ? "nvlink" : "pcie"},
                 {"gpu_memory_utilization", o.gpu_memory_utilization},
                 {"kv_cache_dtype_bytes", mp.kv_dtype_bytes},
                 {"max_model_len", mp.max_model_len},
                 {"concurrent_seqs", o.max_num_seqs},
                 {"max_num_batched_tokens", o.max_num_batched_tokens},
                 {"overhead_bytes", o.overhead_bytes},
                 {"engine", mp.engine.Label()},
                 {"engine_block_size", mp.engine.block_size},
                 {"engine_kv_tokens", mp.engine_kv_tokens},
                 {"all2all_backend", o.all2all_backend},
                 {"engine_max_num_seqs", o.engine_max_num_seqs},
                 {"fits", mp.fits},
                 {"worst_rank", mp.worst_rank},
                 {"failure", mp.failure}};
  for (json& rj : j["ranks"]) {
    const RankMemory& rm = mp.ranks[rj["rank"].get<size_t>()];
    json& b = rj["bytes"];
    b["budget"] = rm.budget;
    b["activations"] = rm.activations;
    b["overhead"] = rm.overhead;
    b["outside_budget"] = rm.outside_budget;
    b["preload"] = rm.preload;  // SGLang: context + NCCL in use at its pre-load snapshot
    json terms = json::array();
    for (const MemoryTerm& t : rm.terms) {
      terms.push_back({{"name", t.name},
                       {"bytes", t.bytes},
                       {"in_kv_budget", t.in_kv_budget},
                       {"source", t.source}});
    }
    rj["memory_terms"] = terms;
    b["kv_cache"] = std::max<int64_t>(rm.kv_cache, 0);
    b["kv_required"] = rm.required_kv;
    b["free"] = rm.free;
    b["kv_per_token"] = rm.kv_bytes_per_token;
    b["state_per_seq"] = rm.state_bytes_per_seq;
    rj["kv_tokens"] = rm.kv_tokens;
    rj["engine_kv_tokens"] = rm.engine_kv_tokens;
    rj["fits"] = rm.fits;
  }
}

}  // namespace moeshard
