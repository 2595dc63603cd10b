// matmul, linear and linear_gelu: validation, autocast and autograd here; the
// product on the CPU through Eigen's blocked, multithreaded GEMM, on the GPU
// through cuBLASLt (ops/cuda/matmul.cu). linear, linear_gelu and linear_gelu_linear
// in f32 and f64 on the CPU, and on the GPU, are one node each over the fused kernels
// (ops/cpu/linear.h, ops/cuda/matmul.h); f16/bf16 on the CPU compose matmul, add and gelu.
//
// For C = A B (A: [M, K], B: [K, N]):  dA = dC B^T,  dB = A^T dC.
// Batch dims broadcast; their gradients are summed back to each input's shape.
// A transposed view has unit stride along its rows instead of its columns; it
// is read in place as a column-major Eigen matrix rather than copied.
#include "ops/matmul.h"

#include <omp.h>

#include <Eigen/Dense>
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>

#include "core/autograd.h"
#include "ops/autocast.h"
#include "ops/checks.h"
#include "ops/cpu/linear.h"
#include "ops/cpu/loops.h"
#include "ops/elementwise.h"
#include "ops/matrix_layout.h"
#include "ops/op_cost.h"
#include "ops/param_grad.h"
#include "ops/reduce.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/matmul.h"
#endif

namespace precis::ops {

namespace {

std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_matmul_autotune{true};

using Eigen::Dynamic;
template <typename T, int Order>
using MatrixMap = Eigen::Map<const Eigen::Matrix<T, Dynamic, Dynamic, Order>, 0, Eigen::OuterStride<>>;
template <typename T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>>;

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
      if (lb == Layout::row_major)
        c.noalias() = A * MatrixMap<T, Eigen::RowMajor>(bi, K, N, Eigen::OuterStride<>(ldb));
      else
        c.noalias() = A * MatrixMap<T, Eigen::ColMajor>(bi, K, N, Eigen::OuterStride<>(ldb));
    };
    if (la == Layout::row_major)
      with_b(MatrixMap<T, Eigen::RowMajor>(ai, M, K, Eigen::OuterStride<>(lda)));
    else
      with_b(MatrixMap<T, Eigen::ColMajor>(ai, M, K, Eigen::OuterStride<>(lda)));
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
  Tensor a = converted(a_in, compute), b = converted(b_in, compute);
  if (!gemm_readable(a)) a = a.contiguous();
  if (!gemm_readable(b)) b = b.contiguous();
  Shape a_shape = batch, b_shape = batch;
  a_shape.insert(a_shape.end(), a.shape().end() - 2, a.shape().end());
  b_shape.insert(b_shape.end(), b.shape().end() - 2, b.shape().end());
  a = broadcast_view(a, a_shape, "matmul");
  b = broadcast_view(b, b_shape, "matmul");
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
  return compute == dtype ? out : converted(out, dtype);
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

#endif

// The fused linear kernels of the operands' device, with one signature: cuBLASLt with its
// epilogues (ops/cuda/matmul.h) or Eigen's GEMM and a pass over the rows (ops/cpu/linear.h).
namespace fused {
void matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
#if PRECIS_WITH_CUDA
  if (out.is_cuda()) return cuda::matmul(out, a, b);
#endif
  cpu::matmul(out, a, b);
}
void linear(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu = false,
            const Tensor& pre_gelu = Tensor()) {
#if PRECIS_WITH_CUDA
  if (out.is_cuda()) return cuda::linear(out, x, weight, bias, gelu, pre_gelu);
#endif
  cpu::linear(out, x, weight, bias, gelu, pre_gelu);
}
void linear_param_backward(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out, const Tensor& x,
                           bool accumulate_weight, bool accumulate_bias) {
#if PRECIS_WITH_CUDA
  if (grad_out.is_cuda())
    return cuda::linear_param_backward(grad_weight, grad_bias, grad_out, x, accumulate_weight, accumulate_bias);
#endif
  cpu::linear_param_backward(grad_weight, grad_bias, grad_out, x, accumulate_weight, accumulate_bias);
}
void gelu_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& pre) {
#if PRECIS_WITH_CUDA
  if (grad_out.is_cuda()) return cuda::gelu_backward(grad_pre, grad_out, pre);
#endif
  cpu::gelu_backward(grad_pre, grad_out, pre);
}
void linear_gelu_input_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& weight, const Tensor& pre,
                                const Tensor& grad_pre_sums, bool accumulate_sums) {
#if PRECIS_WITH_CUDA
  if (grad_out.is_cuda())
    return cuda::linear_gelu_input_backward(grad_pre, grad_out, weight, pre, grad_pre_sums, accumulate_sums);
#endif
  cpu::linear_gelu_input_backward(grad_pre, grad_out, weight, pre, grad_pre_sums, accumulate_sums);
}
// The row stride of the saved GELU input: what cuBLASLt asks of its aux matrix, dense on the CPU.
int64_t gelu_aux_ld([[maybe_unused]] Device device, int64_t out_features) {
#if PRECIS_WITH_CUDA
  if (device.is_cuda()) return cuda::gelu_aux_ld(out_features);
#endif
  return out_features;
}
}  // namespace fused

