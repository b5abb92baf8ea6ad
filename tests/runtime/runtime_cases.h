// Backend-independent multi-rank test bodies for the sharded runtime. runtime_local_test runs
// every case on local ranks (threads), runtime_mpi_test runs the cases of its world size (2 or
// 4) under mpirun: the same bodies on both communicators.
//
// Equivalence cases: every rank builds its shard of a tiny preset's plan with layout-invariant
// dummy weights, runs the MoE layers on its DP rank's tokens, then computes the single-rank
// reference of the same tokens (1-rank plan, same seed, on a singleton communicator split from
// the world) and fails unless max |out - ref| <= atol + rtol * max |ref| (verify.h). Each case
// also checks that it exercises what its name says (padding present, uneven experts, a DP rank
// with no tokens), so a plan change cannot silently turn it into another case.
//
// Dispatch cases: payloads encode (source rank, token, slot, expert), as DeepEP's tests do;
// every received row, every returned row and every weighted sum is checked exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"

namespace moeshard::runtime_test {

struct RuntimeCase {
  std::string name;
  int world = 1;  // ranks the case needs
  std::function<Status(Communicator&)> body;
};

// Every case, in a fixed order (names are unique and valid gtest names).
const std::vector<RuntimeCase>& AllRuntimeCases();

// The deliberately failing case: rank `bad_rank` passes more tokens than the runtime was built
// for; every rank returns what Forward returned. Message of the failing rank contains
// kBadRankMessage.
Status BadRankBody(Communicator& world, int bad_rank);
inline constexpr const char* kBadRankMessage =
    "forward: 'num_tokens': expected 0 <= T <= 8 (max_tokens the runtime was built for), got 9";

}  // namespace moeshard::runtime_test
