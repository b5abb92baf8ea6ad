#include "plan/ownership.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

namespace moeshard {
namespace {

using nlohmann::json;

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// "0-3,8,10-11" of sorted, distinct values.
std::string RangesText(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(v[i]);
    if (j > i) s += "-" + std::to_string(v[j]);
    i = j + 1;
  }
  return s.empty() ? "none" : s;
}

bool IsRouted(const TensorShard& t) { return t.category == TensorCategory::kRoutedExperts; }

// The slices the plan gives `t` on `r`: dim 0 of routed experts (the rank's expert slots, as a
// range when contiguous) and the split dimension.
std::vector<DumpSlice> PlanSlices(const RankPlan& r, const TensorShard& t) {
  std::vector<DumpSlice> out;
  if (IsRouted(t) && !r.expert_slots.empty()) {
    DumpSlice s;
    s.dim = 0;
    const std::vector<int64_t>& e = r.expert_slots;
    bool contiguous = true;
    for (size_t i = 1; i < e.size(); ++i) contiguous = contiguous && e[i] == e[i - 1] + 1;
    if (contiguous) {
      s.begin = e.front();
      s.end = e.back() + 1;
    } else {
      s.experts = e;
    }
    out.push_back(s);
  }
  if (t.shard_dim >= 0) out.push_back(DumpSlice{t.shard_dim, t.shard_begin, t.shard_end, {}});
  return out;
}

std::vector<int64_t> PlanPadding(const TensorShard& t) {
  std::vector<int64_t> p(t.padded_shape.size(), 0);
  for (size_t i = 0; i < p.size() && i < t.local_shape.size(); ++i) {
    p[i] = t.padded_shape[i] - t.local_shape[i];
  }
  return p;
}

json SliceToJson(const DumpSlice& s) {
  if (!s.experts.empty()) return json{{"dim", s.dim}, {"experts", s.experts}};
  return json{{"dim", s.dim}, {"begin", s.begin}, {"end", s.end}};
}

json OwnedTensorJson(const RankPlan& r, const TensorShard& t) {
  json j{{"name", t.name},
         {"category", TensorCategoryName(t.category)},
         {"dtype", std::string(DTypeName(t.dtype))},
         {"logical_shape", t.logical_shape},
         {"local_shape", t.local_shape},
         {"padded_shape", t.padded_shape},
         {"padding", PlanPadding(t)},
         {"padding_bytes", t.padding_bytes}};
  json slices = json::array();
  for (const DumpSlice& s : PlanSlices(r, t)) slices.push_back(SliceToJson(s));
  j["slices"] = slices;
  if (t.shard_dim >= 0 && t.sections > 1) j["sections"] = t.sections;
  if (!t.section_sizes.empty()) j["section_sizes"] = t.section_sizes;
  if (t.split_extent > 0) j["split_extent"] = t.split_extent;
  if (!t.tied_source.empty()) j["tied_source"] = t.tied_source;
  if (!t.layers.empty()) j["layers"] = t.layers.vec();
  return j;
}

}  // namespace

std::string OwnershipMapJson(const ShardPlan& plan) {
  const ResolvedTopology& t = plan.topology;
  json j{{"format", "moeshard-ownership"},
         {"version", 1},
         {"model", plan.model.name},
         {"family", std::string(plan.model.family_name())},
         {"backend", plan.backend.name},
         {"padding_policy", PaddingPolicyName(plan.options.padding)},
         {"num_experts", plan.model.num_experts},
         {"num_slots", plan.num_slots},
         {"topology",
          {{"label", t.Label()},
           {"world", t.world},
           {"tp", t.tp},
           {"dp", t.dp},
           {"pp", t.pp},
           {"pcp", t.pcp},
           {"moe_tp", t.moe_tp},
           {"moe_ep", t.moe_ep}}}};
  json ranks = json::array();
  for (const RankPlan& r : plan.ranks) {
    const RankCoords& c = r.coords;
    json rj{{"rank", c.rank},
            {"coords",
             {{"pp_stage", c.pp_stage},
              {"dp_rank", c.dp_rank},
              {"pcp_rank", c.pcp_rank},
              {"tp_rank", c.tp_rank},
              {"moe_tp_rank", c.moe_tp_rank},
              {"moe_ep_rank", c.moe_ep_rank}}},
            {"expert_slots", r.expert_slots}};
    json tensors = json::array();
    for (const TensorShard& s : r.tensors) tensors.push_back(OwnedTensorJson(r, s));
    rj["tensors"] = std::move(tensors);
    ranks.push_back(std::move(rj));
  }
  j["ranks"] = std::move(ranks);
  return j.dump(1) + "\n";
}

