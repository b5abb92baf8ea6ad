#include "cli/cli_progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "moeshard/base/units.h"

namespace moeshard::cli {
namespace {

constexpr auto kRedrawInterval = std::chrono::milliseconds(100);
constexpr int kBarWidth = 30;

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, std::FILE* out, bool enabled)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 0)),
      out_(out),
      enabled_(enabled && out != nullptr),
      tty_(out != nullptr && ::isatty(::fileno(out)) == 1),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Add(int64_t n) {
  done_.fetch_add(n, std::memory_order_relaxed);
  if (!enabled_) return;
  std::unique_lock<std::mutex> lock(draw_mu_, std::try_to_lock);
  if (!lock.owns_lock() || finished_) return;
  Draw(false);
}

void ProgressBar::SetStage(const std::string& stage) {
  std::lock_guard<std::mutex> lock(draw_mu_);
  stage_ = stage;
}

void ProgressBar::Finish() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(draw_mu_);
  if (finished_) return;
  Draw(true);
  finished_ = true;
}

void ProgressBar::Draw(bool final) {
  const auto now = std::chrono::steady_clock::now();
  const int64_t done = std::min(done_.load(std::memory_order_relaxed), total_);
  const double frac = total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  const int decile = static_cast<int>(frac * 10);
  if (tty_) {
    if (!final && now - last_draw_ < kRedrawInterval) return;
  } else if (!final && decile <= last_decile_) {
    return;
  }
  if (final && !tty_ && decile <= last_decile_ && done < total_) return;
  last_draw_ = now;
  last_decile_ = decile;
  const double secs = std::chrono::duration<double>(now - start_).count();
  const std::string rate =
      secs > 0.05 ? FormatBytes(static_cast<int64_t>(static_cast<double>(done) / secs)) + "/s"
                  : std::string("-");
  const std::string head = stage_.empty() ? label_ : label_ + " " + stage_;
  const std::string tail = fmt::format("{:3.0f}%  {} / {}  {}  {:.1f} s", frac * 100,
                                       FormatBytes(done), FormatBytes(total_), rate, secs);
  if (tty_) {
    const int filled = static_cast<int>(frac * kBarWidth);
    const std::string bar = std::string(static_cast<size_t>(filled), '#') +
                            std::string(static_cast<size_t>(kBarWidth - filled), '.');
    std::fprintf(out_, "\r\033[K%s [%s] %s%s", head.c_str(), bar.c_str(), tail.c_str(),
                 final ? "\n" : "");
  } else {
    std::fprintf(out_, "%s: %s\n", head.c_str(), tail.c_str());
  }
  std::fflush(out_);
}

}  // namespace moeshard::cli
