// Shared state of the local backend: a LocalJob (one per RunLocalRanks call: the abort flag,
// the root-cause failure, which ranks have returned) and LocalGroups (one per communicator
// group: the world and every split; per-rank slots where arguments are published, and the
// barrier the collectives synchronise on).
//
// Synchronisation: a LocalGroup's barrier is a generation counter guarded by a mutex; waiters
// spin briefly on the atomic generation, then block on a condition variable. Publishing a slot
// happens before arriving, and arriving/leaving goes through the mutex and the release/acquire
// generation, so a rank that has passed the barrier sees every peer's slot.
//
// Thread safety: every method is safe from any thread, except slot(r), which rank r writes
// before arriving and peers read between the publish and completion barriers only.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "comm/collective_util.h"
#include "moeshard/base/status.h"
#include "moeshard/comm/local_comm.h"

namespace moeshard::comm_internal {

class LocalGroup;
using LocalClock = std::chrono::steady_clock;

class LocalJob : public std::enable_shared_from_this<LocalJob> {
 public:
  LocalJob(int world_size, const LocalCommOptions& options);

  int world_size() const { return world_size_; }
  const LocalCommOptions& options() const { return options_; }
  int spin_iterations() const { return spin_iterations_; }

  // Creates a group of the given world ranks (in group-rank order) registered for wake-ups.
  // REQUIRES: this job is owned by a std::shared_ptr.
  std::shared_ptr<LocalGroup> NewGroup(std::string name, std::vector<int> world_ranks);

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Records `status` (its message already prefixed "[rank r/n] ") as the job's failure unless
  // one is recorded, then wakes every waiter of every group.
  void Abort(int world_rank, const Status& status);
  // What peers of the failing rank return: Aborted("[rank r/n] <CODE>: <message>").
  Status PeerAbortStatus() const;
  // The recorded failure, or OK.
  Status root_cause() const;

  // Marks world rank r as having returned from its rank function; wakes waiters so that ones
  // waiting for r fail instead of timing out.
  void MarkExited(int world_rank);
  bool exited(int world_rank) const {
    return exited_[static_cast<size_t>(world_rank)].load(std::memory_order_acquire);
  }

  // Diagnostics for timeout messages: which collective each world rank is in.
  void SetActivity(int world_rank, const char* op, const std::string* comm_name);
  std::string DescribeActivity(int world_rank) const;

 private:
  void WakeAll();

  struct Activity {
    std::atomic<const char*> op{nullptr};
    std::atomic<const std::string*> comm_name{nullptr};
  };

  const int world_size_;
  const LocalCommOptions options_;
  const int spin_iterations_;
  std::atomic<bool> aborted_{false};
  std::unique_ptr<std::atomic<bool>[]> exited_;
  std::unique_ptr<Activity[]> activity_;

  mutable std::mutex mutex_;  // guards the fields below; never held while locking a group
  Status root_cause_;
  int root_rank_ = -1;
  std::vector<std::weak_ptr<LocalGroup>> groups_;
};

// What a rank publishes for the collective it is in. Spans point into the caller's arguments
// or into the rank's LocalComm, valid until the completion barrier.
struct LocalSlot {
  CallHeader header;
  const void* send = nullptr;
  void* recv = nullptr;
  std::span<const size_t> send_counts;  // AllToAllV
  std::span<const size_t> send_displs;  // AllToAllV, resolved (never empty when counts are not)
  std::span<const size_t> recv_counts;  // AllGatherV, AllToAllV
  int color = 0;                        // Split
  int key = 0;                          // Split
};

class LocalGroup {
 public:
  LocalGroup(std::shared_ptr<LocalJob> job, std::string name, std::vector<int> world_ranks);

  int size() const { return static_cast<int>(world_ranks_.size()); }
  const std::string& name() const { return name_; }
  int world_rank(int rank) const { return world_ranks_[static_cast<size_t>(rank)]; }
  LocalJob& job() { return *job_; }
  LocalSlot& slot(int rank) { return slots_[static_cast<size_t>(rank)]; }

  // Barrier over the group's ranks. Abortable waits (the publish barrier) return early with
  // the job's Aborted status, with FailedPrecondition when a rank that never arrived has
  // returned from its rank function, or with DeadlineExceeded at `deadline`, naming the
  // missing ranks; the caller is then not counted as arrived. Non-abortable waits (the
  // completion barrier, entered only after everyone published, so every rank arrives after
  // bounded work) always complete and return OK.
  Status Arrive(int rank, bool abortable, LocalClock::time_point deadline, uint64_t seq);

  // Wakes every waiter (after the job's abort or exit state changed).
  void Wake();

  // The group formed by color `color` in split number `seq` of this group: the first rank to
  // ask creates it, the others get the same object.
  std::shared_ptr<LocalGroup> GetOrCreateSplit(uint64_t seq, int color, const std::string& name,
                                               const std::vector<int>& world_ranks);

 private:
  std::string MissingRanksMessage() const;  // REQUIRES: mutex_ held

  const std::shared_ptr<LocalJob> job_;
  const std::string name_;
  const std::vector<int> world_ranks_;
  std::vector<LocalSlot> slots_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};  // written under mutex_, read lock-free while spinning
  int num_arrived_ = 0;
  std::vector<char> arrived_;  // [size()] who has arrived in the current generation
  // Generation whose failure (timeout, exited rank) a waiter has reported; the caller then
  // aborts the job, so the other waiters wait for that instead of reporting their own.
  uint64_t failure_reported_gen_ = UINT64_MAX;

  uint64_t split_seq_ = 0;
  std::map<int, std::shared_ptr<LocalGroup>> split_groups_;
};

}  // namespace moeshard::comm_internal