// ---------------------------------------------------------------------------------------------
// Parsing the dump.
namespace {

Result<DumpSlice> ParseSlice(const json& s, const std::string& where) {
  if (!s.is_object() || !s.contains("dim") || !s["dim"].is_number_integer()) {
    return InvalidArgumentError(
        fmt::format("{}: expected a slice {{\"dim\", \"begin\", \"end\"}} or {{\"dim\", "
                    "\"experts\"}}, got {}",
                    where, s.dump()));
  }
  DumpSlice out;
  out.dim = s["dim"].get<int>();
  if (s.contains("experts")) {
    out.experts = s["experts"].get<std::vector<int64_t>>();
    return out;
  }
  if (!s.contains("begin") || !s.contains("end")) {
    return InvalidArgumentError(fmt::format("{}: slice {} lacks begin or end", where, s.dump()));
  }
  out.begin = s["begin"].get<int64_t>();
  out.end = s["end"].get<int64_t>();
  return out;
}

Result<DumpParam> ParseParam(const json& p, const std::string& where) {
  if (!p.is_object() || !p.contains("name") || !p.contains("shape") || !p.contains("dtype")) {
    return InvalidArgumentError(fmt::format(
        "{}: expected {{\"name\", \"shape\", \"dtype\"}}, got {}", where, p.dump().substr(0, 200)));
  }
  DumpParam out;
  out.name = p["name"].get<std::string>();
  out.shape = p["shape"].get<std::vector<int64_t>>();
  out.dtype = p["dtype"].get<std::string>();
  if (p.contains("slices") && !p["slices"].is_null()) {
    out.has_slices = true;
    for (const json& s : p["slices"]) {
      MOESHARD_ASSIGN_OR_RETURN(DumpSlice slice, ParseSlice(s, where + " '" + out.name + "'"));
      out.slices.push_back(std::move(slice));
    }
  }
  if (p.contains("padding") && !p["padding"].is_null()) {
    out.has_padding = true;
    out.padding = p["padding"].get<std::vector<int64_t>>();
    if (out.padding.size() != out.shape.size()) {
      return InvalidArgumentError(
          fmt::format("{} '{}': padding {} has {} entries, expected one per dim of shape {}", where,
                      out.name, ShapeText(out.padding), out.padding.size(), ShapeText(out.shape)));
    }
  }
  return out;
}

Status ParseRankRecord(const json& r, int64_t world, const std::string& where, EngineDump& dump) {
  if (!r.is_object() || !r.contains("rank") || !r.contains("params") || !r["params"].is_array()) {
    return InvalidArgumentError(
        fmt::format("{}: expected a rank record {{\"rank\", \"params\": [...]}}", where));
  }
  DumpRank rank;
  rank.rank = r["rank"].get<int64_t>();
  const std::string rw = fmt::format("{} rank {}", where, rank.rank);
  for (const json& p : r["params"]) {
    MOESHARD_ASSIGN_OR_RETURN(DumpParam param, ParseParam(p, rw));
    rank.params.push_back(std::move(param));
  }
  if (world > 0) {
    if (dump.world > 0 && dump.world != world) {
      return InvalidArgumentError(fmt::format(
          "{}: world {} differs from the {} of the dump's other records", rw, world, dump.world));
    }
    dump.world = world;
  }
  dump.ranks.push_back(std::move(rank));
  return Status::Ok();
}

Status ParseDumpObject(const json& j, const std::string& where, EngineDump& dump) {
  const int64_t world = j.contains("world") ? j["world"].get<int64_t>() : 0;
  if (j.contains("engine") && j["engine"].is_string()) dump.engine = j["engine"].get<std::string>();
  if (j.contains("ranks")) {
    for (const json& r : j["ranks"])
      MOESHARD_RETURN_IF_ERROR(ParseRankRecord(r, world, where, dump));
    if (world > 0) dump.world = world;
    return Status::Ok();
  }
  return ParseRankRecord(j, world, where, dump);
}

}  // namespace

