#include "moeshard/base/aligned_buffer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <utility>

namespace moeshard {
namespace {

// Small buffers: calloc, 64-byte aligned; large ones: mapped, 2 MiB aligned, advised for huge
// pages. Both zero-filled, writable end to end, and movable.
TEST(AlignedBufferTest, ZeroFilledAlignedAndMovable) {
  for (size_t n : {size_t{1}, size_t{100}, size_t{4096}, AlignedBuffer::kHugePageBytes - 1,
                   AlignedBuffer::kHugePageBytes, 3 * AlignedBuffer::kHugePageBytes + 5}) {
    AlignedBuffer b(n);
    ASSERT_EQ(b.size(), n);
    const auto addr = reinterpret_cast<uintptr_t>(b.data());
    EXPECT_EQ(addr % 64, 0u) << n;
    if (n >= AlignedBuffer::kHugePageBytes) {
      EXPECT_EQ(addr % AlignedBuffer::kHugePageBytes, 0u) << n;
    } else {
      EXPECT_FALSE(b.huge_page_advised()) << n;
    }
    for (size_t i = 0; i < n; i += 997) ASSERT_EQ(b.as<uint8_t>()[i], 0) << n << " @" << i;
    EXPECT_EQ(b.as<uint8_t>()[n - 1], 0);
    std::memset(b.data(), 0xab, n);
    AlignedBuffer moved(std::move(b));
    EXPECT_EQ(b.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from state is defined
    EXPECT_EQ(b.data(), nullptr);
    EXPECT_EQ(moved.as<uint8_t>()[n - 1], 0xab);
    AlignedBuffer assigned(16);
    assigned = std::move(moved);
    EXPECT_EQ(assigned.size(), n);
    EXPECT_EQ(assigned.as<uint8_t>()[0], 0xab);
  }
  AlignedBuffer empty(0);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.data(), nullptr);
}

}  // namespace
}  // namespace moeshard
