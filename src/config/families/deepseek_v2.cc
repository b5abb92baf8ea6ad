// DeepSeek-V2, V2-Lite, V2.5 (`deepseek_v2`): the DeepSeek-V3 text layout (MLA on every layer,
// dense first layers, shared experts, per-expert `mlp.experts.E.{gate,up,down}_proj`) with
// softmax routing: `greedy` top-k (V2-Lite) or `group_limited_greedy` (V2, V2.5: groups scored
// by their best expert, modeling_deepseek.py MoEGate; vLLM grouped_topk without a correction
// bias), not renormalised by default (DeepseekV2Config norm_topk_prob false), weights times
// routed_scaling_factor. V2-Lite has no q LoRA (`q_lora_rank` null: one full-rank q_proj).
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  return family::ParseDeepseekText(f, c, family::kDeepseekV2Defaults);
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  family::AddDeepseekTextTensors(t);
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) { return family::DeepseekExperts(c, ""); }

}  // namespace

const FamilyDescriptor& MoeshardFamily_deepseek_v2() {
  static const FamilyDescriptor d{
      .name = "deepseek_v2",
      .model_types = {"deepseek_v2"},
      .summary = "DeepSeek-V2/V2-Lite/V2.5: MLA, shared experts, softmax (group-limited) top-k",
      .text_prefix = "",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
