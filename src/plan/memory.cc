#include "moeshard/plan/memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <limits>
#include <map>
#include <optional>
#include <string_view>

#include "moeshard/base/math.h"
#include "moeshard/base/units.h"
#include "plan/model_tensors.h"

namespace moeshard {

const std::vector<GpuSpec>& GpuCatalog() {
  // Capacities as the driver reports them where known (nvidia-smi "MiB" totals), else the
  // datasheet figure. What a process can allocate is a little less; gpu_memory_utilization
  // leaves the margin. NVLink: the H100, H200, B200, GB300 and A100 entries are the SXM boards
  // (HGX servers, NVSwitch), the A10, L4 and L40S are PCIe cards; the AMD entries take the PCIe
  // rows (no public vLLM non-torch figure for them was found). --interconnect overrides.
  static const std::vector<GpuSpec> catalog = {
      // H100 and H200: what cudaMemGetInfo reports (vLLM and SGLang divide this, not
      // nvidia-smi's 81559 / 143771 MiB, 0.46 / 0.59 GiB more).
      {"h100", "NVIDIA H100 80 GB", static_cast<int64_t>(79.18 * kGiB),
       "vLLM 'Free memory on device (78.57/79.18 GiB)' on an H100 (llm-d/llm-d-benchmark "
       "config_explorer/empirical-vllm-memory-results.md)",
       90, true},
      {"h200", "NVIDIA H200 141 GB", static_cast<int64_t>(139.81 * kGiB),
       "vLLM 0.10.2 'Free memory on device (139.21/139.81 GiB)' on H200s (docs/engine-memory.md "
       "row 11); PyTorch OOM messages on H200 read 'total capacity of 139.81 GiB'",
       90, true},
      {"b200", "NVIDIA B200 192 GB", 183359 * kMiB, "nvidia-smi: 183359 MiB", 100, true},
      {"gb300", "NVIDIA GB300 288 GB", 288 * kGiB, "datasheet: 288 GB HBM3e", 103, true},
      {"a100", "NVIDIA A100 80 GB", 81920 * kMiB, "nvidia-smi: 81920 MiB", 80, true},
      // What PyTorch (and so vLLM's mem_get_info) reports as total, from OOM messages.
      {"a100-80gb", "NVIDIA A100 80 GB", static_cast<int64_t>(79.25 * kGiB),
       "PyTorch 'total capacity of 79.25 GiB' on A100-SXM4-80GB (vllm-project/vllm issue 20581)",
       80, true},
      {"a100-40gb", "NVIDIA A100 40 GB", static_cast<int64_t>(39.50 * kGiB),
       "PyTorch 'total capacity of 39.50 GiB' (TianheWu/CoSeR issue 10)", 80, true},
      {"a10", "NVIDIA A10 24 GB", static_cast<int64_t>(22.06 * kGiB),
       "PyTorch '22.06 GiB total capacity' (vllm-project/vllm issue 928)", 86},
      {"l4", "NVIDIA L4 24 GB", static_cast<int64_t>(21.96 * kGiB),
       "PyTorch 'total capacity of 21.96 GiB' (vllm-project/vllm issue 12539)", 89},
      {"l40s", "NVIDIA L40S 48 GB", static_cast<int64_t>(44.42 * kGiB),
       "vLLM 'Free memory on device (43.93/44.42 GiB)' on an L40S (docs/engine-memory.md row 7)",
       89},
      {"mi300x", "AMD Instinct MI300X 192 GB", 192 * kGiB, "datasheet: 192 GB HBM3"},
      {"mi355x", "AMD Instinct MI355X 288 GB", 288 * kGiB, "datasheet: 288 GB HBM3E"},
  };
  return catalog;
}

Result<GpuSpec> FindGpu(const std::string& name) {
  std::string lower = name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string names;
  for (const GpuSpec& g : GpuCatalog()) {
    if (g.name == lower) return g;
    names += (names.empty() ? "" : ", ") + g.name;
  }
  return InvalidArgumentError(fmt::format(
      "plan: '--gpu {}': unknown GPU (known: {}; or give --gpu-memory GiB)", name, names));
}

Result<KvCacheDtype> ParseKvCacheDtype(const std::string& name) {
  if (name == "auto") return KvCacheDtype::kAuto;
  if (name == "bf16" || name == "bfloat16") return KvCacheDtype::kBf16;
  if (name == "fp8" || name == "fp8_e4m3" || name == "fp8_e5m2") return KvCacheDtype::kFp8;
  return InvalidArgumentError(fmt::format(
      "plan: '--kv-cache-dtype {}': expected auto, bf16, fp8, fp8_e4m3 or fp8_e5m2", name));
}

Result<int64_t> ParseMaxModelLen(const std::string& text) {
  if (text == "auto" || text == "-1") return 0;
  const auto bad = [&] {
    return InvalidArgumentError(fmt::format(
        "plan: '--max-model-len {}': expected a positive integer, optionally with k/K/m/M "
        "(1k = 1000, 1K = 1024), or auto",
        text));
  };
  if (text.empty()) return bad();
  int64_t mult = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'k': mult = 1000; break;
    case 'K': mult = 1024; break;
    case 'm': mult = 1000 * 1000; break;
    case 'M': mult = 1024 * 1024; break;
    default: break;
  }
  if (mult != 1) digits.pop_back();
  if (digits.empty() || digits.size() > 12) return bad();
  for (char c : digits) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return bad();
  }
  const int64_t v = std::stoll(digits) * mult;
  if (v <= 0) return bad();
  return v;
}

