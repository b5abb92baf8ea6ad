// The roofline's read buffer: made once per context and measured again and again, each thread's
// chunk first-touched by that thread; a buffer made for another thread count is refused.
#include "moeshard/kernels/roofline.h"

#include <gtest/gtest.h>

#include "moeshard/kernels/kernel_context.h"

namespace moeshard {
namespace {

KernelContext Context(int threads) {
  KernelContextOptions o;
  o.num_threads = threads;
  Result<KernelContext> ctx = KernelContext::Create(o);
  EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
  return std::move(*ctx);
}

TEST(ReadBufferTest, OneChunkOfWholePagesPerThreadFilledByItsThread) {
  KernelContext ctx = Context(2);
  Result<ReadBuffer> buf = ReadBuffer::Create(ctx, (int64_t{1} << 20) + 100);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  EXPECT_EQ(buf->threads(), 2);
  EXPECT_EQ(buf->chunk_bytes(), int64_t{1} << 19);
  EXPECT_EQ(buf->chunk(0)[0], 1);
  EXPECT_EQ(buf->chunk(0)[buf->chunk_bytes() - 1], 1);
  EXPECT_EQ(buf->chunk(1)[0], 2);
  EXPECT_EQ(buf->chunk(1)[buf->chunk_bytes() - 1], 2);
  // Measured twice on the same buffer.
  for (int i = 0; i < 2; ++i) {
    Result<double> bw = MeasureReadBandwidth(ctx, *buf, 1);
    ASSERT_TRUE(bw.ok()) << bw.status().ToString();
    EXPECT_GT(*bw, 0.0);
  }
}

TEST(ReadBufferTest, TinyRequestsGetAtLeast256BytesPerThread) {
  KernelContext ctx = Context(2);
  Result<ReadBuffer> buf = ReadBuffer::Create(ctx, 10);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  EXPECT_EQ(buf->chunk_bytes(), 256);
}

TEST(ReadBufferTest, MovedFromBufferIsRefused) {
  KernelContext ctx = Context(2);
  Result<ReadBuffer> a = ReadBuffer::Create(ctx, int64_t{1} << 16);
  ASSERT_TRUE(a.ok());
  const ReadBuffer b = std::move(*a);
  EXPECT_TRUE(MeasureReadBandwidth(ctx, b, 1).ok());
  // NOLINTNEXTLINE(bugprone-use-after-move): the moved-from buffer is what is checked
  const Result<double> bw = MeasureReadBandwidth(ctx, *a, 1);
  ASSERT_FALSE(bw.ok());
  EXPECT_NE(bw.status().message().find("empty"), std::string::npos) << bw.status().ToString();
}

TEST(ReadBufferTest, BufferOfAnotherThreadCountIsRefused) {
  KernelContext two = Context(2);
  KernelContext one = Context(1);
  Result<ReadBuffer> buf = ReadBuffer::Create(two, int64_t{1} << 16);
  ASSERT_TRUE(buf.ok());
  Result<double> bw = MeasureReadBandwidth(one, *buf, 1);
  ASSERT_FALSE(bw.ok());
  EXPECT_NE(bw.status().message().find("made for 2 threads, the context has 1"), std::string::npos)
      << bw.status().ToString();
}

}  // namespace
}  // namespace moeshard
