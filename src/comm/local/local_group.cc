#include "comm/local/local_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

namespace moeshard::comm_internal {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

// ~1000 pauses are tens of microseconds: long enough to catch a peer that is a few
// microseconds behind (the common case for back-to-back collectives), short enough that a
// blocked wait costs little extra. Zero when ranks outnumber cores: the awaited rank may need
// the very core the spinner holds.
int ResolveSpin(const LocalCommOptions& options, int world_size) {
  if (options.spin_iterations >= 0) return options.spin_iterations;
  const unsigned cores = std::thread::hardware_concurrency();
  return cores >= static_cast<unsigned>(world_size) ? 1000 : 0;
}

}  // namespace

LocalJob::LocalJob(int world_size, const LocalCommOptions& options)
    : world_size_(world_size),
      options_(options),
      spin_iterations_(ResolveSpin(options, world_size)),
      exited_(new std::atomic<bool>[static_cast<size_t>(world_size)]),
      activity_(new Activity[static_cast<size_t>(world_size)]) {
  for (int r = 0; r < world_size; ++r) exited_[static_cast<size_t>(r)].store(false);
}

std::shared_ptr<LocalGroup> LocalJob::NewGroup(std::string name, std::vector<int> world_ranks) {
  auto group =
      std::make_shared<LocalGroup>(shared_from_this(), std::move(name), std::move(world_ranks));
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(groups_, [](const std::weak_ptr<LocalGroup>& g) { return g.expired(); });
  groups_.push_back(group);
  return group;
}

void LocalJob::Abort(int world_rank, const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    root_cause_ = status;
    root_rank_ = world_rank;
    aborted_.store(true, std::memory_order_release);
  }
  WakeAll();
}

Status LocalJob::PeerAbortStatus() const {
  std::lock_guard<std::mutex> lock(mutex_);
  // "[rank r/n] CODE: message": the failing rank first, as MpiSession::AbortJob prints it.
  const std::string prefix = RankPrefix(root_rank_, world_size_);
  std::string message = root_cause_.message();
  if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
  return AbortedError(prefix + StatusCodeName(root_cause_.code()) + ": " + message);
}

Status LocalJob::root_cause() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return root_cause_;
}

void LocalJob::MarkExited(int world_rank) {
  exited_[static_cast<size_t>(world_rank)].store(true, std::memory_order_release);
  WakeAll();
}

void LocalJob::WakeAll() {
  std::vector<std::shared_ptr<LocalGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& weak : groups_) {
      if (auto g = weak.lock()) groups.push_back(std::move(g));
    }
  }
  for (const auto& g : groups) g->Wake();
}

void LocalJob::SetActivity(int world_rank, const char* op, const std::string* comm_name) {
  Activity& a = activity_[static_cast<size_t>(world_rank)];
  a.comm_name.store(comm_name, std::memory_order_relaxed);
  a.op.store(op, std::memory_order_release);
}

std::string LocalJob::DescribeActivity(int world_rank) const {
  if (exited(world_rank)) return "returned from its rank function";
  const Activity& a = activity_[static_cast<size_t>(world_rank)];
  const char* op = a.op.load(std::memory_order_acquire);
  const std::string* comm = a.comm_name.load(std::memory_order_relaxed);
  if (op == nullptr || comm == nullptr) return "not in a collective";
  return fmt::format("in {} on '{}'", op, *comm);
}

LocalGroup::LocalGroup(std::shared_ptr<LocalJob> job, std::string name,
                       std::vector<int> world_ranks)
    : job_(std::move(job)),
      name_(std::move(name)),
      world_ranks_(std::move(world_ranks)),
      slots_(world_ranks_.size()),
      arrived_(world_ranks_.size(), 0) {}

void LocalGroup::Wake() {
  // Taking the mutex orders this wake-up after any waiter's check of the state, so the
  // notification cannot fall between a waiter's check and its wait.
  { std::lock_guard<std::mutex> lock(mutex_); }
  cv_.notify_all();
}

