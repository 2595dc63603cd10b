// matmul, linear and linear_gelu: validation, autocast and autograd here; the
// product on the CPU through Eigen's blocked, multithreaded GEMM, on the GPU
// through cuBLASLt (ops/cuda/matmul.cu).
//
// For C = A B (A: [M, K], B: [K, N]):  dA = dC B^T,  dB = A^T dC.
// Batch dims broadcast; their gradients are summed back to each input's shape.
// A transposed view has unit stride along its rows instead of its columns; it
// is read in place as a column-major Eigen matrix rather than copied.
#include <Eigen/Dense>
#include <omp.h>

#include <atomic>

#include "core/autograd.h"
#include "ops/autocast.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/matmul.h"
#endif

namespace precis::ops {

namespace {

std::atomic<bool> g_allow_tf32{false};

using Eigen::Dynamic;
template <typename T, int Order>
using MatrixMap = Eigen::Map<const Eigen::Matrix<T, Dynamic, Dynamic, Order>, 0, Eigen::OuterStride<>>;
template <typename T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>>;

// How the last two dims of a tensor lie in memory: rows dense (row-major), or
// columns dense (column-major, as in a transposed view). Anything else is copied.
enum class Layout { row_major, col_major, neither };
Layout layout_of(const Tensor& t) {
  int64_t rows = t.shape()[t.dim() - 2], cols = t.shape()[t.dim() - 1];
  int64_t rs = t.strides()[t.dim() - 2], cs = t.strides()[t.dim() - 1];
  if ((cs == 1 || cols == 1) && (rs >= cols || rows == 1)) return Layout::row_major;
  if ((rs == 1 || rows == 1) && (cs >= rows || cols == 1)) return Layout::col_major;
  return Layout::neither;
}
bool gemm_readable(const Tensor& t) { return layout_of(t) != Layout::neither; }
// Eigen's outer stride: the distance between rows (row-major) or columns (column-major).
int64_t leading_dim(const Tensor& t) {
  int64_t rows = t.shape()[t.dim() - 2], cols = t.shape()[t.dim() - 1];
  return layout_of(t) == Layout::row_major ? std::max(t.strides()[t.dim() - 2], cols)
                                           : std::max(t.strides()[t.dim() - 1], rows);
}

// out[b] = a[b] * b[b] for each batch index; a, b already broadcast to the batch shape.
template <typename T>
void batched_gemm(const Tensor& a, const Tensor& b, Tensor& out, const Shape& batch) {
  const int64_t M = a.shape()[a.dim() - 2], K = a.shape().back(), N = b.shape().back();
  const int64_t batches = shape_numel(batch);
  const Layout la = layout_of(a), lb = layout_of(b);
  const int64_t lda = leading_dim(a), ldb = leading_dim(b);
  const T* pa = static_cast<const T*>(a.storage()->data());
  const T* pb = static_cast<const T*>(b.storage()->data());
  T* po = out.data<T>();
  auto offset_of = [&](const Tensor& t, int64_t index) {
    int64_t off = t.offset();
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
      off += (index % batch[d]) * t.strides()[d];
      index /= batch[d];
    }
    return off;
  };
  auto one = [&](int64_t i) {
    OutMap<T> c(po + i * M * N, M, N);
    const T* ai = pa + offset_of(a, i);
    const T* bi = pb + offset_of(b, i);
    auto with_b = [&](const auto& A) {
      if (lb == Layout::row_major) c.noalias() = A * MatrixMap<T, Eigen::RowMajor>(bi, K, N, Eigen::OuterStride<>(ldb));
      else c.noalias() = A * MatrixMap<T, Eigen::ColMajor>(bi, K, N, Eigen::OuterStride<>(ldb));
    };
    if (la == Layout::row_major) with_b(MatrixMap<T, Eigen::RowMajor>(ai, M, K, Eigen::OuterStride<>(lda)));
    else with_b(MatrixMap<T, Eigen::ColMajor>(ai, M, K, Eigen::OuterStride<>(lda)));
  };
  // Many small products: one per thread. Few large ones: Eigen parallelises each.
  if (batches >= omp_get_max_threads() && M * N * K < (1 << 21)) {
#pragma omp parallel for schedule(dynamic)
    for (int64_t i = 0; i < batches; ++i) one(i);
  } else {
    for (int64_t i = 0; i < batches; ++i) one(i);
  }
}

Tensor matmul_forward(const Tensor& a_in, const Tensor& b_in) {
  const int64_t M = a_in.shape()[a_in.dim() - 2], N = b_in.shape().back();
  Shape batch_a(a_in.shape().begin(), a_in.shape().end() - 2);
  Shape batch_b(b_in.shape().begin(), b_in.shape().end() - 2);
  Shape batch = broadcast_shapes(batch_a, batch_b, "matmul");
  DType dtype = promote_types(a_in.dtype(), b_in.dtype());
  // f16/bf16 multiply in f32 and round the result, as the design's CPU rule says.
  DType compute = (dtype == DType::f16 || dtype == DType::bf16) ? DType::f32 : dtype;
  Tensor a = cpu::converted(a_in, compute), b = cpu::converted(b_in, compute);
  if (!gemm_readable(a)) a = a.contiguous();
  if (!gemm_readable(b)) b = b.contiguous();
  Shape a_shape = batch, b_shape = batch;
  a_shape.insert(a_shape.end(), a.shape().end() - 2, a.shape().end());
  b_shape.insert(b_shape.end(), b.shape().end() - 2, b.shape().end());
  a = cpu::broadcast_view(a, a_shape, "matmul");
  b = cpu::broadcast_view(b, b_shape, "matmul");
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out = empty(out_shape, compute);
  dispatch_f32_f64(compute, "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.shape().back() == 0) {
      std::fill(out.data<T>(), out.data<T>() + out.numel(), T(0));
      return;
    }
    batched_gemm<T>(a, b, out, batch);
  });
  return compute == dtype ? out : cpu::converted(out, dtype);
}