// The fused path's dtype: on a GPU f32, f16 or bf16 (gpu_dtype); on the CPU f32 or f64, none
// otherwise (f16/bf16 products there compute in f32 and round: the composition).
std::optional<DType> fused_dtype(const char* op, DType dtype, Device device) {
#if PRECIS_WITH_CUDA
  if (device.is_cuda()) return gpu_dtype(op, dtype);
#endif
  (void)op, (void)device;
  if (dtype == DType::f32 || dtype == DType::f64) return dtype;
  return std::nullopt;
}

// The dtype that the defined operands of a linear op promote to.
DType linear_dtype(std::initializer_list<const Tensor*> operands) {
  DType dtype = (*operands.begin())->dtype();
  for (const Tensor* t : operands)
    if (t->defined()) dtype = promote_types(dtype, t->dtype());
  return dtype;
}

// The CPU kernels read 2-D operands with unit column stride; cuBLASLt also takes transposed ones.
Tensor kernel_operand(const Tensor& t) {
  if (t.is_cuda() || !t.defined()) return t;
  return (t.dim() == 2 && t.strides()[1] != 1 && t.size(1) > 1) || (t.dim() == 1 && t.strides()[0] != 1)
             ? t.contiguous()
             : t;
}

// A parameter gradient that a product of `dtype` operands writes (ops/param_grad.h): the
// parameter's .grad where the engine offers it in f32 (the f32 sums unrounded) or in `dtype`
// (a 16-bit .grad, precision.grad_dtype: cuBLASLt's f32 accumulator rounded once, and where it
// adds, beta = 1, the sum of the old value and the accumulator rounded once), else a new tensor
// of `dtype`. A tied weight (GPT-2's wte: the lm_head product writes, the embedding's backward
// adds after it) with a 16-bit .grad so holds the rounded sum of its two contributions, as llm.c's.
ParamGrad product_param_grad(const BackwardArgs& g, size_t input, const Shape& shape, DType dtype, Device device) {
  return param_grad(g, input, {DType::f32, dtype}, shape, dtype, device);
}

// The gradients of z = x W^T + b from g, the gradient of z ([N, out] contiguous), with x
// folded to x2 [N, in]:  dx = g W (of x's shape),  dW = g^T x,  db = g summed over its
// rows, fused into the dW product. Each only where wanted (undefined otherwise; dW and db
// also where written into the parameters' .grad: W and b are inputs weight_input and
// bias_input of the node).
struct LinearGrads {
  Tensor x, weight, bias;
};
LinearGrads linear_grads(const BackwardArgs& args, size_t weight_input, size_t bias_input, const Tensor& grad,
                         const Tensor& x2, const Tensor& w, const Shape& x_shape, bool want_x, bool want_weight,
                         bool want_bias) {
  LinearGrads out;
  if (want_x) {
    out.x = empty(x2.shape(), grad.dtype(), grad.device());
    fused::matmul(out.x, grad, w);
    out.x = out.x.view(x_shape);
  }
  if (want_weight || want_bias) {
    const ParamGrad dw = want_weight ? product_param_grad(args, weight_input, w.shape(), grad.dtype(), grad.device())
                                     : ParamGrad{empty(w.shape(), grad.dtype(), grad.device()), {}};
    const ParamGrad db =
        want_bias ? product_param_grad(args, bias_input, {w.shape()[0]}, grad.dtype(), grad.device()) : ParamGrad{};
    fused::linear_param_backward(dw.values, db.values, grad, x2, dw.destination.accumulate, db.destination.accumulate);
    if (want_weight) out.weight = dw.returned();
    out.bias = db.returned();
  }
  return out;
}

