// The edges of a captured graph that its other edges imply (core/implied_edges.h), removed.
//
// A capture adds an edge wherever a stream waits for another, also when it is already ordered
// after that work: NCCL's internal stream joins the compute stream at every collective, so the
// second of two in-order collectives depends on the first both along the compute stream and
// directly. The executor reads any node with two dependents as a fork and then starts every
// kernel of the graph later (bench/NOTES.md, the eleventh and twelfth sessions); removing the
// implied edges leaves the same order and a one-stream capture a chain again.
//
// Include only from files built with PRECIS_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace precis::cuda {

// Removes the implied edges of `graph` (not instantiated yet); returns how many.
size_t remove_implied_edges(cudaGraph_t graph);

}  // namespace precis::cuda
