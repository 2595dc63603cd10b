// implied_edges (core/implied_edges.h): topological order, reachability bit sets, the rule.
#include "core/implied_edges.h"

#include <cstdint>

#include "core/error.h"

namespace precis {

std::vector<size_t> implied_edges(size_t num_nodes, const std::vector<DagEdge>& edges) {
  std::vector<std::vector<size_t>> out(num_nodes);  // each node's outgoing edges (indices)
  std::vector<size_t> in_degree(num_nodes, 0);
  for (size_t e = 0; e < edges.size(); ++e) {
    PRECIS_CHECK(edges[e].from < num_nodes && edges[e].to < num_nodes, "implied_edges: edge ", e, " (", edges[e].from,
                 " -> ", edges[e].to, ") names a node outside the graph's ", num_nodes, " nodes");
    out[edges[e].from].push_back(e);
    ++in_degree[edges[e].to];
  }
  // Kahn's topological order.
  std::vector<size_t> order;
  order.reserve(num_nodes);
  for (size_t v = 0; v < num_nodes; ++v)
    if (in_degree[v] == 0) order.push_back(v);
  for (size_t i = 0; i < order.size(); ++i)
    for (size_t e : out[order[i]])
      if (--in_degree[edges[e].to] == 0) order.push_back(edges[e].to);
  PRECIS_CHECK(order.size() == num_nodes, "implied_edges: the edges form a cycle; a dependency graph has none");

  // reach[v]: the nodes reachable from v over completion edges, a bit set of `words` words.
  const size_t words = (num_nodes + 63) / 64;
  std::vector<uint64_t> reach(num_nodes * words, 0);
  auto reaches = [&](size_t from, size_t to) { return (reach[from * words + to / 64] >> (to % 64)) & 1; };
  for (size_t i = num_nodes; i-- > 0;) {
    const size_t v = order[i];
    for (size_t e : out[v]) {
      if (!edges[e].orders_completion) continue;
      const size_t x = edges[e].to;
      reach[v * words + x / 64] |= uint64_t{1} << (x % 64);
      for (size_t k = 0; k < words; ++k) reach[v * words + k] |= reach[x * words + k];
    }
  }

  std::vector<size_t> implied;
  for (size_t e = 0; e < edges.size(); ++e) {
    const size_t u = edges[e].from, v = edges[e].to;
    for (size_t other : out[u]) {
      const size_t w = edges[other].to;
      if (other != e && w != v && edges[other].orders_completion && reaches(w, v)) {
        implied.push_back(e);
        break;
      }
    }
  }
  return implied;
}

}  // namespace precis
