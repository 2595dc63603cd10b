// The launchers of the GPU matrix products (ops/cuda/matmul.h): operands checked and
// read as matrices, the row-major product put in cuBLASLt's terms (ops/cuda/cublaslt.h,
// which says how), the epilogue chosen, and the two small kernels that go with
// linear_gelu: the GELU gradient, and bias + GELU for a product whose epilogue could not
// be fused.
//
// Weight gradients in f32 or the operands' dtype. linear_param_backward may write dW (and
// db) in f32 from f16/bf16 operands (D and C of type f32, CUBLAS_COMPUTE_32F: the
// accumulator is stored unrounded), or in their own dtype (the accumulator rounded once), and
// may add into them (beta = 1: D = round(acc + C), one rounding): a product writes a
// parameter's gradient straight into the flat gradient buffer, f32 or 16-bit by
// precision.grad_dtype (core/autograd.h, take_grad_destination).
// A bias gradient from an epilogue has D's type and cannot be added to: where db must be
// added, or differs in type from D, column_sums makes it (it writes f32 and adds).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iostream>
#include <mutex>
#include <vector>

#include "core/copy.h"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"
#include "ops/cuda/column_sums.h"
#include "ops/cuda/compute_math.cuh"
#include "ops/cuda/cublaslt.h"
#include "ops/cuda/matmul.h"
#include "ops/cuda/matmul_autotune.h"
#include "ops/matmul.h"
#include "ops/matrix_layout.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)
using cublaslt::Gemm;
using cublaslt::note_unfused;
using cublaslt::prefer_fused;
using cublaslt::run;
using cublaslt::try_run;

namespace {

std::atomic<bool> g_fuse_epilogues{true};

// out[r, c] = act(out[r, c] + bias[c]) over a dense [rows, cols] out, act = GELU (the tanh
// approximation, in f32: ops/cuda/compute_math.cuh) or identity; pre[r, c] (row stride
// pre_ld) keeps the activation's input. bias and pre may be null.
template <typename T>
__global__ void bias_gelu_kernel(T* out, const T* bias, T* pre, int64_t pre_ld, int64_t rows, int64_t cols, bool gelu) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  int64_t r = i / cols, c = i % cols;
  float z = static_cast<float>(out[i]);
  if (bias) z += static_cast<float>(bias[c]);
  if (pre) pre[r * pre_ld + c] = static_cast<T>(z);
  out[i] = static_cast<T>(gelu ? gelu_tanh(z) : z);
}

// grad_pre[r, c] = grad_out[r, c] * gelu'(pre[r, c]); grad_out, grad_pre dense, pre with row stride pre_ld.
template <typename T>
__global__ void gelu_backward_kernel(T* grad_pre, const T* grad_out, const T* pre, int64_t pre_ld, int64_t rows,
                                     int64_t cols) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  int64_t r = i / cols, c = i % cols;
  grad_pre[i] =
      static_cast<T>(static_cast<float>(grad_out[i]) * gelu_tanh_grad(static_cast<float>(pre[r * pre_ld + c])));
}

// All defined tensors on one CUDA device in one dtype, f32, f16 or bf16; returns that dtype.
DType check_operands(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!first) first = t;
    PRECIS_CHECK(t->is_cuda(), op, ": expected CUDA tensors, got ", describe(*t));
    PRECIS_CHECK(t->device() == first->device() && t->dtype() == first->dtype(), op,
                 ": operands must share one device and one dtype, got ", describe(*first), " and ", describe(*t));
  }
  PRECIS_CHECK(first, op, ": every operand is undefined");
  DType dtype = first->dtype();
  PRECIS_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16, op,
               ": GPU products take float32, float16 or bfloat16, got ", describe(*first));
  return dtype;
}

// `t` itself when cuBLASLt can read its last two dims in place, else a dense copy. No autograd.
Tensor readable(const Tensor& t) { return layout_of(t) == Layout::neither ? t.detach().contiguous() : t; }

