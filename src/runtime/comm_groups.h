// CommGroups: the communicators of the sharded MoE forward on one rank, split from the world
// at Create by the topology's groups (plan/topology.h RankGroup), with the world ranks of the
// peers the forward sizes its collectives by, and the expert-parallel dispatcher over the EP
// group. Private to the runtime.
//
//   tp      attention TP: the ranks of one unit (same tokens)       RankGroup::kTp
//   moe_tp  the ranks sharing one moe_ep rank                       RankGroup::kMoeTp
//   ep      the ranks sharing one moe_tp rank (dispatch / combine)  RankGroup::kMoeEp
//
// Thread safety: owned by one runtime; one thread. Creation is COLLECTIVE over the world.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"
#include "moeshard/plan/shard_plan.h"
#include "moeshard/runtime/expert_dispatch.h"
#include "runtime/layer_shape.h"
#include "runtime/workspace.h"

namespace moeshard::internal {

struct CommGroups {
  Communicator* world = nullptr;
  std::unique_ptr<Communicator> tp, moe_tp, ep;
  std::vector<int64_t> moe_tp_peers;  // [moe_tp] world ranks of the moe_tp group, by position
  // moe_ep > 1: dispatch and combine over `ep`, buffers sized for the workspace's U_max / R_max.
  std::optional<ExpertDispatcher> dispatcher;
};

// COLLECTIVE over `world`: splits the groups of `plan`'s topology for world.rank() and, with
// expert parallelism, builds the dispatcher over the EP group.
Result<CommGroups> CreateCommGroups(const ShardPlan& plan, const LayerShape& shape,
                                    const WorkspaceSizes& sizes, Communicator& world);

// [E]: the EP ranks (positions in the EP group of `rank`) holding each expert, from the plan's
// expert slots of the ranks in that group.
std::vector<std::vector<int>> ExpertOwners(const ShardPlan& plan, int64_t rank);

}  // namespace moeshard::internal
