// The registry of weight sources, `--load-format`'s one parser, and the window engine every
// kCheckpointTensors source shares: see weights/tensor_source.h.
#include "weights/tensor_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <unordered_set>

namespace moeshard {
namespace internal {
namespace {

// Work items are at most this many destination bytes, so a 1 GiB embedding spreads over all
// threads and progress moves smoothly; 4 MiB keeps the per-item overhead negligible.
constexpr int64_t kItemBytes = int64_t{4} << 20;

struct Item {
  int tensor = 0;
  int piece = 0;
  int64_t row_begin = 0;  // window rows [row_begin, row_end)
  int64_t row_end = 0;
};

std::vector<Item> SplitItems(const std::vector<MappedTensor>& tensors) {
  std::vector<Item> items;
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (size_t p = 0; p < tensors[t].pieces.size(); ++p) {
      const Piece& piece = tensors[t].pieces[p];
      if (piece.bytes() == 0) continue;
      const int64_t rows_per =
          std::max<int64_t>(1, kItemBytes / std::max<int64_t>(1, piece.cols()));
      for (int64_t r = piece.window.row_begin; r < piece.window.row_end; r += rows_per) {
        items.push_back({static_cast<int>(t), static_cast<int>(p), r,
                         std::min(piece.window.row_end, r + rows_per)});
      }
    }
  }
  return items;
}

// Writes window rows [a, b) (already in `rows`, `cols` bytes each, contiguous) transposed into
// the destination: window element (r, c) -> dst element (c, r).
void ScatterTransposed(const Piece& p, int64_t a, int64_t b, const std::byte* rows,
                       std::byte* dst) {
  const int64_t es = p.element_bytes, cols = p.cols(), n = cols / es;
  for (int64_t r = a; r < b; ++r) {
    const std::byte* src = rows + (r - a) * cols;
    std::byte* d = dst + p.dst_offset + (r - p.window.row_begin) * es;
    for (int64_t c = 0; c < n; ++c) {
      std::memcpy(d + c * p.window.dst_row_stride, src + c * es, static_cast<size_t>(es));
    }
  }
}

// "auto, dummy, safetensors, presharded"
std::string AutoAndNames(const std::vector<const TensorSourceFormat*>& formats) {
  std::string names = "auto";
  for (const TensorSourceFormat* f : formats) names += fmt::format(", {}", f->name);
  return names;
}

// The source auto picks for `checkpoint`, over every registered source (a command that cannot
// take it says so afterwards, naming it).
const TensorSourceFormat* AutoFormat(const std::string& checkpoint) {
  const TensorSourceFormat* fallback = nullptr;
  for (const TensorSourceFormat& f : TensorSourceFormats()) {
    if (!f.auto_claims(checkpoint)) continue;
    if (!f.auto_fallback) return &f;
    if (fallback == nullptr) fallback = &f;
  }
  return fallback;
}

}  // namespace

const std::vector<TensorSourceFormat>& TensorSourceFormats() {
  // In the order messages and help list them. A new source: one line here.
  static const std::vector<TensorSourceFormat> kFormats = {
      DummySourceFormat(),
      CheckpointSourceFormat(),
      PreshardedSourceFormat(),
  };
  return kFormats;
}

const TensorSourceFormat* FindTensorSourceFormat(std::string_view name) {
  for (const TensorSourceFormat& f : TensorSourceFormats()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::vector<const TensorSourceFormat*> TensorSourceFormatsIn(LoadFormatScope scope) {
  std::vector<const TensorSourceFormat*> out;
  for (const TensorSourceFormat& f : TensorSourceFormats()) {
    switch (scope) {
      case LoadFormatScope::kAny: out.push_back(&f); break;
      case LoadFormatScope::kCheckpointTensors:
        if (f.layout == SourceLayout::kCheckpointTensors) out.push_back(&f);
        break;
    }
  }
  return out;
}

std::string FormatNames(const std::vector<const TensorSourceFormat*>& formats) {
  std::string out;
  for (size_t i = 0; i < formats.size(); ++i) {
    out += fmt::format("{}{}",
                       i == 0                    ? ""
                       : i + 1 == formats.size() ? " or "
                                                 : ", ",
                       formats[i]->name);
  }
  return out;
}

std::string RankTag(const ShardPlan& plan, int64_t rank) {
  return fmt::format("[rank {}/{}]", rank, plan.topology.world);
}

Status ParallelForStatus(ThreadPool& pool, int64_t n, const std::function<Status(int64_t)>& fn) {
  std::mutex mu;
  Status first;
  std::atomic<bool> failed{false};
  pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end && !failed.load(std::memory_order_relaxed); ++i) {
      Status s;
      try {
        s = fn(i);
      } catch (const std::exception& e) {
        s = InternalError(e.what());
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
        failed = true;
      }
    }
  });
  return first;
}

