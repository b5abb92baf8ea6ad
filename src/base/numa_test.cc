// NUMA: sysfs CPU lists and per-node rank placement, on a fake sysfs tree (this machine has one
// node; a real multi-node machine was not available to test on).
#include "moeshard/base/numa.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "moeshard/base/thread_pool.h"

namespace moeshard {
namespace {

TEST(NumaTest, ParsesCpuLists) {
  EXPECT_EQ(ParseCpuList("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(ParseCpuList("5"), (std::vector<int>{5}));
  EXPECT_TRUE(ParseCpuList("").empty());
  EXPECT_TRUE(ParseCpuList("3-1").empty());
  EXPECT_TRUE(ParseCpuList("a,b").empty());
  EXPECT_TRUE(ParseCpuList("1,,2").empty());
}

// Two nodes of four CPUs (0-3, 4-7) as sysfs spells them, plus entries that are not nodes.
std::string FakeSysfs() {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("moeshard_numa_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  for (const auto& [name, list] :
       {std::pair<std::string, std::string>{"node1", "4-7\n"}, {"node0", "0-3\n"}}) {
    std::filesystem::create_directories(root / name);
    std::ofstream(root / name / "cpulist") << list;
  }
  std::filesystem::create_directories(root / "power");
  std::ofstream(root / "possible") << "0-1\n";
  return root.string();
}

TEST(NumaTest, ReadsNodesFromSysfs) {
  const std::string root = FakeSysfs();
  const std::vector<NumaNode> nodes = NumaNodes(root);
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].id, 0);
  EXPECT_EQ(nodes[0].cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(nodes[1].id, 1);
  EXPECT_EQ(nodes[1].cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_TRUE(NumaNodes(root + "/missing").empty());
  std::filesystem::remove_all(root);
}

TEST(NumaTest, RanksAreSpreadOverNodesAndStayOnTheirNode) {
  const std::vector<NumaNode> nodes = {{0, {0, 1, 2, 3}}, {1, {4, 5, 6, 7}}};
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int> node_of;
  // Two ranks of four threads: one per node.
  EXPECT_EQ(SplitCpusByNode(all, nodes, 2, 4, &node_of),
            (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(node_of, (std::vector<int>{0, 1}));
  // Four ranks of two: two per node, in rank order.
  EXPECT_EQ(SplitCpusByNode(all, nodes, 4, 2, &node_of),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(node_of, (std::vector<int>{0, 0, 1, 1}));
  // Three ranks of two: part p on node p * 2 / 3, so ranks 0 and 1 on node 0, rank 2 on node 1.
  EXPECT_EQ(SplitCpusByNode(all, nodes, 3, 2, &node_of),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_EQ(node_of, (std::vector<int>{0, 0, 1}));
  // A rank larger than a node: not placed by node (consecutive CPUs, as SplitCpus).
  EXPECT_EQ(SplitCpusByNode(all, nodes, 1, 6, &node_of),
            (std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5}}));
  EXPECT_EQ(node_of, (std::vector<int>{-1}));
  // Only the allowed CPUs count; a process confined to node 1 is one node.
  EXPECT_EQ(SplitCpusByNode({4, 5, 6, 7}, nodes, 2, 2, &node_of),
            (std::vector<std::vector<int>>{{4, 5}, {6, 7}}));
  EXPECT_EQ(node_of, (std::vector<int>{-1, -1}));
  // One node: exactly SplitCpus.
  EXPECT_EQ(SplitCpusByNode(all, {{0, all}}, 2, 3), SplitCpus(all, 2, 3));
  // Too few CPUs overall: nobody is pinned.
  EXPECT_TRUE(SplitCpusByNode(all, nodes, 3, 3).empty());
}

}  // namespace
}  // namespace moeshard
