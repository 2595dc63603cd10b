// flash_attention: the fused attention op (ops/cuda/flash_attention_*.cu explain the
// kernels), with its autograd node, and the test of whether it can run some inputs.
//
// The output is laid out [B, Tq, H, D] in memory and returned as the [B, H, Tq, D]
// view, so the transformer's y.transpose(1, 2).reshape({B, T, C}) costs no copy; the
// input gradients are laid out the same way. Backward saves q, k, v, the output and
// the per-row log-sum-exp (B H Tq floats): no Tq x Tk matrix is ever kept. The packed
// variant also runs on the CPU in f32 and f64 (ops/cpu/flash_attention.h), and may take the
// bias of the product that made qkv, whose gradient (the column sums of d(qkv)) its backward
// then makes: on a GPU inside the kernels that write d(qkv), which is then not read again.
#include "ops/cpu/flash_attention.h"

#include <cmath>
#include <cstdint>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/gpu.h"
#include "ops/checks.h"
#include "ops/cpu/linear.h"
#include "ops/nn_functional.h"
#include "ops/op_cost.h"
#include "ops/param_grad.h"

#if PRECIS_WITH_CUDA
#include "ops/cuda/flash_attention.h"
#endif

namespace precis::ops {

namespace {

constexpr const char* kOp = "flash_attention";

#if PRECIS_WITH_CUDA  // the layouts the CUDA kernels take
bool rows_aligned(const Tensor& t) {
  // 16-byte rows: the kernels copy 8 values at a time.
  const int64_t bytes = static_cast<int64_t>(element_size(t.dtype()));
  return t.strides()[3] == 1 && reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0 &&
         (t.strides()[0] * bytes) % 16 == 0 && (t.strides()[1] * bytes) % 16 == 0 && (t.strides()[2] * bytes) % 16 == 0;
}

// A fresh [B, H, T, D] tensor laid out [B, T, H, D] in memory.
Tensor heads_last_layout(int64_t B, int64_t H, int64_t T, int64_t D, DType dtype, Device device) {
  return empty({B, T, H, D}, dtype, device).transpose(1, 2);
}

Tensor aligned(const Tensor& t) {
  if (rows_aligned(t)) return t;
  const Tensor out = heads_last_layout(t.size(0), t.size(1), t.size(2), t.size(3), t.dtype(), t.device());
  copy_(out, t);
  return out;
}

// qkv [B, T, 3C] with 16-byte aligned rows and q/k/v parts (a dense copy when not).
Tensor aligned_packed(const Tensor& qkv) {
  const int64_t bytes = static_cast<int64_t>(element_size(qkv.dtype()));
  const bool ok = reinterpret_cast<uintptr_t>(qkv.raw_data()) % 16 == 0 && (qkv.strides()[0] * bytes) % 16 == 0 &&
                  (qkv.strides()[1] * bytes) % 16 == 0 && (qkv.size(2) / 3 * bytes) % 16 == 0;
  return ok ? qkv : qkv.contiguous();
}
#endif

}  // namespace

namespace {

// flash_attention_unsupported from the operands' dtype, device and shapes.
std::optional<std::string> heads_unsupported(DType dtype, Device device, const Shape& q, const Shape& k, const Shape& v,
                                             double dropout_p) {
#if !PRECIS_WITH_CUDA
  (void)dtype, (void)device, (void)q, (void)k, (void)v, (void)dropout_p;
  return std::string("this build has no CUDA");
#else
  if (!device.is_cuda()) return std::string("it runs on CUDA devices only");
  if (cuda_compute_capability(device.index) < 80) return std::string("it needs compute capability 8.0 or newer");
  if (dtype != DType::f16 && dtype != DType::bf16)
    return "it runs in f16 or bf16, and attention here computes in " + std::string(dtype_name(dtype));
  if (dropout_p > 0.0) return std::string("it has no attention dropout (set model.dropout: 0)");
  if (q.size() != 4 || k.size() != 4 || v.size() != 4 || k[0] != q[0] || k[1] != q[1] || k[3] != q[3] || v != k)
    return std::string("it takes q [B, H, Tq, D] and k, v [B, H, Tk, D], with one B, H and D");
  if (q[3] != 64 && q[3] != 128) return "its head size is 64 or 128, not " + std::to_string(q[3]);
  if (q[2] == 0 || k[2] == 0) return std::string("a sequence is empty");
  if (q[0] * q[1] > INT32_MAX || q[2] > INT32_MAX / 2 || k[2] > INT32_MAX / 2)
    return std::string("the problem is too large for its 32-bit indices");
  return std::nullopt;
#endif
}

}  // namespace

std::optional<std::string> flash_attention_unsupported(const Tensor& q, const Tensor& k, const Tensor& v,
                                                       double dropout_p) {
  return heads_unsupported(q.dtype(), q.device(), q.shape(), k.shape(), v.shape(), dropout_p);
}

Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, std::optional<double> scale) {
  require_defined(kOp, q, "query");
  require_defined(kOp, k, "key");
  require_defined(kOp, v, "value");
  common_device(kOp, {&q, &k, &v});
  PRECIS_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kOp, ": query, key and value must have one dtype");
  if (auto why = flash_attention_unsupported(q, k, v, 0.0))
    PRECIS_FAIL(kOp, ": cannot run on query ", q.shape(), " ", q.dtype(), " on ", q.device(), ": ", *why,
                "; use scaled_dot_product_attention (model.attention: reference)");
  OpScope timed(kOp, [&] {
    return cost::attention(q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), causal, false, q.dtype());
  });
