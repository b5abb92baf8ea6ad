// Communicator: the collective operations the sharded runtime needs (barrier, broadcast,
// all-reduce, reduce-scatter, all-gather, all-to-all-v) over a fixed group of ranks, and Split
// to form sub-groups (TP, EP, DP) from one world. Backends: `local` (ranks as threads in one
// process, local_comm.h) and `mpi` (one process per rank, mpi_comm.h).
//
// Contract (every backend implements exactly this; tests run the same bodies on all of them):
//
// Ranks and groups.
//   A communicator connects size() ranks numbered 0..size()-1; rank() is the caller's. Each
//   rank holds its own Communicator object for the group. Messages name ranks of the *world*
//   group as "[rank r/n]", whatever sub-communicator the error happened on.
//
// Collective calls.
//   Every method marked COLLECTIVE must be called by every rank of the communicator, and all
//   ranks must issue the collectives of one communicator in the same order with matching
//   arguments (same count, root, element size; counts that agree between sender and receiver).
//   Collectives on *different* communicators (say a TP group and a DP group) are independent,
//   but a program that makes rank A wait in group X for rank B while B waits in group Y for A
//   deadlocks exactly as it would with MPI; the timeout below turns that into an error.
//
// Buffers.
//   Pointers and spans passed to a collective must stay valid until it returns; when it
//   returns OK, the receive buffer holds the result and the send buffer may be reused. A
//   pointer may be null only when its count is 0. Send and receive buffers must not overlap,
//   except where a method says "in place allowed" (send == recv exactly). Counts are in
//   elements; data-movement calls take the element size in bytes (a token row of hidden bf16
//   values is one element of hidden * 2 bytes), reductions are typed (fp32 or bf16).
//
// Reductions are deterministic and rank-independent.
//   Element i of a sum is computed as ((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{n-1}[i] in fp32,
//   in rank order, starting from x_0[i]; bf16 inputs are widened to fp32 and the fp32 sum is
//   rounded once to bf16 (round to nearest, ties to even). Every rank gets bitwise-identical
//   results, and every backend gives the same bits for the same inputs: this is the sequential
//   fp32 reference, so tests compare exactly.
//
// Thread safety.
//   A Communicator object is used by one thread at a time (one thread per rank). Distinct
//   communicators of one rank (world, TP group, EP group) must also be driven by that rank's one
//   thread in the MPI backend; the local backend allows one thread per communicator object.
//   rank(), size() and name() are immutable and safe from any thread.
//
// Errors, timeouts and failure.
//   Every method returns a Status; no exception escapes. Invalid arguments on one rank
//   (mismatched counts, null buffers) fail the collective with InvalidArgument naming the
//   offending rank and values. A collective that does not complete within the configured timeout
//   (options of the backend; default 300 s) fails with DeadlineExceeded naming the collective and,
//   where the backend can tell (local), the ranks that never arrived. After any collective
//   fails, the communicator and the whole job are broken: the job is meant to end. The launchers
//   (RunLocalRanks, RunMpiRank) make that happen: when one rank fails, every other rank blocked
//   in or later entering a collective returns Aborted("[rank r/n] <the failing rank's
//   message>") promptly (local), or the job is ended with MPI_Abort after printing the message
//   (mpi). No failure mode hangs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "moeshard/base/numeric.h"
#include "moeshard/base/status.h"

namespace moeshard {

// Element type of a reduction.
enum class ReduceDtype { kFloat32, kBfloat16 };
const char* ReduceDtypeName(ReduceDtype dtype);
size_t ReduceDtypeBytes(ReduceDtype dtype);

// Color passed to Split by ranks that join no sub-group (MPI_UNDEFINED).
inline constexpr int kSplitNoColor = -1;

// Arguments of AllToAllV. Counts and displacements are in elements of `elem_bytes` bytes and are
// indexed by peer rank; empty displacements mean "packed": peer p's block starts at the sum of
// the counts of peers 0..p-1.
//
//   send: | to rank 0 | to rank 1 | ... |      block p = send[send_displs[p] .. + send_counts[p])
//   recv: | from rank 0 | from rank 1 | ... |  block p = recv[recv_displs[p] .. + recv_counts[p])
//
// REQUIRES (checked, InvalidArgument): send_counts[q] on rank p == recv_counts[p] on rank q for
// every pair (the receiver must know its counts; exchange them first with AllToAll);
// receive blocks do not overlap; spans hold size() entries (or 0 for displacements).
// The EP dispatch: send is [num_pairs, hidden] bf16 rows sorted by destination rank, elem_bytes
// = hidden * 2, send_counts[p] = rows for the experts rank p holds; combine is the reverse call.
struct AllToAllVArgs {
  size_t elem_bytes = 1;
  const void* send = nullptr;
  std::span<const size_t> send_counts;  // [size()]
  std::span<const size_t> send_displs;  // [size()] or empty (packed)
  void* recv = nullptr;
  std::span<const size_t> recv_counts;  // [size()]
  std::span<const size_t> recv_displs;  // [size()] or empty (packed)
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "world", or the parent's name plus "/split(color=c)".
  const std::string& name() const { return name_; }

