// DeepSeek-V3 / R1 and Kimi-K2 / K2-Thinking (`deepseek_v3`, `kimi_k2`): MLA on every layer,
// dense first layers, one shared expert, sigmoid noaux_tc routing. Tensors without a prefix;
// experts `model.layers.L.mlp.experts.E.{gate,up,down}_proj`. DeepSeek-V3's multi-token
// prediction layer is stored as layer num_hidden_layers and is not planned.
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  return family::ParseDeepseekText(f, c);
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  family::AddDeepseekTextTensors(t);
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) { return family::DeepseekExperts(c, ""); }

}  // namespace

const FamilyDescriptor& MoeshardFamily_deepseek_v3() {
  static const FamilyDescriptor d{
      .name = "deepseek_v3",
      .model_types = {"deepseek_v3", "kimi_k2"},
      .summary = "DeepSeek-V3/R1, Kimi-K2/K2-Thinking: MLA, shared expert, noaux_tc routing",
      .text_prefix = "",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
