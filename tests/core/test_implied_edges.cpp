// implied_edges (core/implied_edges.h) on hand-made graphs of the shapes a capture produces,
// and on random DAGs against a breadth-first search per edge: edge u -> v is implied exactly
// when v is reachable from u over completion edges without that edge itself. Removing the
// implied edges must leave every node reaching what it reached before.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/implied_edges.h"
#include "support/errors.h"

using precis::DagEdge;
using precis::implied_edges;

namespace {

// Whether `to` is reachable from `from` over completion edges, skipping edge `skip`.
bool reachable(size_t num_nodes, const std::vector<DagEdge>& edges, size_t from, size_t to, size_t skip) {
  std::vector<bool> seen(num_nodes, false);
  std::vector<size_t> frontier = {from};
  while (!frontier.empty()) {
    const size_t v = frontier.back();
    frontier.pop_back();
    for (size_t e = 0; e < edges.size(); ++e) {
      if (e == skip || edges[e].from != v || !edges[e].orders_completion || seen[edges[e].to]) continue;
      if (edges[e].to == to) return true;
      seen[edges[e].to] = true;
      frontier.push_back(edges[e].to);
    }
  }
  return false;
}

std::vector<size_t> implied_by_search(size_t num_nodes, const std::vector<DagEdge>& edges) {
  std::vector<size_t> implied;
  for (size_t e = 0; e < edges.size(); ++e)
    if (reachable(num_nodes, edges, edges[e].from, edges[e].to, e)) implied.push_back(e);
  return implied;
}

}  // namespace

TEST(ImpliedEdges, AChainHasNoneAndAShortcutAlongItIsOne) {
  EXPECT_TRUE(implied_edges(4, {{0, 1}, {1, 2}, {2, 3}}).empty());
  EXPECT_EQ(implied_edges(4, {{0, 1}, {1, 2}, {2, 3}, {0, 3}}), std::vector<size_t>{3});
  EXPECT_TRUE(implied_edges(0, {}).empty());
}

// A collective's kernels on the compute stream, u0 -> K1 -> u1 -> K2 -> u2, and the edge NCCL's
// internal stream adds when it joins the compute stream again at the second collective.
TEST(ImpliedEdges, TheEdgeBetweenTwoCollectivesOnOneStreamIsImplied) {
  enum { u0, k1, u1, k2, u2, n };
  EXPECT_EQ(implied_edges(n, {{u0, k1}, {k1, u1}, {u1, k2}, {k2, u2}, {k1, k2}}), std::vector<size_t>{4});
}

// A side stream forked twice: after the first join, both streams' last nodes lead into both
// streams' next nodes. None of those four edges is implied: the graph really forks there.
TEST(ImpliedEdges, AForkFromAJoinKeepsItsEdges) {
  enum { m1, s1, m2, s2, m3, end, n };
  EXPECT_TRUE(
      implied_edges(n, {{m1, s1}, {m1, m2}, {m2, s2}, {s1, s2}, {m2, m3}, {s1, m3}, {s2, end}, {m3, end}}).empty());
}

TEST(ImpliedEdges, OnlyEdgesThatOrderCompletionImplyAnOrder) {
  // 0 -> 1 a launch-completion edge, 1 -> 2: node 2 may not wait for 0's completion through 1.
  EXPECT_TRUE(implied_edges(3, {{0, 1, false}, {1, 2}, {0, 2}}).empty());
  // Such an edge beside a path of edges that order completion adds nothing.
  EXPECT_EQ(implied_edges(3, {{0, 1}, {1, 2}, {0, 2, false}}), std::vector<size_t>{2});
}

TEST(ImpliedEdges, RandomDagsAgreeWithASearchPerEdgeAndKeepTheirReach) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 2 + rng() % 70;  // past 64 nodes the bit sets take a second word
    std::vector<DagEdge> edges;
    const double density = std::uniform_real_distribution<double>(0.02, 0.4)(rng);
    for (size_t a = 0; a < n; ++a)
      for (size_t b = a + 1; b < n; ++b)
        if (std::uniform_real_distribution<double>(0, 1)(rng) < density) edges.push_back({a, b, rng() % 5 != 0});
    std::shuffle(edges.begin(), edges.end(), rng);
    // Relabel the nodes so that their numbers are not a topological order.
    std::vector<size_t> label(n);
    for (size_t v = 0; v < n; ++v) label[v] = v;
    std::shuffle(label.begin(), label.end(), rng);
    for (DagEdge& e : edges) e = {label[e.from], label[e.to], e.orders_completion};

    const std::vector<size_t> implied = implied_edges(n, edges);
    ASSERT_EQ(implied, implied_by_search(n, edges)) << "trial " << trial << ", " << n << " nodes";
    std::vector<DagEdge> kept;
    for (size_t e = 0, i = 0; e < edges.size(); ++e) {
      if (i < implied.size() && implied[i] == e) {
        ++i;
        continue;
      }
      kept.push_back(edges[e]);
    }
    for (size_t a = 0; a < n; ++a)
      for (size_t b = 0; b < n; ++b)
        ASSERT_EQ(reachable(n, kept, a, b, kept.size()), reachable(n, edges, a, b, edges.size()))
            << "trial " << trial << ": " << a << " -> " << b;
  }
}

TEST(ImpliedEdges, ACycleOrAnUnknownNodeIsAnError) {
  precis::testing::expect_error([] { implied_edges(3, {{0, 1}, {1, 2}, {2, 0}}); }, "cycle");
  precis::testing::expect_error([] { implied_edges(2, {{0, 5}}); }, "outside the graph's 2 nodes");
}
