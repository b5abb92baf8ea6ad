// Engine profiles, non-weight memory terms and the engines' KV rules, against engine-logged
// startup figures (docs/engine-memory.md lists each log: model, GPU, flags, line, URL).
#include <gtest/gtest.h>

#include <cmath>

#include "moeshard/base/math.h"
#include "moeshard/base/units.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/plan/engine_profile.h"
#include "moeshard/plan/memory.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

// |predicted / logged - 1| <= 5 %.
void ExpectWithin5Percent(int64_t predicted, int64_t logged, const char* what) {
  const double err = static_cast<double>(predicted) / static_cast<double>(logged) - 1;
  EXPECT_LE(std::fabs(err), 0.05) << what << ": moeshard " << predicted << ", logged " << logged
                                  << " (" << err * 100 << " %)";
}

TEST(EngineProfileTest, VersionsAndDefaults) {
  EXPECT_DOUBLE_EQ(FindEngine("vllm")->memory_fraction, 0.9);
  EXPECT_DOUBLE_EQ(FindEngine("vllm@0.11")->memory_fraction, 0.9);   // the 0.10 row
  EXPECT_DOUBLE_EQ(FindEngine("vllm@0.25")->memory_fraction, 0.92);  // v0.25.0 cache.py
  EXPECT_DOUBLE_EQ(FindEngine("vllm@0.30")->memory_fraction, 0.92);
  EXPECT_EQ(FindEngine("vllm@0.25")->default_all2all_backend, "allgather_reducescatter");
  EXPECT_EQ(FindEngine("vllm")->block_size, 16);
  EXPECT_EQ(FindEngine("trtllm")->block_size, 32);
  const EngineProfile sg = *FindEngine("sglang");
  EXPECT_DOUBLE_EQ(sg.DefaultFraction({.tp = 1}), 0.88);
  EXPECT_DOUBLE_EQ(sg.DefaultFraction({.tp = 4}), 0.85);
  EXPECT_DOUBLE_EQ(sg.DefaultFraction({.tp = 8}), 0.81);
  // SGLang 0.5 sizes the fraction by GPU memory (server_args.py _handle_gpu_memory_settings):
  // round((gpu_mem - reserved_mem) / gpu_mem, 3), everything in MiB, by hand:
  const EngineProfile sg5 = *FindEngine("sglang@0.5");
  auto fraction = [&](const char* gpu, int64_t tp, int64_t dp) {
    return sg5.DefaultFraction({.gpu_bytes = FindGpu(gpu)->bytes, .tp = tp, .pp = 1, .dp = dp});
  };
  // H200, 143,165 MiB, TP1: 512 + 8192 x 1.5 + 256 x 2 + 1/8 x 1024 = 13,440 reserved.
  EXPECT_DOUBLE_EQ(fraction("h200", 1, 1), 0.906);
  // H100, 81,080 MiB, TP8: 512 + 12,288 + 512 x 2 + 1024 = 14,848.
  EXPECT_DOUBLE_EQ(fraction("h100", 8, 1), 0.817);
  // A10, 22,589 MiB, TP1: 512 + 2048 x 1.5 + 24 x 2 + 128 = 3,760 (no 10 GiB floor under 60).
  EXPECT_DOUBLE_EQ(fraction("a10", 1, 1), 0.834);
  // H200, --tp 4 --dp 4 --enable-dp-attention: + 512 x 4 x 3 + 512 x 4 x 1.5 = 23,552.
  EXPECT_DOUBLE_EQ(fraction("h200", 4, 4), 0.835);
  // B200, 183,359 MiB, TP8: 512 + 16,384 x 1.5 + 1024 + 1024 = 27,136.
  EXPECT_DOUBLE_EQ(fraction("b200", 8, 1), 0.852);
  EXPECT_TRUE(sg5.FractionDependsOnTopology());
  EXPECT_FALSE(FindEngine("vllm")->FractionDependsOnTopology());
  // The plan resolves it from the topology: moeshard's TP1 x DP4 is SGLang's --tp 4 --dp 4.
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  mo.engine = "sglang@0.5";
  mo.max_model_len = 32768;
  const MemoryPlan dp4 = PlanMemory(PlanOrDie(PresetOrDie("qwen3-30b-a3b"), Opts(1, 4, true)), mo);
  EXPECT_DOUBLE_EQ(dp4.options.gpu_memory_utilization, 0.835);
  EXPECT_FALSE(FindEngine("tgi").ok());
  EXPECT_NE(FindEngine("tgi").status().message().find("known: vllm@0.10"), std::string::npos);
  EXPECT_FALSE(FindEngine("vllm@0.5").ok());  // before the first profiled version
  EXPECT_FALSE(FindEngine("vllm@x").ok());
  for (const std::string& n : EngineNames()) EXPECT_FALSE(FindEngine(n)->sources.empty()) << n;
}

TEST(EngineProfileTest, VllmRefusesMoeTpWithMoeEp) {
  PlanOptions o = Opts(8);
  o.topology.moe_tp = 2;
  o.topology.moe_ep = 4;
  const ShardPlan hybrid = PlanOrDie(PresetOrDie("qwen3-30b-a3b"), o);
  const Status s = CheckEngineTopology(*FindEngine("vllm"), hybrid);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("moe_tp 2 x moe_ep 4"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckEngineTopology(*FindEngine("sglang"), hybrid).ok());
  EXPECT_TRUE(CheckEngineTopology(*FindEngine("trtllm"), hybrid).ok());
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  const MemoryPlan mp = PlanMemory(hybrid, mo);
  EXPECT_FALSE(mp.fits);
  EXPECT_NE(mp.failure.find("never both"), std::string::npos) << mp.failure;
}

