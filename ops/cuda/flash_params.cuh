// What the flash-attention kernels know of their tensors: each [B, H, T, D] operand
// as a base pointer and three strides (in elements; the last dim is unit-stride),
// and the problem's sizes. Built on the host from checked Tensors.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/cuda/dispatch.cuh"
#include "core/error.h"
#include "core/tensor.h"

namespace precis::ops::cuda::flash {

template <typename T>
struct HeadsView {
  T* data;
  int64_t batch_stride, head_stride, row_stride;

  // The [T, D] matrix of batch b, head h.
  __host__ __device__ T* matrix(int b, int h) const { return data + b * batch_stride + h * head_stride; }
};

template <typename T>
HeadsView<T> heads_view(const Tensor& t) {
  return {static_cast<T*>(t.raw_data()), t.strides()[0], t.strides()[1], t.strides()[2]};
}

struct Sizes;

// A backward block's query side of head (b, h), bh = b H + h: the head's Q and dO
// matrices, and its rows of the per-row lse and delta ([B H Tq] f32) and of the dQ
// sums ([B H Tq, kD] f32).
template <typename T, int kD>
struct QueryRows {
  const T* q;
  const T* dout;
  const float* lse;
  const float* delta;
  float* dq_accum;
};

struct Sizes {
  int batch, heads, q_len, k_len;
  bool causal;
  float scale;       // softmax(scale * q.k)
  float scale_log2;  // scale * log2(e): the kernels exponentiate with exp2
};

inline Sizes sizes_of(const Tensor& q, const Tensor& k, bool causal, double scale) {
  const double log2e = 1.4426950408889634;
  return {static_cast<int>(q.size(0)),
          static_cast<int>(q.size(1)),
          static_cast<int>(q.size(2)),
          static_cast<int>(k.size(2)),
          causal,
          static_cast<float>(scale),
          static_cast<float>(scale * log2e)};
}

template <int kD, typename T>
__device__ __forceinline__ QueryRows<T, kD> query_rows(const HeadsView<const T>& q, const HeadsView<const T>& dout,
                                                       const float* lse, const float* delta, float* dq_accum,
                                                       const Sizes& s, int b, int h, int bh) {
  return {q.matrix(b, h), dout.matrix(b, h), lse + static_cast<int64_t>(bh) * s.q_len,
          delta + static_cast<int64_t>(bh) * s.q_len, dq_accum + static_cast<int64_t>(bh) * s.q_len * kD};
}

// Calls fn(TypeTag<T>{}, std::integral_constant<int, kD>{}) for q's dtype (f16, bf16) and
// head size kD (64, 128): the kernels each launcher compiles.
template <typename Fn>
void dispatch_heads(const Tensor& q, const char* op, Fn&& fn) {
  precis::cuda::dispatch_half(q.dtype(), op, [&](auto tag) {
    const int64_t D = q.size(3);
    if (D == 64)
      fn(tag, std::integral_constant<int, 64>{});
    else if (D == 128)
      fn(tag, std::integral_constant<int, 128>{});
    else
      PRECIS_FAIL(op, ": head size ", D, " is not supported (64 or 128)");
  });
}

__host__ __device__ inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace precis::ops::cuda::flash
