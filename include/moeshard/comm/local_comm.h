// Local communicator: N ranks as threads of one process, over shared memory. The embedded
// default (`moeshard run` without mpirun) and the fake every multi-rank test runs on.
//
// How a collective moves data: every rank publishes its arguments (pointers and counts) in its
// slot of the group, waits until all ranks have published, then copies *directly* from the
// peers' buffers into its own (or, for all-reduce, reduces its 1/n chunk of everyone's inputs
// and writes the result into everyone's outputs), and finally waits until every rank is done
// touching the others' buffers before returning. Each byte is copied once; there is no staging
// buffer. Waiting spins briefly and then blocks on a condition variable, so 8 ranks on 2 cores
// do not burn the cores the other ranks need.
//
// Failure: RunLocalRanks runs one function per rank; the first rank that fails (returns an
// error, throws, passes bad arguments, or times out in a collective) aborts the job: every rank
// blocked in or later entering a collective, on any communicator of the job, returns
// Aborted("[rank r/n] <code>: <message of rank r>") at once, and RunLocalRanks returns the
// original failure, "[rank r/n] <message>". A rank that returns while others still wait for it
// in a collective fails those collectives with FailedPrecondition (not a timeout).
//
// Thread safety: RunLocalRanks may be called from several threads at once (jobs are
// independent). Inside a job, see communicator.h: one thread per communicator object.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"

namespace moeshard {

struct LocalCommOptions {
  // A collective that has not started on every rank after this long fails with
  // DeadlineExceeded naming the ranks that never arrived. Applies to every communicator of the
  // job (the world and its splits).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Iterations of busy-waiting (with a CPU pause) before blocking in a wait. -1: automatic —
  // a short spin (~tens of microseconds) when there are at least as many cores as ranks, none
  // when oversubscribed (spinning would steal the core the awaited rank needs).
  int spin_iterations = -1;
};

// Runs per_rank(world) on `num_ranks` threads, one per rank of a fresh world communicator, and
// returns when all have returned: OK when every rank returned OK, otherwise the first failure
// (the rank that caused the abort), its message prefixed "[rank r/n] ". Exceptions thrown by
// per_rank are caught and reported as Internal errors of that rank. When rank_statuses is not
// null it receives what each rank's function returned ([num_ranks]).
// REQUIRES: num_ranks >= 1 (InvalidArgument otherwise).
Status RunLocalRanks(int num_ranks, const LocalCommOptions& options,
                     const std::function<Status(Communicator&)>& per_rank,
                     std::vector<Status>* rank_statuses = nullptr);

}  // namespace moeshard
