#include "optim/clip_grad.h"

#include "core/convert.h"
#include "core/op_profile.h"
#include "core/strided_loop.h"
#include "optim/grad_norm_rule.h"

#if PRECIS_WITH_CUDA
#include "optim/cuda/grad_norm.h"
#endif

namespace precis::optim {

namespace {

double squared_norm(const Tensor& g) {
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

}  // namespace

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, const Tensor& scale, const Tensor& found_inf,
                      Tensor out, const SumReduction& reduce_sum) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  const Device device = out.defined() ? out.device() : grads.empty() ? Device::cpu() : grads.front().device();
  if (!out.defined()) out = empty({2}, DType::f64, device);
  PRECIS_CHECK(out.is_contiguous() && out.dtype() == DType::f64 && out.numel() == 2,
               "clip_grad_norm: the result must be a dense f64 [2], got ", describe(out));
  for (const Tensor& g : grads)
    PRECIS_CHECK(g.device() == device && is_non_overlapping_and_dense(g),
                 "clip_grad_norm: gradients must be dense and on ", device, ", got ", describe(g));
  for (const Tensor* scalar : {&scale, &found_inf})
    PRECIS_CHECK(
        !scalar->defined() || (scalar->dtype() == DType::f64 && scalar->numel() == 1 && scalar->device() == device),
        "clip_grad_norm: the loss scale and the inf/NaN flag must be f64 scalars on ", device, ", got ",
        describe(*scalar));
  // In a profile, a step-pass op of its own: reads every gradient once, 2 FLOPs (x * x + sum) each.
  OpScope timed(
      "grad_norm",
      [&] {
        OpCost cost;
        for (const Tensor& g : grads) {
          cost.flops += 2.0 * static_cast<double>(g.numel());
          cost.bytes += static_cast<double>(g.numel() * element_size(g.dtype()));
        }
        return OpWork{cost, {}};
      },
      OpPass::step);
#if PRECIS_WITH_CUDA
  if (device.is_cuda()) {
    cuda::grad_norm_and_factor(grads, max_norm, scale, found_inf, out, reduce_sum);
    return out;
  }
#endif
  PRECIS_CHECK(device.is_cpu(), "clip_grad_norm: gradients on ", device, ", but this build has no CUDA backend");
  double total = 0;
  for (const Tensor& g : grads) total += squared_norm(g);
  if (reduce_sum) {
    Tensor sum = full({1}, total, DType::f64, device);
    reduce_sum(sum);
    total = sum.data<double>()[0];
  }
  const GradNorm r = grad_norm_from_sum(total, max_norm, scale.defined() ? scale.item<double>() : 1.0);
  out.data<double>()[0] = r.norm;
  out.data<double>()[1] = r.factor;
  if (found_inf.defined()) found_inf.data<double>()[0] = r.found_inf;
  return out;
}

}  // namespace precis::optim
