// ggml_moe_bench: times one MoE layer's routed experts in ggml's CPU backend, the same work as
// `moeshard bench kernels`, for side-by-side comparison (bench/ggml/compare.py). Standalone: built
// by bench/ggml/CMakeLists.txt against a user-supplied ggml checkout; only ggml's public API is
// used.
//
// The graph is the one llama.cpp builds for an MoE FFN (build_moe_ffn): ggml_mul_mat_id for
// gate/up ([H, I, E]) and down ([I, H, E]), ggml_swiglu_split, ggml_mul by the routing weights,
// then a chain of ggml_add over the top_k slot views. Routing (softmax top-k of fresh random
// logits, renormalised) runs on the host each repetition and is uploaded untimed; only
// ggml_backend_graph_compute is timed. Median over repetitions after one warm-up, at least 3
// repetitions and at least --min-time seconds per case, as moeshard does.
//
//   ggml_moe_bench --shape qwen3-30b-a3b --format q4_0 --tokens 1 32 --threads 2
//                  --min-time 0.5 --json out.json
//   ggml_moe_bench --shape tiny --format mxfp4 --tokens 4 --check   # numerics vs an fp32 reference

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "moeshard/base/cpu_info.h"

#ifndef GGML_BENCH_GGML_COMMIT
#define GGML_BENCH_GGML_COMMIT "unknown"
#endif

namespace {

struct Shape {
  const char* name;
  int64_t hidden;
  int64_t intermediate;
  int64_t experts;
  int64_t top_k;
};

// The shapes of `moeshard bench kernels`, plus a tiny one for --check.
constexpr Shape kShapes[] = {
    {"qwen3-30b-a3b", 2048, 768, 128, 8},
    {"kimi-k2-32e", 7168, 2048, 32, 8},
    {"kimi-k3-latent-64e", 3584, 3072, 64, 16},
    {"tiny", 512, 256, 16, 4},
};

struct Format {
  const char* name;
  ggml_type type;
};

// q4_1 (a scale and a minimum per 32) is the nearest peer of AWQ/GPTQ int4; nvfp4 is E2M1 with one
// UE4M3 scale per 16, in blocks of 64.
constexpr Format kFormats[] = {
    {"bf16", GGML_TYPE_BF16}, {"mxfp4", GGML_TYPE_MXFP4}, {"q4_0", GGML_TYPE_Q4_0},
    {"q4_1", GGML_TYPE_Q4_1}, {"q8_0", GGML_TYPE_Q8_0},   {"nvfp4", GGML_TYPE_NVFP4},
};

struct Options {
  std::string shape;
  std::string format;
  std::vector<int64_t> tokens;
  int threads = 0;
  double min_time = 0.5;
  int min_repetitions = 3;
  std::string json;
  bool check = false;
  uint64_t seed = 1;
};

[[noreturn]] void Usage(const char* argv0, const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "ggml_moe_bench: %s\n\n", error.c_str());
  std::fprintf(
      error.empty() ? stdout : stderr,
      "Usage: %s --shape NAME --format FMT [--tokens T ...] [--threads N] [--min-time SEC]\n"
      "          [--min-reps N] [--json FILE] [--check]\n"
      "  --shape      qwen3-30b-a3b, kimi-k2-32e, kimi-k3-latent-64e (or tiny, for --check)\n"
      "  --format     bf16, mxfp4, q4_0, q4_1, q8_0, nvfp4\n"
      "  --tokens     token counts, repeatable and/or several values (default 1 8 32 128 512)\n"
      "  --threads    threads including the caller (default: all cores)\n"
      "  --min-time   seconds per case (default 0.5; at least --min-reps repetitions, 3)\n"
      "  --json       also write the results as JSON to this file\n"
      "  --check      compute once for the first token count with distinct random experts and\n"
      "               compare against an fp32 host reference on the dequantized weights\n",
      argv0);
  std::exit(error.empty() ? 0 : 2);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  auto need = [&](int& i) -> std::string {
    if (i + 1 >= argc) Usage(argv[0], std::string("'") + argv[i] + "' needs a value");
    return argv[++i];
  };
  auto to_int = [&](const std::string& flag, const std::string& s) -> long long {
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0')
      Usage(argv[0], "'" + flag + "': expected an integer, got '" + s + "'");
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      Usage(argv[0], "");
    } else if (a == "--shape") {
      o.shape = need(i);
    } else if (a == "--format") {
      o.format = need(i);
    } else if (a == "--tokens") {
      o.tokens.push_back(to_int(a, need(i)));
      // also accept `--tokens 1 8 32` like moeshard
      while (i + 1 < argc && argv[i + 1][0] != '-') o.tokens.push_back(to_int(a, argv[++i]));
    } else if (a == "--threads") {
      o.threads = static_cast<int>(to_int(a, need(i)));
    } else if (a == "--min-time") {
      const std::string s = need(i);
      char* end = nullptr;
      o.min_time = std::strtod(s.c_str(), &end);
      if (s.empty() || *end != '\0' || o.min_time < 0)
        Usage(argv[0], "'--min-time': expected seconds, got '" + s + "'");
    } else if (a == "--min-reps") {
      o.min_repetitions = static_cast<int>(to_int(a, need(i)));
    } else if (a == "--json") {
      o.json = need(i);
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--seed") {
      o.seed = static_cast<uint64_t>(to_int(a, need(i)));
    } else {
      Usage(argv[0], "unknown argument '" + a + "'");
    }
  }
  if (o.shape.empty()) Usage(argv[0], "'--shape' is required");
  if (o.format.empty()) Usage(argv[0], "'--format' is required");
  if (o.tokens.empty()) o.tokens = {1, 8, 32, 128, 512};
  for (int64_t t : o.tokens) {
    if (t < 1) Usage(argv[0], "'--tokens': expected positive token counts");
  }
  if (o.min_repetitions < 1) Usage(argv[0], "'--min-reps': expected at least 1");
  return o;
}