  // COLLECTIVE: returns once every rank has entered the barrier.
  virtual Status Barrier() = 0;

  // COLLECTIVE: copies `num_bytes` bytes at `data` on rank `root` to `data` on every rank.
  // REQUIRES: 0 <= root < size(); num_bytes equal on every rank.
  virtual Status Broadcast(void* data, size_t num_bytes, int root) = 0;

  // COLLECTIVE: recv[i] = sum over ranks of send[i] (order and rounding: see the contract),
  // for i in [0, count). send, recv: [count]. In place allowed. REQUIRES: count equal on all.
  Status AllReduceSum(const float* send, float* recv, size_t count) {
    return DoAllReduceSum(ReduceDtype::kFloat32, send, recv, count);
  }
  Status AllReduceSum(const bf16_t* send, bf16_t* recv, size_t count) {
    return DoAllReduceSum(ReduceDtype::kBfloat16, send, recv, count);
  }
  // COLLECTIVE: in-place all-reduce of `data`.
  Status AllReduceSum(std::span<float> data) {
    return AllReduceSum(data.data(), data.data(), data.size());
  }
  Status AllReduceSum(std::span<bf16_t> data) {
    return AllReduceSum(data.data(), data.data(), data.size());
  }

  // COLLECTIVE: reduce-scatter with variable blocks. send: [sum(recv_counts)] laid out as
  // | block 0 | block 1 | ... | (packed); rank r receives recv: [recv_counts[r]] = the sum over
  // ranks of block r. recv_counts: [size()], equal on every rank.
  Status ReduceScatterSumV(const float* send, float* recv, std::span<const size_t> recv_counts) {
    return DoReduceScatterSum(ReduceDtype::kFloat32, send, recv, recv_counts);
  }
  Status ReduceScatterSumV(const bf16_t* send, bf16_t* recv, std::span<const size_t> recv_counts) {
    return DoReduceScatterSum(ReduceDtype::kBfloat16, send, recv, recv_counts);
  }
  // COLLECTIVE: reduce-scatter with equal blocks. send: [size() * recv_count], recv:
  // [recv_count].
  Status ReduceScatterSum(const float* send, float* recv, size_t recv_count);
  Status ReduceScatterSum(const bf16_t* send, bf16_t* recv, size_t recv_count);

  // COLLECTIVE: all-gather with variable counts (uneven batches, 0 allowed). send:
  // [send_count] elements of elem_bytes; recv block p = recv[recv_displs[p] .. +
  // recv_counts[p]) receives rank p's send. REQUIRES: recv_counts[p] == send_count of rank p;
  // recv_counts, recv_displs: [size()], recv_displs may be empty (packed, rank order).
  virtual Status AllGatherV(const void* send, size_t send_count, void* recv,
                            std::span<const size_t> recv_counts,
                            std::span<const size_t> recv_displs, size_t elem_bytes) = 0;
  // COLLECTIVE: all-gather with equal counts. send: [num_bytes], recv: [size() * num_bytes],
  // rank p's bytes at recv + p * num_bytes.
  Status AllGather(const void* send, void* recv, size_t num_bytes);

  // COLLECTIVE: all-to-all with variable counts; see AllToAllVArgs.
  virtual Status AllToAllV(const AllToAllVArgs& args) = 0;
  // COLLECTIVE: all-to-all with equal blocks: send, recv: [size() * block_bytes]; block p of
  // send goes to rank p, block p of recv comes from rank p. Typical use: exchange counts before
  // AllToAllV.
  Status AllToAll(const void* send, void* recv, size_t block_bytes);

  // COLLECTIVE: as MPI_Comm_split. Ranks passing the same color >= 0 form one new communicator,
  // ordered by (key, rank in this communicator). Ranks passing kSplitNoColor get a null
  // pointer. The new communicator inherits this one's options; it is independent of this one
  // (its collectives do not order against this one's) and may outlive it.
  // Example, 2x2 grid (tp = 2, dp = 2, rank = dp_idx * 2 + tp_idx):
  //   tp group: Split(/*color=*/rank / 2, /*key=*/rank); dp group: Split(rank % 2, rank).
  virtual Result<std::unique_ptr<Communicator>> Split(int color, int key) = 0;

 protected:
  Communicator(int rank, int size, std::string name)
      : rank_(rank), size_(size), name_(std::move(name)) {}

  virtual Status DoAllReduceSum(ReduceDtype dtype, const void* send, void* recv, size_t count) = 0;
  virtual Status DoReduceScatterSum(ReduceDtype dtype, const void* send, void* recv,
                                    std::span<const size_t> recv_counts) = 0;

 private:
  const int rank_;
  const int size_;
  const std::string name_;
};

}  // namespace moeshard
