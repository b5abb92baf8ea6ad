#include "config/presets.h"

#include <map>

namespace moeshard {

std::string PresetDescription(const std::string& name) {
  static const std::map<std::string, std::string> kDescriptions = {
      {"kimi-k3", "Kimi-K3: 2.8T MoE, 896 experts top-16, latent MoE 3584, MLA+KDA, MXFP4 experts"},
      {"kimi-k2", "Kimi-K2 (Thinking/K2.5 weights): 1T MoE, 384 experts top-8, int4 experts"},
      {"deepseek-v3", "DeepSeek-V3/R1: 671B MoE, 256 experts top-8, fp8 128x128 blocks"},
      {"qwen3-30b-a3b", "Qwen3-30B-A3B: 128 experts top-8, bf16"},
      {"qwen3-235b-a22b", "Qwen3-235B-A22B: 128 experts top-8, bf16"},
      {"mixtral-8x7b", "Mixtral-8x7B: 8 experts top-2, bf16"},
      {"gpt-oss-120b", "gpt-oss-120b: 128 experts top-4, MXFP4 experts with biases"},
      {"gpt-oss-20b", "gpt-oss-20b: 32 experts top-4, MXFP4 experts with biases"},
      {"qwen3-next-80b-a3b", "Qwen3-Next-80B-A3B: 512 experts top-10, Gated DeltaNet, bf16"},
      {"qwen3.5-35b-a3b", "Qwen3.5-35B-A3B: 256 experts top-8, Gated DeltaNet, bf16, ViT"},
      {"llama-4-scout-17b-16e", "Llama-4-Scout: 109B MoE, 16 experts top-1 + shared, bf16, ViT"},
      {"llama-4-maverick-17b-128e",
       "Llama-4-Maverick: 400B MoE, 128 experts top-1 + shared every 2nd layer, bf16, ViT"},
      // Quantized releases' config.json (models/README.md).
      {"kimi-k2.5", "Kimi-K2.5: 1T MoE, 384 experts top-8, compressed-tensors int4 g32, ViT"},
      {"qwen3-235b-a22b-nvfp4", "nvidia/Qwen3-235B-A22B-NVFP4: ModelOpt NVFP4 (hf_quant_config)"},
      {"minimax-m2.5-nvfp4", "nvidia/MiniMax-M2.5-NVFP4: 256 experts top-8, ModelOpt NVFP4"},
      {"qwen1.5-moe-a2.7b-chat-gptq-int4",
       "Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int4: 60 experts top-4 + shared, GPTQ int4 g128"},
      {"mixtral-8x7b-instruct-v0.1-awq",
       "Mixtral-8x7B-Instruct-v0.1-AWQ (TheBloke): 8 experts top-2, AWQ int4 g128"},
  };
  auto it = kDescriptions.find(name);
  if (it != kDescriptions.end()) return it->second;
  if (name.rfind("tiny-", 0) == 0) return "scaled-down model for tests and demos";
  return "";
}

}  // namespace moeshard
