// The edges of a dependency DAG that its other edges already imply.
//
// An edge u -> v says "v starts after u". If u also reaches v through another of its
// dependents (u -> w -> ... -> v), the edge adds no order: removing it changes nothing that
// runs. A captured CUDA graph collects such edges when a stream waits for work it is already
// ordered after (NCCL's internal stream re-joining the compute stream at each collective, a
// side stream forked again after a join), and the graph executor treats a node with two
// dependents as a fork to a second stream whatever the edges mean (bench/NOTES.md, the twelfth
// session): core/cuda/graph_edges.h removes them after a capture.
//
// Not every edge orders completion. A programmatic (PDL) edge does: its dependent may start
// early, but it completes only after its dependency (a kernel queued after the dependent without
// PDL must see the dependency's writes, and its only edge is from the dependent). A
// launch-completion edge does not (its dependent may even finish first), so a path through one
// implies nothing; an edge of either kind is implied by a path of edges that order completion.
//
// The rule: edge u -> v is implied when some completion edge u -> w, w != v, has v among the
// nodes reachable from w over completion edges. reach(w) is computed once per node, in
// reverse topological order, as a bit set: reach(w) = union over completion edges w -> x of
// {x} and reach(x).
#pragma once

#include <cstddef>
#include <vector>

namespace precis {

struct DagEdge {
  size_t from = 0;
  size_t to = 0;
  bool orders_completion = true;  // false: a launch-completion edge (its dependent may finish first)
};

// The indices into `edges` of the edges implied by the others, ascending. Nodes are numbered
// 0..num_nodes-1. Fails if an edge names a node out of range or the edges form a cycle.
std::vector<size_t> implied_edges(size_t num_nodes, const std::vector<DagEdge>& edges);

}  // namespace precis
