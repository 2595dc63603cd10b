#include "ops/cpu/linear.h"

#include <Eigen/Dense>
#include <algorithm>

#include "core/error.h"
#include "core/strided_loop.h"
#include "ops/cpu/gelu_rows.h"

namespace precis::ops::cpu {

namespace {

using Eigen::Dynamic;
template <typename T>
using ConstRows = Eigen::Map<const Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
template <typename T>
using Rows = Eigen::Map<Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;

void check_rows(const Tensor& t, const char* what) {
  PRECIS_CHECK(t.dim() == 2 && (t.strides()[1] == 1 || t.size(1) <= 1) && t.is_cpu(), "cpu linear kernels: ", what,
               " must be a 2-D CPU tensor with unit column stride, got ", t.shape(), " strides ", t.strides());
}
int64_t row_stride(const Tensor& t) { return std::max(t.strides()[0], t.size(1)); }

// The tensor as an Eigen row-major matrix, read (or written) where it lies.
template <typename T>
ConstRows<T> rows(const Tensor& t, const char* what) {
  check_rows(t, what);
  return ConstRows<T>(static_cast<const T*>(t.raw_data()), t.size(0), t.size(1), Eigen::OuterStride<>(row_stride(t)));
}
template <typename T>
Rows<T> mutable_rows(const Tensor& t, const char* what) {
  check_rows(t, what);
  return Rows<T>(static_cast<T*>(const_cast<void*>(t.raw_data())), t.size(0), t.size(1),
                 Eigen::OuterStride<>(row_stride(t)));
}

// Calls fn(TypeTag<T>) for f32 or f64 tensors.
template <typename Fn>
void dispatch(const Tensor& t, Fn&& fn) {
  dispatch_f32_f64(t.dtype(), "cpu linear kernels", std::forward<Fn>(fn));
}

// Runs row(i) for i in [0, n) over the OpenMP threads when the n x width values are enough to pay.
template <typename Fn>
void for_rows(int64_t n, int64_t width, Fn row) {
#pragma omp parallel for schedule(static) if (n * width >= kParallelGrain && n > 1)
  for (int64_t i = 0; i < n; ++i) row(i);
}

// sums[j] (+)= sum_i m[i][j], row by row (each row's adds vectorise along j).
template <typename T>
void column_sums(const ConstRows<T>& m, T* sums, bool accumulate) {
  if (!accumulate) std::fill(sums, sums + m.cols(), T(0));
  for (int64_t i = 0; i < m.rows(); ++i) {
    const T* row = m.data() + i * m.outerStride();
    for (int64_t j = 0; j < m.cols(); ++j) sums[j] += row[j];
  }
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch(out, [&](auto tag) {
    using T = typename decltype(tag)::type;
    mutable_rows<T>(out, "out").noalias() = rows<T>(a, "a") * rows<T>(b, "b");
  });
}

void linear(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu,
            const Tensor& pre_gelu) {
  dispatch(out, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Rows<T> y = mutable_rows<T>(out, "out");
    y.noalias() = rows<T>(x, "x") * rows<T>(weight, "weight").transpose();
    if (!bias.defined() && !gelu) return;
    // One pass over the product's rows: z = y + b, then pre = z and y = gelu(z).
    const T* b = bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr;
    T* pre = pre_gelu.defined() ? mutable_rows<T>(pre_gelu, "pre_gelu").data() : nullptr;
    const int64_t pre_ld = pre ? row_stride(pre_gelu) : 0, width = y.cols();
    for_rows(y.rows(), width, [&](int64_t i) {
      bias_gelu_row(y.data() + i * y.outerStride(), b, pre ? pre + i * pre_ld : nullptr, width, gelu);
    });
  });
}

void linear_param_backward(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out, const Tensor& x,
                           bool accumulate_weight, bool accumulate_bias) {
  dispatch(grad_out, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ConstRows<T> g = rows<T>(grad_out, "grad_out");
    if (grad_weight.defined()) {
      Rows<T> dw = mutable_rows<T>(grad_weight, "grad_weight");
      if (accumulate_weight)
        dw.noalias() += g.transpose() * rows<T>(x, "x");
      else
        dw.noalias() = g.transpose() * rows<T>(x, "x");
    }
    if (grad_bias.defined())
      column_sums<T>(g, static_cast<T*>(const_cast<void*>(grad_bias.raw_data())), accumulate_bias);
  });
}

void gelu_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& pre) {
  dispatch(grad_out, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Rows<T> d = mutable_rows<T>(grad_pre, "grad_pre");
    const ConstRows<T> g = rows<T>(grad_out, "grad_out"), z = rows<T>(pre, "pre");
    for_rows(d.rows(), d.cols(), [&](int64_t i) {
      gelu_backward_row(d.data() + i * d.outerStride(), g.data() + i * g.outerStride(), z.data() + i * z.outerStride(),
                        d.cols());
    });
  });
}

void linear_gelu_input_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& weight, const Tensor& pre,
                                const Tensor& grad_pre_sums, bool accumulate_sums) {
  matmul(grad_pre, grad_out, weight);  // the gradient of gelu(pre)
  gelu_backward(grad_pre, grad_pre, pre);
  if (grad_pre_sums.defined()) {
    dispatch(grad_pre, [&](auto tag) {
      using T = typename decltype(tag)::type;
      column_sums<T>(rows<T>(grad_pre, "grad_pre"), static_cast<T*>(const_cast<void*>(grad_pre_sums.raw_data())),
                     accumulate_sums);
    });
  }
}

}  // namespace precis::ops::cpu