int OnlineCpus() {
  const unsigned n = std::max(1u, static_cast<unsigned>(sysconf(_SC_NPROCESSORS_ONLN)));
  return static_cast<int>(n);
}

// Whether ggml's CPU backend was linked with an OpenMP runtime (then its threads are OpenMP's).
bool OpenMpLoaded() {
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("libgomp") != std::string::npos || line.find("libomp") != std::string::npos ||
        line.find("libiomp") != std::string::npos) {
      return true;
    }
  }
  return false;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string line;
  std::getline(in, line);
  return line.empty() ? "unknown" : line;
}

std::string JsonString(const std::string& s) {
  std::string r = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      r += '\\';
      r += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      r += buf;
    } else {
      r += c;
    }
  }
  return r + "\"";
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {  // as moeshard: the upper median
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Softmax top-k of logits [tokens, experts], the weights renormalised over the chosen k (as
// moeshard's RoutingKind::kSoftmaxTopK): ids I32 [top_k, tokens], weights F32 [1, top_k, tokens].
void Route(const std::vector<float>& logits, int64_t tokens, int64_t experts, int64_t top_k,
           std::vector<int32_t>* ids, std::vector<float>* weights) {
  std::vector<int32_t> order(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits.data() + t * experts;
    for (int64_t e = 0; e < experts; ++e) order[e] = static_cast<int32_t>(e);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    const float mx = l[order[0]];
    double sum = 0.0;
    for (int64_t k = 0; k < top_k; ++k) sum += std::exp(static_cast<double>(l[order[k]] - mx));
    for (int64_t k = 0; k < top_k; ++k) {
      (*ids)[t * top_k + k] = order[k];
      (*weights)[t * top_k + k] =
          static_cast<float>(std::exp(static_cast<double>(l[order[k]] - mx)) / sum);
    }
  }
}

// One expert matrix [rows x cols] (cols contiguous, ggml's ne0) in `type`, written at `dst`.
void QuantizeMatrix(ggml_type type, const float* src, int64_t rows, int64_t cols, uint8_t* dst) {
  if (type == GGML_TYPE_BF16) {
    ggml_fp32_to_bf16_row(src, reinterpret_cast<ggml_bf16_t*>(dst), rows * cols);
  } else {
    ggml_quantize_chunk(type, src, dst, 0, rows, cols, nullptr);
  }
}

// Host bytes of a [cols, rows, experts] expert tensor. distinct: every expert its own random
// matrix (for --check; a window into one longer random pool at a per-expert offset); otherwise one
// expert's bytes replicated E times (speed does not depend on the values).
std::vector<uint8_t> MakeExpertBytes(ggml_type type, int64_t cols, int64_t rows, int64_t experts,
                                     bool distinct, uint64_t seed) {
  const size_t expert_bytes = ggml_row_size(type, cols) * static_cast<size_t>(rows);
  std::vector<uint8_t> bytes(expert_bytes * static_cast<size_t>(experts));
  const int64_t n = rows * cols;
  const int64_t stride = 97;  // not a multiple of any block size: experts' blocks all differ
  std::vector<float> pool(static_cast<size_t>(n + (distinct ? stride * (experts - 1) : 0)));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
  for (float& v : pool) v = nd(rng);
  for (int64_t e = 0; e < (distinct ? experts : 1); ++e) {
    QuantizeMatrix(type, pool.data() + e * stride, rows, cols, bytes.data() + e * expert_bytes);
  }
  if (!distinct) {
    for (int64_t e = 1; e < experts; ++e) {
      std::memcpy(bytes.data() + e * expert_bytes, bytes.data(), expert_bytes);
    }
  }
  return bytes;
}

// An expert weight tensor and where it lives.
struct ExpertTensor {
  ggml_context* ctx = nullptr;
  ggml_tensor* t = nullptr;
  ggml_backend_buffer_t buf = nullptr;
  std::string buft_name;
  bool repack = false;
  std::vector<uint8_t> host;  // kept for --check only
};

// llama.cpp's weight_buft_supported for MUL_MAT_ID: would the device run this op with the weight
// in `buft`?
bool BuftSupportsMulMatId(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, ggml_tensor* w,
                          int64_t top_k) {
  ggml_init_params ip = {ggml_tensor_overhead() * 8, nullptr, true};
  ggml_context* ctx = ggml_init(ip);
  ggml_tensor* b = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, w->ne[0], top_k, 512);
  ggml_tensor* ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, top_k, 512);
  ggml_tensor* op = ggml_mul_mat_id(ctx, w, b, ids);
  ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(buft, 0);
  ggml_backend_buffer_t saved = w->buffer;
  w->buffer = dummy;
  const bool ok = dummy != nullptr && ggml_backend_dev_supports_op(dev, op);
  w->buffer = saved;
  if (dummy) ggml_backend_buffer_free(dummy);
  ggml_free(ctx);
  return ok;
}