Status ParseEngineDump(const std::string& text, const std::string& source, EngineDump& dump) {
  try {
    json whole = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!whole.is_discarded()) return ParseDumpObject(whole, source, dump);
    // JSON lines: one rank record per line.
    std::istringstream in(text);
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = fmt::format("{}:{}", source, line_no);
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded()) {
        return InvalidArgumentError(fmt::format(
            "{}: not JSON (expected a dump object or one rank record per line)", where));
      }
      MOESHARD_RETURN_IF_ERROR(ParseDumpObject(j, where, dump));
    }
    return Status::Ok();
  } catch (const json::exception& e) {
    return InvalidArgumentError(fmt::format("{}: malformed dump: {}", source, e.what()));
  }
}

}  // namespace moeshard

// ---------------------------------------------------------------------------------------------
// Comparing the dump with the plan.
namespace moeshard {
namespace {

// torch spellings ("bfloat16", "torch.float8_e4m3fn") and safetensors ones ("BF16").
std::optional<DType> ParseDumpDType(std::string name) {
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  static const std::map<std::string, DType> kTorch = {{"bfloat16", DType::kBF16},
                                                      {"float16", DType::kF16},
                                                      {"half", DType::kF16},
                                                      {"float32", DType::kF32},
                                                      {"float", DType::kF32},
                                                      {"float64", DType::kF64},
                                                      {"double", DType::kF64},
                                                      {"float8_e4m3fn", DType::kF8E4M3},
                                                      {"float8_e5m2", DType::kF8E5M2},
                                                      {"float8_e4m3fnuz", DType::kF8E4M3Fnuz},
                                                      {"float8_e5m2fnuz", DType::kF8E5M2Fnuz},
                                                      {"float8_e8m0fnu", DType::kF8E8M0},
                                                      {"uint8", DType::kU8},
                                                      {"int8", DType::kI8},
                                                      {"int16", DType::kI16},
                                                      {"uint16", DType::kU16},
                                                      {"int32", DType::kI32},
                                                      {"int", DType::kI32},
                                                      {"uint32", DType::kU32},
                                                      {"int64", DType::kI64},
                                                      {"long", DType::kI64},
                                                      {"uint64", DType::kU64},
                                                      {"bool", DType::kBool}};
  auto it = kTorch.find(name);
  if (it != kTorch.end()) return it->second;
  return ParseDType(name);
}

// A dump or plan name reduced to a lookup key and its layer: the first "layers.<n>." becomes
// "layers.{layer}."; routed experts reduce to vLLM's fused leaf ("experts.w13_weight"), so any
// module prefix matches.
struct DumpNameKey {
  std::string key;
  int64_t layer = -1;
};

std::string RoutedKey(const std::string& name) {
  for (const char* leaf : {".experts.w13_", ".experts.w2_"}) {
    const size_t at = name.rfind(leaf);
    if (at != std::string::npos) return "experts." + name.substr(at + 9);
  }
  return "";
}

DumpNameKey KeyOfDumpName(std::string name) {
  if (name.rfind("module.", 0) == 0) name = name.substr(7);  // DistributedDataParallel
  DumpNameKey k;
  const size_t at = name.find("layers.");
  if (at != std::string::npos && (at == 0 || name[at - 1] == '.')) {
    size_t end = at + 7;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end > at + 7 && end < name.size() && name[end] == '.') {
      k.layer = std::stoll(name.substr(at + 7, end - at - 7));
      name = name.substr(0, at + 7) + "{layer}" + name.substr(end);
    }
  }
  const std::string routed = RoutedKey(name);
  k.key = routed.empty() ? name : routed;
  return k;
}

std::string SliceText(const DumpSlice& s) {
  if (!s.experts.empty()) return fmt::format("dim {} experts {}", s.dim, RangesText(s.experts));
  return fmt::format("dim {} [{}:{}){}", s.dim, s.begin, s.end, s.end <= s.begin ? " (empty)" : "");
}

int64_t SliceCount(const DumpSlice& s) {
  return s.experts.empty() ? std::max<int64_t>(0, s.end - s.begin)
                           : static_cast<int64_t>(s.experts.size());
}

bool SameSlice(const DumpSlice& a, const DumpSlice& b) {
  auto ids = [](const DumpSlice& s) {
    if (!s.experts.empty()) return s.experts;
    std::vector<int64_t> v;
    for (int64_t i = s.begin; i < s.end; ++i) v.push_back(i);
    return v;
  };
  if (a.dim != b.dim) return false;
  if (a.experts.empty() && b.experts.empty()) return a.begin == b.begin && a.end == b.end;
  return ids(a) == ids(b);
}

const DumpSlice* FindSlice(const std::vector<DumpSlice>& slices, int dim) {
  for (const DumpSlice& s : slices) {
    if (s.dim == dim) return &s;
  }
  return nullptr;
}

// Differences keyed by everything but the layer, so one engine bug repeated over 60 layers is
// one line naming the layers.
class DiffSet {
 public:
  void Add(const std::string& rule, const std::string& tensor, int64_t layer,
           const std::vector<int64_t>& ranks, const std::string& expected,
           const std::string& actual) {
    Entry& e = entries_[{rule, tensor, expected, actual}];
    if (layer >= 0) e.layers.insert(layer);
    e.ranks.insert(ranks.begin(), ranks.end());
    if (e.order < 0) e.order = next_++;
  }
  std::vector<OwnershipDiff> Take() const {
    std::vector<std::pair<int64_t, OwnershipDiff>> out;
    for (const auto& [k, e] : entries_) {
      OwnershipDiff d;
      d.rule = std::get<0>(k);
      d.tensor = std::get<1>(k);
      if (!e.layers.empty()) {
        d.tensor += fmt::format(" (layer{} {})", e.layers.size() == 1 ? "" : "s",
                                RangesText({e.layers.begin(), e.layers.end()}));
      }
      d.ranks = RangesText({e.ranks.begin(), e.ranks.end()});
      d.expected = std::get<2>(k);
      d.actual = std::get<3>(k);
      out.emplace_back(e.order, std::move(d));
    }
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<OwnershipDiff> diffs;
    for (auto& [order, d] : out) diffs.push_back(std::move(d));
    return diffs;
  }