#if PRECIS_WITH_CUDA
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  const Tensor qa = aligned(q), ka = aligned(k), va = aligned(v);
  Tensor out = heads_last_layout(B, H, Tq, D, q.dtype(), q.device());
  Tensor lse = empty({B, H, Tq}, DType::f32, q.device());
  cuda::flash_attention_forward(qa, ka, va, causal, s, out, lse);
  if (autograd::any_requires_grad({&q, &k, &v})) {
    autograd::record(kOp, {q, k, v}, {out},
                     [qa = qa.detach(), ka = ka.detach(), va = va.detach(), saved_out = out.detach(), lse, causal,
                      s](const BackwardArgs& g) {
                       const Tensor dout = aligned(g.grad());
                       auto like = [](const Tensor& t) {
                         return heads_last_layout(t.size(0), t.size(1), t.size(2), t.size(3), t.dtype(), t.device());
                       };
                       Tensor dq = like(qa), dk = like(ka), dv = like(va);
                       cuda::flash_attention_backward(qa, ka, va, saved_out, lse, dout, causal, s, dq, dk, dv);
                       return std::vector<Tensor>{dq, dk, dv};
                     });
  }
  return out;
#else
  (void)causal, (void)scale;
  return Tensor();
#endif
}

namespace {

// The [B, H, T, D] view of part `part` (0 q, 1 k, 2 v) of a [B, T, 3 H D] tensor.
Tensor head_part(const Tensor& qkv, int64_t part, int64_t n_head) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  return qkv.narrow(2, part * C, C).view({B, T, n_head, C / n_head}).transpose(1, 2);
}

// The autograd inputs of flash_attention_packed: qkv, and qkv_bias (in qkv's dtype, as linear
// takes its bias) where given.
std::vector<Tensor> packed_inputs(const Tensor& qkv, const Tensor& qkv_bias) {
  if (!qkv_bias.defined()) return {qkv};
  return {qkv, qkv_bias.to(qkv.dtype())};
}

// flash_attention_packed on the CPU (ops/cpu/flash_attention.h): y [B, T, C] and the per-row
// log-sum-exp in qkv's dtype; the backward writes d(qkv) whole, recomputing the probabilities,
// and qkv_bias's gradient by linear's column sums.
Tensor flash_attention_packed_cpu(const Tensor& qkv_in, int64_t n_head, bool causal, const Tensor& qkv_bias) {
  const Tensor qkv = qkv_in.is_contiguous() ? qkv_in : qkv_in.contiguous();
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  const double scale = 1.0 / std::sqrt(static_cast<double>(C / n_head));
  Tensor y = empty({B, T, C}, qkv.dtype()), lse = empty({B, n_head, T}, qkv.dtype());
  cpu::flash_attention_forward(qkv, n_head, causal, scale, y, lse);
  const std::vector<Tensor> inputs = packed_inputs(qkv_in, qkv_bias);
  if (autograd::any_requires_grad(inputs)) {
    autograd::record(
        "flash_attention_packed", inputs, {y},
        [qkv = qkv.detach(), y = y.detach(), lse, n_head, causal, scale](const BackwardArgs& g) {
          const Tensor dy = g.grad().is_contiguous() ? g.grad() : g.grad().contiguous();
          Tensor dqkv = empty(qkv.shape(), qkv.dtype());
          cpu::flash_attention_backward(qkv, y, lse, dy.to(qkv.dtype()), n_head, causal, scale, dqkv);
          std::vector<Tensor> grads{dqkv};
          if (g.needs_input_grad.size() > 1) {
            Tensor db;
            if (g.needs(1)) {
              db = empty({qkv.size(2)}, qkv.dtype());
              cpu::linear_param_backward(Tensor(), db, dqkv.view({-1, qkv.size(2)}), Tensor(), false, false);
            }
            grads.push_back(db);
          }
          return grads;
        });
  }
  return y;
}

}  // namespace