bool MakeExpertTensor(ggml_backend_dev_t dev, const std::vector<ggml_backend_buffer_type_t>& extra,
                      ggml_backend_buffer_type_t plain, ggml_type type, int64_t cols, int64_t rows,
                      int64_t experts, int64_t top_k, const char* name, bool distinct,
                      uint64_t seed, ExpertTensor* out, std::string* why) {
  ggml_init_params ip = {ggml_tensor_overhead() * 2, nullptr, true};
  out->ctx = ggml_init(ip);
  out->t = ggml_new_tensor_3d(out->ctx, type, cols, rows, experts);
  ggml_set_name(out->t, name);
  // The extra (repack) buffer types first, as llama.cpp orders them, then the plain CPU buffer.
  std::vector<ggml_backend_buffer_type_t> candidates = extra;
  candidates.push_back(plain);
  ggml_backend_buffer_type_t chosen = nullptr;
  for (ggml_backend_buffer_type_t buft : candidates) {
    if (BuftSupportsMulMatId(dev, buft, out->t, top_k)) {
      chosen = buft;
      break;
    }
  }
  if (chosen == nullptr) {
    *why = std::string("ggml's CPU device does not support MUL_MAT_ID with ") +
           ggml_type_name(type) + " weights [" + std::to_string(cols) + ", " +
           std::to_string(rows) + ", " + std::to_string(experts) + "]";
    return false;
  }
  out->buf = ggml_backend_alloc_ctx_tensors_from_buft(out->ctx, chosen);
  if (out->buf == nullptr) {
    *why = std::string("cannot allocate ") + std::to_string(ggml_nbytes(out->t)) + " bytes in " +
           ggml_backend_buft_name(chosen);
    return false;
  }
  ggml_backend_buffer_set_usage(out->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
  out->buft_name = ggml_backend_buft_name(chosen);
  out->repack = chosen != plain;
  std::vector<uint8_t> bytes = MakeExpertBytes(type, cols, rows, experts, distinct, seed);
  // A repack buffer converts the whole tensor in one set_tensor call.
  ggml_backend_tensor_set(out->t, bytes.data(), 0, bytes.size());
  if (distinct) out->host = std::move(bytes);
  return true;
}

void FreeExpertTensor(ExpertTensor* e) {
  if (e->buf) ggml_backend_buffer_free(e->buf);
  if (e->ctx) ggml_free(e->ctx);
  *e = ExpertTensor();
}

// The graph of one case (T tokens), llama.cpp-style.
struct Graph {
  ggml_context* in_ctx = nullptr;
  ggml_backend_buffer_t in_buf = nullptr;
  ggml_context* ctx = nullptr;
  ggml_cgraph* gf = nullptr;
  ggml_gallocr_t galloc = nullptr;
  ggml_tensor* x = nullptr;        // F32 [H, 1, T]
  ggml_tensor* ids = nullptr;      // I32 [top_k, T]
  ggml_tensor* weights = nullptr;  // F32 [1, top_k, T]
  ggml_tensor* out = nullptr;      // F32 [H, T]
};

void FreeGraph(Graph* g) {
  if (g->galloc) ggml_gallocr_free(g->galloc);
  if (g->ctx) ggml_free(g->ctx);
  if (g->in_buf) ggml_backend_buffer_free(g->in_buf);
  if (g->in_ctx) ggml_free(g->in_ctx);
  *g = Graph();
}

bool BuildGraph(ggml_backend_t backend, const Shape& s, int64_t tokens, ggml_tensor* gate_exps,
                ggml_tensor* up_exps, ggml_tensor* down_exps, Graph* g, std::string* why) {
  const int64_t h = s.hidden, k = s.top_k;
  {
    ggml_init_params ip = {ggml_tensor_overhead() * 4, nullptr, true};
    g->in_ctx = ggml_init(ip);
    g->x = ggml_new_tensor_3d(g->in_ctx, GGML_TYPE_F32, h, 1, tokens);
    g->ids = ggml_new_tensor_2d(g->in_ctx, GGML_TYPE_I32, k, tokens);
    g->weights = ggml_new_tensor_3d(g->in_ctx, GGML_TYPE_F32, 1, k, tokens);
    g->in_buf = ggml_backend_alloc_ctx_tensors(g->in_ctx, backend);
    if (g->in_buf == nullptr) {
      *why = "cannot allocate the input tensors";
      return false;
    }
  }
  const size_t n_nodes = 64 + 2 * static_cast<size_t>(k);
  ggml_init_params ip = {
      ggml_tensor_overhead() * n_nodes + ggml_graph_overhead_custom(n_nodes, false), nullptr, true};
  g->ctx = ggml_init(ip);
  ggml_context* ctx = g->ctx;
  // build_moe_ffn: up/gate [I, k, T], swiglu, down [H, k, T], * weights, sum over the k slots.
  ggml_tensor* up = ggml_mul_mat_id(ctx, up_exps, g->x, g->ids);
  ggml_tensor* gate = ggml_mul_mat_id(ctx, gate_exps, g->x, g->ids);
  ggml_tensor* par = ggml_swiglu_split(ctx, gate, up);
  ggml_tensor* experts = ggml_mul_mat_id(ctx, down_exps, par, g->ids);
  experts = ggml_mul(ctx, experts, g->weights);
  ggml_tensor* moe_out = nullptr;
  for (int64_t i = 0; i < k; ++i) {
    ggml_tensor* v = ggml_view_2d(ctx, experts, h, tokens, experts->nb[2], i * experts->nb[1]);
    moe_out = moe_out == nullptr ? v : ggml_add(ctx, moe_out, v);
  }
  if (k == 1) moe_out = ggml_cont(ctx, moe_out);
  ggml_set_output(moe_out);
  g->out = moe_out;
  g->gf = ggml_new_graph_custom(ctx, n_nodes, false);
  ggml_build_forward_expand(g->gf, moe_out);
  for (int i = 0; i < ggml_graph_n_nodes(g->gf); ++i) {
    ggml_tensor* node = ggml_graph_node(g->gf, i);
    if (!ggml_backend_supports_op(backend, node)) {
      *why = std::string("ggml's CPU backend does not support ") + ggml_op_desc(node) + " here";
      return false;
    }
  }
  g->galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
  if (!ggml_gallocr_alloc_graph(g->galloc, g->gf)) {
    *why = "cannot allocate the graph's intermediate tensors";
    return false;
  }
  return true;
}

struct Result {
  std::string shape, format;
  int64_t tokens = 0;
  double seconds = 0, experts_touched = 0, weight_bytes = 0, flops = 0;
  int repetitions = 0;
  bool repack = false;
  std::string buffer_types;
};

// --check: output vs an fp32 host MoE on the dequantized (ggml to_float) weights.
int RunCheck(const Options& o, const Shape& s, const Format& f, ggml_backend_t backend,
             const ExpertTensor& gate, const ExpertTensor& up, const ExpertTensor& down) {
  const int64_t tokens = o.tokens.front(), h = s.hidden, im = s.intermediate, e = s.experts,
                k = s.top_k;
  Graph g;
  std::string why;
  if (!BuildGraph(backend, s, tokens, gate.t, up.t, down.t, &g, &why)) {
    std::printf("check %s %s tokens %lld: skipped: %s\n", s.name, f.name, (long long)tokens,
                why.c_str());
    FreeGraph(&g);
    return 1;
  }
  std::mt19937_64 rng(o.seed + static_cast<uint64_t>(tokens));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens * h)), logits(static_cast<size_t>(tokens * e));
  for (float& v : x) v = nd(rng);
  for (float& v : logits) v = nd(rng);
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  std::vector<float> rw(ids.size());
  Route(logits, tokens, e, k, &ids, &rw);
  ggml_backend_tensor_set(g.x, x.data(), 0, ggml_nbytes(g.x));
  ggml_backend_tensor_set(g.ids, ids.data(), 0, ggml_nbytes(g.ids));
  ggml_backend_tensor_set(g.weights, rw.data(), 0, ggml_nbytes(g.weights));
  if (ggml_backend_graph_compute(backend, g.gf) != GGML_STATUS_SUCCESS) {
    std::printf("check: ggml_backend_graph_compute failed\n");
    FreeGraph(&g);
    return 1;
  }
  std::vector<float> got(static_cast<size_t>(tokens * h));
  ggml_backend_tensor_get(g.out, got.data(), 0, got.size() * sizeof(float));

  const ggml_type_traits* tr = ggml_get_type_traits(f.type);
  auto dequant = [&](const ExpertTensor& w, int64_t expert, int64_t cols, int64_t rows,
                     std::vector<float>* dst) {
    dst->resize(static_cast<size_t>(rows * cols));
    const size_t eb = ggml_row_size(f.type, cols) * static_cast<size_t>(rows);
    tr->to_float(w.host.data() + eb * static_cast<size_t>(expert), dst->data(), rows * cols);
  };
  std::vector<double> ref(static_cast<size_t>(tokens * h), 0.0);
  std::vector<float> wg, wu, wd;
  std::vector<double> act(static_cast<size_t>(im));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x.data() + t * h;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t ex = ids[t * k + j];
      dequant(gate, ex, h, im, &wg);
      dequant(up, ex, h, im, &wu);
      dequant(down, ex, im, h, &wd);
      for (int64_t r = 0; r < im; ++r) {
        double a = 0, b = 0;
        for (int64_t c = 0; c < h; ++c) {
          a += static_cast<double>(wg[r * h + c]) * xt[c];
          b += static_cast<double>(wu[r * h + c]) * xt[c];
        }
        act[r] = a / (1.0 + std::exp(-a)) * b;  // silu(gate) * up
      }
      for (int64_t r = 0; r < h; ++r) {
        double y = 0;
        for (int64_t c = 0; c < im; ++c) y += static_cast<double>(wd[r * im + c]) * act[c];
        ref[t * h + r] += rw[t * k + j] * y;
      }
    }
  }
  double max_abs_err = 0, max_abs_ref = 0, err2 = 0, ref2 = 0;
  bool finite = true;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) finite = false;
    const double d = std::fabs(got[i] - ref[i]);
    max_abs_err = std::max(max_abs_err, d);
    max_abs_ref = std::max(max_abs_ref, std::fabs(ref[i]));
    err2 += d * d;
    ref2 += ref[i] * ref[i];
  }
  const double rel = max_abs_ref > 0 ? max_abs_err / max_abs_ref : max_abs_err;
  const double rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  const double tol = f.type == GGML_TYPE_BF16 ? 2e-2 : 5e-2;
  const bool ok = finite && rel <= tol;
  std::printf(
      "check %s %s tokens %lld (distinct experts, weights in %s/%s/%s): max|err|/max|ref| = %.3e, "
      "relative L2 = %.3e, max|ref| = %.3e: %s "
      "(tolerance %.0e; ggml rounds activations to %s)\n",
      s.name, f.name, (long long)tokens, gate.buft_name.c_str(), up.buft_name.c_str(),
      down.buft_name.c_str(), rel, rel_l2, max_abs_ref, ok ? "OK" : "FAIL", tol,
      ggml_type_name(ggml_get_type_traits_cpu(f.type)->vec_dot_type));
  FreeGraph(&g);
  return ok ? 0 : 1;
}