// linear and linear_gelu (on the GPU, and in f32/f64 on the CPU): one product on x folded
// to [N, in], the bias added (and the GELU applied, keeping its input z) by cuBLASLt's
// epilogue or by one pass over the rows on the CPU, and one autograd node. With
// z = x W^T + b and g the gradient of z (dy for linear, dy * gelu'(z) for linear_gelu),
// linear_grads. On a GPU the weight and bias gradients go straight into their f32 .grad
// (the flat gradient buffer) where the engine offers it: no gradient tensor in the
// compute dtype, no cast and no add after the product.
Tensor linear_fused(const char* op, DType dtype, const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                    bool gelu) {
  const Tensor x = x_in.to(dtype), weight = weight_in.to(dtype);
  const Tensor bias = bias_in.defined() ? bias_in.to(dtype) : Tensor();
  const int64_t out_features = weight.shape()[0];
  const Tensor x2 = kernel_operand(x.detach().reshape({-1, weight.shape()[1]})), w = kernel_operand(weight.detach());
  const bool needs_grad = autograd::any_requires_grad({&x, &weight, &bias});
  Tensor pre;
  if (gelu && needs_grad) {
    pre = empty({x2.shape()[0], fused::gelu_aux_ld(x.device(), out_features)}, dtype, x.device())
              .narrow(1, 0, out_features);
  }
  Tensor y = empty({x2.shape()[0], out_features}, dtype, x.device());
  fused::linear(y, x2, w, bias.defined() ? kernel_operand(bias.detach()) : Tensor(), gelu, pre);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  y = y.view(out_shape);
  if (needs_grad) {
    autograd::record(op, {x, weight, bias}, {y},
                     [x2, w, pre, gelu, dtype, has_bias = bias.defined(), x_shape = x.shape()](const BackwardArgs& g) {
                       Tensor grad = g.grad().to(dtype).reshape({-1, w.shape()[0]}).contiguous();
                       if (gelu) {
                         Tensor grad_pre = empty(grad.shape(), dtype, grad.device());
                         fused::gelu_backward(grad_pre, grad, pre);
                         grad = grad_pre;
                       }
                       LinearGrads d =
                           linear_grads(g, 1, 2, grad, x2, w, x_shape, g.needs(0), g.needs(1), has_bias && g.needs(2));
                       return std::vector<Tensor>{d.x, d.weight, d.bias};
                     });
  }
  return y;
}

// linear_gelu_linear (on the GPU, and in f32/f64 on the CPU): linear_gelu's call
// (GELU_AUX_BIAS, keeping z1 = x W1^T + b1), then linear's (BIAS), one autograd node. With g the gradient of y = h W2^T
// + b2, h = gelu(z1): linear_grads of the second linear from g and h; then dz1 = (g W2) * gelu'(z1) in one product
// (DGELU epilogue: the gradient of h is never written; DGELU_BGRAD sums dz1 for db1 too), and linear_grads of the first
// from dz1 and x for dx, dW1. Saved: x, W1, z1, h, W2.
Tensor linear_gelu_linear_fused(const char* op, DType dtype, const Tensor& x_in, const Tensor& w1_in,
                                const Tensor& b1_in, const Tensor& w2_in, const Tensor& b2_in) {
  auto as_dtype = [dtype](const Tensor& t) { return t.defined() ? kernel_operand(t.to(dtype)) : Tensor(); };
  const Tensor x = as_dtype(x_in), w1 = as_dtype(w1_in), b1 = as_dtype(b1_in), w2 = as_dtype(w2_in),
               b2 = as_dtype(b2_in);
  const int64_t hidden = w1.shape()[0], out_features = w2.shape()[0];
  const Tensor x2 = kernel_operand(x.detach().reshape({-1, w1.shape()[1]}));
  const int64_t N = x2.shape()[0];
  const bool needs_grad = autograd::any_requires_grad({&x, &w1, &b1, &w2, &b2});
  const Tensor pre = needs_grad
                         ? empty({N, fused::gelu_aux_ld(x.device(), hidden)}, dtype, x.device()).narrow(1, 0, hidden)
                         : Tensor();
  Tensor h = empty({N, hidden}, dtype, x.device()), y = empty({N, out_features}, dtype, x.device());
  fused::linear(h, x2, w1.detach(), b1.defined() ? b1.detach() : Tensor(), /*gelu=*/true, pre);
  fused::linear(y, h, w2.detach(), b2.defined() ? b2.detach() : Tensor());
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  y = y.view(out_shape);
  if (needs_grad) {
    autograd::record(
        op, {x, w1, b1, w2, b2}, {y},
        [x2, w1 = w1.detach(), w2 = w2.detach(), pre, h, dtype, has_b1 = b1.defined(), has_b2 = b2.defined(),
         x_shape = x.shape()](const BackwardArgs& g) {
          const Tensor grad = g.grad().to(dtype).reshape({-1, w2.shape()[0]}).contiguous();
          const LinearGrads second =
              linear_grads(g, 3, 4, grad, h, w2, h.shape(), false, g.needs(3), has_b2 && g.needs(4));
          LinearGrads first;
          if (g.needs(0) || g.needs(1) || (has_b1 && g.needs(2))) {
            // db1 = dz1 summed over rows comes from dz1's own product (DGELU_BGRAD).
            Tensor grad_pre = empty(h.shape(), dtype, grad.device());
            const ParamGrad db1 =
                has_b1 && g.needs(2) ? product_param_grad(g, 2, {w1.shape()[0]}, dtype, grad.device()) : ParamGrad{};
            fused::linear_gelu_input_backward(grad_pre, grad, w2, pre, db1.values, db1.destination.accumulate);
            first = linear_grads(g, 1, 2, grad_pre, x2, w1, x_shape, g.needs(0), g.needs(1), false);
            first.bias = db1.returned();
          }
          return std::vector<Tensor>{first.x, first.weight, first.bias, second.weight, second.bias};
        });
  }
  return y;
}

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
void set_matmul_autotune(bool autotune) { g_matmul_autotune.store(autotune); }
bool matmul_autotune() { return g_matmul_autotune.load(); }

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
  OpScope timed("matmul", [&] {
    const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
    return cost::matmul(std::max(a.numel() / std::max<int64_t>(M * K, 1), b.numel() / std::max<int64_t>(K * N, 1)), M,
                        N, K, a.dtype(), b.dtype(), a.dtype());
  });
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
  OpScope timed("linear", [&] {
    const int64_t K = x.size(-1);
    return cost::linear(x.numel() / std::max<int64_t>(K, 1), weight.size(0), K, bias.defined(), false, x.dtype());
  });
  if (auto dtype = fused_dtype("linear", linear_dtype({&x, &weight, &bias}), x.device()))
    return linear_fused("linear", *dtype, x, weight, bias, /*gelu=*/false);
  // Fold the leading dims into one so the product is a single GEMM.
  Shape out_shape = x.shape();
  out_shape.back() = weight.shape()[0];
  Tensor y = matmul(x.reshape({-1, x.shape().back()}), weight.t());
  if (bias.defined()) y = y + bias;
  return y.reshape(out_shape);
}