// The transpose of a 2-D tensor, as a view without autograd.
Tensor transposed(const Tensor& t) {
  return t.as_strided({t.shape()[1], t.shape()[0]}, {t.strides()[1], t.strides()[0]}, t.offset());
}

// The last two dims of a readable tensor: element (i, j) of its first matrix is at
// data + (i ld + j) elements (row-major) or data + (i + j ld) (column-major).
struct Matrix {
  const char* data;
  bool col_major;
  int64_t ld;
};
Matrix matrix_of(const Tensor& t) {
  int64_t rows = t.shape()[t.dim() - 2], cols = t.shape()[t.dim() - 1];
  if (layout_of(t) == Layout::row_major)
    return {static_cast<const char*>(t.raw_data()), false, std::max(t.strides()[t.dim() - 2], cols)};
  return {static_cast<const char*>(t.raw_data()), true, std::max(t.strides()[t.dim() - 1], rows)};
}

// The cuBLASLt problem for the row-major D = A B with A: [M, K], B: [K, N] and D
// dense [M, N] at `d` (see the top of the file).
Gemm row_major_product(const char* op, Device device, DType dtype, const Matrix& a, const Matrix& b, void* d, int64_t M,
                       int64_t N, int64_t K) {
  Gemm g;
  g.op = op;
  g.device = device;
  g.dtype = dtype;
  g.out_dtype = dtype;
  g.m = N;
  g.n = M;
  g.k = K;
  g.a = b.data;
  g.trans_a = b.col_major;
  g.lda = b.ld;
  g.b = a.data;
  g.trans_b = a.col_major;
  g.ldb = a.ld;
  g.d = d;
  g.ldd = N;
  return g;
}

// The stride of `t` along dim `d` of an `out_batch`-dim batch shape (aligned
// from the right): 0 where t lacks the dim or broadcasts it.
int64_t batch_stride(const char* op, const Tensor& t, const Shape& out_batch, size_t d) {
  int64_t t_batch = t.dim() - 2;
  int64_t j = static_cast<int64_t>(d) - (static_cast<int64_t>(out_batch.size()) - t_batch);
  if (j < 0 || t.shape()[j] == 1) return 0;
  PRECIS_CHECK(t.shape()[j] == out_batch[d], op, ": batch dims of ", describe(t), " do not broadcast to ", out_batch);
  return t.strides()[j];
}

// A weight gradient's product. Where cuBLASLt has no algorithm writing f32 from f16/bf16
// operands (said once), it runs in the operands' dtype into a scratch matrix, then
// widened into `out` or added to it.
void run_weight_gradient(const Gemm& g, const Tensor& out) {
  if (try_run(g)) return;
  PRECIS_CHECK(g.out_dtype != g.dtype, g.op, ": cuBLASLt has no algorithm for ", g.problem());
  static std::once_flag noted;
  std::call_once(noted, [&] {
    std::cerr << "note: " << g.op << ": cuBLASLt has no algorithm for " << g.problem() << "; the gradient is made in "
              << dtype_name(g.dtype) << " and then widened (said once)\n";
  });
  Tensor scratch = empty(out.shape(), g.dtype, out.device());
  Gemm narrow = g;
  narrow.out_dtype = g.dtype;
  narrow.accumulate = false;
  narrow.d = scratch.raw_data();
  run(narrow);
  if (g.accumulate)
    accumulate_(out, scratch);
  else
    copy_(out, scratch);
}

// A parameter gradient written by a product of `dtype` operands: contiguous `shape`, in `dtype` or f32,
// on `device` (check_operands checked the operands).
void check_gradient_output(const char* op, const char* what, const Tensor& t, DType dtype, Device device,
                           const Shape& shape) {
  PRECIS_CHECK(t.is_cuda() && t.device() == device && (t.dtype() == dtype || t.dtype() == DType::f32) &&
                   t.shape() == shape && t.is_contiguous(),
               op, ": ", what, " ", describe(t), " must be contiguous ", shape, " on ", device, ", of ",
               dtype_name(dtype), " or float32");
}

}  // namespace