 private:
  struct Entry {
    std::set<int64_t> layers, ranks;
    int64_t order = -1;
  };
  std::map<std::tuple<std::string, std::string, std::string, std::string>, Entry> entries_;
  int64_t next_ = 0;
};

// Who holds what of one concrete tensor (a layer's): experts (routed) and rows of the split dim.
struct Holding {
  int64_t rank = 0;
  std::vector<int64_t> experts;  // global ids; {-1} for a tensor without an expert dim
  int64_t begin = 0, end = 1;    // rows of the plan's split dim (first block); [0, 1) unsplit
  bool operator==(const Holding&) const = default;
};

struct Coverage {
  const TensorShard* plan_tensor = nullptr;
  std::vector<Holding> plan, dump;
  bool undeclared = false;
};

Holding PlanHolding(const RankPlan& r, const TensorShard& t) {
  Holding h;
  h.rank = r.coords.rank;
  h.experts = IsRouted(t) ? r.expert_slots : std::vector<int64_t>{-1};
  if (t.shard_dim >= 0) {
    h.begin = t.shard_begin;
    h.end = t.shard_end;
  }
  return h;
}

// What the dump says rank `r` holds, from its declared slices (the plan's where it declares
// none for a dimension).
Holding DumpHolding(const RankPlan& r, const TensorShard& t, const DumpParam& p) {
  Holding h = PlanHolding(r, t);
  if (const DumpSlice* s = IsRouted(t) ? FindSlice(p.slices, 0) : nullptr) {
    h.experts = s->experts;
    if (s->experts.empty()) {
      for (int64_t e = s->begin; e < s->end; ++e) h.experts.push_back(e);
    }
  }
  if (t.shard_dim >= 0) {
    if (const DumpSlice* s = FindSlice(p.slices, t.shard_dim)) {
      h.begin = s->begin;
      h.end = std::max(s->begin, s->end);
    }
  }
  return h;
}

struct Segment {
  int64_t begin, end, expected, actual;
  std::set<int64_t> expected_ranks, actual_ranks;
};

// Rows of one expert where the dump's holder count differs from the plan's.
std::vector<Segment> CountDifferences(const std::vector<std::pair<const Holding*, bool>>& hs) {
  std::set<int64_t> cuts;
  for (const auto& [h, dump] : hs) {
    cuts.insert(h->begin);
    cuts.insert(h->end);
  }
  std::vector<Segment> out;
  const std::vector<int64_t> c(cuts.begin(), cuts.end());
  for (size_t i = 0; i + 1 < c.size(); ++i) {
    Segment s{c[i], c[i + 1], 0, 0, {}, {}};
    for (const auto& [h, dump] : hs) {
      if (h->begin > s.begin || h->end < s.end) continue;
      (dump ? s.actual : s.expected) += 1;
      (dump ? s.actual_ranks : s.expected_ranks).insert(h->rank);
    }
    if (s.expected == s.actual) continue;  // held as often, by other ranks: the slice rule says so
    if (!out.empty() && out.back().end == s.begin && out.back().expected == s.expected &&
        out.back().actual == s.actual && out.back().actual_ranks == s.actual_ranks) {
      out.back().end = s.end;
      out.back().expected_ranks.insert(s.expected_ranks.begin(), s.expected_ranks.end());
    } else {
      out.push_back(std::move(s));
    }
  }
  return out;
}

std::string TimesText(int64_t n) { return n == 1 ? "once" : fmt::format("{} times", n); }

void CompareCoverage(const std::string& name, int64_t layer, const Coverage& cov, DiffSet& diffs) {
  const TensorShard& t = *cov.plan_tensor;
  // expert id -> (holding, from the dump?)
  std::map<int64_t, std::vector<std::pair<const Holding*, bool>>> by_expert;
  for (const Holding& h : cov.plan) {
    for (int64_t e : h.experts) by_expert[e].push_back({&h, false});
  }
  for (const Holding& h : cov.dump) {
    for (int64_t e : h.experts) by_expert[e].push_back({&h, true});
  }
  // Group experts with the same differences into one report line.
  struct Key {
    int64_t begin, end, expected, actual;
    std::vector<int64_t> ranks_expected, ranks_actual;
    auto operator<=>(const Key&) const = default;  // NOLINT(modernize-use-nullptr): tidy 14 bug
  };
  std::map<Key, std::vector<int64_t>> grouped;
  for (const auto& [expert, hs] : by_expert) {
    for (const Segment& s : CountDifferences(hs)) {
      grouped[Key{s.begin,
                  s.end,
                  s.expected,
                  s.actual,
                  {s.expected_ranks.begin(), s.expected_ranks.end()},
                  {s.actual_ranks.begin(), s.actual_ranks.end()}}]
          .push_back(expert);
    }
  }
  for (const auto& [k, experts] : grouped) {
    std::string where = experts.front() >= 0 ? "experts " + RangesText(experts) : "";
    if (t.shard_dim >= 0) {
      where += fmt::format("{}dim {} rows [{}:{})", where.empty() ? "" : ", ", t.shard_dim, k.begin,
                           k.end);
    }
    const std::string expected =
        fmt::format("{} held {} across ranks (once per replica group; plan: rank{} {})", where,
                    TimesText(k.expected), k.ranks_expected.size() == 1 ? "" : "s",
                    RangesText(k.ranks_expected));
    const std::string actual =
        k.ranks_actual.empty()
            ? "held by no rank"
            : fmt::format("held {} (rank{} {})", TimesText(k.actual),
                          k.ranks_actual.size() == 1 ? "" : "s", RangesText(k.ranks_actual));
    std::vector<int64_t> ranks = k.ranks_expected;
    ranks.insert(ranks.end(), k.ranks_actual.begin(), k.ranks_actual.end());
    diffs.Add("coverage", name, layer, ranks, expected, actual);
  }
}

}  // namespace
}  // namespace moeshard

