// The safetensors checkpoint source (`--load-format safetensors`): a Hugging Face checkpoint (one
// file, a directory or an index), each window read from its stored tensor -- converted on the way
// where the format stores it otherwise (quant_layouts.h) -- and nothing else read.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_set>

#include "moeshard/weights/checkpoint.h"
#include "weights/quant_layouts.h"
#include "weights/tensor_source.h"
#include "weights/weights_internal.h"

namespace moeshard::internal {
namespace {

using weights_internal::FormatDims;

bool IsOneValue(const std::vector<int64_t>& shape) {
  return shape.empty() || shape == std::vector<int64_t>{1};
}

// The stored tensor `got` holds `want`'s bytes: the same dtype and shape, or a spelling of them
// real checkpoints use (see CheckCheckpointTensor).
bool Compatible(const SourceTensorSpec& want, const TensorInfo& got) {
  if (got.dtype == want.dtype && got.shape == want.shape) return true;
  // One value stored as a scalar [] where [1] is expected (ModelOpt's per-tensor scales).
  if (got.dtype == want.dtype && got.shape.empty() && want.shape == std::vector<int64_t>{1}) {
    return true;
  }
  if (want.encoding == SourceEncoding::kScalarF32 ||
      want.encoding == SourceEncoding::kReciprocalF32 ||
      want.encoding == SourceEncoding::kTensorScale) {
    // One F32 per tensor, stored as a scalar [] (ModelOpt) or [1] (compressed-tensors).
    return got.dtype == DType::kF32 && IsOneValue(got.shape);
  }
  if (want.dtype == DType::kU8 && got.dtype == DType::kF8E8M0 && got.shape == want.shape) {
    return true;
  }
  if (want.dtype == DType::kU8 && got.dtype == DType::kI32 && !want.shape.empty() &&
      got.shape.size() == want.shape.size() && want.shape.back() % 4 == 0) {
    std::vector<int64_t> s = want.shape;
    s.back() /= 4;
    return got.shape == s;
  }
  return false;
}

// One checkpoint tensor of the rank: its entry, and its spec when it is converted on read.
struct StoredTensor {
  const Checkpoint::Entry* entry = nullptr;
  const SourceTensorSpec* spec = nullptr;
};

class CheckpointReader final : public WindowReader {
 public:
  CheckpointReader(const Checkpoint& ckpt, std::vector<std::vector<StoredTensor>> tensors)
      : ckpt_(ckpt), tensors_(std::move(tensors)), read_before_(ckpt.bytes_read()) {}

  Status ReadRows(size_t tensor_idx, const Piece& p, int64_t a, int64_t b, std::byte* out,
                  int64_t stride) const override {
    const StoredTensor& src = tensors_[tensor_idx][static_cast<size_t>(p.source_idx)];
    if (src.spec != nullptr) {
      return ReadEncoded(*src.entry->file, *src.entry->info, *src.spec, a, b, p.window.col_begin,
                         p.window.col_end, out, stride);
    }
    Slice2D w = p.window;
    w.row_begin = a;
    w.row_end = b;
    w.dst_row_stride = stride;
    return src.entry->file->ReadSlice2D(
        *src.entry->info, w, std::span<std::byte>(out, static_cast<size_t>(w.DstBytesNeeded())));
  }

  int64_t bytes_read() const override { return ckpt_.bytes_read() - read_before_; }

 private:
  const Checkpoint& ckpt_;
  std::vector<std::vector<StoredTensor>> tensors_;  // [tensor][source]
  int64_t read_before_;
};

class CheckpointSource final : public WindowSource {
 public:
  static Result<std::unique_ptr<TensorSource>> Open(const ShardPlan& plan,
                                                    const LoadOptions& options) {
    std::unique_ptr<CheckpointSource> source(new CheckpointSource());
    if (options.checkpoint != nullptr) {
      source->ckpt_ = options.checkpoint;
    } else {
      MOESHARD_ASSIGN_OR_RETURN(source->owned_, Checkpoint::Open(options.checkpoint_dir));
      source->ckpt_ = source->owned_.get();
    }
    MOESHARD_RETURN_IF_ERROR(source->CheckAgainst(plan));
    return std::unique_ptr<TensorSource>(std::move(source));
  }