namespace {

int KvBytes(const ShardPlan& plan, KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kAuto: return DTypeBits(plan.model.dtype) / 8;
    case KvCacheDtype::kBf16: return 2;
    case KvCacheDtype::kFp8: return 1;
  }
  return 2;
}

struct KvCost {
  int64_t per_token = 0;  // bytes per token of context, summed over the stage's layers
  int64_t per_seq = 0;    // fixed bytes per sequence (linear-attention state, sliding windows)
};

// How vLLM's KV cache manager pages a layer (vllm/v1/kv_cache_interface.py): full attention,
// sliding-window attention, a recurrent state per sequence (MambaSpec: GDN, KDA), or a
// layout moeshard does not map to vLLM's groups (DeepSeek-V4's compressed MQA).
enum class VllmSpec { kFull, kSliding, kState, kOther };

struct LayerKv {
  VllmSpec spec = VllmSpec::kFull;
  int64_t token_bytes = 0;  // attention layers: bytes per token, sliding ones too
  KvCost cost;              // what the layer adds to the rank's capacity model
};

LayerKv LayerKvOf(const ShardPlan& plan, const LayerSpec& spec, int kvb, int64_t max_model_len) {
  const ModelConfig& m = plan.model;
  const int64_t tp = plan.topology.tp;
  LayerKv k;
  KvCost& c = k.cost;
  switch (spec.attention) {
    case AttentionKind::kMla:
      // The compressed latent and the rope key, the same on every TP rank.
      k.token_bytes = (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) * kvb;
      c.per_token = k.token_bytes;
      break;
    case AttentionKind::kGqa: {
      const int64_t kv_local = m.num_kv_heads >= tp ? m.num_kv_heads / tp : 1;
      k.token_bytes = 2 * kv_local * m.head_dim * kvb;
      if (spec.sliding && m.sliding_window > 0) k.spec = VllmSpec::kSliding;
      if (spec.sliding && m.sliding_window > 0 && m.sliding_window < max_model_len) {
        c.per_seq = k.token_bytes * m.sliding_window;
      } else {
        c.per_token = k.token_bytes;
      }
      break;
    }
    case AttentionKind::kKda: {
      k.spec = VllmSpec::kState;
      const int64_t heads_local = m.kda.num_heads / tp;
      // Recurrent state [heads, head_dim, head_dim] fp32 plus the q/k/v short-conv tails.
      c.per_seq += heads_local * m.kda.head_dim * m.kda.head_dim * 4;
      c.per_seq += 3 * heads_local * m.kda.head_dim * (m.kda.short_conv_kernel - 1) * 2;
      break;
    }
    case AttentionKind::kGatedDeltaNet: {
      k.spec = VllmSpec::kState;
      // Recurrent state [Vh, dk, dv] and the depthwise conv's tail over q, k, v, both in
      // the model dtype (vLLM's default mamba cache dtype "auto"; fp32 with
      // --mamba-ssm-cache-dtype float32 is not modelled).
      const GdnConfig& g = m.gdn;
      const int64_t el = DTypeBytes(m.dtype, 1).value_or(2);
      c.per_seq += g.num_v_heads / tp * g.k_head_dim * g.v_head_dim * el;
      c.per_seq += (2 * g.key_dim() + g.value_dim()) / tp * (g.conv_kernel - 1) * el;
      break;
    }
    case AttentionKind::kCompressedMqa: {
      k.spec = VllmSpec::kOther;
      // DeepSeek-V4 (vLLM deepseek_v4_attention.py, deepseek_compressor.py): one latent KV
      // head of head_dim, the same on every TP rank. Every layer keeps the last `window`
      // tokens uncompressed (per sequence); a ratio-r layer adds one compressed entry per r
      // tokens, and ratio 4 the indexer's index_head_dim-wide key per 4 tokens; the
      // compressors' running state (kv and score, [c * r, c * width] fp32 each, c = 2 for
      // the overlapping ratio 4) is per sequence. vLLM packs entries as fp8 with scales
      // (584 bytes for head_dim 512, 132 for the indexer's 128); this model uses the KV
      // dtype's bytes per element.
      const CompressedMqaConfig& a = m.cmqa;
      const int64_t r = spec.compress_ratio;
      c.per_seq += std::min(a.window, max_model_len) * a.head_dim * kvb;
      if (r > 0) {
        const int64_t cf = r == 4 ? 2 : 1;
        c.per_token += CeilDiv(a.head_dim * kvb, r);
        c.per_seq += 2 * (cf * r) * (cf * a.head_dim) * 4;
        if (r == 4) {
          c.per_token += CeilDiv(a.index_head_dim * kvb, r);
          c.per_seq += 2 * (cf * r) * (cf * a.index_head_dim) * 4;
        }
      }
      break;
    }
  }
  return k;
}

