#include "optim/clip_grad.h"

#include <cmath>

#include "core/convert.h"
#include "core/strided_loop.h"

#if PRECIS_WITH_CUDA
#include "ops/cuda/global_norm.h"
#endif

namespace precis::optim {

namespace {

double squared_norm(const Tensor& g) {
  PRECIS_CHECK(g.is_cpu() && g.is_contiguous(), "clip_grad_norm: gradients must be dense CPU tensors here (got ",
               describe(g), ")");
  double total = 0;
  dispatch_all(g.dtype(), "clip_grad_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = g.data<T>();
    const int64_t n = g.numel();
#pragma omp parallel for reduction(+ : total) schedule(static) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      double x = convert<double>(p[i]);
      total += x * x;
    }
  });
  return total;
}

void scale(const Tensor& g, double factor) {
  dispatch_all(g.dtype(), "clip_grad_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = g.data<T>();
    const int64_t n = g.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(convert<double>(p[i]) * factor);
  });
}

}  // namespace

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  // CUDA gradients are summed by ops/cuda/global_norm (batched launches, one copy back).
  std::vector<Tensor> cpu_grads, cuda_grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) (p.grad().is_cuda() ? cuda_grads : cpu_grads).push_back(p.grad());
  double total = 0;
  for (const Tensor& g : cpu_grads) total += squared_norm(g);
#if PRECIS_WITH_CUDA
  if (!cuda_grads.empty()) total += ops::cuda::sum_of_squares(cuda_grads);
#endif
  double norm = std::sqrt(total);
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
    double factor = max_norm / (norm + 1e-6);
    for (const Tensor& g : cpu_grads) scale(g, factor);
#if PRECIS_WITH_CUDA
    if (!cuda_grads.empty()) ops::cuda::scale_(cuda_grads, factor);
#endif
  }
  return norm;
}

void clip_grad_norm_on_device(const std::vector<Tensor>& params, [[maybe_unused]] double max_norm, const Tensor& out,
                              [[maybe_unused]] const Tensor& scale, [[maybe_unused]] const Tensor& found_inf) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    if (!p.grad().defined()) continue;
    PRECIS_CHECK(p.grad().is_cuda() && p.grad().device() == out.device(), "clip_grad_norm_on_device: gradient on ",
                 p.grad().device(), ", but the result is on ", out.device(), "; every gradient must be on that GPU");
    grads.push_back(p.grad());
  }
#if PRECIS_WITH_CUDA
  ops::cuda::global_norm_and_clip_factor(grads, max_norm, scale, found_inf, out);
#else
  PRECIS_FAIL("clip_grad_norm_on_device: this build of Precis has no CUDA backend");
#endif
}

}  // namespace precis::optim