// ---------------------------------------------------------------------------

void matmul(const Tensor& out, const Tensor& a_in, const Tensor& b_in) {
  const char* op = "matmul";
  DType dtype = check_operands(op, {&out, &a_in, &b_in});
  PRECIS_CHECK(a_in.dim() >= 2 && b_in.dim() >= 2 && out.dim() >= 2, op, ": operands must have at least 2 dims, got ",
               describe(a_in), ", ", describe(b_in), " and out ", describe(out));
  const int64_t M = a_in.shape()[a_in.dim() - 2], K = a_in.shape().back(), N = b_in.shape().back();
  Shape batch(out.shape().begin(), out.shape().end() - 2);
  PRECIS_CHECK(b_in.shape()[b_in.dim() - 2] == K && out.shape()[out.dim() - 2] == M && out.shape().back() == N &&
                   out.is_contiguous() && a_in.dim() - 2 <= out.dim() - 2 && b_in.dim() - 2 <= out.dim() - 2,
               op, ": shapes ", a_in.shape(), " x ", b_in.shape(), " do not fit a contiguous out ", describe(out));
  if (out.numel() == 0) return;
  if (K == 0) {
    fill_(out, 0.0);
    return;
  }
  const Tensor a = readable(a_in), b = readable(b_in);
  const Matrix ma = matrix_of(a), mb = matrix_of(b);

  // Batch dims of size > 1, with the strides of a, b and out along each (0 where broadcast).
  std::vector<int64_t> sizes, sa, sb, so;
  for (size_t d = 0; d < batch.size(); ++d) {
    int64_t stride_a = batch_stride(op, a, batch, d), stride_b = batch_stride(op, b, batch, d);
    if (batch[d] == 1) continue;
    sizes.push_back(batch[d]);
    sa.push_back(stride_a);
    sb.push_back(stride_b);
    so.push_back(out.strides()[d]);
  }
  // The trailing dims whose strides line up in all three tensors make one strided
  // batch; the leading ones (a broadcast that no single stride describes) are looped over.
  size_t first = sizes.empty() ? 0 : sizes.size() - 1;
  auto lines_up = [&](size_t d) {
    return sa[d] == sa[d + 1] * sizes[d + 1] && sb[d] == sb[d + 1] * sizes[d + 1] && so[d] == so[d + 1] * sizes[d + 1];
  };
  while (first > 0 && lines_up(first - 1)) --first;
  int64_t count = 1, stride_a = 0, stride_b = 0;
  for (size_t d = first; d < sizes.size(); ++d) count *= sizes[d];
  if (count > 1) {
    stride_a = sa.back();
    stride_b = sb.back();
  }
  PRECIS_CHECK(count <= INT32_MAX, op, ": a batch of ", count, " products is more than cuBLASLt takes");
  // A batch that shares one b, with a's rows evenly spaced across it, is one
  // taller product: [count*M, K] x [K, N].
  int64_t rows = M;
  if (count > 1 && stride_b == 0 && !ma.col_major && stride_a == M * ma.ld) {
    rows = M * count;
    count = 1;
    stride_a = 0;
  }

  int64_t outer = 1;
  for (size_t d = 0; d < first; ++d) outer *= sizes[d];
  const size_t bytes = element_size(dtype);
  for (int64_t index = 0; index < outer; ++index) {
    int64_t offset_a = 0, offset_b = 0, offset_out = 0;
    for (int64_t d = static_cast<int64_t>(first) - 1, rest = index; d >= 0; --d) {
      int64_t i = rest % sizes[d];
      rest /= sizes[d];
      offset_a += i * sa[d];
      offset_b += i * sb[d];
      offset_out += i * so[d];
    }
    Gemm g = row_major_product(op, out.device(), dtype, {ma.data + offset_a * bytes, ma.col_major, ma.ld},
                               {mb.data + offset_b * bytes, mb.col_major, mb.ld},
                               static_cast<char*>(out.raw_data()) + offset_out * bytes, rows, N, K);
    if (count > 1) {
      g.batch = count;
      g.stride_a = stride_b;  // cuBLASLt's first operand is our b
      g.stride_b = stride_a;
      g.stride_d = M * N;
    }
    run(g);
  }
}