Tensor linear_gelu_linear(const Tensor& x_arg, const Tensor& w1_arg, const Tensor& b1_arg, const Tensor& w2_arg,
                          const Tensor& b2_arg) {
  const char* op = "linear_gelu_linear";
  const Tensor x = autocast::to_compute(x_arg), w1 = autocast::to_compute(w1_arg), b1 = autocast::to_compute(b1_arg),
               w2 = autocast::to_compute(w2_arg), b2 = autocast::to_compute(b2_arg);
  check_linear(op, x, w1, b1);
  require_defined(op, w2, "second weight");
  common_device(op, {&x, &w2, &b2});
  PRECIS_CHECK(w2.dim() == 2 && w2.shape()[1] == w1.shape()[0], op, ": second weight ", w2.shape(),
               " must be [out_features, ", w1.shape()[0], "] (in_features = the first weight's out_features)");
  PRECIS_CHECK(!b2.defined() || (b2.dim() == 1 && b2.shape()[0] == w2.shape()[0]), op, ": second bias ", b2.shape(),
               " must be [out_features] = [", w2.shape()[0], "]");
  OpScope timed(op, [&] {
    const int64_t K = x.size(-1);
    return cost::linear_gelu_linear(x.numel() / std::max<int64_t>(K, 1), K, w1.size(0), w2.size(0), x.dtype());
  });
  if (auto dtype = fused_dtype(op, linear_dtype({&x, &w1, &b1, &w2, &b2}), x.device()))
    return linear_gelu_linear_fused(op, *dtype, x, w1, b1, w2, b2);
  return linear(gelu(linear(x, w1, b1)), w2, b2);
}

Tensor linear_gelu(const Tensor& x_arg, const Tensor& weight_arg, const Tensor& bias_arg) {
  const Tensor x = autocast::to_compute(x_arg), weight = autocast::to_compute(weight_arg),
               bias = autocast::to_compute(bias_arg);
  check_linear("linear_gelu", x, weight, bias);
  OpScope timed("linear_gelu", [&] {
    const int64_t K = x.size(-1);
    return cost::linear(x.numel() / std::max<int64_t>(K, 1), weight.size(0), K, bias.defined(), true, x.dtype());
  });
  if (auto dtype = fused_dtype("linear_gelu", linear_dtype({&x, &weight, &bias}), x.device()))
    return linear_fused("linear_gelu", *dtype, x, weight, bias, /*gelu=*/true);
  return gelu(linear(x, weight, bias));
}

}  // namespace precis::ops
