// ExpertDispatcher: expert-parallel dispatch and combine of (token, expert) pairs over the EP
// communicator, as DESIGN.md's sharded forward step 3 describes.
//
//   Dispatch  every (token u, slot s) pair whose expert e = topk_ids[u, s] lives on EP rank
//             p = Owner(e, u) sends the token's row to p (one row per pair, so a token with two
//             experts on p is sent twice), together with e. Counts are exchanged first
//             (AllToAll), then expert ids and rows (AllToAllV). Rows leave sorted by destination
//             rank and, within one, by (u, s).
//   Expert    the caller runs its local experts on received_rows() (expert of row i:
//             received_expert_ids()[i]) and writes each row's unweighted output into
//             received_outputs().
//   Combine   the outputs go back the reverse way (AllToAllV, fp32), so the source receives the
//             output of pair (u, s) at CombinedRow(u, s); Combine then forms
//             out[u] = sum over s, in slot order, of topk_weights[u, s] * CombinedRow(u, s)
//             -- the same order the single-rank unpermute sums in.
//
// Owner(e, u): EP ranks holding expert e (EPLB may place it on several); with several, token u
// goes to owners[u % count] (deterministic, spreads redundant experts' load).
//
// Buffers are allocated once, at construction, for at most `max_tokens` tokens per Dispatch and
// `max_received_rows` received rows (a sender's token sends at most min(top_k, slots on p) rows
// to p, so moe_ep * max_tokens * min(top_k, max slots per rank) always suffices).
//
// Thread safety: one thread at a time (the rank's thread); Dispatch/Combine are COLLECTIVE over
// the EP communicator and must alternate: Dispatch, Combine, Dispatch, ...
#pragma once

#include <cstdint>
#include <vector>

#include "moeshard/base/numeric.h"
#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"

namespace moeshard {

struct ExpertDispatcherOptions {
  int64_t num_experts = 0;        // global (logical) experts E
  int64_t top_k = 0;              // k
  int64_t row_width = 0;          // bf16 elements per dispatched row (the experts' padded H)
  int64_t out_width = 0;          // fp32 elements per expert output row
  int64_t max_tokens = 0;         // tokens per Dispatch, at most
  int64_t max_received_rows = 0;  // rows one rank may receive, at most
  // [num_experts]: EP ranks holding each expert, each list non-empty, ranks in [0, ep size).
  std::vector<std::vector<int>> owners;
};

class ExpertDispatcher {
 public:
  // `ep` must outlive the dispatcher. InvalidArgument for inconsistent options.
  static Result<ExpertDispatcher> Create(Communicator& ep, ExpertDispatcherOptions options);

  // COLLECTIVE over ep. rows: [num_tokens, row_width] bf16 row-major; topk_ids: [num_tokens,
  // top_k] int32 global expert ids in [0, num_experts) (else InvalidArgument).
  // REQUIRES: num_tokens <= max_tokens. Fails with ResourceExhausted (on the receiving rank,
  // which then aborts the job) when more than max_received_rows rows arrive.
  Status Dispatch(const bf16_t* rows, const int32_t* topk_ids, int64_t num_tokens);

  int64_t num_received() const { return num_received_; }
  // [num_received(), row_width] bf16: the rows sent to this rank, grouped by source EP rank.
  const bf16_t* received_rows() const { return recv_rows_.data(); }
  // [num_received()] int32: the global expert each received row is for.
  const int32_t* received_expert_ids() const { return recv_ids_.data(); }
  // [num_received(), out_width] fp32: filled by the caller before Combine.
  float* received_outputs() { return recv_out_.data(); }
  // [num_received()] int32: source EP rank of each received row (for tests and diagnostics).
  const int32_t* received_source_ranks() const { return recv_src_.data(); }

  // COLLECTIVE over ep: returns every received_outputs() row to its source. topk_weights:
  // [num_tokens, top_k] fp32; out: [num_tokens, out_stride] fp32, columns [0, out_width)
  // written (accumulate: added to). Tokens of the last Dispatch.
  Status Combine(const float* topk_weights, float* out, int64_t out_stride, bool accumulate);

  // After Combine: the (unweighted) output returned for pair (token u, slot s):
  // [out_width] fp32.
  const float* CombinedRow(int64_t u, int64_t s) const {
    return back_rows_.data() + static_cast<size_t>(row_of_pair_[u * opt_.top_k + s]) *
                                   static_cast<size_t>(opt_.out_width);
  }

  // Bytes of the buffers held (all allocated at Create).
  int64_t WorkspaceBytes() const;

 private:
  ExpertDispatcher(Communicator& ep, ExpertDispatcherOptions options);

  Communicator* ep_;
  ExpertDispatcherOptions opt_;
  int64_t num_tokens_ = 0;
  int64_t num_received_ = 0;
  int64_t num_sent_ = 0;
  std::vector<size_t> send_counts_, recv_counts_;  // [ep size]
  std::vector<size_t> send_displs_, recv_displs_;  // [ep size]
  std::vector<size_t> cursor_;                     // [ep size]
  std::vector<int32_t> dest_of_pair_;              // [max_tokens * top_k]
  std::vector<int32_t> row_of_pair_;               // [max_tokens * top_k] send row of each pair
  std::vector<int32_t> send_ids_;                  // [max_tokens * top_k]
  std::vector<bf16_t> send_rows_;                  // [max_tokens * top_k, row_width]
  std::vector<int32_t> recv_ids_;                  // [max_received_rows]
  std::vector<int32_t> recv_src_;                  // [max_received_rows]
  std::vector<bf16_t> recv_rows_;                  // [max_received_rows, row_width]
  std::vector<float> recv_out_;                    // [max_received_rows, out_width]
  std::vector<float> back_rows_;                   // [max_tokens * top_k, out_width]
};

}  // namespace moeshard