std::optional<std::string> flash_attention_packed_unsupported(const Tensor& qkv, int64_t n_head) {
  if (qkv.dim() == 3 && qkv.strides()[2] != 1) return std::string("qkv's last dim must be unit-stride");
  return flash_attention_packed_unsupported(qkv.dtype(), qkv.device(), qkv.shape(), n_head);
}

std::optional<std::string> flash_attention_packed_unsupported(DType dtype, Device device, const Shape& qkv_shape,
                                                              int64_t n_head) {
  if (qkv_shape.size() != 3 || n_head <= 0 || qkv_shape[2] % (3 * n_head) != 0)
    return std::string("it takes qkv of shape [B, T, 3 * n_head * D]");
  if (device.is_cpu()) {  // ops/cpu/flash_attention.h
    if (dtype != DType::f32 && dtype != DType::f64)
      return "on the CPU it runs in f32 or f64, and attention here computes in " + std::string(dtype_name(dtype));
    return std::nullopt;
  }
  const Shape heads{qkv_shape[0], n_head, qkv_shape[1], qkv_shape[2] / 3 / n_head};  // head_part's view
  return heads_unsupported(dtype, device, heads, heads, heads, 0.0);
}

Tensor flash_attention_packed(const Tensor& qkv, int64_t n_head, bool causal, const Tensor& qkv_bias) {
  const char* op = "flash_attention_packed";
  require_defined(op, qkv, "qkv");
  if (auto why = flash_attention_packed_unsupported(qkv, n_head))
    PRECIS_FAIL(op, ": cannot run on qkv ", qkv.shape(), " ", qkv.dtype(), " on ", qkv.device(), " with ", n_head,
                " heads: ", *why);
  if (qkv_bias.defined()) {
    common_device(op, {&qkv, &qkv_bias});
    PRECIS_CHECK(qkv_bias.dim() == 1 && qkv_bias.size(0) == qkv.size(2) && is_floating(qkv_bias.dtype()), op,
                 ": qkv_bias ", qkv_bias.shape(), " ", qkv_bias.dtype(), " must be a floating [", qkv.size(2),
                 "] (qkv's last dim)");
  }
  OpScope timed(op, [&] {
    const int64_t C = qkv.size(2) / 3;
    return cost::attention(qkv.size(0), n_head, qkv.size(1), qkv.size(1), C / n_head, causal, false, qkv.dtype());
  });
  if (qkv.is_cpu()) return flash_attention_packed_cpu(qkv, n_head, causal, qkv_bias);
#if PRECIS_WITH_CUDA
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, D = C / n_head;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Tensor packed = aligned_packed(qkv);
  const Tensor q = head_part(packed, 0, n_head), k = head_part(packed, 1, n_head), v = head_part(packed, 2, n_head);
  Tensor y = empty({B, T, C}, qkv.dtype(), qkv.device());
  const Tensor out = y.view({B, T, n_head, D}).transpose(1, 2);
  Tensor lse = empty({B, n_head, T}, DType::f32, qkv.device());
  cuda::flash_attention_forward(q, k, v, causal, scale, out, lse);
  const std::vector<Tensor> inputs = packed_inputs(qkv, qkv_bias);
  if (autograd::any_requires_grad(inputs)) {
    autograd::record(
        op, inputs, {y},
        [q = q.detach(), k = k.detach(), v = v.detach(), out = out.detach(), lse, n_head, causal,
         scale](const BackwardArgs& g) {
          const Tensor dy = g.grad().is_contiguous() ? g.grad() : g.grad().contiguous();
          const int64_t B = dy.size(0), T = dy.size(1), C = dy.size(2);
          const Tensor dout = dy.view({B, T, n_head, C / n_head}).transpose(1, 2);
          // d(qkv) is written in place by the kernels: no split backward, no zero fill.
          Tensor dqkv = empty({B, T, 3 * C}, dy.dtype(), dy.device());
          // qkv_bias's gradient, summed by the same kernels: in its .grad where the
          // engine offers it (f32, or qkv's dtype: precision.grad_dtype), as linear's.
          const bool bias = g.needs_input_grad.size() > 1;
          const ParamGrad db =
              bias ? param_grad(g, 1, {DType::f32, dy.dtype()}, {3 * C}, dy.dtype(), dy.device()) : ParamGrad{};
          cuda::flash_attention_backward(q, k, v, out, lse, dout, causal, scale, head_part(dqkv, 0, n_head),
                                         head_part(dqkv, 1, n_head), head_part(dqkv, 2, n_head),
                                         {db.values, db.destination.accumulate});
          std::vector<Tensor> grads{dqkv};
          if (bias) grads.push_back(db.returned());
          return grads;
        });
  }
  return y;
#else
  (void)causal;
  return Tensor();
#endif
}

}  // namespace precis::ops
