// A progress bar for long jobs (loading weights), drawn once for the whole job.
//
// On a terminal the bar is redrawn in place ('\r', at most every 100 ms); when the stream is not
// a terminal (CI logs, pipes) it prints a plain line at every 10% instead, so logs stay short
// and readable. Add() may be called from any thread (loader workers); drawing is serialised and
// never blocks a worker (a worker that finds the bar busy skips the redraw).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace moeshard::cli {

class ProgressBar {
 public:
  // `total` bytes of work; `out` is usually stderr. Disabled bars draw nothing.
  ProgressBar(std::string label, int64_t total, std::FILE* out, bool enabled = true);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Thread-safe.
  void Add(int64_t n);
  // What is being worked on now, e.g. "rank 3/8" (shown after the label).
  void SetStage(const std::string& stage);
  // Draws the final state (100% when all work was added) and ends the line. Idempotent.
  void Finish();

  bool is_tty() const { return tty_; }

 private:
  void Draw(bool final);

  const std::string label_;
  const int64_t total_;
  std::FILE* const out_;
  const bool enabled_;
  const bool tty_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<int64_t> done_{0};
  std::mutex draw_mu_;  // guards everything below
  std::string stage_;
  std::chrono::steady_clock::time_point last_draw_;
  int last_decile_ = -1;
  bool finished_ = false;
};

}  // namespace moeshard::cli