// What the machine and ggml's build are, recorded before the first case.
struct Feature {
  const char* name;
  int on;
};
struct Machine {
  std::string cpu;
  int threads = 0;
  std::string load_before;
  bool openmp = false;
  std::vector<Feature> features;  // ggml's CPU features, as built
};

Machine DescribeMachine(int threads) {
  Machine m;
  m.cpu = moeshard::CpuDescription();
  m.threads = threads;
  m.load_before = LoadAverage();
  m.openmp = OpenMpLoaded();
  m.features = {{"AVX2", ggml_cpu_has_avx2()},
                {"FMA", ggml_cpu_has_fma()},
                {"F16C", ggml_cpu_has_f16c()},
                {"AVX512", ggml_cpu_has_avx512()},
                {"AVX512_BF16", ggml_cpu_has_avx512_bf16()},
                {"AVX512_VNNI", ggml_cpu_has_avx512_vnni()},
                {"AVX512_VBMI", ggml_cpu_has_avx512_vbmi()},
                {"AVX_VNNI", ggml_cpu_has_avx_vnni()}};
  return m;
}

void PrintMachine(const Machine& m) {
  std::string feat_list;
  for (const Feature& ft : m.features) {
    if (ft.on) feat_list += std::string(feat_list.empty() ? "" : " ") + ft.name;
  }
  std::printf(
      "machine: %s, %d threads, ggml %s commit %s, CPU features (as built): %s, %s, "
      "load average %s\n",
      m.cpu.c_str(), m.threads, ggml_version(), GGML_BENCH_GGML_COMMIT,
      feat_list.empty() ? "none of AVX2/AVX512" : feat_list.c_str(),
      m.openmp ? "OpenMP threads" : "ggml threadpool", m.load_before.c_str());
}

