// The routed-expert steps of LayerSteps (4-6 of layer_steps.h): gather over MoE TP, the
// experts (locally, or dispatched over the EP group and combined back), and the MoE-TP
// reduce-scatter back into this rank's chunk.
#include "runtime/layer_steps.h"

namespace moeshard::internal {

Status LayerSteps::GatherMoeTp(int64_t C, Routed* r) {
  if (topo_.moe_tp == 1) return Status::Ok();
  const int64_t Lp = shape_.routed_width_padded, k = shape_.top_k;
  Communicator& comm = *groups_.moe_tp;
  r->num_rows = 0;
  for (size_t rows : ws_.mt_rows) r->num_rows += static_cast<int64_t>(rows);
  MOESHARD_RETURN_IF_ERROR(comm.AllGatherV(ws_.chunk_rows.data(), C, ws_.union_rows.data(),
                                           ws_.mt_rows, {}, Lp * sizeof(bf16_t)));
  MOESHARD_RETURN_IF_ERROR(comm.AllGatherV(ws_.chunk_ids.data(), C, ws_.union_ids.data(),
                                           ws_.mt_rows, {}, k * sizeof(int32_t)));
  MOESHARD_RETURN_IF_ERROR(comm.AllGatherV(ws_.chunk_w.data(), C, ws_.union_w.data(), ws_.mt_rows,
                                           {}, k * sizeof(float)));
  r->rows = ws_.union_rows.data();
  r->ids = ws_.union_ids.data();
  r->weights = ws_.union_w.data();
  return Status::Ok();
}

Status LayerSteps::RoutedExperts(const LayerWeights& ly, Routed* r, const LayerCounts& counts) {
  // This rank's I slice of its experts' outputs, weighted: union_out [U, Lp] fp32. The
  // down-projection bias is added once, by moe_tp rank 0.
  MoeExpertsParams mp;
  mp.num_experts_global = shape_.num_experts;
  mp.expert_global_to_local = global_to_local_;
  mp.x_dtype = DType::kBF16;
  mp.weights = &ly.experts;
  mp.activation = shape_.activation;
  mp.add_down_bias = coords_.moe_tp_rank == 0;
  if (topo_.moe_ep == 1) {
    if (r->num_rows == 0) return Status::Ok();
    // Every (row, choice) pair of the union runs on this rank's experts.
    CountSlots(r->ids, r->num_rows * shape_.top_k, counts);
    mp.topk_ids = r->ids;
    mp.topk_weights = r->weights;
    mp.num_tokens = r->num_rows;
    mp.top_k = shape_.top_k;
    mp.x = r->rows;
    mp.out = ws_.union_out.data();
    return kb_.MoeExperts(mp);
  }
  ExpertDispatcher& dispatcher = *groups_.dispatcher;
  MOESHARD_RETURN_IF_ERROR(dispatcher.Dispatch(r->rows, r->ids, r->num_rows));
  const int64_t R = dispatcher.num_received();
  CountSlots(dispatcher.received_expert_ids(), R, counts);
  if (R > 0) {
    if (ly.experts.num_experts_local == 0) {
      return InternalError("runtime: rows dispatched to a rank without experts");
    }
    // Each received row is one (token, expert) pair, weighted at its source on Combine.
    mp.topk_ids = dispatcher.received_expert_ids();
    mp.topk_weights = ws_.ones.data();
    mp.num_tokens = R;
    mp.top_k = 1;
    mp.x = dispatcher.received_rows();
    mp.out = dispatcher.received_outputs();
    MOESHARD_RETURN_IF_ERROR(kb_.MoeExperts(mp));
  }
  return dispatcher.Combine(r->weights, ws_.union_out.data(), shape_.routed_width_padded, false);
}

Status LayerSteps::ReduceMoeTp(Routed* r) {
  // Sum the moe_tp partials into this rank's chunk: [C, Lp].
  if (topo_.moe_tp == 1) return Status::Ok();
  MOESHARD_RETURN_IF_ERROR(
      groups_.moe_tp->ReduceScatterSumV(ws_.union_out.data(), ws_.chunk_out.data(), ws_.mt_floats));
  r->output = ws_.chunk_out.data();
  return Status::Ok();
}

}  // namespace moeshard::internal