std::string LocalGroup::MissingRanksMessage() const {
  std::vector<int> arrived;
  std::string missing;
  for (int r = 0; r < size(); ++r) {
    if (arrived_[static_cast<size_t>(r)]) {
      arrived.push_back(r);
      continue;
    }
    if (!missing.empty()) missing += "; ";
    const int w = world_rank(r);
    if (name_ == "world") {
      missing += fmt::format("rank {}: {}", r, job_->DescribeActivity(w));
    } else {
      missing += fmt::format("rank {} (world rank {}): {}", r, w, job_->DescribeActivity(w));
    }
  }
  return fmt::format("missing {}; arrived: [{}]", missing, JoinRanks(arrived));
}

Status LocalGroup::Arrive(int rank, bool abortable, LocalClock::time_point deadline, uint64_t seq) {
  const size_t r = static_cast<size_t>(rank);
  std::unique_lock<std::mutex> lock(mutex_);
  if (abortable && job_->aborted()) return job_->PeerAbortStatus();
  const uint64_t gen = generation_.load(std::memory_order_relaxed);
  arrived_[r] = 1;
  if (++num_arrived_ == size()) {
    num_arrived_ = 0;
    std::fill(arrived_.begin(), arrived_.end(), 0);
    generation_.store(gen + 1, std::memory_order_release);
    lock.unlock();
    cv_.notify_all();
    return Status::Ok();
  }
  lock.unlock();

  for (int i = 0; i < job_->spin_iterations(); ++i) {
    if (generation_.load(std::memory_order_acquire) != gen) return Status::Ok();
    if (abortable && job_->aborted()) break;
    CpuRelax();
  }

  lock.lock();
  auto withdraw = [&] {
    arrived_[r] = 0;
    --num_arrived_;
  };
  while (generation_.load(std::memory_order_relaxed) == gen) {
    if (!abortable) {
      cv_.wait(lock);
      continue;
    }
    if (job_->aborted()) {
      withdraw();
      return job_->PeerAbortStatus();
    }
    if (failure_reported_gen_ == gen) {
      // A peer has already reported this barrier's failure and is about to abort the job:
      // wait for that (one root cause, with the full list of missing ranks).
      cv_.wait(lock);
      continue;
    }
    Status failure;
    for (int q = 0; q < size() && failure.ok(); ++q) {
      if (!arrived_[static_cast<size_t>(q)] && job_->exited(world_rank(q))) {
        failure = FailedPreconditionError(fmt::format(
            "collective #{} can never complete: {} (a rank returned while its peers still "
            "expected it in a collective; every rank must issue the same collectives)",
            seq, MissingRanksMessage()));
      }
    }
    if (failure.ok() && cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        generation_.load(std::memory_order_relaxed) == gen && !job_->aborted() &&
        failure_reported_gen_ != gen) {
      const double secs = std::chrono::duration<double>(job_->options().timeout).count();
      failure = DeadlineExceededError(fmt::format(
          "collective #{} timed out after {:g} s waiting for ranks to arrive: {} (a rank is "
          "stuck, or the ranks issue collectives in different orders; raise "
          "LocalCommOptions::timeout if the work between collectives is slow)",
          seq, secs, MissingRanksMessage()));
    }
    if (!failure.ok()) {
      failure_reported_gen_ = gen;
      withdraw();
      return failure;
    }
  }
  return Status::Ok();
}

std::shared_ptr<LocalGroup> LocalGroup::GetOrCreateSplit(uint64_t seq, int color,
                                                         const std::string& name,
                                                         const std::vector<int>& world_ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Every rank has left split `split_seq_` before any rank can pass the publish barrier of a
  // later collective, so older entries are no longer needed.
  if (split_seq_ != seq) {
    split_groups_.clear();
    split_seq_ = seq;
  }
  std::shared_ptr<LocalGroup>& group = split_groups_[color];
  if (!group) group = job_->NewGroup(name, world_ranks);
  return group;
}

}  // namespace moeshard::comm_internal