void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  require_defined(op, x, "input");
  require_defined(op, weight, "weight");
  common_device(op, {&x, &weight, &bias});
  PRECIS_CHECK(weight.dim() == 2, op, ": weight must be [out_features, in_features], got ", weight.shape());
  PRECIS_CHECK(x.dim() >= 1 && x.shape().back() == weight.shape()[1], op, ": input ", x.shape(),
               " does not end in in_features = ", weight.shape()[1], " (weight ", weight.shape(), ")");
  PRECIS_CHECK(!bias.defined() || (bias.dim() == 1 && bias.shape()[0] == weight.shape()[0]), op, ": bias ",
               bias.shape(), " must be [out_features] = [", weight.shape()[0], "]");
}

#if PRECIS_WITH_CUDA
// cuBLASLt multiplies f32, f16 and bf16; f64 products stay on the CPU.
DType gpu_dtype(const char* op, DType dtype) {
  PRECIS_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16, op, ": no GPU product for ",
               dtype_name(dtype), " tensors; use float32, float16 or bfloat16 on the GPU");
  return dtype;
}

Tensor matmul_forward_cuda(const Tensor& a_in, const Tensor& b_in) {
  DType dtype = gpu_dtype("matmul", promote_types(a_in.dtype(), b_in.dtype()));
  Tensor a = a_in.detach().to(dtype), b = b_in.detach().to(dtype);
  Shape out_shape = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                     Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
  out_shape.push_back(a.shape()[a.dim() - 2]);
  out_shape.push_back(b.shape().back());
  Tensor out = empty(out_shape, dtype, a.device());
  cuda::matmul(out, a, b);
  return out;
}

// linear and linear_gelu on the GPU: one cuBLASLt call on x folded to [N, in],
// its epilogue adding the bias (and applying the GELU, keeping its input z), and
// one autograd node. With z = x W^T + b and g the gradient of z (dy for linear,
// dy * gelu'(z) for linear_gelu):  dx = g W,  dW = g^T x,  db = g summed over
// its rows, fused into the dW product.
Tensor linear_cuda(const char* op, const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, bool gelu) {
  DType dtype = promote_types(x_in.dtype(), weight_in.dtype());
  if (bias_in.defined()) dtype = promote_types(dtype, bias_in.dtype());
  gpu_dtype(op, dtype);
  const Tensor x = x_in.to(dtype), weight = weight_in.to(dtype);
  const Tensor bias = bias_in.defined() ? bias_in.to(dtype) : Tensor();
  const int64_t out_features = weight.shape()[0];
  const Tensor x2 = x.detach().reshape({-1, weight.shape()[1]}), w = weight.detach();
  const bool needs_grad = autograd::any_requires_grad({&x, &weight, &bias});
  Tensor pre;
  if (gelu && needs_grad) {
    pre = empty({x2.shape()[0], cuda::gelu_aux_ld(out_features)}, dtype, x.device()).narrow(1, 0, out_features);
  }
  Tensor y = empty({x2.shape()[0], out_features}, dtype, x.device());
  cuda::linear(y, x2, w, bias.defined() ? bias.detach() : Tensor(), gelu, pre);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  y = y.view(out_shape);
  if (needs_grad) {
    autograd::record(op, {x, weight, bias}, {y},
                     [x2, w, pre, gelu, dtype, has_bias = bias.defined(), x_shape = x.shape()](const BackwardArgs& g) {
                       const int64_t out_features = w.shape()[0];
                       Tensor grad = g.grad().to(dtype).reshape({-1, out_features}).contiguous();
                       if (gelu) {
                         Tensor grad_pre = empty(grad.shape(), dtype, grad.device());
                         cuda::gelu_backward(grad_pre, grad, pre);
                         grad = grad_pre;
                       }
                       Tensor grad_x, grad_w, grad_b;
                       if (g.needs(0)) {
                         grad_x = empty(x2.shape(), dtype, grad.device());
                         cuda::matmul(grad_x, grad, w);
                         grad_x = grad_x.view(x_shape);
                       }
                       const bool needs_bias = has_bias && g.needs(2);
                       if (g.needs(1) || needs_bias) {
                         Tensor grad_weight = empty(w.shape(), dtype, grad.device());
                         if (needs_bias) grad_b = empty({out_features}, dtype, grad.device());
                         cuda::linear_param_backward(grad_weight, grad_b, grad, x2);
                         if (g.needs(1)) grad_w = grad_weight;
                       }
                       return std::vector<Tensor>{grad_x, grad_w, grad_b};
                     });
  }
  return y;
}
#endif

