// The dummy source (`--load-format dummy`): every window of every checkpoint tensor the model
// consists of, generated from a counter-based hash of (seed, tensor name, flat storage index)
// (dummy_weights.h), so every topology holds the same logical model.
#include <fmt/format.h>

#include <cstring>

#include "moeshard/weights/dummy_weights.h"
#include "weights/tensor_source.h"

namespace moeshard::internal {
namespace {

// One checkpoint tensor of the rank, as the generator addresses it.
struct DummyTensor {
  uint64_t key = 0;
  DummyKind kind = DummyKind::kWeight;
  DType dtype = DType::kU8;  // what the windows address (the view of a converted tensor)
  int64_t element_bytes = 1;
  const std::vector<int64_t>* values = nullptr;  // known values (weight_shape), or null
  const SourceTensorSpec* spec = nullptr;        // set when the tensor is converted
};

class DummyReader final : public WindowReader {
 public:
  DummyReader(const RankFill& fill, uint64_t seed) {
    const std::vector<MappedTensor>& tensors = *fill.tensors;
    tensors_.resize(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (const SourceTensorSpec& spec : tensors[i].sources) {
        DummyTensor d;
        const bool encoded = spec.encoding != SourceEncoding::kDirect;
        d.dtype = encoded ? spec.view_dtype : spec.dtype;
        d.element_bytes = DTypeBits(d.dtype) / 8;
        if (encoded) d.spec = &spec;
        d.key = DummyTensorKey(seed, spec.name);
        d.kind = spec.dummy_kind;
        if (!spec.values.empty()) d.values = &spec.values;
        tensors_[i].push_back(d);
      }
    }
  }

  Status ReadRows(size_t tensor_idx, const Piece& p, int64_t a, int64_t b, std::byte* out,
                  int64_t stride) const override {
    const DummyTensor& src = tensors_[tensor_idx][static_cast<size_t>(p.source_idx)];
    for (int64_t r = a; r < b; ++r) {
      const int64_t flat = p.window.base_offset + r * p.window.row_bytes + p.window.col_begin;
      std::byte* row = out + (r - a) * stride;
      if (src.values != nullptr) {
        WriteKnownValues(src, flat, p.cols(), row);
      } else if (src.spec != nullptr && RowUniformEncoding(src.spec->encoding)) {
        // One value per view row (per-channel) or per tensor, repeated along the row.
        const int64_t index = src.spec->encoding == SourceEncoding::kRowScale ? r : 0;
        for (int64_t c = 0; c < p.cols(); c += src.element_bytes) {
          FillDummy(src.key, src.dtype, src.kind, index,
                    std::span<std::byte>(row + c, static_cast<size_t>(src.element_bytes)));
        }
      } else {
        FillDummy(src.key, src.dtype, src.kind, flat / src.element_bytes,
                  std::span<std::byte>(row, static_cast<size_t>(p.cols())));
      }
    }
    return Status::Ok();
  }

 private:
  // Known integers (I32 or I64), element by element from flat byte offset `flat`.
  static void WriteKnownValues(const DummyTensor& src, int64_t flat, int64_t cols, std::byte* row) {
    for (int64_t c = 0; c < cols / src.element_bytes; ++c) {
      const int64_t v =
          (*src.values)[static_cast<size_t>(flat / src.element_bytes + c) % src.values->size()];
      if (src.element_bytes == 8) {
        std::memcpy(row + c * 8, &v, 8);
      } else {
        const int32_t v32 = static_cast<int32_t>(v);
        std::memcpy(row + c * 4, &v32, 4);
      }
    }
  }

  std::vector<std::vector<DummyTensor>> tensors_;  // [tensor][source]
};

class DummySource final : public WindowSource {
 public:
  explicit DummySource(uint64_t seed) : seed_(seed) {}

 protected:
  Result<std::unique_ptr<WindowReader>> OpenRank(const RankFill& fill) const override {
    return std::unique_ptr<WindowReader>(std::make_unique<DummyReader>(fill, seed_));
  }

 private:
  uint64_t seed_;
};

}  // namespace

TensorSourceFormat DummySourceFormat() {
  return {
      .name = LoadOptions::Source::kDummy,
      .layout = SourceLayout::kCheckpointTensors,
      .reads_checkpoint = false,
      .auto_claims = [](const std::string& checkpoint) { return checkpoint.empty(); },
      .auto_help = "dummy without --checkpoint",
      .describe =
          [](const LoadOptions& o) { return fmt::format("dummy weights (seed {})", o.seed); },
      .open = [](const ShardPlan&, const LoadOptions& o) -> Result<std::unique_ptr<TensorSource>> {
        return std::unique_ptr<TensorSource>(std::make_unique<DummySource>(o.seed));
      },
  };
}

}  // namespace moeshard::internal
