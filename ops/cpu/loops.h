// Elementwise CPU loops: map_unary, map_binary, map_ternary; and the per-thread scratch
// buffer of the row loops.
//
// Each takes a generic lambda `f` on values of the compute type (float for
// f16/bf16, otherwise the element type itself) and returns a new contiguous
// tensor of `out_dtype`. Inputs are broadcast to a common shape (stride-0 views)
// and converted to `in_dtype` first when they differ, so each loop is compiled
// once per dtype, not once per pair of dtypes.
#pragma once

#include <algorithm>
#include <vector>

#include "core/convert.h"
#include "core/copy.h"
#include "core/half_convert.h"
#include "core/strided_loop.h"
#include "core/tensor.h"
#include "ops/broadcast.h"

namespace precis::ops::cpu {

// Calls fn(TypeTag<T>) for the floating dtypes f32, f64, f16, bf16 (core/dtype.h's dispatch_types).
template <typename Fn>
decltype(auto) dispatch_floating(DType dtype, const char* op, Fn&& fn) {
  return dispatch_types<float, double, half, bfloat16>(
      dtype, std::forward<Fn>(fn), op, ": expected a floating tensor (float32, float64, float16, bfloat16), got ",
      dtype);
}

// Same as dispatch_floating, plus i32 and i64 (for arithmetic on indices).
template <typename Fn>
decltype(auto) dispatch_numeric(DType dtype, const char* op, Fn&& fn) {
  return dispatch_types<int32_t, int64_t, float, double, half, bfloat16>(
      dtype, std::forward<Fn>(fn), op, ": expected a floating tensor (float32, float64, float16, bfloat16), got ",
      dtype);
}

// The f16/bf16 loops over dense rows run in blocks of f32: widen a block of each input
// with convert_n (vectorised, core/half_convert.h), apply f in f32, narrow the block back.
// block(start, count, buffer) gets a buffer of kF32Block floats for the first input.
inline constexpr int64_t kF32Block = 256;
template <typename Block>
void for_f32_blocks(int64_t n, Block&& block) {
  float buffer[kF32Block];
  for (int64_t start = 0; start < n; start += kF32Block) block(start, std::min(kF32Block, n - start), buffer);
}

// out[i] = f(x[i]); x and out both of dtype `dtype`.
template <typename Fn>
Tensor map_unary(const Tensor& x_in, const char* op, Fn f) {
  Tensor out = empty(x_in.shape(), x_in.dtype());
  dispatch_floating(x_in.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_type_t<T>;
    const T* x = static_cast<const T*>(x_in.storage()->data()) + x_in.offset();
    T* o = out.data<T>();
    for_each_row<2>(out.shape(), {out.strides(), x_in.strides()}, [&](auto base, int64_t n, auto inner) {
      T* op_ = o + base[0];
      const T* xp = x + base[1];
      if constexpr (has_convert_n<float, T>) {
        if (inner[1] == 1) {
          for_f32_blocks(n, [&](int64_t start, int64_t m, float* xs) {
            convert_n(xp + start, xs, m);
            for (int64_t i = 0; i < m; ++i) xs[i] = f(xs[i]);
            convert_n(xs, op_ + start, m);
          });
          return;
        }
      }
      if (inner[1] == 1) {
        for (int64_t i = 0; i < n; ++i) op_[i] = convert<T>(f(convert<C>(xp[i])));
      } else {
        for (int64_t i = 0; i < n; ++i) op_[i] = convert<T>(f(convert<C>(xp[i * inner[1]])));
      }
    });
  });
  return out;
}