// The forward product on the operands' device.
Tensor product(const Tensor& a, const Tensor& b) {
#if PRECIS_WITH_CUDA
  if (a.is_cuda()) return matmul_forward_cuda(a, b);
#endif
  return matmul_forward(a, b);
}

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
bool allow_tf32() { return g_allow_tf32.load(); }

Tensor matmul(const Tensor& a_arg, const Tensor& b_arg) {
  // autocast: products run in the compute dtype.
  const Tensor a = autocast::to_compute(a_arg), b = autocast::to_compute(b_arg);
  require_defined("matmul", a, "first operand");
  require_defined("matmul", b, "second operand");
  common_device("matmul", {&a, &b});
  require_floating("matmul", a, "first operand");
  require_floating("matmul", b, "second operand");
  PRECIS_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: operands must have at least 1 dim, got shapes ", a.shape(),
               " and ", b.shape());
  if (a.dim() == 1) return matmul(a.unsqueeze(0), b).squeeze(-2);
  if (b.dim() == 1) return matmul(a, b.unsqueeze(-1)).squeeze(-1);
  PRECIS_CHECK(a.shape().back() == b.shape()[b.dim() - 2], "matmul: shapes ", a.shape(), " and ", b.shape(),
               " do not fit (inner dims ", a.shape().back(), " and ", b.shape()[b.dim() - 2], " differ)");
  Tensor out = product(a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record("matmul", {a, b}, {out}, [a = a.detach(), b = b.detach()](const BackwardArgs& g) {
      Tensor grad_a, grad_b;
      if (g.needs(0)) grad_a = sum_to_shape(matmul(g.grad(), b.transpose(-1, -2)), a.shape()).to(a.dtype());
      if (g.needs(1)) grad_b = sum_to_shape(matmul(a.transpose(-1, -2), g.grad()), b.shape()).to(b.dtype());
      return std::vector<Tensor>{grad_a, grad_b};
    });
  }
  return out;
}

Tensor linear(const Tensor& x_arg, const Tensor& weight_arg, const Tensor& bias_arg) {
  const Tensor x = autocast::to_compute(x_arg), weight = autocast::to_compute(weight_arg),
               bias = autocast::to_compute(bias_arg);
  check_linear("linear", x, weight, bias);
#if PRECIS_WITH_CUDA
  if (x.is_cuda()) return linear_cuda("linear", x, weight, bias, /*gelu=*/false);
#endif
  // Fold the leading dims into one so the product is a single GEMM.
  Shape out_shape = x.shape();
  out_shape.back() = weight.shape()[0];
  Tensor y = matmul(x.reshape({-1, x.shape().back()}), weight.t());
  if (bias.defined()) y = y + bias;
  return y.reshape(out_shape);
}

Tensor linear_gelu(const Tensor& x_arg, const Tensor& weight_arg, const Tensor& bias_arg) {
  const Tensor x = autocast::to_compute(x_arg), weight = autocast::to_compute(weight_arg),
               bias = autocast::to_compute(bias_arg);
  check_linear("linear_gelu", x, weight, bias);
#if PRECIS_WITH_CUDA
  if (x.is_cuda()) return linear_cuda("linear_gelu", x, weight, bias, /*gelu=*/true);
#endif
  return gelu(linear(x, weight, bias));
}

}  // namespace precis::ops
