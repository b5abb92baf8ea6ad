// The Communicator contract on the local backend: every shared case (comm_cases.h) on 1, 2, 3,
// 4 and 8 ranks (8 threads on a 2-core machine: oversubscribed), plus what only an in-process
// backend can observe: barrier semantics through shared memory, and failure handling (a
// failing, throwing, mismatched, missing or early-returning rank ends the job with its message
// on every rank, promptly, never hanging).
#include "moeshard/comm/local_comm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>

#include "moeshard/comm/mpi_comm.h"
#include "tests/comm/comm_cases.h"

namespace moeshard {
namespace {

using comm_test::AllCommCases;
using comm_test::CommCase;
using ::testing::HasSubstr;

// Long enough for any case on a loaded 2-core machine, short enough that a bug shows as a
// failure rather than as a ctest timeout.
LocalCommOptions TestOptions() {
  LocalCommOptions options;
  options.timeout = std::chrono::seconds(30);
  return options;
}

class LocalCommCaseTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(LocalCommCaseTest, Passes) {
  const auto& [name, num_ranks] = GetParam();
  const CommCase* found = nullptr;
  for (const CommCase& c : AllCommCases()) {
    if (c.name == name) found = &c;
  }
  ASSERT_NE(found, nullptr);
  std::vector<int> seen_sizes(static_cast<size_t>(num_ranks), 0);
  Status s = RunLocalRanks(num_ranks, TestOptions(), [&](Communicator& world) {
    seen_sizes[static_cast<size_t>(world.rank())] = world.size();
    return found->body(world);
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  for (int size : seen_sizes) EXPECT_EQ(size, num_ranks);
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  for (const CommCase& c : AllCommCases()) names.push_back(c.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllCases, LocalCommCaseTest,
                         ::testing::Combine(::testing::ValuesIn(CaseNames()),
                                            ::testing::Values(1, 2, 3, 4, 8)),
                         [](const ::testing::TestParamInfo<LocalCommCaseTest::ParamType>& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "ranks";
                         });

TEST(LocalCommTest, BarrierSeparatesPhases) {
  constexpr int kRanks = 8;
  std::atomic<int> arrived{0};
  Status s = RunLocalRanks(kRanks, TestOptions(), [&](Communicator& comm) -> Status {
    for (int iter = 0; iter < 50; ++iter) {
      arrived.fetch_add(1);
      MOESHARD_RETURN_IF_ERROR(comm.Barrier());
      // Everyone has incremented for this iteration, nobody for the next one yet.
      const int seen = arrived.load();
      if (seen != kRanks * (iter + 1)) {
        return InternalError("rank " + std::to_string(comm.rank()) + " saw " +
                             std::to_string(seen) + " arrivals after barrier " +
                             std::to_string(iter));
      }
      MOESHARD_RETURN_IF_ERROR(comm.Barrier());
    }
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(LocalCommTest, RejectsZeroRanks) {
  Status s = RunLocalRanks(0, TestOptions(), [](Communicator&) { return Status::Ok(); });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

// Runs `per_rank` on `n` ranks and returns (overall status, per-rank statuses).
std::pair<Status, std::vector<Status>> RunAndCollect(
    int n, const LocalCommOptions& options, const std::function<Status(Communicator&)>& per_rank) {
  std::vector<Status> statuses;
  Status s = RunLocalRanks(n, options, per_rank, &statuses);
  return {s, statuses};
}

// The failing rank returns an error while the others wait in a barrier (and, later, in a
// sub-communicator): every rank reports the failing rank's message, the others as Aborted.
TEST(LocalCommFailureTest, ErrorOnOneRankAbortsEveryRankWithItsMessage) {
  LocalCommOptions options;
  options.timeout = std::chrono::seconds(60);  // if the abort did not wake them: a timeout
  auto [s, statuses] = RunAndCollect(4, options, [](Communicator& comm) -> Status {
    MOESHARD_RETURN_IF_ERROR(comm.Barrier());
    if (comm.rank() == 1) return InvalidArgumentError("deliberate failure on rank 1");
    MOESHARD_RETURN_IF_ERROR(comm.Barrier());  // blocks: rank 1 never comes
    return InternalError("unreachable: the barrier completed without rank 1");
  });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "[rank 1/4] deliberate failure on rank 1");
  ASSERT_EQ(statuses.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const Status& rs = statuses[static_cast<size_t>(r)];
    EXPECT_THAT(rs.message(), HasSubstr("deliberate failure on rank 1")) << "rank " << r;
    if (r != 1) {
      EXPECT_EQ(rs.code(), StatusCode::kAborted) << rs.ToString();
      EXPECT_THAT(rs.message(), HasSubstr("[rank 1/4] INVALID_ARGUMENT: deliberate failure"));
    }
  }
}

TEST(LocalCommFailureTest, FailureWakesRanksBlockedInOtherGroups) {
  LocalCommOptions options;
  options.timeout = std::chrono::seconds(60);
  auto [s, statuses] = RunAndCollect(8, options, [](Communicator& world) -> Status {
    MOESHARD_ASSIGN_OR_RETURN(auto tp, world.Split(world.rank() / 2, world.rank()));
    MOESHARD_ASSIGN_OR_RETURN(auto dp, world.Split(world.rank() % 2, world.rank()));
    if (world.rank() == 5) throw std::runtime_error("deliberate exception on rank 5");
    // Rank 4 waits for rank 5 in their TP group; the others wait in DP groups.
    if (world.rank() == 4) return tp->Barrier();
    float v = 1.0f;
    return dp->AllReduceSum(std::span<float>(&v, 1));
  });
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("[rank 5/8] uncaught exception in the rank function: "
                                     "deliberate exception on rank 5"));
  for (int r = 0; r < 8; ++r) {
    if (r == 5) continue;
    const Status& rs = statuses[static_cast<size_t>(r)];
    EXPECT_EQ(rs.code(), StatusCode::kAborted) << "rank " << r << ": " << rs.ToString();
    EXPECT_THAT(rs.message(), HasSubstr("deliberate exception on rank 5")) << "rank " << r;
  }
}

TEST(LocalCommFailureTest, MismatchedCountsFailOnEveryRank) {
  auto [s, statuses] = RunAndCollect(3, TestOptions(), [](Communicator& comm) -> Status {
    const size_t n = static_cast<size_t>(comm.size());
    std::vector<size_t> send_counts(n, 1), recv_counts(n, 1);
    if (comm.rank() == 2) recv_counts[0] = 2;  // rank 0 sends 1 element, rank 2 expects 2
    std::vector<uint8_t> send(n), recv(n + 1);
    AllToAllVArgs args;
    args.send = send.data();
    args.send_counts = send_counts;
    args.recv = recv.data();
    args.recv_counts = recv_counts;
    return comm.AllToAllV(args);
  });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const Status& rs : statuses) {
    EXPECT_THAT(rs.message(), HasSubstr("rank 0 sends send_counts[2] = 1 elements to rank 2, "
                                        "but rank 2 expects recv_counts[0] = 2"))
        << rs.ToString();
  }
}

TEST(LocalCommFailureTest, BadArgumentOnOneRankEndsTheJob) {
  auto [s, statuses] = RunAndCollect(4, TestOptions(), [](Communicator& comm) -> Status {
    std::vector<float> data(16, 1.0f);
    // Rank 3 passes a recv buffer overlapping its send buffer by half.
    float* recv = comm.rank() == 3 ? data.data() + 4 : data.data();
    return comm.AllReduceSum(data.data(), recv, 8);
  });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("[rank 3/4] AllReduceSum on 'world': send [32 bytes] and "
                                     "recv [32 bytes] overlap"));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(statuses[static_cast<size_t>(r)].code(), StatusCode::kAborted);
  }
}

TEST(LocalCommFailureTest, DifferentCollectivesAreAMismatchNotAHang) {
  auto [s, statuses] = RunAndCollect(3, TestOptions(), [](Communicator& comm) -> Status {
    if (comm.rank() == 1) return comm.Barrier();
    float v = 0;
    return comm.AllReduceSum(std::span<float>(&v, 1));
  });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("collective mismatch: rank 0 called AllReduceSum(count=1, "
                                     "fp32) as collective #1, rank 1 called Barrier() as "
                                     "collective #1"));
}

TEST(LocalCommFailureTest, TimeoutNamesTheCollectiveAndTheMissingRanks) {
  LocalCommOptions options;
  options.timeout = std::chrono::milliseconds(200);
  auto [s, statuses] = RunAndCollect(4, options, [](Communicator& comm) -> Status {
    if (comm.rank() == 3) {
      // Stuck in work longer than the timeout, then tries to join: finds the job aborted.
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
      return comm.Barrier();
    }
    float v = 1.0f;
    return comm.AllReduceSum(std::span<float>(&v, 1));
  });
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("AllReduceSum on 'world': collective #1 timed out after "
                                     "0.2 s waiting for ranks to arrive: missing rank 3: not in "
                                     "a collective; arrived: ["));
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(statuses[static_cast<size_t>(r)].message(), HasSubstr("timed out")) << "rank " << r;
  }
  EXPECT_EQ(statuses[3].code(), StatusCode::kAborted);
}

TEST(LocalCommFailureTest, RankReturningEarlyFailsItsPeersWithoutTimeout) {
  LocalCommOptions options;
  options.timeout = std::chrono::seconds(60);
  auto [s, statuses] = RunAndCollect(3, options, [](Communicator& comm) -> Status {
    if (comm.rank() == 0) return Status::Ok();  // forgets the barrier
    return comm.Barrier();
  });
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("Barrier on 'world': collective #1 can never complete: "
                                     "missing rank 0: returned from its rank function"));
  EXPECT_TRUE(statuses[0].ok());
}

TEST(LocalCommFailureTest, CollectivesAfterAbortReturnImmediately) {
  auto [s, statuses] = RunAndCollect(2, TestOptions(), [](Communicator& comm) -> Status {
    if (comm.rank() == 0) return DataLossError("rank 0 gives up");
    // Rank 1 keeps calling: each call fails at once with rank 0's message.
    Status last;
    for (int i = 0; i < 3; ++i) last = comm.Barrier();
    return last;
  });
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(statuses[1].code(), StatusCode::kAborted);
  EXPECT_EQ(statuses[1].message(), "[rank 0/2] DATA_LOSS: rank 0 gives up");
}

#ifdef MOESHARD_TEST_WITHOUT_MPI
// Builds without MPI keep the MPI entry points, failing with a message that says what to do.
TEST(MpiUnavailableTest, InitSaysHowToGetMpi) {
  ASSERT_FALSE(MpiAvailable());
  auto session = MpiSession::Init(nullptr, nullptr);
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(session.status().message(), HasSubstr("built without MPI"));
}
#endif  // MOESHARD_TEST_WITHOUT_MPI

}  // namespace
}  // namespace moeshard
