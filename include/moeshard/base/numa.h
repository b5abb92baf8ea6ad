// NUMA nodes (Linux sysfs) and splitting a process's CPUs between ranks node by node.
//
// On a machine with several NUMA nodes each local rank's kernel threads go on CPUs of one node,
// so the pages its threads first touch while loading (the rank's weights and scratch) are that
// node's memory under Linux's default local allocation: a NUMA node is then a rank, the way a GPU
// is one. One node (or no sysfs) changes nothing.
//
// Thread safety: pure functions over their arguments (NumaNodes reads the file system).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moeshard {

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // ascending
};

// A Linux CPU list ("0-3,8,10-11") as ascending CPU numbers; empty for malformed text.
std::vector<int> ParseCpuList(std::string_view list);

// The NUMA nodes under `node_dir` (nodeN/cpulist), ascending by id; empty when the directory is
// absent or unreadable.
std::vector<NumaNode> NumaNodes(const std::string& node_dir = "/sys/devices/system/node");

// `allowed` split into `parts` runs of `per_part` CPUs: with two or more nodes holding allowed
// CPUs, the parts are spread over the nodes in contiguous blocks (part p on node p * N / parts)
// and each takes its CPUs from its own node; otherwise (one node, or a node too small for its
// parts) as SplitCpus. `node_of` (when non-null) receives each part's node id, -1 when not placed
// by node.
std::vector<std::vector<int>> SplitCpusByNode(const std::vector<int>& allowed,
                                              const std::vector<NumaNode>& nodes, int parts,
                                              int per_part, std::vector<int>* node_of = nullptr);

}  // namespace moeshard
