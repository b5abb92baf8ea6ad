// Backend-independent test bodies for the Communicator contract. Each case is a function every
// rank runs with its world communicator; it returns an error Status describing the first
// mismatch (rank, element, expected, got). comm_local_test runs them on 1, 2, 3, 4 and 8 local
// ranks, comm_mpi_test on 2 and 4 MPI processes: the same bodies, so both backends obey the
// same contract and give the same bits.
//
// Payloads are encoded with the sender's rank, the receiver's rank and the element index (as
// DeepEP's tests do), so every misplaced, missing or duplicated element is caught exactly.
// Reductions are compared bitwise with a sequential fp32 reference computed locally.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"

namespace moeshard::comm_test {

struct CommCase {
  std::string name;
  std::function<Status(Communicator&)> body;
};

// Every case, in a fixed order.
const std::vector<CommCase>& AllCommCases();

}  // namespace moeshard::comm_test