 protected:
  Result<std::unique_ptr<WindowReader>> OpenRank(const RankFill& fill) const override {
    const std::vector<MappedTensor>& tensors = *fill.tensors;
    const std::string tag = RankTag(*fill.plan, fill.rank);
    std::vector<std::vector<StoredTensor>> stored(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (const SourceTensorSpec& spec : tensors[i].sources) {
        StoredTensor s;
        s.entry = ckpt_->Find(spec.name);
        if (s.entry == nullptr) {
          return NotFoundError(
              fmt::format("{} load: '{}': not in checkpoint '{}' (needed for '{}')", tag, spec.name,
                          ckpt_->path(), tensors[i].name));
        }
        MOESHARD_RETURN_IF_ERROR(
            CheckCheckpointTensor(spec, *s.entry->info, s.entry->file->path(), tag));
        if (spec.encoding != SourceEncoding::kDirect) s.spec = &spec;
        stored[i].push_back(s);
      }
    }
    return std::unique_ptr<WindowReader>(
        std::make_unique<CheckpointReader>(*ckpt_, std::move(stored)));
  }

 private:
  CheckpointSource() = default;

  // Every tensor the model needs must be there, in the expected dtype and shape; the others are
  // listed (unplaced, or multi-token prediction).
  Status CheckAgainst(const ShardPlan& plan) {
    MOESHARD_ASSIGN_OR_RETURN(std::vector<SourceTensorSpec> expected,
                              ExpectedCheckpointTensors(plan));
    std::vector<std::string> missing;
    std::unordered_set<std::string> names;
    for (const SourceTensorSpec& spec : expected) {
      names.insert(spec.name);
      const Checkpoint::Entry* e = ckpt_->Find(spec.name);
      if (e == nullptr) {
        missing.push_back(spec.name);
        continue;
      }
      MOESHARD_RETURN_IF_ERROR(CheckCheckpointTensor(spec, *e->info, e->file->path()));
    }
    if (!missing.empty()) {
      const size_t show = std::min<size_t>(missing.size(), 8);
      return NotFoundError(fmt::format(
          "load: checkpoint '{}': expected {} tensor{} the model needs, e.g. {} (wrong "
          "--model for this checkpoint, or an incomplete download?)",
          ckpt_->path(), missing.size(), missing.size() == 1 ? "" : "s",
          fmt::format("'{}'", fmt::join(missing.begin(), missing.begin() + show, "', '"))));
    }
    for (const auto& [name, entry] : ckpt_->tensors()) {
      if (names.count(name)) continue;
      if (IsMtpTensor(plan.model, name)) {
        mtp_.push_back(name);  // loaded only for speculative decoding
      } else {
        unplaced_.push_back(name);
      }
    }
    return Status::Ok();
  }

  std::unique_ptr<Checkpoint> owned_;
  const Checkpoint* ckpt_ = nullptr;
};

}  // namespace

Status CheckCheckpointTensor(const SourceTensorSpec& want, const TensorInfo& got,
                             std::string_view file, std::string_view rank_tag) {
  if (Compatible(want, got)) return Status::Ok();
  return InvalidArgumentError(fmt::format(
      "{}{}load: '{}' in {}: {} {} does not match config {} {} (wrong config.json for this "
      "checkpoint?)",
      rank_tag, rank_tag.empty() ? "" : " ", want.name, file, DTypeName(got.dtype),
      FormatDims(got.shape), DTypeName(want.dtype), FormatDims(want.shape)));
}

TensorSourceFormat CheckpointSourceFormat() {
  return {
      .name = LoadOptions::Source::kCheckpoint,
      .layout = SourceLayout::kCheckpointTensors,
      .reads_checkpoint = true,
      .auto_claims = [](const std::string& checkpoint) { return !checkpoint.empty(); },
      .auto_fallback = true,
      .auto_help = "safetensors",
      .describe =
          [](const LoadOptions& o) {
            return fmt::format("checkpoint {}",
                               o.checkpoint != nullptr ? o.checkpoint->path() : o.checkpoint_dir);
          },
      .open = CheckpointSource::Open,
  };
}

}  // namespace moeshard::internal