namespace moeshard {
namespace {

// The per-parameter rules: dtype, shape, padding, slice, data.
void CheckParam(const RankPlan& r, const TensorShard& t, const DumpParam& p, int64_t layer,
                DiffSet& diffs) {
  const std::vector<int64_t> rk{r.coords.rank};
  const std::optional<DType> dt = ParseDumpDType(p.dtype);
  if (!dt || *dt != t.dtype) {
    diffs.Add("dtype", t.name, layer, rk, std::string(DTypeName(t.dtype)),
              dt ? std::string(DTypeName(*dt)) : "'" + p.dtype + "' (not a known dtype)");
  }
  if (p.shape != t.padded_shape) {
    diffs.Add(
        "shape", t.name, layer, rk,
        fmt::format("{} (local {} padded)", ShapeText(t.padded_shape), ShapeText(t.local_shape)),
        ShapeText(p.shape));
  }
  const std::vector<int64_t> plan_padding = PlanPadding(t);
  if (p.has_padding && p.padding != plan_padding) {
    diffs.Add("padding", t.name, layer, rk, fmt::format("padded tail {}", ShapeText(plan_padding)),
              fmt::format("padded tail {}{}", ShapeText(p.padding),
                          p.padding < plan_padding ? " (padding held as data)" : ""));
  }
  if (!p.has_slices) return;
  const std::vector<DumpSlice> plan_slices = PlanSlices(r, t);
  for (const DumpSlice& ps : plan_slices) {
    const DumpSlice* ds = FindSlice(p.slices, ps.dim);
    if (ds == nullptr) {
      diffs.Add("slice", t.name, layer, rk, SliceText(ps),
                "no slice declared for dim " + std::to_string(ps.dim));
    } else if (!SameSlice(ps, *ds)) {
      diffs.Add("slice", t.name, layer, rk, SliceText(ps), SliceText(*ds));
    }
  }
  for (const DumpSlice& ds : p.slices) {
    const DumpSlice* ps = FindSlice(plan_slices, ds.dim);
    const bool whole = ds.dim >= 0 && static_cast<size_t>(ds.dim) < t.logical_shape.size() &&
                       ds.experts.empty() && ds.begin == 0 && ds.end == t.logical_shape[ds.dim];
    if (ps == nullptr && !whole) {
      diffs.Add("slice", t.name, layer, rk, fmt::format("dim {} whole (not split)", ds.dim),
                SliceText(ds));
    }
    if (!p.has_padding || ds.dim < 0 || static_cast<size_t>(ds.dim) >= p.shape.size()) continue;
    // The rank's data along the dim: the slice, once per section (gated w13: gate and up).
    const int64_t plan_count = ps ? SliceCount(*ps) : t.local_shape[ds.dim];
    const int64_t per_row = plan_count > 0 ? t.local_shape[ds.dim] / plan_count : 1;
    const int64_t data = SliceCount(ds) * per_row;
    const int64_t held = p.shape[ds.dim] - p.padding[ds.dim];
    if (held != data) {
      diffs.Add("data", t.name, layer, rk,
                fmt::format("dim {}: {} entries of data from slice {}, the rest declared padding",
                            ds.dim, data, SliceText(ds)),
                fmt::format("{} entries held as data ({} allocated, {} declared padding)", held,
                            p.shape[ds.dim], p.padding[ds.dim]));
    }
  }
}

// Per rank: the plan's tensors by lookup key, and which of their layers the dump matched.
struct RankIndex {
  std::unordered_map<std::string, size_t> exact;  // tensors without layers, by name
  // Layered tensors by DumpNameKey::key (one name can recur with other layers: Kimi-K3's
  // g_proj of its KDA and its MLA layers).
  std::unordered_map<std::string, std::vector<size_t>> by_key;
  std::vector<std::vector<char>> matched;  // [tensor][layer position]
};

RankIndex IndexRank(const RankPlan& r) {
  RankIndex idx;
  idx.matched.resize(r.tensors.size());
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const TensorShard& t = r.tensors[i];
    idx.matched[i].assign(std::max<size_t>(1, t.layers.size()), 0);
    if (t.layers.empty()) {
      idx.exact[t.name] = i;
    } else {
      const std::string routed = IsRouted(t) ? RoutedKey(t.name) : "";
      idx.by_key[routed.empty() ? t.name : routed].push_back(i);
    }
  }
  return idx;
}

// Finds the plan tensor and the layer position a dump name stands for on one rank.
std::optional<std::pair<size_t, size_t>> Lookup(const RankPlan& r, const RankIndex& idx,
                                                const std::string& name, int64_t* layer) {
  *layer = -1;
  if (auto it = idx.exact.find(name); it != idx.exact.end())
    return std::pair{it->second, size_t{0}};
  const DumpNameKey k = KeyOfDumpName(name);
  auto it = idx.by_key.find(k.key);
  if (it == idx.by_key.end() || k.layer < 0) return std::nullopt;
  for (size_t i : it->second) {
    const std::vector<int64_t>& layers = r.tensors[i].layers.vec();
    auto at = std::find(layers.begin(), layers.end(), k.layer);
    if (at == layers.end()) continue;
    *layer = k.layer;
    return std::pair{i, static_cast<size_t>(at - layers.begin())};
  }
  return std::nullopt;
}

std::string Concrete(const TensorShard& t, int64_t layer) {
  if (layer < 0) return t.name;
  std::string n = t.name;
  const size_t at = n.find("{layer}");
  if (at != std::string::npos) n.replace(at, 7, std::to_string(layer));
  return n;
}

void CheckWorld(const ShardPlan& plan, const EngineDump& dump, DiffSet& diffs,
                std::vector<const DumpRank*>& by_rank) {
  const int64_t world = plan.topology.world;
  by_rank.assign(world, nullptr);
  if (dump.world != 0 && dump.world != world) {
    diffs.Add("world", "(dump)", -1, {}, fmt::format("world {} ({})", world, plan.topology.Label()),
              fmt::format("world {}", dump.world));
  }
  for (const DumpRank& r : dump.ranks) {
    if (r.rank < 0 || r.rank >= world) {
      diffs.Add("world", "(dump)", -1, {r.rank}, fmt::format("ranks 0-{}", world - 1),
                fmt::format("rank {}", r.rank));
    } else if (by_rank[r.rank] != nullptr) {
      diffs.Add("world", "(dump)", -1, {r.rank}, "one record per rank", "two records");
    } else {
      by_rank[r.rank] = &r;
    }
  }
  for (int64_t r = 0; r < world; ++r) {
    if (by_rank[r] == nullptr) {
      diffs.Add("world", "(dump)", -1, {r}, "a record for every rank", "no record");
    }
  }
}

}  // namespace