int64_t gelu_aux_ld(int64_t out_features) { return (out_features + 7) / 8 * 8; }

void linear(const Tensor& out, const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, bool gelu,
            const Tensor& pre) {
  const char* op = gelu ? "linear_gelu" : "linear";
  DType dtype = check_operands(op, {&out, &x_in, &weight_in, &bias_in, &pre});
  PRECIS_CHECK(x_in.dim() == 2 && weight_in.dim() == 2 && x_in.shape()[1] == weight_in.shape()[1], op, ": input ",
               describe(x_in), " and weight ", describe(weight_in), " must be [N, in] and [out, in]");
  const int64_t N = x_in.shape()[0], in = x_in.shape()[1], out_features = weight_in.shape()[0];
  PRECIS_CHECK(out.shape() == Shape({N, out_features}) && out.is_contiguous(), op, ": out ", describe(out),
               " must be contiguous [", N, ", ", out_features, "]");
  PRECIS_CHECK(!bias_in.defined() || bias_in.shape() == Shape({out_features}), op, ": bias ", describe(bias_in),
               " must be [", out_features, "]");
  PRECIS_CHECK(!pre.defined() || gelu, op, ": pre_gelu is only written with gelu");
  PRECIS_CHECK(
      !pre.defined() || (pre.shape() == Shape({N, out_features}) && (pre.strides()[1] == 1 || out_features == 1) &&
                         pre.strides()[0] >= out_features && pre.strides()[0] % 8 == 0),
      op, ": pre_gelu ", describe(pre), " must be [", N, ", ", out_features,
      "] with unit column stride and a row stride that is a multiple of 8, e.g. gelu_aux_ld(", out_features,
      ") = ", gelu_aux_ld(out_features));
  if (out.numel() == 0) return;
  const Tensor bias = bias_in.defined() ? bias_in.detach().contiguous() : Tensor();
  const Device device = out.device();
  if (in > 0) {
    const Tensor x = readable(x_in), weight_t = readable(transposed(weight_in));
    Gemm g =
        row_major_product(op, device, dtype, matrix_of(x), matrix_of(weight_t), out.raw_data(), N, out_features, in);
    if (fuse_epilogues() && (bias.defined() || gelu)) {
      if (gelu && pre.defined()) {
        g.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        g.aux = pre.raw_data();
        g.aux_ld = pre.strides()[0];
      } else if (gelu) {
        g.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
      } else {
        g.epilogue = CUBLASLT_EPILOGUE_BIAS;
      }
      g.bias = bias.defined() ? bias.raw_data() : nullptr;
      if (try_run(g)) return;
      note_unfused(g);
      g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = g.aux = nullptr;
      g.aux_ld = 0;
    }
    run(g);
  } else {
    fill_(out, 0.0);
  }
  if (!bias.defined() && !gelu) return;
  const int64_t n = out.numel();
  dispatch_device<float, __half, __nv_bfloat16>(
      dtype,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        precis::cuda::launch(bias_gelu_kernel<T>, precis::cuda::grid_for(n), precis::cuda::kBlockSize, 0,
                             precis::cuda::compute_stream(device), static_cast<T*>(out.raw_data()),
                             bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr,
                             pre.defined() ? static_cast<T*>(pre.raw_data()) : nullptr,
                             pre.defined() ? pre.strides()[0] : 0, N, out_features, gelu);
      },
      op, ": no GPU kernel for ", dtype_name(dtype));
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void linear_param_backward(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,
                           const Tensor& x_in, bool accumulate_weight, bool accumulate_bias) {
  const char* op = "linear backward";
  DType dtype = check_operands(op, {&grad_out, &x_in});
  PRECIS_CHECK(grad_out.dim() == 2 && x_in.dim() == 2 && grad_out.shape()[0] == x_in.shape()[0], op,
               ": output gradient ", describe(grad_out), " and input ", describe(x_in),
               " must be [N, out] and [N, in]");
  const int64_t N = x_in.shape()[0], in = x_in.shape()[1], out_features = grad_out.shape()[1];
  check_gradient_output(op, "grad_weight", grad_weight, dtype, grad_out.device(), {out_features, in});
  if (grad_bias.defined()) check_gradient_output(op, "grad_bias", grad_bias, dtype, grad_out.device(), {out_features});
  if (N == 0) {  // sums of nothing
    if (!accumulate_weight) fill_(grad_weight, 0.0);
    if (grad_bias.defined() && !accumulate_bias) fill_(grad_bias, 0.0);
    return;
  }
  const Tensor g = readable(grad_out), x = readable(x_in);
  const Tensor g_t = transposed(g);
  // db = g summed over its rows, by our column-sum kernel (column_sums.cu), when not fused into dW's product.
  auto bias_sum = [&] { column_sums(grad_bias, g, accumulate_bias); };
  if (grad_weight.numel() > 0) {
    Gemm gemm = row_major_product(op, x.device(), dtype, matrix_of(g_t), matrix_of(x), grad_weight.raw_data(),
                                  out_features, in, N);
    gemm.out_dtype = grad_weight.dtype();
    gemm.accumulate = accumulate_weight;
    // BGRADB writes db in D's type and cannot add to it; and only products that add to nothing are timed.
    const bool fusable =
        grad_bias.defined() && grad_bias.dtype() == grad_weight.dtype() && !accumulate_weight && !accumulate_bias;
    Gemm fused = gemm;
    fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    fused.bias = grad_bias.defined() ? grad_bias.raw_data() : nullptr;
    if (fusable && fuse_epilogues() && prefer_fused(fused, [&] {
          run_weight_gradient(gemm, grad_weight);
          bias_sum();
        })) {
      if (try_run(fused)) return;
      note_unfused(fused);
    }
    run_weight_gradient(gemm, grad_weight);
  }
  if (grad_bias.defined()) bias_sum();
}