KvCost KvCostOf(const ShardPlan& plan, const RankPlan& rank, int kvb, int64_t max_model_len) {
  KvCost c;
  for (int64_t l : rank.layers) {
    const KvCost lc = LayerKvOf(plan, plan.model.layers[l], kvb, max_model_len).cost;
    c.per_token += lc.per_token;
    c.per_seq += lc.per_seq;
  }
  return c;
}

// The count vLLM logs as "GPU KV cache size: N tokens" for a model whose layers are paged
// differently (v0.10-v0.11 vllm/v1/core/kv_cache_utils.py, checked against the logs of
// docs/engine-memory.md rows 11 and 14). Each spec's layers, in model order, form groups of
// equally many layers (`_get_kv_cache_groups_uniform_page_size`: the smallest spec's layer
// count, or the largest where that is under 1.25x the smallest); one block is a page of every
// layer at one position of a group, so num_blocks = kv_cache // page // group size on the
// rank (`get_kv_cache_config_from_groups`), and the log divides the blocks by the number of
// groups: N = num_blocks // groups * the smallest block size (`_report_kv_cache_config`).
// Recurrent-state layers widen the attention block so that one page holds a sequence's state
// (`HybridAttentionMambaModelConfig.verify_and_update_config`: 16 * cdiv(state, 16 * attention
// bytes per token)); their own block size is max_model_len. A model of one spec logs its
// capacity; so does one with a layout not mapped here.
int64_t VllmLoggedTokens(const ShardPlan& plan, const RankPlan& rank, int kvb, int64_t len,
                         int64_t kv_cache, int64_t block, int64_t capacity_tokens) {
  const ModelConfig& m = plan.model;
  std::vector<LayerKv> layers;
  std::array<int64_t, 3> count{};  // layers per spec: full, sliding, state
  for (const LayerSpec& spec : m.layers) {
    layers.push_back(LayerKvOf(plan, spec, kvb, len));
    if (layers.back().spec == VllmSpec::kOther) return capacity_tokens;
    ++count[static_cast<int>(layers.back().spec)];
  }
  int64_t min_n = 0, max_n = 0, specs = 0;
  for (int64_t n : count) {
    if (n == 0) continue;
    ++specs;
    min_n = min_n == 0 ? n : std::min(min_n, n);
    max_n = std::max(max_n, n);
  }
  if (specs < 2) return capacity_tokens;
  const int64_t group_size = 4 * max_n < 5 * min_n ? max_n : min_n;
  int64_t groups = 0;
  for (int64_t n : count) groups += CeilDiv(n, group_size);

  // Layers of the rank in each group (a PP stage holds part of them).
  std::map<std::pair<int, int64_t>, int64_t> on_rank;
  std::array<int64_t, 3> seen{};
  int64_t token_bytes = 0, state_bytes = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const int s = static_cast<int>(layers[l].spec);
    const int64_t group = seen[s]++ / group_size;
    token_bytes = std::max(token_bytes, layers[l].token_bytes);
    if (layers[l].spec == VllmSpec::kState)
      state_bytes = std::max(state_bytes, layers[l].cost.per_seq);
    if (std::find(rank.layers.begin(), rank.layers.end(), static_cast<int64_t>(l)) !=
        rank.layers.end()) {
      ++on_rank[{s, group}];
    }
  }
  int64_t rank_group_size = 0;
  for (const auto& [key, n] : on_rank) rank_group_size = std::max(rank_group_size, n);
  if (rank_group_size == 0 || token_bytes == 0 || kv_cache <= 0) return 0;
  int64_t attn_block = block, min_block = block;
  if (state_bytes > 0) {
    attn_block = 16 * CeilDiv(state_bytes, 16 * token_bytes);
    min_block = std::min(attn_block, len);
  }
  const int64_t page = std::max(attn_block * token_bytes, state_bytes);
  const int64_t num_blocks = kv_cache / page / rank_group_size;
  return num_blocks / groups * min_block;
}

}  // namespace

