// add_relu: y = max(0, x + r), and the gradient g' = g [y > 0] for both x and r (it saves y).
// x and r are read, and y written, dense in x's memory format (r and g copied into it when
// they come in another), so the whole op is one flat pass over matching buffers each way: a
// CPU loop or a CUDA kernel (ops/cuda/residual.cu).
#include "ops/residual.h"

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/memory_format.h"
#include "ops/op_cost.h"

#if PRECIS_WITH_CUDA
#include "ops/cuda/residual.h"
#endif

namespace precis::ops {

namespace {

constexpr const char* kOp = "add_relu";

// t dense in `format` (4-D) or contiguous (other ranks), in `dtype`.
Tensor dense_like(const Tensor& t, MemoryFormat format, DType dtype) {
  return t.dim() == 4 ? dense_in(t, format, dtype) : dense(t, dtype);
}

Tensor empty_like_format(const Tensor& t, MemoryFormat format) {
  return t.dim() == 4 ? empty_in(t.shape(), format, t.dtype(), t.device()) : empty(t.shape(), t.dtype(), t.device());
}

// dx = y > 0 ? g : 0 over matching dense buffers.
Tensor relu_mask(const Tensor& g, const Tensor& y, MemoryFormat format) {
  Tensor dx = empty_like_format(y, format);
  if (y.is_cpu()) {
    cpu::dispatch_floating(y.dtype(), kOp, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_type_t<T>;
      const T* gp = g.data<T>();
      const T* yp = y.data<T>();
      T* out = dx.data<T>();
      const int64_t n = y.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
      for (int64_t i = 0; i < n; ++i) out[i] = convert<C>(yp[i]) > C(0) ? gp[i] : convert<T>(C(0));
    });
  } else {
#if PRECIS_WITH_CUDA
    cuda::relu_mask(g, y, dx);
#endif
  }
  return dx;
}

}  // namespace

Tensor add_relu(const Tensor& x_in, const Tensor& residual_in) {
  require_defined(kOp, x_in);
  require_defined(kOp, residual_in, "residual");
  require_floating(kOp, x_in);
  PRECIS_CHECK(x_in.shape() == residual_in.shape() && x_in.dtype() == residual_in.dtype(), kOp, ": x ", describe(x_in),
               " and residual ", describe(residual_in), " must have one shape and dtype");
  common_device(kOp, {&x_in, &residual_in});
  // relu(x + residual): 2 FLOPs per element forward; backward masks dy once for both inputs.
  OpScope timed(kOp, [&] {
    OpWork w = cost::binary(x_in.numel(), x_in.dtype(), x_in.dtype(), x_in.dtype());
    w.forward.flops *= 2;
    return w;
  });
  const MemoryFormat format = x_in.dim() == 4 ? suggest_memory_format(x_in) : MemoryFormat::contiguous;
  const Tensor x = dense_like(x_in, format, x_in.dtype()), r = dense_like(residual_in, format, x_in.dtype());
  Tensor y = empty_like_format(x, format);
  if (x.is_cpu()) {
    cpu::dispatch_floating(x.dtype(), kOp, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_type_t<T>;
      const T* xp = x.data<T>();
      const T* rp = r.data<T>();
      T* out = y.data<T>();
      const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
      for (int64_t i = 0; i < n; ++i) out[i] = convert<T>(std::max(convert<C>(xp[i]) + convert<C>(rp[i]), C(0)));
    });
  } else {
#if PRECIS_WITH_CUDA
    cuda::add_relu_forward(x, r, y);
#endif
  }
  if (autograd::any_requires_grad({&x_in, &residual_in})) {
    autograd::record(kOp, {x_in, residual_in}, {y}, [y = y.detach(), format](const BackwardArgs& g) {
      const Tensor dx = relu_mask(dense_like(g.grad(), format, y.dtype()), y, format);
      return std::vector<Tensor>{g.needs(0) ? dx : Tensor(), g.needs(1) ? dx : Tensor()};
    });
  }
  return y;
}

}  // namespace precis::ops