// Why ggml cannot run this type/shape combination ("" when it can): reported and skipped, not
// failed.
std::string UnsupportedReason(const Shape& s, const Format& f) {
  if (s.hidden % ggml_blck_size(f.type) != 0 || s.intermediate % ggml_blck_size(f.type) != 0) {
    return std::string(ggml_type_name(f.type)) + " needs rows that are a multiple of " +
           std::to_string(ggml_blck_size(f.type));
  }
  if (ggml_quantize_requires_imatrix(f.type)) {
    return std::string(ggml_type_name(f.type)) + " needs an importance matrix";
  }
  return "";
}

// ggml's CPU backend with `threads` threads and its weight buffer types.
struct CpuBackend {
  ggml_backend_t backend = nullptr;
  ggml_threadpool_t threadpool = nullptr;
  ggml_backend_dev_t dev = nullptr;
  std::vector<ggml_backend_buffer_type_t> extra;  // the extra ("repack") buffer types
  ggml_backend_buffer_type_t plain = nullptr;
};

bool InitCpuBackend(int threads, CpuBackend* cb) {
  cb->backend = ggml_backend_cpu_init();
  if (cb->backend == nullptr) return false;
  ggml_backend_cpu_set_n_threads(cb->backend, threads);
  ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
  // persistent, as llama.cpp's tools use; GGML_BENCH_NO_THREADPOOL=1: a threadpool per compute
  cb->threadpool = std::getenv("GGML_BENCH_NO_THREADPOOL") ? nullptr : ggml_threadpool_new(&tpp);
  if (cb->threadpool) ggml_backend_cpu_set_threadpool(cb->backend, cb->threadpool);
  cb->dev = ggml_backend_get_device(cb->backend);
  ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cb->dev);
  using GetExtraBufts = ggml_backend_buffer_type_t* (*)(ggml_backend_dev_t);
  auto get_extra = reinterpret_cast<GetExtraBufts>(
      ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
  if (get_extra) {
    for (ggml_backend_buffer_type_t* p = get_extra(cb->dev); p && *p; ++p) cb->extra.push_back(*p);
  }
  cb->plain = ggml_backend_dev_buffer_type(cb->dev);
  return true;
}

