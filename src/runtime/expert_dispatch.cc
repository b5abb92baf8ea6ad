#include "moeshard/runtime/expert_dispatch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace moeshard {

Result<ExpertDispatcher> ExpertDispatcher::Create(Communicator& ep,
                                                  ExpertDispatcherOptions options) {
  const auto& o = options;
  if (o.num_experts <= 0 || o.top_k <= 0 || o.top_k > o.num_experts || o.row_width <= 0 ||
      o.out_width <= 0 || o.max_tokens < 0 || o.max_received_rows < 0) {
    return InvalidArgumentError(fmt::format(
        "expert dispatch: 'options': expected num_experts > 0, 0 < top_k <= num_experts, "
        "positive widths, non-negative maxima, got E {} k {} widths {}/{} maxima {}/{}",
        o.num_experts, o.top_k, o.row_width, o.out_width, o.max_tokens, o.max_received_rows));
  }
  if (static_cast<int64_t>(o.owners.size()) != o.num_experts) {
    return InvalidArgumentError(
        fmt::format("expert dispatch: 'owners': expected {} lists (one per expert), got {}",
                    o.num_experts, o.owners.size()));
  }
  for (int64_t e = 0; e < o.num_experts; ++e) {
    if (o.owners[e].empty()) {
      return InvalidArgumentError(
          fmt::format("expert dispatch: 'owners[{}]': expected at least one EP rank, got none "
                      "(expert {} is held by no rank)",
                      e, e));
    }
    for (int p : o.owners[e]) {
      if (p < 0 || p >= ep.size()) {
        return InvalidArgumentError(
            fmt::format("expert dispatch: 'owners[{}]': expected EP ranks in [0, {}), got {}", e,
                        ep.size(), p));
      }
    }
  }
  return ExpertDispatcher(ep, std::move(options));
}

ExpertDispatcher::ExpertDispatcher(Communicator& ep, ExpertDispatcherOptions options)
    : ep_(&ep), opt_(std::move(options)) {
  const size_t n = static_cast<size_t>(ep.size());
  const size_t pairs = static_cast<size_t>(opt_.max_tokens * opt_.top_k);
  const size_t recv = static_cast<size_t>(opt_.max_received_rows);
  send_counts_.assign(n, 0);
  recv_counts_.assign(n, 0);
  send_displs_.assign(n, 0);
  recv_displs_.assign(n, 0);
  cursor_.assign(n, 0);
  dest_of_pair_.assign(pairs, 0);
  row_of_pair_.assign(pairs, 0);
  send_ids_.assign(pairs, 0);
  send_rows_.assign(pairs * static_cast<size_t>(opt_.row_width), bf16_t{});
  recv_ids_.assign(recv, 0);
  recv_src_.assign(recv, 0);
  recv_rows_.assign(recv * static_cast<size_t>(opt_.row_width), bf16_t{});
  recv_out_.assign(recv * static_cast<size_t>(opt_.out_width), 0.0f);
  back_rows_.assign(pairs * static_cast<size_t>(opt_.out_width), 0.0f);
}

int64_t ExpertDispatcher::WorkspaceBytes() const {
  auto b = [](const auto& v) { return static_cast<int64_t>(v.size() * sizeof(v[0])); };
  return b(send_counts_) + b(recv_counts_) + b(send_displs_) + b(recv_displs_) + b(cursor_) +
         b(dest_of_pair_) + b(row_of_pair_) + b(send_ids_) + b(send_rows_) + b(recv_ids_) +
         b(recv_src_) + b(recv_rows_) + b(recv_out_) + b(back_rows_);
}