OwnershipReport CheckOwnership(const ShardPlan& plan, const EngineDump& dump) {
  OwnershipReport report;
  DiffSet diffs;
  std::vector<const DumpRank*> by_rank;
  CheckWorld(plan, dump, diffs, by_rank);
  std::map<std::string, Coverage> coverage;  // by concrete name
  std::set<std::string> absent;
  for (const RankPlan& r : plan.ranks) {
    const DumpRank* d = by_rank[r.coords.rank];
    if (d == nullptr) continue;
    RankIndex idx = IndexRank(r);
    for (const DumpParam& p : d->params) {
      int64_t layer = -1;
      const auto hit = Lookup(r, idx, p.name, &layer);
      if (!hit) {
        report.unknown_params.push_back(fmt::format("rank {}: {}", r.coords.rank, p.name));
        continue;
      }
      const TensorShard& t = r.tensors[hit->first];
      idx.matched[hit->first][hit->second] = 1;
      ++report.params_matched;
      CheckParam(r, t, p, layer, diffs);
      if (!IsRouted(t) && t.shard_dim < 0) continue;
      Coverage& c = coverage[Concrete(t, layer)];
      c.plan_tensor = &t;
      c.undeclared = c.undeclared || !p.has_slices;
      c.dump.push_back(DumpHolding(r, t, p));
    }
    for (size_t i = 0; i < r.tensors.size(); ++i) {
      const TensorShard& t = r.tensors[i];
      const std::vector<int64_t>& layers = t.layers.vec();
      for (size_t l = 0; l < idx.matched[i].size(); ++l) {
        if (idx.matched[i][l]) continue;
        if (IsRouted(t)) {
          diffs.Add("missing", t.name, layers.empty() ? -1 : layers[l], {r.coords.rank}, "present",
                    "absent from the dump");
        } else {
          absent.insert(t.name);
        }
      }
    }
  }
  // The plan's holders of every concrete tensor the dump holds somewhere.
  for (const RankPlan& r : plan.ranks) {
    for (const TensorShard& t : r.tensors) {
      if (!IsRouted(t) && t.shard_dim < 0) continue;
      for (int64_t layer : t.layers.empty() ? std::vector<int64_t>{-1} : t.layers.vec()) {
        auto it = coverage.find(Concrete(t, layer));
        if (it != coverage.end()) it->second.plan.push_back(PlanHolding(r, t));
      }
    }
  }
  for (const auto& [name, c] : coverage) {
    if (c.undeclared) {
      ++report.coverage_undeclared;
      continue;
    }
    ++report.coverage_checked;
    if (c.dump == c.plan) continue;
    const DumpNameKey k = KeyOfDumpName(name);
    CompareCoverage(c.plan_tensor->name, k.layer, c, diffs);
  }
  report.diffs = diffs.Take();
  report.absent_tensors.assign(absent.begin(), absent.end());
  return report;
}

}  // namespace moeshard
