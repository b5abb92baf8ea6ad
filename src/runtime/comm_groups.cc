#include "runtime/comm_groups.h"

#include <algorithm>

#include "moeshard/plan/topology.h"

namespace moeshard::internal {
namespace {

// COLLECTIVE over `world`: the communicator of world.rank()'s group of kind `group`, its ranks
// ordered by their position in the group.
Result<std::unique_ptr<Communicator>> SplitGroup(Communicator& world, const ResolvedTopology& topo,
                                                 RankGroup group) {
  const int64_t rank = world.rank();
  return world.Split(static_cast<int>(GroupIndexOf(topo, group, rank)),
                     static_cast<int>(RankInGroup(topo, group, rank)));
}

}  // namespace

std::vector<std::vector<int>> ExpertOwners(const ShardPlan& plan, int64_t rank) {
  std::vector<std::vector<int>> owners(static_cast<size_t>(plan.model.num_experts));
  const std::vector<int64_t> peers = GroupPeers(plan.topology, RankGroup::kMoeEp, rank);
  for (size_t position = 0; position < peers.size(); ++position) {
    for (int64_t e : plan.ranks[static_cast<size_t>(peers[position])].expert_slots) {
      std::vector<int>& list = owners[static_cast<size_t>(e)];
      const int owner = static_cast<int>(position);
      if (std::find(list.begin(), list.end(), owner) == list.end()) list.push_back(owner);
    }
  }
  return owners;
}

Result<CommGroups> CreateCommGroups(const ShardPlan& plan, const LayerShape& shape,
                                    const WorkspaceSizes& sizes, Communicator& world) {
  const ResolvedTopology& topo = plan.topology;
  CommGroups g;
  g.world = &world;
  // Every rank splits the same groups in the same order.
  MOESHARD_ASSIGN_OR_RETURN(g.tp, SplitGroup(world, topo, RankGroup::kTp));
  MOESHARD_ASSIGN_OR_RETURN(g.moe_tp, SplitGroup(world, topo, RankGroup::kMoeTp));
  MOESHARD_ASSIGN_OR_RETURN(g.ep, SplitGroup(world, topo, RankGroup::kMoeEp));
  g.moe_tp_peers = GroupPeers(topo, RankGroup::kMoeTp, world.rank());
  if (topo.moe_ep > 1) {
    ExpertDispatcherOptions d;
    d.num_experts = shape.num_experts;
    d.top_k = shape.top_k;
    d.row_width = shape.routed_width_padded;
    d.out_width = shape.routed_width_padded;
    d.max_tokens = sizes.max_union;
    d.max_received_rows = sizes.max_received;
    d.owners = ExpertOwners(plan, world.rank());
    MOESHARD_ASSIGN_OR_RETURN(ExpertDispatcher disp, ExpertDispatcher::Create(*g.ep, d));
    g.dispatcher.emplace(std::move(disp));
  }
  return g;
}

}  // namespace moeshard::internal