TEST(EngineProfileTest, All2AllBuffers) {
  All2AllParams p{
      .backend = "deepep_high_throughput", .ep_size = 8, .num_experts = 256, .hidden = 7168};
  EXPECT_EQ(All2AllBufferTerm(p)->bytes, 1024 * kMiB);  // VLLM_DEEPEP_BUFFER_SIZE_MB
  p.internode = true;
  EXPECT_EQ(All2AllBufferTerm(p)->bytes, 2048 * kMiB);  // + the same for RDMA
  // DeepEP low latency, DeepSeek-V3 at 256 tokens per rank: dispatch message 16 + 2 * 7168,
  // combine message 2 * 7168; the send buffer holds the larger of one rank's dispatch and its
  // combine to 256 experts x 256 tokens, the receive buffer 256 x 256 dispatch messages; 1 KiB of
  // signalling; two buffers.
  p = All2AllParams{.backend = "deepep_low_latency",
                    .ep_size = 16,
                    .num_experts = 256,
                    .hidden = 7168,
                    .max_tokens_per_rank = 256};
  const int64_t msg = 16 + 2 * 7168;
  const int64_t by_hand = RoundUp(2 * (256 * 256 * 2 * 7168 + 256 * 256 * msg + 1024), 128);
  EXPECT_EQ(All2AllBufferTerm(p)->bytes, by_hand);
  EXPECT_NEAR(by_hand / double(kGiB), 3.5, 0.1);
  p.backend = "naive";  // an all-gather: an activation, no buffer
  EXPECT_EQ(All2AllBufferTerm(p)->bytes, 0);
  p.backend = "deepep";
  EXPECT_FALSE(All2AllBufferTerm(p).ok());
  EXPECT_NE(All2AllBufferTerm(p).status().message().find("deepep_low_latency"), std::string::npos);
}