void FreeCpuBackend(CpuBackend* cb) {
  if (cb->backend) ggml_backend_free(cb->backend);
  if (cb->threadpool) ggml_threadpool_free(cb->threadpool);
  *cb = CpuBackend();
}

// The gate, up and down expert tensors (distinct experts for --check); false with `why` set when
// one cannot be made.
bool MakeExpertTensors(const CpuBackend& cb, const Options& o, const Shape& s, const Format& f,
                       ExpertTensor* gate, ExpertTensor* up, ExpertTensor* down, std::string* why) {
  const bool distinct = o.check;
  const double t0 = Now();
  if (!MakeExpertTensor(cb.dev, cb.extra, cb.plain, f.type, s.hidden, s.intermediate, s.experts,
                        s.top_k, "ffn_gate_exps", distinct, o.seed * 3 + 0, gate, why) ||
      !MakeExpertTensor(cb.dev, cb.extra, cb.plain, f.type, s.hidden, s.intermediate, s.experts,
                        s.top_k, "ffn_up_exps", distinct, o.seed * 3 + 1, up, why) ||
      !MakeExpertTensor(cb.dev, cb.extra, cb.plain, f.type, s.intermediate, s.hidden, s.experts,
                        s.top_k, "ffn_down_exps", distinct, o.seed * 3 + 2, down, why)) {
    return false;
  }
  std::printf(
      "weights: %s [%lld, %lld, %lld] x2 + [%lld, %lld, %lld], %.1f MB, in %s / %s / %s "
      "(gate/up/down), %.1f s to make\n",
      ggml_type_name(f.type), (long long)s.hidden, (long long)s.intermediate, (long long)s.experts,
      (long long)s.intermediate, (long long)s.hidden, (long long)s.experts,
      (ggml_nbytes(gate->t) + ggml_nbytes(up->t) + ggml_nbytes(down->t)) / 1e6,
      gate->buft_name.c_str(), up->buft_name.c_str(), down->buft_name.c_str(), Now() - t0);
  return true;
}

