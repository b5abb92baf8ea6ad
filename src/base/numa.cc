#include "moeshard/base/numa.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moeshard/base/thread_pool.h"

namespace moeshard {
namespace {

bool ParseInt(std::string_view s, int* out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && *out >= 0;
}

}  // namespace

std::vector<int> ParseCpuList(std::string_view list) {
  std::vector<int> out;
  while (!list.empty() && (list.back() == '\n' || list.back() == ' ')) list.remove_suffix(1);
  if (list.empty()) return out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string_view item = list.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    int lo = 0, hi = 0;
    if (dash == std::string_view::npos) {
      if (!ParseInt(item, &lo)) return {};
      hi = lo;
    } else if (!ParseInt(item.substr(0, dash), &lo) || !ParseInt(item.substr(dash + 1), &hi) ||
               hi < lo) {
      return {};
    }
    for (int c = lo; c <= hi; ++c) out.push_back(c);
    pos = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<NumaNode> NumaNodes(const std::string& node_dir) {
  std::vector<NumaNode> nodes;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(node_dir, ec)) {
    const std::string name = entry.path().filename().string();
    int id = 0;
    if (name.rfind("node", 0) != 0 || !ParseInt(std::string_view(name).substr(4), &id)) continue;
    std::ifstream in(entry.path() / "cpulist");
    if (!in) continue;
    std::stringstream text;
    text << in.rdbuf();
    nodes.push_back({id, ParseCpuList(text.str())});
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  return nodes;
}

std::vector<std::vector<int>> SplitCpusByNode(const std::vector<int>& allowed,
                                              const std::vector<NumaNode>& nodes, int parts,
                                              int per_part, std::vector<int>* node_of) {
  if (node_of != nullptr) node_of->assign(static_cast<size_t>(std::max(parts, 0)), -1);
  // The nodes that hold allowed CPUs, with only those.
  std::vector<NumaNode> usable;
  for (const NumaNode& n : nodes) {
    NumaNode u{n.id, {}};
    for (int c : n.cpus) {
      if (std::find(allowed.begin(), allowed.end(), c) != allowed.end()) u.cpus.push_back(c);
    }
    if (!u.cpus.empty()) usable.push_back(std::move(u));
  }
  const int num_nodes = static_cast<int>(usable.size());
  if (num_nodes < 2 || parts < 1 || per_part < 1) return SplitCpus(allowed, parts, per_part);
  std::vector<std::vector<int>> out(static_cast<size_t>(parts));
  std::vector<size_t> used(static_cast<size_t>(num_nodes), 0);
  for (int p = 0; p < parts; ++p) {
    const int n = static_cast<int>(static_cast<int64_t>(p) * num_nodes / parts);
    const std::vector<int>& cpus = usable[static_cast<size_t>(n)].cpus;
    size_t& u = used[static_cast<size_t>(n)];
    if (u + static_cast<size_t>(per_part) > cpus.size()) {
      return SplitCpus(allowed, parts, per_part);  // a node too small: no per-node placement
    }
    out[static_cast<size_t>(p)].assign(cpus.begin() + static_cast<std::ptrdiff_t>(u),
                                       cpus.begin() + static_cast<std::ptrdiff_t>(u) + per_part);
    u += static_cast<size_t>(per_part);
  }
  if (node_of != nullptr) {
    for (int p = 0; p < parts; ++p) {
      (*node_of)[static_cast<size_t>(p)] =
          usable[static_cast<size_t>(static_cast<int64_t>(p) * num_nodes / parts)].id;
    }
  }
  return out;
}

}  // namespace moeshard