void linear_gelu_input_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& weight, const Tensor& pre,
                                const Tensor& grad_pre_sums, bool accumulate_sums) {
  const char* op = "linear_gelu backward";
  DType dtype = check_operands(op, {&grad_pre, &grad_out, &weight, &pre});
  PRECIS_CHECK(grad_out.dim() == 2 && weight.dim() == 2 && grad_out.shape()[1] == weight.shape()[0], op,
               ": output gradient ", describe(grad_out), " and weight ", describe(weight),
               " must be [N, out] and [out, in]");
  const int64_t N = grad_out.shape()[0], out_features = weight.shape()[0], in = weight.shape()[1];
  PRECIS_CHECK(grad_pre.shape() == Shape({N, in}) && grad_pre.is_contiguous() && pre.shape() == Shape({N, in}) &&
                   (pre.strides()[1] == 1 || in == 1) && pre.strides()[0] >= in && pre.strides()[0] % 8 == 0,
               op, ": the gradient ", describe(grad_pre), " must be contiguous [", N, ", ", in, "] and the GELU input ",
               describe(pre), " as linear's pre_gelu");
  const bool sums = grad_pre_sums.defined();
  if (sums) check_gradient_output(op, "the column sums", grad_pre_sums, dtype, grad_pre.device(), {in});
  if (grad_pre.numel() == 0) {
    if (sums && !accumulate_sums) fill_(grad_pre_sums, 0.0);
    return;
  }
  if (out_features == 0) {
    fill_(grad_pre, 0.0);
    if (sums && !accumulate_sums) fill_(grad_pre_sums, 0.0);
    return;
  }
  auto column_sums_of_grad_pre = [&] {
    if (sums) column_sums(grad_pre_sums, grad_pre, accumulate_sums);
  };
  const Tensor g = readable(grad_out), w = readable(weight);
  Gemm gemm = row_major_product(op, grad_pre.device(), dtype, matrix_of(g), matrix_of(w), grad_pre.raw_data(), N, in,
                                out_features);
  if (fuse_epilogues()) {
    gemm.epilogue = CUBLASLT_EPILOGUE_DGELU;
    gemm.aux = pre.raw_data();
    gemm.aux_ld = pre.strides()[0];
    // Sums added into a 16-bit .grad (precision.grad_dtype) skip the epilogue, which would round
    // them before the add: column_sums adds the f32 sums and rounds once.
    if (sums && !(accumulate_sums && grad_pre_sums.dtype() == dtype)) {
      // DGELU_BGRAD writes the sums in grad_pre's dtype, over what was there: sums in f32, or
      // to be added, go through a scratch vector (timing uses one too, never grad_pre_sums).
      const bool direct = grad_pre_sums.dtype() == dtype && !accumulate_sums;
      const Tensor epilogue_sums = direct ? grad_pre_sums : empty({in}, dtype, grad_pre.device());
      Gemm fused = gemm;
      fused.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
      fused.bias = epilogue_sums.raw_data();
      if (prefer_fused(fused, [&] {
            if (try_run(gemm)) column_sums(epilogue_sums, grad_pre);
          })) {
        if (try_run(fused)) {
          if (direct) return;
          if (accumulate_sums)
            accumulate_(grad_pre_sums, epilogue_sums);
          else
            copy_(grad_pre_sums, epilogue_sums);
          return;
        }
        note_unfused(fused);
      }
    }
    if (try_run(gemm)) {
      column_sums_of_grad_pre();
      return;
    }
    note_unfused(gemm);
    gemm.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    gemm.aux = nullptr;
    gemm.aux_ld = 0;
  }
  run(gemm);
  gelu_backward(grad_pre, grad_pre, pre);  // in place: each element reads only itself
  column_sums_of_grad_pre();
}