// Repetitions of one built case (T tokens): x from seed + tokens, then fresh logits per
// repetition from the same stream, as moeshard. Warm-up (rep -1), then timed repetitions: at
// least min_repetitions and min_time. False (with a message) when a compute fails.
bool TimeCase(const Options& o, const Shape& s, const Format& f, ggml_backend_t backend,
              const Graph& g, int64_t tokens, std::vector<double>* times, double* touched_sum) {
  const bool verbose = std::getenv("GGML_BENCH_VERBOSE") != nullptr;  // every repetition's time
  std::mt19937_64 rng(o.seed + static_cast<uint64_t>(tokens));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens * s.hidden));
  for (float& v : x) v = nd(rng);
  ggml_backend_tensor_set(g.x, x.data(), 0, ggml_nbytes(g.x));
  std::vector<float> logits(static_cast<size_t>(tokens * s.experts));
  std::vector<int32_t> ids(static_cast<size_t>(tokens * s.top_k));
  std::vector<float> rw(ids.size());
  const double start = Now();
  for (int rep = -1; rep < o.min_repetitions || Now() - start < o.min_time; ++rep) {
    for (float& v : logits) v = nd(rng);
    Route(logits, tokens, s.experts, s.top_k, &ids, &rw);
    ggml_backend_tensor_set(g.ids, ids.data(), 0, ggml_nbytes(g.ids));
    ggml_backend_tensor_set(g.weights, rw.data(), 0, ggml_nbytes(g.weights));
    const double a = Now();
    const ggml_status st = ggml_backend_graph_compute(backend, g.gf);
    const double dt = Now() - a;
    if (st != GGML_STATUS_SUCCESS) {
      std::printf("%s %s tokens %lld: ggml_backend_graph_compute failed (%d)\n", s.name, f.name,
                  (long long)tokens, static_cast<int>(st));
      return false;
    }
    if (verbose) std::printf("    rep %d: %.3f ms\n", rep, dt * 1e3);
    if (rep < 0) continue;
    times->push_back(dt);
    *touched_sum += static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size());
    if (rep > 1000) break;
  }
  return true;
}

// Every --tokens case: a result each, or a skipped line when ggml cannot build its graph.
// Returns 1 when a compute failed, else 0.
int RunTimings(const Options& o, const Shape& s, const Format& f, ggml_backend_t backend,
               const ExpertTensor& gate, const ExpertTensor& up, const ExpertTensor& down,
               std::vector<Result>* results, std::vector<std::string>* skipped) {
  int rc = 0;
  const double expert_bytes =
      static_cast<double>(ggml_nbytes(gate.t) + ggml_nbytes(up.t) + ggml_nbytes(down.t)) /
      static_cast<double>(s.experts);
  for (const int64_t tokens : o.tokens) {
    Graph g;
    std::string gwhy;
    if (!BuildGraph(backend, s, tokens, gate.t, up.t, down.t, &g, &gwhy)) {
      std::printf("%s %s tokens %lld: skipped: %s\n", s.name, f.name, (long long)tokens,
                  gwhy.c_str());
      skipped->push_back(std::string(s.name) + " " + f.name + " tokens " + std::to_string(tokens) +
                         ": " + gwhy);
      FreeGraph(&g);
      continue;
    }
    std::vector<double> times;
    double touched_sum = 0;
    const bool ok = TimeCase(o, s, f, backend, g, tokens, &times, &touched_sum);
    FreeGraph(&g);
    if (!ok) {
      rc = 1;
      continue;
    }
    Result r;
    r.shape = s.name;
    r.format = f.name;
    r.tokens = tokens;
    r.repetitions = static_cast<int>(times.size());
    r.seconds = Median(times);
    r.experts_touched = touched_sum / r.repetitions;
    r.weight_bytes = r.experts_touched * expert_bytes;
    r.flops = 2.0 * static_cast<double>(tokens * s.top_k) * 3.0 *
              static_cast<double>(s.hidden * s.intermediate);
    r.repack = gate.repack || up.repack || down.repack;
    r.buffer_types = gate.buft_name + "/" + up.buft_name + "/" + down.buft_name;
    std::printf("  %s %s tokens %lld: %.3f ms\n", s.name, f.name, (long long)tokens,
                r.seconds * 1e3);
    std::fflush(stdout);
    results->push_back(r);
  }
  return rc;
}

void PrintTable(const std::vector<Result>& results, const std::string& load_after) {
  if (results.empty()) return;
  std::printf("\nload average after: %s\n", load_after.c_str());
  std::printf(
      "\n| shape | format | tokens | experts | weights MB | time ms | reps | GB/s | GFLOP/s | "
      "buffers (gate/up/down) |\n");
  std::printf("|---|---|--:|--:|--:|--:|--:|--:|--:|---|\n");
  for (const Result& r : results) {
    std::printf("| %s | %s | %lld | %.1f | %.1f | %.3f | %d | %.1f | %.0f | %s |\n",
                r.shape.c_str(), r.format.c_str(), (long long)r.tokens, r.experts_touched,
                r.weight_bytes / 1e6, r.seconds * 1e3, r.repetitions,
                r.weight_bytes / r.seconds / 1e9, r.flops / r.seconds / 1e9,
                r.buffer_types.c_str());
  }
}