namespace {

int64_t BatchedTokens(const MemoryOptions& o) {
  return o.max_num_batched_tokens > 0 ? o.max_num_batched_tokens : 8192;
}

// The widest per-token projection of the attention or dense-MLP path, per TP rank.
int64_t WidestProjection(const ShardPlan& plan) {
  const ModelConfig& m = plan.model;
  const int64_t tp = plan.topology.tp;
  int64_t w = 0;
  if (m.num_layers_of(AttentionKind::kGqa) > 0) {
    w = (m.num_attention_heads + 2 * std::max<int64_t>(1, m.num_kv_heads)) * m.head_dim / tp;
  }
  if (m.num_layers_of(AttentionKind::kMla) > 0) {
    w = std::max(w, m.num_attention_heads *
                        (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim + m.mla.v_head_dim) / tp);
  }
  if (m.num_layers_of(AttentionKind::kKda) > 0) {
    w = std::max(w, 3 * m.kda.num_heads * m.kda.head_dim / tp);
  }
  if (m.num_layers_of(AttentionKind::kGatedDeltaNet) > 0) {
    w = std::max(w, 2 * (m.gdn.key_dim() + m.gdn.value_dim()) / tp);
  }
  if (m.num_layers_of(AttentionKind::kCompressedMqa) > 0) {
    // q over the local heads (wq_b's output), the widest per-token projection.
    w = std::max(w, m.num_attention_heads * m.cmqa.head_dim / tp);
  }
  if (m.num_dense_layers() > 0) w = std::max(w, 2 * m.intermediate_size / tp);
  return w;
}

}  // namespace

int64_t ActivationBytes(const ShardPlan& plan, const RankPlan& rank, const MemoryOptions& o,
                        const EngineProfile& engine) {
  // The peak of the engine's profile forward: T = max_num_batched_tokens tokens per DP rank,
  // bf16 activations (vLLM gpu_model_runner.py profile_run; the torch peak increase it logs):
  //   residual + hidden + normed hidden            3 * T * H * 2
  //   widest attention / dense-MLP projection      T * width * 2
  //   routed experts over the group's M = T * dp * pcp gathered tokens (all-gather dispatch):
  //     the gathered hidden states                 M * H_moe * 2
  //     fused-MoE workspace (fused_moe.py): the shared gate_up / down output cache
  //     [M, top_k, max(g * I_pad, H_moe)] and the activation cache [M * top_k, I_pad]
  //                                                M * top_k * (max(g * I, H) + I) * 2
  //   last stage only, the sampler's dummy run over R = min(max_num_seqs, T) rows, at the
  //     engine's bytes per logit (the engine table: vLLM's PyTorch top-k / top-p path sorts)
  //                                                R * vocab * sampler_bytes_per_logit
  const ModelConfig& m = plan.model;
  const ResolvedTopology& t = plan.topology;
  const int64_t T = BatchedTokens(o), H = m.hidden_size;
  int64_t bytes = 3 * T * H * 2 + T * WidestProjection(plan) * 2;
  if (!rank.expert_slots.empty()) {
    const int64_t gathered = T * t.dp * t.pcp;
    const int64_t g = m.gated() ? 2 : 1;
    const int64_t i_pad = plan.intermediate.padded_local, h_moe = plan.hidden.padded_local;
    bytes += gathered * h_moe * 2;
    bytes += gathered * m.num_experts_per_tok * (std::max(g * i_pad, h_moe) + i_pad) * 2;
  }
  if (rank.coords.pp_stage == t.pp - 1) {
    const int64_t seqs = o.engine_max_num_seqs > 0 ? o.engine_max_num_seqs : 256;
    bytes += std::min(seqs, T) * m.vocab_size * engine.sampler_bytes_per_logit;
  }
  return bytes;
}

