// The shared-expert step of LayerSteps (8 of layer_steps.h): replicated shared experts run on
// the chunk; TP-split ones run their columns on all T rows of the unit and are reduce-scattered
// into the chunks. A gated shared output is scaled per token by sigmoid(shared_out_gate . x).
#include "runtime/layer_steps.h"

namespace moeshard::internal {

Status LayerSteps::SharedExperts(const LayerWeights& ly, const LayerInput& in, const float* xc) {
  if (!ly.has_shared) return Status::Ok();
  const int64_t H = shape_.hidden, C = in.chunk.size();
  GatedMlpArgs mlp{.gate = &ly.shared_gate,
                   .up = &ly.shared_up,
                   .down = &ly.shared_down,
                   .activation = shape_.activation,
                   .x_stride = H,
                   .gate_buf = ws_.gate_buf.data(),
                   .up_buf = ws_.up_buf.data(),
                   .y_stride = H};
  if (shape_.shared_split) {
    mlp.x = ws_.xn.data();
    mlp.num_tokens = in.num_tokens;
    mlp.y = ws_.shared_partial.data();
    kb_.GatedMlp(mlp);
    MOESHARD_RETURN_IF_ERROR(groups_.tp->ReduceScatterSumV(ws_.shared_partial.data(),
                                                           ws_.shared_chunk.data(), ws_.tp_floats));
    AddSharedOutput(ly, xc, C);
    return Status::Ok();
  }
  if (C == 0) return Status::Ok();
  // Ungated: straight into chunk_y; gated: into shared_chunk, then scaled per token.
  mlp.x = xc;
  mlp.num_tokens = C;
  mlp.y = shape_.shared_gated ? ws_.shared_chunk.data() : ws_.chunk_y.data();
  mlp.accumulate = !shape_.shared_gated;
  kb_.GatedMlp(mlp);
  if (shape_.shared_gated) AddSharedOutput(ly, xc, C);
  return Status::Ok();
}

void LayerSteps::AddSharedOutput(const LayerWeights& ly, const float* xc, int64_t C) {
  const int64_t H = shape_.hidden;
  if (!shape_.shared_gated) {
    kb_.AddRows({.y = ws_.chunk_y.data(), .x = ws_.shared_chunk.data(), .num_rows = C, .cols = H});
    return;
  }
  if (C == 0) return;
  kb_.Linear(LinearArgs{.w = &ly.shared_out_gate,
                        .x = xc,
                        .x_stride = H,
                        .num_tokens = C,
                        .y = ws_.shared_gate_logit.data(),
                        .y_stride = 1});
  kb_.AddRows({.y = ws_.chunk_y.data(),
               .x = ws_.shared_chunk.data(),
               .num_rows = C,
               .cols = H,
               .gate_logits = ws_.shared_gate_logit.data()});
}

}  // namespace moeshard::internal