// out[i] = f(a[i], b[i]) with a, b broadcast and converted to `dtype`; out has `dtype`.
template <typename Dispatch, typename Fn>
Tensor map_binary_with(Dispatch dispatch, const Tensor& a_in, const Tensor& b_in, DType dtype, const char* op, Fn f) {
  Shape shape = broadcast_shapes(a_in.shape(), b_in.shape(), op);
  Tensor a = broadcast_view(converted(a_in, dtype), shape, op);
  Tensor b = broadcast_view(converted(b_in, dtype), shape, op);
  Tensor out = empty(shape, dtype);
  dispatch(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_type_t<T>;
    const T* ap = static_cast<const T*>(a.storage()->data()) + a.offset();
    const T* bp = static_cast<const T*>(b.storage()->data()) + b.offset();
    T* o = out.data<T>();
    for_each_row<3>(shape, {out.strides(), a.strides(), b.strides()}, [&](auto base, int64_t n, auto inner) {
      T* oo = o + base[0];
      const T* aa = ap + base[1];
      const T* bb = bp + base[2];
      if constexpr (has_convert_n<float, T>) {
        if (inner[1] == 1 && inner[2] == 1) {
          for_f32_blocks(n, [&](int64_t start, int64_t m, float* as) {
            float bs[kF32Block];
            convert_n(aa + start, as, m);
            convert_n(bb + start, bs, m);
            for (int64_t i = 0; i < m; ++i) as[i] = f(as[i], bs[i]);
            convert_n(as, oo + start, m);
          });
          return;
        }
      }
      if (inner[1] == 1 && inner[2] == 1) {
        for (int64_t i = 0; i < n; ++i) oo[i] = convert<T>(f(convert<C>(aa[i]), convert<C>(bb[i])));
      } else {
        for (int64_t i = 0; i < n; ++i)
          oo[i] = convert<T>(f(convert<C>(aa[i * inner[1]]), convert<C>(bb[i * inner[2]])));
      }
    });
  });
  return out;
}

template <typename Fn>
Tensor map_binary(const Tensor& a, const Tensor& b, DType dtype, const char* op, Fn f) {
  return map_binary_with([](DType d, const char* name, auto&& fn) { return dispatch_floating(d, name, fn); }, a, b,
                         dtype, op, f);
}

// out[i] = f(c[i] != 0, a[i], b[i]) with c, a, b broadcast to one shape. The condition c
// (bool or u8) is read as it is, not converted; a and b are converted to `dtype`; out has `dtype`.
template <typename Fn>
Tensor map_ternary(const Tensor& c_in, const Tensor& a_in, const Tensor& b_in, DType dtype, const char* op, Fn f) {
  PRECIS_CHECK(c_in.dtype() == DType::boolean || c_in.dtype() == DType::u8, op,
               ": the condition must be a bool or uint8 tensor, got ", describe(c_in));
  Shape shape = broadcast_shapes(broadcast_shapes(c_in.shape(), a_in.shape(), op), b_in.shape(), op);
  Tensor c = broadcast_view(c_in, shape, op);
  Tensor a = broadcast_view(converted(a_in, dtype), shape, op);
  Tensor b = broadcast_view(converted(b_in, dtype), shape, op);
  Tensor out = empty(shape, dtype);
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_type_t<T>;
    const uint8_t* cp = static_cast<const uint8_t*>(c.storage()->data()) + c.offset();
    const T* ap = static_cast<const T*>(a.storage()->data()) + a.offset();
    const T* bp = static_cast<const T*>(b.storage()->data()) + b.offset();
    T* o = out.data<T>();
    for_each_row<4>(
        shape, {out.strides(), c.strides(), a.strides(), b.strides()}, [&](auto base, int64_t n, auto inner) {
          T* oo = o + base[0];
          const uint8_t* cc = cp + base[1];
          const T* aa = ap + base[2];
          const T* bb = bp + base[3];
          if (inner[1] == 1 && inner[2] == 1 && inner[3] == 1) {
            for (int64_t i = 0; i < n; ++i) oo[i] = convert<T>(f(cc[i] != 0, convert<C>(aa[i]), convert<C>(bb[i])));
          } else {
            for (int64_t i = 0; i < n; ++i)
              oo[i] = convert<T>(f(cc[i * inner[1]] != 0, convert<C>(aa[i * inner[2]]), convert<C>(bb[i * inner[3]])));
          }
        });
  });
  return out;
}

// A per-thread buffer of at least n values, reused from row to row (or sample to sample) by
// the loops that need one per row: softmax's exponentials, conv2d's im2col matrix.
template <typename C>
C* scratch(int64_t n) {
  thread_local std::vector<C> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

}  // namespace precis::ops::cpu
