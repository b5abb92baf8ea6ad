// libFuzzer target: the safetensors header parser on raw file bytes.
//
// Beyond "no crash, no sanitizer report", checks two properties of every accepted file:
//   - every tensor can be read through the in-memory SafetensorsFile, whole and by 2-D slices;
//   - writing the parsed tensors back with SafetensorsWriter (in data order, same bytes) and
//     parsing the result gives the same tensors and metadata (parser and writer agree).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "moeshard/weights/safetensors.h"
#include "moeshard/weights/safetensors_writer.h"

namespace {

void Check(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeshard;
  std::vector<uint8_t> bytes(data, data + size);
  Result<SafetensorsHeader> header =
      ParseSafetensorsHeader(bytes, static_cast<int64_t>(bytes.size()), "fuzz");
  if (!header.ok()) {
    Check(!header.status().message().empty(), "an error has a message");
    return 0;
  }
  // A header-only prefix of the same file parses identically.
  {
    std::span<const uint8_t> prefix(bytes.data(), static_cast<size_t>(header->data_offset));
    Result<SafetensorsHeader> again =
        ParseSafetensorsHeader(prefix, static_cast<int64_t>(bytes.size()), "fuzz");
    Check(again.ok() && again->tensors == header->tensors, "prefix parse agrees");
  }

  Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::FromBytes("fuzz", bytes);
  Check(file.ok(), "FromBytes accepts what the parser accepts");
  SafetensorsWriter writer;
  writer.SetMetadata(header->metadata);
  for (const TensorInfo& t : (*file)->tensors()) {
    std::vector<std::byte> buf(static_cast<size_t>(t.num_bytes()));
    Check((*file)->ReadTensor(t, buf).ok(), "whole-tensor read");
    Check(buf.empty() || std::memcmp(buf.data(), bytes.data() + header->data_offset + t.data_begin,
                                     buf.size()) == 0,
          "read returns the file's bytes");
    if (t.num_bytes() >= 2) {
      // The tensor as [2, n/2] bytes, right column, padded destination.
      const int64_t row = t.num_bytes() / 2;
      Slice2D s{.row_bytes = row,
                .row_begin = 0,
                .row_end = 2,
                .col_begin = row / 2,
                .col_end = row,
                .dst_row_stride = row + 3};
      std::vector<std::byte> dst(static_cast<size_t>(s.DstBytesNeeded()));
      Check((*file)->ReadSlice2D(t, s, dst).ok(), "slice read");
    }
    Check(writer
              .Add(t.name, t.dtype, t.shape,
                   std::as_bytes(std::span(bytes).subspan(
                       static_cast<size_t>(header->data_offset + t.data_begin),
                       static_cast<size_t>(t.num_bytes()))))
              .ok(),
          "writer accepts every parsed tensor");
  }
  Result<std::vector<uint8_t>> written = writer.Serialize();
  Check(written.ok(), "serialize");
  Result<SafetensorsHeader> reparsed =
      ParseSafetensorsHeader(*written, static_cast<int64_t>(written->size()), "rewritten");
  Check(reparsed.ok(), "rewritten file parses");
  Check(reparsed->tensors == header->tensors, "rewritten tensors match");
  Check(reparsed->metadata == header->metadata, "rewritten metadata matches");
  Check(header->data_bytes == 0 ||
            std::memcmp(written->data() + reparsed->data_offset, bytes.data() + header->data_offset,
                        static_cast<size_t>(header->data_bytes)) == 0,
        "rewritten data matches");
  return 0;
}