Status ExpertDispatcher::Dispatch(const bf16_t* rows, const int32_t* topk_ids, int64_t num_tokens) {
  const int64_t k = opt_.top_k;
  const int n = ep_->size();
  if (num_tokens < 0 || num_tokens > opt_.max_tokens) {
    return InvalidArgumentError(
        fmt::format("expert dispatch: 'num_tokens': expected at most {} (max_tokens), got {}",
                    opt_.max_tokens, num_tokens));
  }
  if (num_tokens > 0 && (rows == nullptr || topk_ids == nullptr)) {
    return InvalidArgumentError("expert dispatch: 'rows/topk_ids': expected non-null");
  }
  // Destination of every pair, counts per destination.
  std::fill(send_counts_.begin(), send_counts_.end(), 0);
  for (int64_t u = 0; u < num_tokens; ++u) {
    for (int64_t s = 0; s < k; ++s) {
      const int32_t e = topk_ids[u * k + s];
      if (e < 0 || e >= opt_.num_experts) {
        return InvalidArgumentError(fmt::format(
            "expert dispatch: 'topk_ids[{}, {}]': expected an expert in [0, {}), got {}", u, s,
            opt_.num_experts, e));
      }
      const std::vector<int>& owners = opt_.owners[e];
      const int p = owners[static_cast<size_t>(u) % owners.size()];
      dest_of_pair_[u * k + s] = p;
      ++send_counts_[p];
    }
  }
  // Pack: rows sorted by destination, then (u, s).
  size_t off = 0;
  for (int p = 0; p < n; ++p) {
    send_displs_[p] = off;
    cursor_[p] = off;
    off += send_counts_[p];
  }
  num_sent_ = static_cast<int64_t>(off);
  const size_t w = static_cast<size_t>(opt_.row_width);
  for (int64_t u = 0; u < num_tokens; ++u) {
    for (int64_t s = 0; s < k; ++s) {
      const size_t row = cursor_[dest_of_pair_[u * k + s]]++;
      row_of_pair_[u * k + s] = static_cast<int32_t>(row);
      send_ids_[row] = topk_ids[u * k + s];
      std::memcpy(send_rows_.data() + row * w, rows + static_cast<size_t>(u) * w,
                  w * sizeof(bf16_t));
    }
  }
  num_tokens_ = num_tokens;

  MOESHARD_RETURN_IF_ERROR(ep_->AllToAll(send_counts_.data(), recv_counts_.data(), sizeof(size_t)));
  size_t total = 0;
  for (int p = 0; p < n; ++p) {
    recv_displs_[p] = total;
    total += recv_counts_[p];
  }
  if (static_cast<int64_t>(total) > opt_.max_received_rows) {
    return ResourceExhaustedError(fmt::format(
        "expert dispatch: 'received rows': expected at most {} (the buffer sized from the plan "
        "and max tokens), got {}",
        opt_.max_received_rows, total));
  }
  num_received_ = static_cast<int64_t>(total);
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < recv_counts_[p]; ++i) recv_src_[recv_displs_[p] + i] = p;
  }
  MOESHARD_RETURN_IF_ERROR(ep_->AllToAllV(AllToAllVArgs{.elem_bytes = sizeof(int32_t),
                                                        .send = send_ids_.data(),
                                                        .send_counts = send_counts_,
                                                        .send_displs = send_displs_,
                                                        .recv = recv_ids_.data(),
                                                        .recv_counts = recv_counts_,
                                                        .recv_displs = recv_displs_}));
  return ep_->AllToAllV(AllToAllVArgs{.elem_bytes = w * sizeof(bf16_t),
                                      .send = send_rows_.data(),
                                      .send_counts = send_counts_,
                                      .send_displs = send_displs_,
                                      .recv = recv_rows_.data(),
                                      .recv_counts = recv_counts_,
                                      .recv_displs = recv_displs_});
}

Status ExpertDispatcher::Combine(const float* topk_weights, float* out, int64_t out_stride,
                                 bool accumulate) {
  const size_t w = static_cast<size_t>(opt_.out_width);
  // The reverse exchange: what this rank received goes back with the counts swapped.
  MOESHARD_RETURN_IF_ERROR(ep_->AllToAllV(AllToAllVArgs{.elem_bytes = w * sizeof(float),
                                                        .send = recv_out_.data(),
                                                        .send_counts = recv_counts_,
                                                        .send_displs = recv_displs_,
                                                        .recv = back_rows_.data(),
                                                        .recv_counts = send_counts_,
                                                        .recv_displs = send_displs_}));
  const int64_t k = opt_.top_k;
  for (int64_t u = 0; u < num_tokens_; ++u) {
    float* o = out + u * out_stride;
    if (!accumulate) std::fill(o, o + w, 0.0f);
    for (int64_t s = 0; s < k; ++s) {
      const float wt = topk_weights[u * k + s];
      const float* y = CombinedRow(u, s);
      for (size_t h = 0; h < w; ++h) o[h] += wt * y[h];
    }
  }
  return Status::Ok();
}

}  // namespace moeshard