TEST(EngineProfileTest, EveryTermIsSourcedAndVllmLeavesContextOutside) {
  PlanOptions o = Opts(8, 1, true);
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-235b-a22b"), o);
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  mo.all2all_backend = "deepep_low_latency";
  const MemoryPlan mp = PlanMemory(p, mo);
  ASSERT_TRUE(mp.fits) << mp.failure;
  const RankMemory& r = mp.ranks[0];
  std::vector<std::string> names;
  for (const MemoryTerm& t : r.terms) {
    EXPECT_FALSE(t.source.empty()) << t.name;
    names.push_back(t.name);
    if (t.name == "cuda_context" || t.name == "nccl") {
      EXPECT_FALSE(t.in_kv_budget) << t.name;
    }
    if (t.name == "nccl") {
      EXPECT_EQ(t.bytes, 392 * kMiB);  // TP8 row
    }
  }
  for (const char* n :
       {"activations", "cuda_context", "nccl", "non_torch_profile", "all2all:deepep_low_latency"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  // vLLM: requested = 0.9 x total minus weights, activations and the in-budget terms.
  EXPECT_EQ(r.kv_cache, static_cast<int64_t>(static_cast<double>(mo.gpu.bytes) * 0.9) - r.weights -
                            r.activations - r.overhead);
  EXPECT_EQ(r.kv_tokens % 16, 0);  // whole blocks
}

TEST(EngineProfileTest, SglangCountsNoActivationProfile) {
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-30b-a3b"), Opts(4));
  MemoryOptions mo;
  mo.gpu = *FindGpu("h100");
  mo.gpu_memory_utilization = 0.9;
  const MemoryPlan v = PlanMemory(p, mo);
  mo.engine = "sglang";
  const MemoryPlan s = PlanMemory(p, mo);
  const RankMemory& r = s.ranks[0];
  // SGLang's "total" is the free memory after NCCL init (model_runner.py init_torch_distributed,
  // min_per_gpu_memory): the fraction applies to total - context - NCCL.
  int64_t preload = 0;
  for (const MemoryTerm& t : r.terms) {
    if (t.name == "cuda_context" || t.name == "nccl") preload += t.bytes;
  }
  EXPECT_EQ(r.preload, preload);
  EXPECT_GT(preload, 0);
  EXPECT_EQ(r.kv_cache, static_cast<int64_t>(static_cast<double>(mo.gpu.bytes - preload) * 0.9) -
                            r.weights - (r.overhead - preload));
  EXPECT_GT(r.kv_cache,  // the reserve (1 - f) is taken of less than the total
            static_cast<int64_t>(static_cast<double>(mo.gpu.bytes) * 0.9) - r.weights - r.overhead);
  EXPECT_GT(s.engine_kv_tokens, v.engine_kv_tokens);
  mo.gpu_memory_utilization = 0;  // SGLang's default at TP4
  EXPECT_DOUBLE_EQ(PlanMemory(p, mo).options.gpu_memory_utilization, 0.85);
  mo.engine = "trtllm";  // 0.9 of what is free after the profile
  const MemoryPlan t = PlanMemory(p, mo);
  const RankMemory& tr = t.ranks[0];
  EXPECT_EQ(tr.kv_cache,
            static_cast<int64_t>(0.9 * static_cast<double>(mo.gpu.bytes - tr.weights -
                                                           tr.activations - tr.overhead)));
  EXPECT_EQ(tr.kv_tokens % 32, 0);
}

// vLLM, Qwen3-30B-A3B bf16, TP4 on four A10 (24 GB), defaults (utilization 0.9, the small-GPU
// batch defaults 2048 / 256): "GPU KV cache size: 198,784 tokens" (issue 16;
// docs/engine-memory.md).
TEST(EngineLogTest, VllmQwen3_30B_TP4_A10) {
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-30b-a3b"), Opts(4));
  MemoryOptions mo;
  mo.gpu = *FindGpu("a10");
  const MemoryPlan mp = PlanMemory(p, mo);
  EXPECT_EQ(mp.options.max_num_batched_tokens, 2048);
  EXPECT_EQ(mp.options.engine_max_num_seqs, 256);
  ExpectWithin5Percent(mp.engine_kv_tokens, 198'784, "Qwen3-30B-A3B TP4 4xA10");
}

// vLLM 0.9.2 dev (V1), DeepSeek-V2-Lite bf16 (MLA), TP2 x PP2 on four L4 (24 GB), `--max-model-len
// 1024 --enforce-eager`, utilization 0.9 by default: "Available KV cache memory: 12.13 GiB" on
// the first stage, 11.33 GiB on the last, "GPU KV cache size: 807,792 tokens"
// (https://github.com/vllm-project/vllm/pull/20665; docs/engine-memory.md). The first stage holds
// 14 of the 27 layers and decides the count; none of the rows used here was set against it.
// Row 16 (docs/engine-memory.md): vLLM 0.10.1, Qwen3-30B-A3B-Instruct-2507 bf16 at TP4 x PP2 on
// eight GH200 120GB (the log names the device in its fused-MoE config path), offline
// throughput run: max_num_batched_tokens 16384, max_seq_len 262144, utilization 0.9. The GPU's
// total as PyTorch sees it is not in the log; "about 95 GiB visible" on a GH200 120GB (a
// benchmark note) is taken, and 95 +- 0.5 GiB moves the last stage between +4.0 and +5.3 %.
// Whether the four GH200 of a node are joined by NVLink is not stated in the sources used here:
// the log must be met with either row of vLLM's non-torch memory (PCIe 215 MiB, NVLink 973 MiB
// at TP4).
TEST(EngineLogTest, VllmQwen3_30B_TP4PP2_GH200) {
  PlanOptions o = Opts(4);
  o.topology.pp = 2;
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-30b-a3b"), o);
  for (const bool nvlink : {false, true}) {
    SCOPED_TRACE(nvlink ? "NVLink" : "PCIe");
    MemoryOptions mo;
    mo.gpu = GpuSpec{"custom", "GH200 120GB", static_cast<int64_t>(95.0 * kGiB), "", 90, nvlink};
    mo.max_model_len = 262144;
    mo.max_num_batched_tokens = 16384;
    const MemoryPlan mp = PlanMemory(p, mo);
    ASSERT_TRUE(mp.fits) << mp.failure;
    // Both stages as logged: 6,654,432 tokens (first stage) and 6,167,536 (last stage, the
    // sampler's dummy run); the engine runs with the smaller.
    for (const RankMemory& r : mp.ranks) {
      const bool last = p.ranks[r.rank].coords.pp_stage == 1;
      ExpectWithin5Percent(r.kv_tokens, last ? 6'167'536 : 6'654'432,
                           last ? "Qwen3-30B-A3B TP4 PP2 GH200, last stage"
                                : "Qwen3-30B-A3B TP4 PP2 GH200, first stage");
    }
    ExpectWithin5Percent(mp.engine_kv_tokens, 6'167'536, "Qwen3-30B-A3B TP4 PP2 GH200");
  }
}

TEST(EngineLogTest, VllmDeepSeekV2Lite_TP2PP2_L4) {
  PlanOptions o = Opts(2);
  o.topology.pp = 2;
  const ShardPlan p = PlanOrDie(PresetOrDie("deepseek-v2-lite"), o);
  MemoryOptions mo;
  mo.gpu = *FindGpu("l4");
  mo.max_model_len = 1024;
  const MemoryPlan mp = PlanMemory(p, mo);
  ASSERT_TRUE(mp.fits) << mp.failure;
  EXPECT_EQ(mp.options.max_num_batched_tokens, 2048);  // < 70 GiB: the small-GPU defaults
  // The worst rank is on the first stage, as in the log (more layers, no sampler).
  int64_t first_stage_tokens = 0;
  for (const RankMemory& r : mp.ranks) {
    if (p.ranks[r.rank].coords.pp_stage == 0) first_stage_tokens = r.kv_tokens;
  }
  EXPECT_EQ(first_stage_tokens, mp.engine_kv_tokens);
  ExpectWithin5Percent(mp.engine_kv_tokens, 807'792, "DeepSeek-V2-Lite TP2 PP2 4xL4");
  // The last stage's KV memory (11.33 GiB logged) follows once the sampler's dummy run is
  // counted at the PyTorch top-k / top-p path's 24 bytes per logit (at 10 it was +4.5 %).
  for (const RankMemory& r : mp.ranks) {
    if (p.ranks[r.rank].coords.pp_stage != 1) continue;
    const double err = static_cast<double>(r.kv_cache) / (11.33 * kGiB) - 1;
    EXPECT_LE(std::fabs(err), 0.025) << "last stage " << r.kv_cache / kGiB << " GiB";
  }
}

// vLLM on L40S GPUs (compute capability 8.9: native FP8, the block-fp8 kernels) with TP x EP and
// `--max-model-len 32K`: the memory plan of the fp8 config at tests/engine_logs/`config`, after
// checking the backend and the EP size the logs show.
MemoryPlan VllmFp8TpEpOnL40s(const char* config, int64_t tp, double utilization) {
  const Result<ModelConfig> model =
      LoadModelConfig(std::string(MOESHARD_SOURCE_DIR) + "/tests/engine_logs/" + config);
  if (!model.ok()) {
    ADD_FAILURE() << model.status().message();
    return {};  // fits is false
  }
  PlanOptions o = Opts(tp, 1, true);
  o.native_fp8 = FindGpu("l40s")->NativeFp8();
  const ShardPlan p = PlanOrDie(*model, o);
  EXPECT_EQ(p.backend.name, "block-fp8");
  EXPECT_EQ(p.topology.moe_ep, tp);
  MemoryOptions mo;
  mo.gpu = *FindGpu("l40s");
  mo.gpu_memory_utilization = utilization;
  mo.max_model_len = 32768;
  MemoryPlan mp = PlanMemory(p, mo);
  EXPECT_TRUE(mp.fits) << mp.failure;
  return mp;
}

// vLLM 0.10.2, Qwen3-235B-A22B-Instruct-2507-FP8 (128 x 128 fp8 blocks), `--tensor-parallel-size 8
// --enable-expert-parallel --gpu-memory-utilization 0.90 --swap-space 0 --max-model-len 32K` on
// eight L40S (compute capability 8.9: native FP8, the block-fp8 kernels), PyTorch-native
// sampler ("FlashInfer is not available"): "Model loading took 27.7183 GiB", "Actual usage is
// 27.72 GiB for weight, 1.4 GiB for peak activation, 0.21 GiB for non-torch memory",
// num_gpu_blocks 14834 = 237,344 tokens (docs/engine-memory.md row 7). The TP4-8 non-torch row
// is taken from this log; the weights and the activation peak are not.
TEST(EngineLogTest, VllmQwen3_235B_Fp8_TP8EP_L40S) {
  const MemoryPlan mp = VllmFp8TpEpOnL40s("qwen3-235b-a22b-fp8.json", 8, 0.9);
  ASSERT_TRUE(mp.fits);
  EXPECT_EQ(mp.options.max_num_batched_tokens, 2048);  // 44.42 GiB < 70: the small defaults
  const RankMemory& r = mp.ranks[0];
  EXPECT_LE(std::fabs(static_cast<double>(r.weights) / (27.7183 * kGiB) - 1), 0.005);
  // The sampler's dummy run: 256 rows x 151,936 logits x 24 bytes, most of the 1.4 GiB peak.
  EXPECT_GE(r.activations, 256LL * 151936 * 24);
  ExpectWithin5Percent(mp.engine_kv_tokens, 237'344, "Qwen3-235B-FP8 TP8 EP 8xL40S");
}

// vLLM 0.10.2 (`vllm --version`), Qwen/Qwen3-30B-A3B-Instruct-2507-FP8 (the architecture of the
// Qwen3-Coder FP8 config used here), `vllm serve ... --tensor-parallel-size 2
// --enable-expert-parallel --gpu-memory-utilization 0.95 --swap-space 0 --max-model-len 32K` on
// two L40S, named by the nvidia-smi table of the same paste (processes VLLM::Worker_TP0_EP0 and
// Worker_TP1_EP1): "Available KV cache memory: 25.91 GiB", "GPU KV cache size: 566,016 tokens"
// (tim-roethig/ai-platform @8fc2c9be platform/docs/ollama_vs_vllm.md; docs/engine-memory.md row
// 20). Independent: the TP2 non-torch row is vllm issue 13061's, the L40S total row 7's.
TEST(EngineLogTest, VllmQwen3_30B_Fp8_TP2EP2_L40S) {
  const MemoryPlan mp = VllmFp8TpEpOnL40s("qwen3-coder-30b-a3b-instruct-fp8.json", 2, 0.95);
  ASSERT_TRUE(mp.fits);
  ExpectWithin5Percent(mp.engine_kv_tokens, 566'016, "Qwen3-30B-A3B-FP8 TP2 EP2 2xL40S");
  const double kv_err = static_cast<double>(mp.ranks[0].kv_cache) / (25.91 * kGiB) - 1;
  EXPECT_LE(std::fabs(kv_err), 0.05) << "KV memory " << mp.ranks[0].kv_cache / kGiB << " GiB";
}

// SGLang (a 2026 source checkout), a Qwen3MoeForCausalLM with Qwen3-30B-A3B's geometry in bf16,
// DP attention x EP4 on four 141 GB GPUs (`--tp-size 4 --ep-size 4 --dp-size 4
// --enable-dp-attention --moe-a2a-backend deepep --deepep-mode low_latency --mem-fraction-static
// 0.8`): every rank "Load weight end. ... avail mem=121.95 GB, mem usage=16.39 GB" and "KV Cache
// is allocated. #tokens: 1029388" (https://github.com/sgl-project/sglang/pull/17392, turn 0;
// docs/engine-memory.md row 9: SGLang's "GB" are GiB, and the GPU is inferred from the 138.3 GiB
// free before loading). In moeshard's terms: TP1 x DP4 with EP (attention whole on every rank,
// a quarter of the experts each).
TEST(EngineLogTest, SglangQwen3_30B_DP4EP4_DeepEpLowLatency) {
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-30b-a3b"), Opts(1, 4, true));
  EXPECT_EQ(p.topology.moe_ep, 4);
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  mo.engine = "sglang";
  mo.gpu_memory_utilization = 0.8;
  mo.all2all_backend = "deepep_low_latency";
  mo.max_model_len = 40960;
  const MemoryPlan mp = PlanMemory(p, mo);
  ASSERT_TRUE(mp.fits) << mp.failure;
  EXPECT_LE(std::fabs(static_cast<double>(mp.ranks[0].weights) / (16.39 * kGiB) - 1), 0.005);
  ExpectWithin5Percent(mp.engine_kv_tokens, 1'029'388, "Qwen3-30B-A3B DP4 EP4 SGLang H200");
}

// SGLang (a source checkout of 2026-06), Qwen3-30B-A3B-Instruct-2507 in bf16 and its FP8
// release (128 x 128 blocks), TP1 on one H200 (named by the log's own MoE-config line,
// `E=128,N=768,device_name=NVIDIA_H200`), `mem_fraction_static=0.85 context_length=32768
// max_running_requests=32 disable_cuda_graph=True`: "Load weight begin. avail mem=139.11 GB",
// bf16 "Load weight end. ... mem usage=57.02 GB" and "KV Cache is allocated. #tokens: 668504";
// FP8 "mem usage=29.23 GB" and "#tokens: 972034" (gujialiang123/end2end-optimization @015bf4f0,
// results/2026-06-11_harness-v1/sglang-triton-{bf16,fp8}-baseline/server.log;
// docs/engine-memory.md rows 18 and 19). Independent: no table row was set against them.
MemoryPlan SglangH200Tp1(const ModelConfig& model) {
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  mo.engine = "sglang";
  mo.gpu_memory_utilization = 0.85;
  mo.max_model_len = 32768;
  mo.engine_max_num_seqs = 32;  // max_running_requests
  return PlanMemory(PlanOrDie(model, Opts(1)), mo);
}

TEST(EngineLogTest, SglangQwen3_30B_Bf16_TP1_H200) {
  const MemoryPlan mp = SglangH200Tp1(PresetOrDie("qwen3-30b-a3b"));
  ASSERT_TRUE(mp.fits) << mp.failure;
  EXPECT_LE(std::fabs(static_cast<double>(mp.ranks[0].weights) / (57.02 * kGiB) - 1), 0.005);
  ExpectWithin5Percent(mp.engine_kv_tokens, 668'504, "Qwen3-30B-A3B bf16 SGLang H200");
}

TEST(EngineLogTest, SglangQwen3_30B_Fp8_TP1_H200) {
  const Result<ModelConfig> model =
      LoadModelConfig(std::string(MOESHARD_SOURCE_DIR) +
                      "/tests/engine_logs/qwen3-coder-30b-a3b-instruct-fp8.json");
  ASSERT_TRUE(model.ok()) << model.status().message();
  const MemoryPlan mp = SglangH200Tp1(*model);
  ASSERT_TRUE(mp.fits) << mp.failure;
  EXPECT_LE(std::fabs(static_cast<double>(mp.ranks[0].weights) / (29.23 * kGiB) - 1), 0.01);
  ExpectWithin5Percent(mp.engine_kv_tokens, 972'034, "Qwen3-30B-A3B FP8 SGLang H200");
}

// vLLM 0.19.0, gpt-oss-20b (MXFP4 experts), one A100 80 GB, `--max-model-len 131072
// --gpu-memory-utilization 0.65`: "Model loading took 13.72 GiB", "Available KV cache memory:
// 36.56 GiB" (https://myoceane.fr/index.php/ai-vllm-a100-gemma-4/; docs/engine-memory.md). The
// log gives the KV memory, not a token count (gpt-oss mixes sliding-window and full layers, which
// vLLM's hybrid manager counts differently), so this compares bytes. On an A100 vLLM keeps the
// small batch defaults (2048 tokens, 256 sequences) whatever its memory.
TEST(EngineLogTest, VllmGptOss20b_A100_80GB_KvMemory) {
  PlanOptions o = Opts(1);
  o.gpu_sm = FindGpu("a100-80gb")->sm;  // compute capability 8.0: MXFP4 on Marlin
  const ShardPlan p = PlanOrDie(PresetOrDie("gpt-oss-20b"), o);
  EXPECT_EQ(p.backend.name, "marlin");
  MemoryOptions mo;
  mo.gpu = *FindGpu("a100-80gb");
  mo.engine = "vllm@0.19";
  mo.gpu_memory_utilization = 0.65;
  mo.max_model_len = 131072;
  const MemoryPlan mp = PlanMemory(p, mo);
  ASSERT_TRUE(mp.fits) << mp.failure;
  EXPECT_EQ(mp.options.max_num_batched_tokens, 2048);
  EXPECT_EQ(mp.options.engine_max_num_seqs, 256);
  ExpectWithin5Percent(mp.ranks[0].weights, static_cast<int64_t>(13.72 * kGiB), "weights");
  ExpectWithin5Percent(mp.ranks[0].kv_cache, static_cast<int64_t>(36.56 * kGiB),
                       "gpt-oss-20b A100 KV memory");
}

// gpt-oss-120b on one H100, vLLM's weights: Marlin 65.97 GiB, Triton 64.38 GiB ("Model loading
// took", vllm issues 23278 and 33155; docs/engine-memory.md). The Triton MXFP4 path keeps fp32
// copies of the expert biases and the original scales beside the swizzled ones (BackendSpec
// weight_extras, docs/uneven-shards.md): the checkpoint's 60.77 GiB alone is 5.6 % short; with
// the extras term within 0.5 %, as the other logged weight figures. Marlin has no such term.
int64_t TermBytes(const RankMemory& r, const std::string& name) {
  for (const MemoryTerm& t : r.terms) {
    if (t.name == name) return t.bytes;
  }
  return -1;
}

TEST(EngineLogTest, VllmGptOss120bWeightsOnTritonAndMarlin) {
  MemoryOptions mo;
  mo.gpu = *FindGpu("h100");
  const ShardPlan triton = PlanOrDie(PresetOrDie("gpt-oss-120b"), Opts(1, 1, false, "triton"));
  const RankMemory t = PlanMemory(triton, mo).ranks[0];
  const int64_t extras = TermBytes(t, "weight_extras:triton");
  // 36 layers x 128 experts: biases (5760 + 2880) bf16 -> fp32, scales 5760 x 90 + 2880 x 90.
  EXPECT_EQ(extras, 36LL * 128 * ((5760 + 2880) * 2 + (5760 + 2880) * 90));
  const double logged_triton = 64.38 * kGiB;
  EXPECT_GT(std::fabs(t.weights / logged_triton - 1), 0.05);  // without the extras: a miss
  EXPECT_LE(std::fabs((t.weights + extras) / logged_triton - 1), 0.005);
  const RankMemory m =
      PlanMemory(PlanOrDie(PresetOrDie("gpt-oss-120b"), Opts(1, 1, false, "marlin")), mo).ranks[0];
  EXPECT_EQ(TermBytes(m, "weight_extras:marlin"), -1);
  EXPECT_LE(std::fabs(m.weights / (65.97 * kGiB) - 1), 0.005);
}

// vLLM v0.11.0 on one H100 (llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-
// results.md; docs/engine-memory.md row 12): gpt-oss-20b, `--gpu-memory-utilization=0.90
// --max-model-len=16000 --block-size=128`, weights 13.47 GiB, KV cache 50.28 GiB of the 79.18 GiB
// the log reports. Compute capability 9.0: `auto` takes vLLM's Triton MXFP4 path and its extras.
// Bytes, as row 6 (gpt-oss's sliding-window layers).
TEST(EngineLogTest, VllmGptOss20b_H100_KvMemory) {
  PlanOptions o = Opts(1);
  o.gpu_sm = FindGpu("h100")->sm;
  const ShardPlan p = PlanOrDie(PresetOrDie("gpt-oss-20b"), o);
  EXPECT_EQ(p.backend.name, "triton");
  MemoryOptions mo;
  mo.gpu = *FindGpu("h100");
  mo.max_model_len = 16000;
  const MemoryPlan mp = PlanMemory(p, mo);
  ASSERT_TRUE(mp.fits) << mp.failure;
  EXPECT_EQ(mp.options.engine_max_num_seqs, 1024);
  const RankMemory& r = mp.ranks[0];
  ExpectWithin5Percent(r.weights + TermBytes(r, "weight_extras:triton"),
                       static_cast<int64_t>(13.47 * kGiB), "weights");
  ExpectWithin5Percent(r.kv_cache, static_cast<int64_t>(50.28 * kGiB), "gpt-oss-20b H100 KV");
  // The TP1 non-torch row is this source's logged figure (0.13 GiB, rounded by the table).
  EXPECT_NEAR(static_cast<double>(TermBytes(r, "non_torch_profile")) / kGiB, 0.13, 0.005);
}

// vLLM 0.11.2, gpt-oss-120b on Marlin (that install had no triton_kernels), `--gpu-memory-
// utilization 0.96 --max-model-len 98304 --max-num-seqs 6`: "Model loading took 65.9651 GiB",
// "Available KV cache memory: 8.99 GiB" (tonghuikang/blog, a Kaggle notebook's log; the GPU is
// not printed, an H100 by the competition's rules: docs/engine-memory.md row 14). max_num_seqs 6
// shrinks the sampler's dummy run from 1024 rows of 201,088 logits (4.6 GiB) to 6.
TEST(EngineLogTest, VllmGptOss120b_Marlin_MaxNumSeqs6_KvMemory) {
  const ShardPlan p = PlanOrDie(PresetOrDie("gpt-oss-120b"), Opts(1, 1, false, "marlin"));
  MemoryOptions mo;
  mo.gpu = *FindGpu("h100");
  mo.gpu_memory_utilization = 0.96;
  mo.max_model_len = 98304;
  mo.engine_max_num_seqs = 6;
  const MemoryPlan mp = PlanMemory(p, mo);
  ASSERT_TRUE(mp.fits) << mp.failure;
  ExpectWithin5Percent(mp.ranks[0].weights, static_cast<int64_t>(65.9651 * kGiB), "weights");
  ExpectWithin5Percent(mp.ranks[0].kv_cache, static_cast<int64_t>(8.99 * kGiB), "KV memory");
  // "GPU KV cache size: 130,960 tokens": vLLM's count over its two layer groups (18 sliding,
  // 18 full), half the tokens of context the pool holds.
  ExpectWithin5Percent(mp.engine_kv_tokens, 130'960, "gpt-oss-120b KV tokens");
  EXPECT_GT(mp.ranks[0].kv_tokens, 2 * mp.engine_kv_tokens - 1000);
  mo.engine_max_num_seqs = 0;  // the engine's default, 1024 on an H100: 4.6 GiB less KV
  EXPECT_LT(PlanMemory(p, mo).ranks[0].kv_cache, static_cast<int64_t>(5.0 * kGiB));
}

// vLLM 0.11.2, deepseek-ai/DeepSeek-R1-0528 (fp8 blocks, MLA) at TP8, max_seq_len 8192: "Model
// loading took 79.7390 GiB", "Available KV cache memory: 41.60 GiB", "GPU KV cache size: 635,648
// tokens" (docs/engine-memory.md row 15). The GPU is not printed; only a 139.81 GiB H200 at the
// default 0.9 leaves a possible 4.49 GiB for the profile peak and non-torch memory.
TEST(EngineLogTest, VllmDeepSeekR1_TP8_H200) {
  const ShardPlan p = PlanOrDie(PresetOrDie("deepseek-v3"), Opts(8));
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  mo.max_model_len = 8192;
  const MemoryPlan mp = PlanMemory(p, mo);
  ASSERT_TRUE(mp.fits) << mp.failure;
  EXPECT_LE(std::fabs(mp.ranks[0].weights / (79.7390 * kGiB) - 1), 0.01);
  ExpectWithin5Percent(mp.engine_kv_tokens, 635'648, "DeepSeek-R1 TP8 H200");
}

// vLLM nightly of November 2025, moonshotai/Kimi-K2-Thinking (MLA, int4 experts in group 32) at
// TP8 on 8 x H200 with the defaults (utilization 0.9, the model's 262,144 context): "Available KV
// cache memory: 46.80 GiB", "GPU KV cache size: 715,072 tokens" (vllm-project/recipes,
// moonshotai/Kimi-K2-Think.md; docs/engine-memory.md row 10). No row of the memory table was set
// against it: the TP8 NVLink non-torch row (1782 MiB) is another H200 log's figure. With the PCIe
// row (215 MiB) the plan said 756,400 tokens (+5.8 %).
TEST(EngineLogTest, VllmKimiK2Thinking_TP8_H200) {
  const Result<ModelConfig> model = LoadModelConfig(
      std::string(MOESHARD_SOURCE_DIR) + "/tests/checkpoints/configs/kimi-k2-thinking.json");
  ASSERT_TRUE(model.ok()) << model.status().message();
  const ShardPlan p = PlanOrDie(*model, Opts(8));
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  ASSERT_TRUE(mo.gpu.nvlink);
  const MemoryPlan mp = PlanMemory(p, mo);
  ASSERT_TRUE(mp.fits) << mp.failure;
  EXPECT_EQ(mp.ranks[0].overhead, 1782 * kMiB);
  EXPECT_LE(std::fabs(static_cast<double>(mp.ranks[0].kv_cache) / (46.80 * kGiB) - 1), 0.05);
  ExpectWithin5Percent(mp.engine_kv_tokens, 715'072, "Kimi-K2-Thinking TP8 H200");
}

// vLLM 0.10.2, Qwen3-Next-80B-A3B-Instruct bf16 at TP2 on two H200 ("Model loading took 74.2812
// GiB"; docs/engine-memory.md row 11). Only the weights match: the KV memory misses by 6 %.
TEST(EngineLogTest, VllmQwen3Next_TP2_H200_Weights) {
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-next-80b-a3b"), Opts(2));
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  mo.max_model_len = 262144;
  const MemoryPlan mp = PlanMemory(p, mo);
  EXPECT_LE(std::fabs(mp.ranks[0].weights / (74.2812 * kGiB) - 1), 0.005);
}

// vLLM's "GPU KV cache size" for models whose layers it pages in groups (memory.cc
// VllmLoggedTokens), from the KV memory the logs print, shifted into the plan with the user
// overhead row so that only the count is under test:
//  - Qwen3-Next-80B-A3B TP2 (row 11, vLLM 0.10.2): 12 full-attention and 36 Gated DeltaNet
//    layers form four groups of 12; one GDN state per rank is 16 x 128 x 128 x 2 + 4096 x 3 x 2
//    = 548,864 bytes, so the attention block widens to 16 x cdiv(548,864, 16 x 1,024) = 544
//    tokens (one KV head of 256 per rank: 1,024 bytes per token); 44.59 GiB / (544 x 1,024) /
//    12 = 7162 blocks, logged as 7162 // 4 x 544 = 973,760 tokens.
//  - gpt-oss-120b (row 14, vLLM 0.11.2): 18 sliding and 18 full layers, two groups of 18, pages
//    of 16 x 32,768 bytes; 8.99 GiB gives 16,365 blocks, 130,912 tokens against the logged
//    130,960 (the log rounds the GiB).
TEST(EngineLogTest, VllmLogsHybridTokensPerLayerGroup) {
  const auto logged_tokens = [](const ShardPlan& p, MemoryOptions mo, double kv_gib) {
    const int64_t planned = PlanMemory(p, mo).ranks[0].kv_cache;
    mo.overhead_bytes = planned - static_cast<int64_t>(kv_gib * kGiB);
    const MemoryPlan mp = PlanMemory(p, mo);
    EXPECT_EQ(mp.ranks[0].kv_cache, static_cast<int64_t>(kv_gib * kGiB));
    return mp.engine_kv_tokens;
  };
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  mo.max_model_len = 262144;
  EXPECT_EQ(logged_tokens(PlanOrDie(PresetOrDie("qwen3-next-80b-a3b"), Opts(2)), mo, 44.59),
            973'760);
  mo.gpu = *FindGpu("h100");
  mo.gpu_memory_utilization = 0.96;
  mo.max_model_len = 98304;
  mo.engine_max_num_seqs = 6;
  const ShardPlan oss = PlanOrDie(PresetOrDie("gpt-oss-120b"), Opts(1, 1, false, "marlin"));
  EXPECT_EQ(logged_tokens(oss, mo, 8.99), 130'912);
  // SGLang logs its pool's capacity, not vLLM's group count.
  mo.engine = "sglang";
  const MemoryPlan s = PlanMemory(oss, mo);
  EXPECT_EQ(s.engine_kv_tokens, s.ranks[0].kv_tokens);
}

// Qwen3-Coder-30B-A3B-Instruct-FP8 (128 x 128 fp8 blocks) on one A100-40GB: no native FP8
// (compute capability 8.0 < 8.9), so vLLM runs every fp8 linear and the experts on Marlin
// (fp8.py: use_marlin = not has_device_capability(89)), whose weight-only FP8 turns each
// weight's fp32 block scales [N/128, K/128] into bf16 group scales [K/128, N]
// (marlin_utils_fp8.py). vLLM logged "Model loading took 29.54 GiB" (issue 16;
// docs/engine-memory.md row 2); the checkpoint's tensors alone are 1.7 % short of it.
TEST(EngineLogTest, VllmFp8OnA100RunsMarlinWithPerColumnScales) {
  const Result<ModelConfig> model =
      LoadModelConfig(std::string(MOESHARD_SOURCE_DIR) +
                      "/tests/engine_logs/qwen3-coder-30b-a3b-instruct-fp8.json");
  ASSERT_TRUE(model.ok()) << model.status().message();
  PlanOptions o = Opts(1);
  EXPECT_EQ(PlanOrDie(*model, o).backend.name, "block-fp8");  // an H100: native FP8
  o.native_fp8 = FindGpu("a100-40gb")->NativeFp8();
  EXPECT_FALSE(o.native_fp8);
  const ShardPlan p = PlanOrDie(*model, o);
  EXPECT_EQ(p.backend.name, "marlin");
  MemoryOptions mo;
  mo.gpu = *FindGpu("a100-40gb");
  mo.gpu_memory_utilization = 0.9;
  mo.max_model_len = 32768;
  const RankMemory r = PlanMemory(p, mo).ranks[0];
  // Per layer: 128 experts x (w13 [1536, 2048]: 16 x 1536 bf16 for 12 x 16 fp32; w2 [2048, 768]:
  // 6 x 2048 for 16 x 6) and attention (q [4096, 2048], k and v [512, 2048], o [2048, 4096]).
  const int64_t experts = 128 * ((16 * 1536 * 2 - 12 * 16 * 4) + (6 * 2048 * 2 - 16 * 6 * 4));
  const int64_t attention = (16 * 4096 * 2 - 32 * 16 * 4) + 2 * (16 * 512 * 2 - 4 * 16 * 4) +
                            (32 * 2048 * 2 - 16 * 32 * 4);
  const int64_t extras = TermBytes(r, "weight_extras:marlin");
  EXPECT_EQ(extras, 48 * (experts + attention));
  const double logged = 29.54 * kGiB;
  EXPECT_GT(std::fabs(r.weights / logged - 1), 0.01);
  EXPECT_LE(std::fabs((r.weights + extras) / logged - 1), 0.005);
  // "GPU KV cache size: 54,912 tokens". Independent since the TP1 non-torch row comes from
  // another source (the gpt-oss H100 table of row 12; it was set against this log before).
  ExpectWithin5Percent(PlanMemory(p, mo).engine_kv_tokens, 54'912, "Qwen3-Coder-FP8 A100-40GB");
}

// vLLM 0.24.0, Qwen/Qwen3-30B-A3B-FP8 (the architecture of the Qwen3-Coder FP8 config used
// here), DP16 x EP16 over 2 x p5en.48xlarge (8 x H200 each), `vllm serve ... --enable-expert-
// parallel --tensor-parallel-size 1 --data-parallel-size 16 --data-parallel-size-local 8
// --all2all-backend deepep_v2 --trust-remote-code --enforce-eager`: every engine's
// `vllm:cache_config_info` gauge reports kv_cache_size_tokens 1280464 with gpu_memory_utilization
// 0.92 (vLLM's default there) and a max concurrency of 31.26 at the model's 40,960 tokens
// (antonai-work/deepep-v2-efa-repro @048d07f0, docs/engine-memory.md row 17). Independent of the
// tables; DeepEP V2's buffers are not modelled, the high-throughput ones (internode) stand in.
TEST(EngineLogTest, VllmQwen3_30B_Fp8_DP16EP16_H200) {
  const Result<ModelConfig> model =
      LoadModelConfig(std::string(MOESHARD_SOURCE_DIR) +
                      "/tests/engine_logs/qwen3-coder-30b-a3b-instruct-fp8.json");
  ASSERT_TRUE(model.ok()) << model.status().message();
  const ShardPlan p = PlanOrDie(*model, Opts(1, 16, true));
  EXPECT_EQ(p.topology.moe_ep, 16);
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  mo.gpu_memory_utilization = 0.92;
  mo.all2all_backend = "deepep_high_throughput";
  mo.max_model_len = 40960;
  const MemoryPlan mp = PlanMemory(p, mo);
  ASSERT_TRUE(mp.fits) << mp.failure;
  ExpectWithin5Percent(mp.engine_kv_tokens, 1'280'464, "Qwen3-30B-A3B-FP8 DP16 EP16 vLLM H200");
}

}  // namespace
}  // namespace moeshard
