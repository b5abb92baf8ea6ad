#include "moeshard/base/status.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace moeshard {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError(fmt::format("half: '{}': expected even", x));
  return x / 2;
}

Result<int> Quarter(int x) {
  MOESHARD_ASSIGN_OR_RETURN(int h, Half(x));
  MOESHARD_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckPositive(int x) {
  if (x <= 0) return OutOfRangeError("not positive");
  return Status::Ok();
}

Status Both(int a, int b) {
  MOESHARD_RETURN_IF_ERROR(CheckPositive(a));
  MOESHARD_RETURN_IF_ERROR(CheckPositive(b));
  return Status::Ok();
}

TEST(StatusTest, PropagatesFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "half: '3': expected even");
  EXPECT_TRUE(Both(1, 2).ok());
  EXPECT_EQ(Both(1, -2).code(), StatusCode::kOutOfRange);
}

TEST(StatusTest, ContextAndToString) {
  Status s = NotFoundError("x").WithContext("load");
  EXPECT_EQ(s.ToString(), "NOT_FOUND: load: x");
  EXPECT_EQ(Status::Ok().WithContext("load").ToString(), "OK");
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  Result<int> r = Half(3);
  EXPECT_DEATH((void)r.value(), "Result::value\\(\\) on error");
}

}  // namespace
}  // namespace moeshard
