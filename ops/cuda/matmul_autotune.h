// The autotuner of the GPU matrix products: which cuBLASLt algorithm runs a product, and
// whether a fused epilogue beats the plain product plus a separate pass.
//
// Choosing the algorithm. cuBLASLt's heuristic ranks algorithms by a model of the
// GPU, and its first choice is not always the fastest: on an H100 it gave GPT-2's
// f16 products (the same shapes as bf16) older xmma kernels that ran the f16 step
// measurably slower than bf16's (bench/NOTES.md). So, with ops::matmul_autotune() on, a problem large
// enough to matter is timed once: its first kAutotuneCandidates heuristic answers
// each run kAutotuneRuns times on the real operands (a product with beta = 0 writes
// only D and the epilogue's outputs, so a run repeats nothing; the real run follows;
// one that adds into D, beta = 1, is timed on a scratch D) and the fastest, by more
// than kAutotuneMargin, is cached. Never during a
// CUDA graph capture (timing synchronises): there the heuristic's first answer is used.
// The same timing decides between a fused epilogue and the plain product plus a
// separate pass (prefer_fused: linear's bias gradient, BGRADB or DGELU_BGRAD against
// column_sums).
#pragma once

#include <functional>

#include "ops/cuda/cublaslt.h"

namespace precis::ops::cuda::cublaslt {

inline constexpr int kAutotuneCandidates = 8;

// Whether autotuning is on (ops::matmul_autotune()) and the product is large enough for
// timing to matter (smaller ones are launch-bound): then its algorithm is timed, unless a
// CUDA graph is being captured.
bool worth_autotuning(const Gemm& g);

// The index of the fastest of `candidates` (in the heuristic's order; a later one must win by
// the margin). A product that adds into D runs on a scratch D: every run would add to the real one.
int fastest(const Gemm& g, const Problem& p, const cublasLtMatmulHeuristicResult_t* candidates, int count);

// Whether a product with a fused epilogue should run as such, or as `split` (the plain
// product and a separate pass: for BGRADB, our column-sum kernel over g, column_sums.cu).
// Autotuning times both once per problem, as it times algorithms: cuBLASLt's fastest fused
// candidate is not always faster than its plain product plus one more pass (on an H100,
// GPT-2's f16 weight gradients with BGRADB got xmma kernels slower than the plain
// product's nvjet kernels and a bias sum: bench/NOTES.md). Without autotuning, for small problems, or in a capture that
// finds no choice made by the eager steps before it: fused.
// Neither may add into its outputs (each runs several times).
bool prefer_fused(const Gemm& fused, const std::function<void()>& split);

}  // namespace precis::ops::cuda::cublaslt