Status CheckEngineTopology(const EngineProfile& engine, const ShardPlan& plan) {
  const ResolvedTopology& t = plan.topology;
  if (engine.rejects_moe_tp_with_moe_ep && t.moe_tp > 1 && t.moe_ep > 1) {
    return InvalidArgumentError(fmt::format(
        "plan: '--engine {}': moe_tp {} x moe_ep {}: vLLM shards experts either by tensor "
        "parallelism (no -ep: moe_tp = dp*pcp*tp) or by expert parallelism (-ep: moe_ep = "
        "dp*pcp*tp), never both (use -ep or drop --moe-tp/--moe-ep, or --engine sglang / "
        "trtllm for a hybrid)",
        engine.Label(), t.moe_tp, t.moe_ep));
  }
  return Status::Ok();
}

namespace {

// Exact checkpoint bytes of the slices the rank holds, plus the padding its plan adds.
int64_t RankWeightsFromCheckpoint(const CheckpointSizing& sizing, const RankPlan& r) {
  int64_t padding = 0;
  for (const TensorShard& s : r.tensors) padding += s.padding_bytes;
  return sizing.RankTotal(r.coords.rank) + padding;
}

// Engine defaults filled into the options: the fraction, the profile's batched tokens and
// max_num_seqs (by GPU size), the all-to-all backend.
MemoryOptions ResolveOptions(const MemoryOptions& in, const EngineProfile& e,
                             const ShardPlan& plan) {
  MemoryOptions o = in;
  // vLLM's get_batch_defaults keeps the small defaults on every A100 ("a100" in the name).
  const bool large = static_cast<double>(o.gpu.bytes) >= e.large_gpu_min_gib * kGiB &&
                     o.gpu.name.rfind("a100", 0) != 0;
  if (o.gpu_memory_utilization <= 0) {
    // In SGLang's terms DP ranks whose experts form one group are DP attention, and its
    // tp_size counts them (--tp 4 --dp 4 --enable-dp-attention is moeshard's TP1 x DP4).
    const ResolvedTopology& t = plan.topology;
    o.gpu_memory_utilization = e.DefaultFraction(
        FractionInputs{.gpu_bytes = o.gpu.bytes, .tp = t.tp * t.dp, .pp = t.pp, .dp = t.dp});
  }
  if (o.max_num_batched_tokens <= 0) {
    o.max_num_batched_tokens =
        large ? e.max_num_batched_tokens_large : e.max_num_batched_tokens_small;
  }
  if (o.engine_max_num_seqs <= 0) {
    o.engine_max_num_seqs = large ? e.max_num_seqs_large : e.max_num_seqs_small;
  }
  if (o.all2all_backend.empty()) o.all2all_backend = e.default_all2all_backend;
  return o;
}

// Marlin's weight-only FP8 (BackendWeightExtras::fp8_block_scales_per_column): the scales of
// every fp8 weight [.., N, K] of the rank become [.., K/bk, N] in bf16 (per channel or per
// tensor: [.., 1, N]), replacing the checkpoint's fp32 ones. Returns the bytes added.
int64_t Fp8ScalesPerColumnExtra(const RankPlan& r) {
  std::map<std::string_view, const TensorShard*> weights;
  for (const TensorShard& s : r.tensors) {
    if (s.part == TensorPart::kWeight && s.dtype == DType::kF8E4M3) weights[s.name] = &s;
  }
  int64_t extra = 0;
  for (const TensorShard& s : r.tensors) {
    const size_t at = s.name.rfind("weight_scale");
    if (s.part != TensorPart::kScale || at == std::string::npos) continue;
    const auto w = weights.find(std::string_view(s.name).substr(0, at + 6));  // "...weight"
    if (w == weights.end()) continue;
    const std::vector<int64_t>& ws = w->second->padded_shape;
    int64_t columns = ws.size() >= 2 ? ws[ws.size() - 2] : 1;  // N (times the leading dims)
    for (size_t d = 0; d + 2 < ws.size(); ++d) columns *= ws[d];
    const int64_t groups = s.padded_shape.size() >= 2 ? s.padded_shape.back() : 1;  // K / bk
    extra += w->second->count() * columns * groups * 2 - s.bytes;
  }
  return extra;
}

// What the backend adds beside the rank's tensors after loading (BackendSpec weight_extras), or
// a term of 0 bytes.
MemoryTerm WeightExtrasTerm(const ShardPlan& plan, const RankPlan& r) {
  MemoryTerm term{"weight_extras:" + plan.backend.name, 0, "", true};
  const BackendWeightExtras* x = plan.backend.ExtrasFor(plan.expert_scheme.format);
  if (x == nullptr) return term;
  term.source = x->source;
  if (x->fp8_block_scales_per_column) term.bytes += Fp8ScalesPerColumnExtra(r);
  for (const TensorShard& s : r.tensors) {
    if (s.category != TensorCategory::kRoutedExperts) continue;
    const bool bias = s.role == TensorRole::kExpertsW13Bias || s.role == TensorRole::kExpertsW2Bias;
    const int bits = DTypeBits(s.dtype);
    if (bias && x->fp32_bias_copies && bits < 32) term.bytes += s.bytes * (32 - bits) / bits;
    if (s.part == TensorPart::kScale && x->scales_kept_twice) term.bytes += s.bytes;
  }
  return term;
}

// Every non-weight term of one rank, marked by whether the engine's KV rule subtracts it.
std::vector<MemoryTerm> RankTerms(const ShardPlan& plan, const RankPlan& r, const MemoryOptions& o,
                                  const EngineProfile& e, int64_t activations) {
  const ResolvedTopology& t = plan.topology;
  const bool vllm = e.rule == EngineRule::kVllm;
  std::vector<MemoryTerm> terms;
  terms.push_back(MemoryTerm{"activations", activations,
                             "profile forward peak, memory.cc ActivationBytes (vLLM profile_run)",
                             e.rule != EngineRule::kSglang});
  MemoryTerm ctx = CudaContextTerm();
  ctx.in_kv_budget = !vllm;
  terms.push_back(ctx);
  MemoryTerm nccl = NcclTerm(t.dp * t.pcp * t.tp);
  nccl.in_kv_budget = !vllm;
  if (t.world > 1) terms.push_back(nccl);
  if (vllm) terms.push_back(NonTorchProfileTerm(t.tp, o.gpu.nvlink));
  // Weight memory the engine sees as its model's (vLLM's "Model loading took"), subtracted as
  // the weights are.
  if (MemoryTerm x = WeightExtrasTerm(plan, r); x.bytes > 0) terms.push_back(x);
  if (t.moe_ep > 1 && !r.expert_slots.empty()) {
    All2AllParams a{.backend = o.all2all_backend,
                    .ep_size = t.moe_ep,
                    .dp_size = t.dp * t.pcp,
                    .num_experts = plan.num_slots,
                    .hidden = plan.hidden.padded_local,
                    .top_k = plan.model.num_experts_per_tok,
                    .act_bytes = 2,
                    .max_tokens_per_rank = 256,
                    .internode = t.moe_ep > 8};
    Result<MemoryTerm> term = All2AllBufferTerm(a);
    if (term.ok() && term->bytes > 0) terms.push_back(*term);
  }
  if (o.cuda_graph_bytes > 0) {
    terms.push_back(MemoryTerm{"cuda_graphs", o.cuda_graph_bytes, "--cuda-graph-gib", false});
  }
  if (o.overhead_bytes > 0) {
    terms.push_back(MemoryTerm{"user_overhead", o.overhead_bytes, "--overhead-gib", true});
  }
  return terms;
}

// The KV cache the engine's rule leaves on one rank (may be < 0). `overhead` holds the terms the
// rule subtracts, besides weights and activations.
int64_t KvByRule(const EngineProfile& e, const MemoryOptions& o, const RankMemory& rm) {
  const double total = static_cast<double>(o.gpu.bytes);
  const double f = o.gpu_memory_utilization;
  switch (e.rule) {
    case EngineRule::kVllm:  // requested = util * total; minus weights, peak, non-torch
      return static_cast<int64_t>(total * f) - rm.weights - rm.activations - rm.overhead;
    case EngineRule::kSglang: {
      // (free after loading) - (1 - fraction) x (free before loading): SGLang's "total" is the
      // free memory it measured after NCCL init, so the fraction applies to total - preload.
      const double before = total - static_cast<double>(rm.preload);
      return static_cast<int64_t>(before * f) - rm.weights - (rm.overhead - rm.preload);
    }
    case EngineRule::kTrtllm:  // fraction of what is free after the profiling peak
      return static_cast<int64_t>(
          f * static_cast<double>(o.gpu.bytes - rm.weights - rm.activations - rm.overhead));
  }
  return 0;
}

void SizeRank(const ShardPlan& plan, const RankPlan& r, const MemoryPlan& mp,
              const std::optional<CheckpointSizing>& sizing, int64_t len, RankMemory& rm) {
  const MemoryOptions& o = mp.options;
  const EngineProfile& e = mp.engine;
  rm.rank = r.coords.rank;
  rm.budget = static_cast<int64_t>(static_cast<double>(o.gpu.bytes) * o.gpu_memory_utilization);
  rm.weights = sizing ? RankWeightsFromCheckpoint(*sizing, r) : r.WeightBytes();
  rm.activations = ActivationBytes(plan, r, o, e);
  rm.terms = RankTerms(plan, r, o, e, rm.activations);
  for (const MemoryTerm& t : rm.terms) {
    if (t.in_kv_budget) {
      rm.overhead += t.bytes;
    } else {
      rm.outside_budget += t.bytes;
    }
  }
  // `overhead` excludes the activations, which have their own column.
  if (rm.terms.front().in_kv_budget) rm.overhead -= rm.activations;
  if (e.rule == EngineRule::kSglang) {
    for (const MemoryTerm& t : rm.terms) {
      if (t.name == "cuda_context" || t.name == "nccl") rm.preload += t.bytes;
    }
  }
  rm.kv_cache = KvByRule(e, o, rm);
  const KvCost cost = KvCostOf(plan, r, mp.kv_dtype_bytes, len);
  rm.kv_bytes_per_token = cost.per_token;
  rm.state_bytes_per_seq = cost.per_seq;
  const int64_t seqs = std::max<int64_t>(1, o.max_num_seqs);
  const int64_t for_tokens = rm.kv_cache - cost.per_seq * seqs;
  const int64_t block = std::max<int64_t>(1, e.block_size);
  if (for_tokens <= 0) {
    rm.kv_tokens = 0;
  } else if (cost.per_token == 0) {
    rm.kv_tokens = std::numeric_limits<int64_t>::max();
  } else {
    rm.kv_tokens = for_tokens / (cost.per_token * block) * block;  // whole blocks
  }
  rm.engine_kv_tokens =
      e.kv_token_report == KvTokenReport::kVllmGroups
          ? VllmLoggedTokens(plan, r, mp.kv_dtype_bytes, len, rm.kv_cache, block, rm.kv_tokens)
          : rm.kv_tokens;
}

// What the engine leaves outside its fraction must hold the terms it does not budget.
int64_t OutsideRoom(const MemoryOptions& o, const RankMemory& rm) {
  return o.gpu.bytes - rm.budget - rm.outside_budget;
}

std::string FailureOf(const MemoryPlan& mp, const RankMemory& w, int64_t seqs) {
  const MemoryOptions& o = mp.options;
  const int64_t fixed = w.weights + w.activations + w.overhead;
  if (w.kv_cache < 0) {
    return fmt::format(
        "the weight budget fails on rank {}: weights {} + activations {} + overhead {} = {} GiB "
        "exceed what {} leaves of {:.0f}% of {} ({} GiB); shortfall {} GiB before any KV cache",
        w.rank, FormatGiB(w.weights), FormatGiB(w.activations), FormatGiB(w.overhead),
        FormatGiB(fixed), mp.engine.Label(), o.gpu_memory_utilization * 100, o.gpu.description,
        FormatGiB(w.budget), FormatGiB(-w.kv_cache));
  }
  if (OutsideRoom(o, w) < 0) {
    return fmt::format(
        "the memory outside {}'s fraction fails on rank {}: CUDA context, NCCL and graphs need "
        "{} GiB, {:.0f}% of {} leaves {} GiB; shortfall {} GiB (lower "
        "--gpu-memory-utilization)",
        mp.engine.Label(), w.rank, FormatGiB(w.outside_budget), o.gpu_memory_utilization * 100,
        o.gpu.description, FormatGiB(o.gpu.bytes - w.budget), FormatGiB(-OutsideRoom(o, w)));
  }
  if (mp.max_model_len == 0) {
    return fmt::format(
        "the KV budget fails on rank {}: {} GiB left for KV cache holds no full sequence", w.rank,
        FormatGiB(w.kv_cache));
  }
  return fmt::format(
      "the KV budget fails on rank {}: {} sequence(s) x {} tokens need {} GiB of KV cache, "
      "{} GiB is left after weights; shortfall {} GiB (fits {} tokens)",
      w.rank, seqs, FormatCount(mp.max_model_len), FormatGiB(w.required_kv), FormatGiB(w.kv_cache),
      FormatGiB(-w.free), FormatCount(w.kv_tokens));
}

}  // namespace