void gelu_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& pre) {
  const char* op = "linear_gelu backward";
  DType dtype = check_operands(op, {&grad_pre, &grad_out, &pre});
  PRECIS_CHECK(grad_out.dim() == 2 && grad_out.is_contiguous() && grad_pre.shape() == grad_out.shape() &&
                   grad_pre.is_contiguous() && pre.shape() == grad_out.shape() &&
                   (pre.strides()[1] == 1 || pre.shape()[1] == 1),
               op, ": gradients ", describe(grad_pre), " and ", describe(grad_out),
               " must be contiguous [N, out] and the GELU input ", describe(pre), " [N, out] with unit column stride");
  const int64_t rows = grad_out.shape()[0], cols = grad_out.shape()[1], n = rows * cols;
  if (n == 0) return;
  dispatch_device<float, __half, __nv_bfloat16>(
      dtype,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        precis::cuda::launch(gelu_backward_kernel<T>, precis::cuda::grid_for(n), precis::cuda::kBlockSize, 0,
                             precis::cuda::compute_stream(grad_out.device()), static_cast<T*>(grad_pre.raw_data()),
                             static_cast<const T*>(grad_out.raw_data()), static_cast<const T*>(pre.raw_data()),
                             pre.strides()[0], rows, cols);
      },
      op, ": no GPU kernel for ", dtype_name(dtype));
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void set_fuse_epilogues(bool fuse) { g_fuse_epilogues.store(fuse); }
bool fuse_epilogues() { return g_fuse_epilogues.load(); }

}  // namespace precis::ops::cuda
