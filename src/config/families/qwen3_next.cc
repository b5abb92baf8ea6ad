// Qwen3-Next (`qwen3_next`: Qwen3-Next-80B-A3B Instruct / Thinking): hybrid attention, every
// `full_attention_interval`-th layer gated full attention (q_proj holds q and a per-head output
// gate interleaved, q/k norms over head_dim), the others Gated DeltaNet linear attention
// (`linear_attn.{in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj}`, grouped by
// key head so a contiguous TP split gives each rank whole groups; the depthwise conv1d over
// [q, k, v] is split per block, vLLM mamba_v2_sharded_weight_loader). The MoE block is
// Qwen2-MoE's: softmax top-k (renormalised), a shared expert behind a [1, H] sigmoid gate. Its
// RMSNorms scale by (1 + w) (Qwen3NextRMSNorm). Sources: vLLM models/qwen3_next.py and
// layers/mamba/gdn/qwen_gdn_linear_attn.py, transformers configuration_qwen3_next.py. Every
// tensor of Qwen3-Next-80B-A3B-Instruct is BF16, A_log [32] and the gated norm [128] included
// (a public header dump of the release: 41 shards, 75,944 tensors, 81,324,862,720 parameters;
// tests/checkpoints/README.md). The multi-token-prediction weights the release stores under
// `mtp.` (`mtp.fc`, `mtp.pre_fc_norm_*`, `mtp.norm`, `mtp.layers.0.*`: 1,553 tensors in its last
// shard; vLLM loads them only in qwen3_next_mtp.py) are recognised and not planned.
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  // Qwen3NextConfig defaults norm_topk_prob to true (Qwen2-MoE's and Qwen3-MoE's to false).
  MOESHARD_RETURN_IF_ERROR(family::ParseQwenMoe(f, c, /*norm_topk_prob_default=*/true));
  return family::ParseQwenHybrid(f, c);
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  family::AddQwenHybridTensors(t, {.split_projections = false});
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) {
  return family::PerExpertLayout(c, "", "model.layers.{layer}.mlp", "gate_proj", "up_proj",
                                 "down_proj");
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_qwen3_next() {
  static const FamilyDescriptor d{
      .name = "qwen3_next",
      .model_types = {"qwen3_next"},
      .summary = "Qwen3-Next: Gated DeltaNet + gated attention, softmax top-k, gated shared expert",
      .text_prefix = "",
      .mtp_prefix = "mtp.",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