std::string ResultsJson(const Machine& m, const std::string& load_after,
                        const std::vector<Result>& results,
                        const std::vector<std::string>& skipped) {
  std::ostringstream js;
  js.precision(9);
  js << "{\n  \"machine\": {\n    \"cpu\": " << JsonString(m.cpu)
     << ",\n    \"threads\": " << m.threads
     << ",\n    \"ggml_commit\": " << JsonString(GGML_BENCH_GGML_COMMIT)
     << ",\n    \"ggml_version\": " << JsonString(ggml_version())
     << ",\n    \"openmp\": " << (m.openmp ? "true" : "false")
     << ",\n    \"loadavg_before\": " << JsonString(m.load_before)
     << ",\n    \"loadavg_after\": " << JsonString(load_after) << ",\n    \"cpu_features\": {";
  for (size_t i = 0; i < m.features.size(); ++i) {
    js << (i ? ", " : "") << JsonString(m.features[i].name) << ": "
       << (m.features[i].on ? "true" : "false");
  }
  js << "}\n  },\n  \"results\": [";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    js << (i ? "," : "") << "\n    {\"shape\": " << JsonString(r.shape)
       << ", \"format\": " << JsonString(r.format) << ", \"tokens\": " << r.tokens
       << ", \"seconds\": " << r.seconds << ", \"repetitions\": " << r.repetitions
       << ", \"repack\": " << (r.repack ? "true" : "false")
       << ", \"buffer_types\": " << JsonString(r.buffer_types)
       << ", \"experts_touched\": " << r.experts_touched << ", \"weight_bytes\": " << r.weight_bytes
       << ", \"flops\": " << r.flops << "}";
  }
  js << "\n  ],\n  \"skipped\": [";
  for (size_t i = 0; i < skipped.size(); ++i) js << (i ? ", " : "") << JsonString(skipped[i]);
  js << "]\n}\n";
  return js.str();
}

// Writes `text` to `path` through a temporary name; false (with a message) when it cannot.
bool WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    written = out.good();
  }
  if (written && std::rename(tmp.c_str(), path.c_str()) == 0) {
    std::printf("wrote %s\n", path.c_str());
    return true;
  }
  std::remove(tmp.c_str());
  std::fprintf(stderr, "ggml_moe_bench: '--json': cannot write '%s'\n", path.c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseArgs(argc, argv);
  const Shape* shape = nullptr;
  for (const Shape& s : kShapes) {
    if (o.shape == s.name) shape = &s;
  }
  const Format* format = nullptr;
  for (const Format& f : kFormats) {
    if (o.format == f.name) format = &f;
  }
  if (shape == nullptr) Usage(argv[0], "'--shape': unknown shape '" + o.shape + "'");
  if (format == nullptr)
    Usage(argv[0],
          "'--format': expected bf16, mxfp4, q4_0, q4_1, q8_0 or nvfp4, got '" + o.format + "'");
  const Shape& s = *shape;
  const Format& f = *format;
  const Machine machine = DescribeMachine(o.threads > 0 ? o.threads : OnlineCpus());
  PrintMachine(machine);

  std::vector<Result> results;
  std::vector<std::string> skipped;
  int rc = 0;
  std::string why = UnsupportedReason(s, f);
  CpuBackend cb;
  if (!InitCpuBackend(machine.threads, &cb)) {
    std::fprintf(stderr, "ggml_moe_bench: ggml_backend_cpu_init failed\n");
    return 1;
  }
  ExpertTensor gate, up, down;
  if (why.empty()) MakeExpertTensors(cb, o, s, f, &gate, &up, &down, &why);
  if (!why.empty()) {
    std::printf("%s %s: skipped: %s\n", s.name, f.name, why.c_str());
    skipped.push_back(std::string(s.name) + " " + f.name + ": " + why);
  } else if (o.check) {
    rc = RunCheck(o, s, f, cb.backend, gate, up, down);
  } else {
    rc = RunTimings(o, s, f, cb.backend, gate, up, down, &results, &skipped);
  }

  const std::string load_after = LoadAverage();
  PrintTable(results, load_after);
  if (!o.json.empty() && !o.check &&
      !WriteFileAtomically(o.json, ResultsJson(machine, load_after, results, skipped))) {
    rc = 1;
  }

  FreeExpertTensor(&gate);
  FreeExpertTensor(&up);
  FreeExpertTensor(&down);
  FreeCpuBackend(&cb);
  return rc;
}