MemoryPlan PlanMemory(const ShardPlan& plan, const MemoryOptions& options) {
  MemoryPlan mp;
  Result<EngineProfile> engine = FindEngine(options.engine);
  mp.engine = engine.ok() ? *engine : *FindEngine("vllm");
  std::optional<CheckpointSizing> sizing;
  if (options.checkpoint_tensors != nullptr) {
    sizing = SizeFromCheckpoint(plan, *options.checkpoint_tensors);
  }
  mp.options = ResolveOptions(options, mp.engine, plan);
  const MemoryOptions& o = mp.options;
  mp.kv_dtype_bytes = KvBytes(plan, o.kv_cache_dtype);
  const int64_t model_max = plan.model.max_position_embeddings;
  const bool auto_len = o.max_model_len == 0;
  const int64_t len = o.max_model_len < 0 || auto_len ? model_max : o.max_model_len;
  const int64_t seqs = std::max<int64_t>(1, o.max_num_seqs);

  // First pass: the largest length that fits on every rank (for "auto").
  int64_t auto_fit = model_max;
  mp.engine_kv_tokens = std::numeric_limits<int64_t>::max();
  for (const RankPlan& r : plan.ranks) {
    RankMemory rm;
    SizeRank(plan, r, mp, sizing, len, rm);
    auto_fit = std::min(auto_fit, rm.kv_tokens / seqs);
    mp.engine_kv_tokens = std::min(mp.engine_kv_tokens, rm.engine_kv_tokens);
    mp.ranks.push_back(std::move(rm));
  }
  mp.max_model_len = auto_len ? std::max<int64_t>(auto_fit, 0) : len;

  mp.fits = true;
  int64_t worst_free = std::numeric_limits<int64_t>::max();
  for (RankMemory& rm : mp.ranks) {
    rm.required_kv =
        rm.state_bytes_per_seq * seqs + rm.kv_bytes_per_token * mp.max_model_len * seqs;
    rm.free = rm.kv_cache - rm.required_kv;
    rm.fits = rm.kv_cache >= 0 && rm.free >= 0 && mp.max_model_len > 0 && OutsideRoom(o, rm) >= 0;
    mp.fits = mp.fits && rm.fits;
    if (rm.free < worst_free) {
      worst_free = rm.free;
      mp.worst_rank = rm.rank;
    }
  }
  if (!engine.ok()) {
    mp.fits = false;
    mp.failure = engine.status().message();
  } else if (Status s = CheckEngineTopology(mp.engine, plan); !s.ok()) {
    mp.fits = false;
    mp.failure = s.message();
  } else if (!mp.fits) {
    mp.failure = FailureOf(mp, mp.ranks[mp.worst_rank], seqs);
  }
  return mp;
}

ParamCounts CountParams(const ShardPlan& plan) {
  const ModelConfig& m = plan.model;
  ParamCounts p;
  for (const TensorDef& t : internal::PlanTensors(m, plan.options, 1)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const int64_t count =
        t.where == StagePlacement::kLayers ? static_cast<int64_t>(t.layers.size()) : 1;
    p.total += n * count;
    // Every text token reads the embedding row and all non-routed layers; count them as
    // active. The vision tower runs on images, not per token.
    if (t.category != TensorCategory::kVision) p.active += n * count;
  }
  if (m.tie_word_embeddings) p.active += m.vocab_size * m.hidden_size;  // head shares the table
  const int64_t g = m.gated() ? 2 : 1;
  const int64_t per_expert =
      (g + 1) * m.moe_intermediate_size * m.routed_expert_hidden_size +
      (m.expert_bias ? g * m.moe_intermediate_size + m.routed_expert_hidden_size : 0);
  p.total += per_expert * m.num_experts * m.num_moe_layers();
  p.active += per_expert * m.num_experts_per_tok * m.num_moe_layers();
  return p;
}

}  // namespace moeshard
