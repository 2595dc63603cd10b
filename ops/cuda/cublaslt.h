// The cuBLASLt wrapper of the GPU matrix products (ops/cuda/matmul.cu): one product in
// cuBLASLt's own column-major terms (Gemm), run with the algorithm the heuristic (or the
// autotuner, ops/cuda/matmul_autotune.h) chose for it, cached per problem.
//
// Row-major through a column-major library. cuBLASLt reads matrices
// column-major, and a row-major [R, C] matrix read column-major is its
// transpose [C, R]. So for the row-major D = A B (A: [M, K], B: [K, N]) we ask
// cuBLASLt for D^T = B^T A^T: its m = N, n = M, k = K, its first operand is our
// B, its second our A, and the column-major D^T it writes is D, row-major. A
// transposed view (columns dense) read column-major is the matrix itself, so it
// goes in with CUBLAS_OP_T instead of being copied.
//
// Epilogues in those terms. For linear, z = x W^T + b (m = out features, n = rows of x):
//   BIAS, GELU_BIAS    add b (one value per row of D^T, i.e. per output feature), then GELU;
//   GELU_AUX(_BIAS)    also store z in the aux matrix (leading dim a multiple of 8).
// For linear's weight gradient dW = g^T x (m = in, n = out, k = rows of g):
//   BGRADB             sum the second operand, g^T read in place from g, over k:
//                      db = g summed over its rows, in the same pass over g.
// For the input gradient of a linear applied to a GELU's output, dz = (g W) * gelu'(z)
// (m = in, n = rows of g, k = out), with z the aux matrix the forward's GELU_AUX stored:
//   DGELU              multiply the product by gelu'(aux) as it is written;
//   DGELU_BGRAD        and sum dz over its rows (one value per row of D^T): the bias
//                      gradient of the linear that produced z, with no pass of its own.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace precis::ops::cuda::cublaslt {

// The most workspace a product's algorithm may ask for (the heuristic's bound); each call takes
// what its algorithm needs (cublaslt.cu).
inline constexpr size_t kWorkspaceBytes = size_t(32) << 20;

const char* epilogue_name(cublasLtEpilogue_t epilogue);

// One cuBLASLt product in its own column-major terms: D (m x n) = op(A) (m x k)
// op(B) (k x n), `batch` times with each operand `stride` elements after the
// previous, then the epilogue. C is D: beta = 0, or 1 to add the product into D.
struct Gemm {
  const char* op = "matmul";
  Device device;
  DType dtype = DType::f32;      // of A and B
  DType out_dtype = DType::f32;  // of D (C) and of a bias or bias gradient: dtype, or f32
  bool accumulate = false;       // D += product (beta = 1)
  int64_t m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;
  bool trans_a = false;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  bool trans_b = false;
  int64_t ldb = 0, stride_b = 0;
  void* d = nullptr;
  int64_t ldd = 0, stride_d = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;  // read by the BIAS epilogues, written by BGRADB
  void* aux = nullptr;   // the GELU input, written by GELU_AUX, read by DGELU
  int64_t aux_ld = 0;

  // The problem in the user's row-major terms, for error messages.
  std::string problem() const {
    return detail::concat(dtype_name(dtype), " [", n, ", ", k, "] x [", k, ", ", m, "]",
                          batch > 1 ? detail::concat(" (batch of ", batch, ")") : std::string(),
                          out_dtype != dtype ? detail::concat(" into ", dtype_name(out_dtype)) : std::string(),
                          accumulate ? " (added to D)" : "", " with the ", epilogue_name(epilogue), " epilogue on ",
                          device);
  }
};

// The descriptors of one product, as cublasLtMatmul takes them.
struct Problem {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  void* workspace;  // the call's own (cublaslt.cu), or null where its algorithm needs none
  cudaStream_t stream;
  size_t workspace_bytes = 0;
};

// One run of the product with `algo`.
void run_algo(const Gemm& g, const Problem& p, const cublasLtMatmulAlgo_t& algo);

// Runs the product on the compute stream. Returns false, having run nothing,
// when cuBLASLt has no algorithm for it (the caller may then drop the epilogue).
bool try_run(const Gemm& g);
// try_run, and an error where cuBLASLt has no algorithm.
void run(const Gemm& g);

// An epilogue cuBLASLt cannot fuse is applied by a separate kernel; say so once per epilogue.
void note_unfused(const Gemm& g);

}  // namespace precis::ops::cuda::cublaslt