Result<FillStats> WindowSource::Fill(const RankFill& fill) const {
  const std::vector<MappedTensor>& tensors = *fill.tensors;
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<WindowReader> reader, OpenRank(fill));
  FillStats stats;
  std::unordered_set<std::string_view> distinct;
  for (const MappedTensor& t : tensors) {
    for (const SourceTensorSpec& spec : t.sources) distinct.insert(spec.name);
  }
  stats.num_source_tensors = static_cast<int64_t>(distinct.size());
  const std::vector<Item> items = SplitItems(tensors);
  const std::string tag = RankTag(*fill.plan, fill.rank);
  MOESHARD_RETURN_IF_ERROR(
      ParallelForStatus(*fill.pool, static_cast<int64_t>(items.size()), [&](int64_t k) -> Status {
        const Item& it = items[static_cast<size_t>(k)];
        const MappedTensor& t = tensors[static_cast<size_t>(it.tensor)];
        const Piece& p = t.pieces[static_cast<size_t>(it.piece)];
        std::byte* base = fill.dst[static_cast<size_t>(it.tensor)];
        const size_t ti = static_cast<size_t>(it.tensor);
        Status s;
        if (p.transpose) {
          std::vector<std::byte> tmp(static_cast<size_t>((it.row_end - it.row_begin) * p.cols()));
          s = reader->ReadRows(ti, p, it.row_begin, it.row_end, tmp.data(), p.cols());
          if (s.ok()) ScatterTransposed(p, it.row_begin, it.row_end, tmp.data(), base);
        } else {
          std::byte* out =
              base + p.dst_offset + (it.row_begin - p.window.row_begin) * p.window.dst_row_stride;
          s = reader->ReadRows(ti, p, it.row_begin, it.row_end, out, p.window.dst_row_stride);
        }
        if (!s.ok()) return s.WithContext(fmt::format("{} load: '{}'", tag, t.name));
        fill.report((it.row_end - it.row_begin) * p.cols());
        return Status::Ok();
      }));
  stats.bytes_read = reader->bytes_read();
  return stats;
}

}  // namespace internal

Result<std::string> ParseLoadFormat(const std::string& load_format, const std::string& checkpoint,
                                    LoadFormatScope scope) {
  using internal::TensorSourceFormat;
  const std::vector<const TensorSourceFormat*> allowed = internal::TensorSourceFormatsIn(scope);
  const std::string names = internal::AutoAndNames(allowed);
  const bool is_auto = load_format == "auto" || load_format.empty();
  const TensorSourceFormat* format =
      is_auto ? internal::AutoFormat(checkpoint) : internal::FindTensorSourceFormat(load_format);
  if (format == nullptr) {
    return InvalidArgumentError(
        fmt::format("'--load-format {}': expected {}", is_auto ? "auto" : load_format, names));
  }
  if (std::find(allowed.begin(), allowed.end(), format) == allowed.end()) {
    return InvalidArgumentError(
        fmt::format("'--load-format {}': this command reads {}, not {} (--checkpoint {})",
                    is_auto ? "auto" : load_format, names, format->name,
                    checkpoint.empty() ? "not given" : checkpoint));
  }
  if (!format->reads_checkpoint && !checkpoint.empty()) {
    return InvalidArgumentError(fmt::format(
        "'--load-format {}': expected no --checkpoint, got '{}'", format->name, checkpoint));
  }
  if (format->reads_checkpoint && checkpoint.empty()) {
    return InvalidArgumentError(
        fmt::format("'--load-format {}': expected --checkpoint DIR", format->name));
  }
  return std::string(format->name);
}

std::string LoadFormatHelp(LoadFormatScope scope) {
  const std::vector<const internal::TensorSourceFormat*> formats =
      internal::TensorSourceFormatsIn(scope);
  // "auto (default: dummy without --checkpoint, presharded for ..., else safetensors), dummy, ..."
  std::string rules, fallbacks, names;
  for (const internal::TensorSourceFormat* f : formats) {
    std::string& list = f->auto_fallback ? fallbacks : rules;
    list += fmt::format("{}{}", list.empty() ? "" : f->auto_fallback ? " or " : ", ", f->auto_help);
    names += fmt::format(", {}", f->name);
  }
  if (!fallbacks.empty()) rules += fmt::format("{}else {}", rules.empty() ? "" : ", ", fallbacks);
  return fmt::format("auto (default: {}){}", rules, names);
}

std::string DescribeLoadSource(const LoadOptions& options) {
  const internal::TensorSourceFormat* f = internal::FindTensorSourceFormat(options.source);
  return f != nullptr ? f->describe(options) : fmt::format("unknown source '{}'", options.source);
}

}  // namespace moeshard
