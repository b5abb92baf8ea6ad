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
#include <memory>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"
#include "moeshard/kernels/kernel_backend.h"

namespace moeshard::runtime_test {

struct RuntimeCase {
  std::string name;
  int world = 1;  // ranks the case needs
  // Runs the case with the runtime on the kernel backend of that registry name
  // (KernelBackendNames(): every equivalence case runs on each; both the sharded run and its
  // single-rank reference use it).
  std::function<Status(Communicator&, const std::string& kernel_backend)> body;
  bool uses_kernels = true;  // false: the backend is not used (dispatch cases run once, "cpu")
};

// Every case, in a fixed order (names are unique and valid gtest names).
const std::vector<RuntimeCase>& AllRuntimeCases();

// One case on one kernel backend, named "<case>_<backend>" (a valid gtest name).
struct CaseRun {
  std::string name;
  const RuntimeCase* runtime_case = nullptr;
  std::string kernel_backend;
  Status Run(Communicator& world) const { return runtime_case->body(world, kernel_backend); }
};
// Every case that uses the kernels on every backend of KernelBackendNames(), the others on
// "cpu"; `world` > 0 keeps the cases of that size only.
std::vector<CaseRun> AllCaseRuns(int world = 0);

// The deliberately failing case: rank `bad_rank` passes more tokens than the runtime was built
// for; every rank returns what Forward returned. Message of the failing rank contains
// kBadRankMessage.
Status BadRankBody(Communicator& world, int bad_rank);

// A runtime's kernel backend for tests: `name` with one thread.
Result<std::unique_ptr<KernelBackend>> TestKernelBackend(const std::string& name);
inline constexpr const char* kBadRankMessage =
    "forward: 'num_tokens': expected 0 <= T <= 8 (max_tokens the runtime was built for), got 9";

}  // namespace moeshard::runtime_test
