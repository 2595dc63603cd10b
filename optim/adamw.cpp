#include "optim/adamw.h"

#include <cmath>

#include "core/copy.h"
#include "core/strided_loop.h"
#include "ops/op_cost.h"
#include "optim/cuda/adamw.h"  // plain C++: the parameter table both steps use
#include "optim/low_precision.h"

namespace precis::optim {

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Optimizer(std::move(groups), options.lr), options_(options) {
  PRECIS_CHECK(options.lr >= 0, "AdamW: lr must be >= 0, got ", options.lr);
  PRECIS_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
               "AdamW: betas must be in [0, 1), got (", options.beta1, ", ", options.beta2, ")");
  PRECIS_CHECK(options.eps > 0, "AdamW: eps must be > 0, got ", options.eps);
}

namespace {

// The step's constants in the compute type T (f32 or f64).
template <typename T>
struct AdamWConstants {
  T decay, step_size, inv_sqrt_bias2, b1, b2, eps;
};

template <typename T>
AdamWConstants<T> adamw_constants(double lr, double wd, const AdamWOptions& o, double bias1, double bias2) {
  return {static_cast<T>(1.0 - lr * wd), static_cast<T>(lr / bias1), static_cast<T>(1.0 / std::sqrt(bias2)),
          static_cast<T>(o.beta1),       static_cast<T>(o.beta2),    static_cast<T>(o.eps)};
}

// One element: m, v updated in place; returns the new parameter value
//   x * (1 - lr wd) - (lr / bias1) m / (sqrt(v) / sqrt(bias2) + eps)
template <typename T>
inline T adamw_element(T x, T grad, T& m, T& v, const AdamWConstants<T>& c) {
  m = c.b1 * m + (1 - c.b1) * grad;
  v = c.b2 * v + (1 - c.b2) * grad * grad;
  return x * c.decay - c.step_size * m / (std::sqrt(v) * c.inv_sqrt_bias2 + c.eps);
}

// A parameter of the compute type T (f32 or f64), updated in place.
template <typename T>
void adamw_update(T* p, const T* g, double grad_factor, T* m, T* v, int64_t n, const AdamWConstants<T>& c) {
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) p[i] = adamw_element(p[i], scaled_gradient<T>(g[i], grad_factor), m[i], v[i], c);
}

// A parameter P with gradient G (each f32, f16 or bf16; not both f32), f32 moments:
//   x = master ? master[i] : float(p[i]);  x <- adamw_element(x, float(g[i]))
//   master[i] = x (when kept);  p[i] = round(x) (nearest-even or stochastic)
template <typename P, typename G>
void adamw_update_low_precision(P* p, float* master, const G* g, double grad_factor, bool grad_in_f32, float* m,
                                float* v, int64_t n, const AdamWConstants<float>& c, const Rounding& rounding) {
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    float x = adamw_element(master ? master[i] : convert<float>(p[i]),
                            scaled_gradient<float>(g[i], grad_factor, grad_in_f32), m[i], v[i], c);
    if (master) master[i] = x;
    p[i] = round_to<P>(x, rounding, static_cast<uint64_t>(i));
  }
}

}  // namespace

void AdamW::step(const StepInputs& inputs) {
  check_inputs(inputs, "AdamW");
  std::vector<cuda::AdamWTensors> params;
  for_each_param([&](size_t index, Tensor& p, double weight_decay) {
    check_param(index, p);
    Tensor& m = state_buffer(index, "exp_avg", p);
    Tensor& v = state_buffer(index, "exp_avg_sq", p);
    const Tensor master = is_low_precision(p.dtype()) && options_.master_weights ? master_buffer(index, p) : Tensor();
    params.push_back({p, p.grad(), m, v, master, compute_copy(index), weight_decay, index, peer_copies(index)});
  });
  OpScope timed(
      "adamw",
      [&] {
        int64_t n = 0, copy_bytes = 0;
        for (const cuda::AdamWTensors& a : params)
          n += a.param.numel(), copy_bytes += compute_copy_bytes(a.compute_copy);
        OpCost cost = params.empty() ? OpCost{}
                                     : ops::cost::adamw(n, params[0].param.dtype(), params[0].grad.dtype(),
                                                        params[0].master.defined());
        cost.bytes += copy_bytes;
        return OpWork{cost, {}};
      },
      OpPass::step);
#if PRECIS_WITH_CUDA
  if (device().is_cuda()) {
    cuda::adamw_step(
        params, {options_.beta1, options_.beta2, options_.eps, options_.stochastic_rounding, options_.seed},
        {lr_tensor_.data<double>(), step_tensor_.data<int64_t>(),
         inputs.grad_factor.defined() ? inputs.grad_factor.data<double>() : nullptr,
         inputs.skip_if.defined() ? inputs.skip_if.data<double>() : nullptr, inputs.round_scaled_grads_to_f32});
    return;
  }
#endif
  PRECIS_CHECK(device().is_cpu(), "AdamW: parameters on ", device(), ", but this build of Precis has no CUDA backend");
  int64_t t = 0;
  double factor = 1;
  if (!begin_cpu_step(inputs, t, factor)) return;
  const double lr = lr_tensor_.item<double>();
  const double bias1 = 1.0 - std::pow(options_.beta1, static_cast<double>(t));
  const double bias2 = 1.0 - std::pow(options_.beta2, static_cast<double>(t));
  for (const cuda::AdamWTensors& a : params) {
    const Tensor &p = a.param, &g = a.grad, &m = a.exp_avg, &v = a.exp_avg_sq;
    if (p.dtype() == DType::f32 && g.dtype() == DType::f32) {
      adamw_update<float>(p.data<float>(), g.data<float>(), factor, m.data<float>(), v.data<float>(), p.numel(),
                          adamw_constants<float>(lr, a.weight_decay, options_, bias1, bias2));
    } else if (p.dtype() == DType::f64) {
      adamw_update<double>(p.data<double>(), g.data<double>(), factor, m.data<double>(), v.data<double>(), p.numel(),
                           adamw_constants<double>(lr, a.weight_decay, options_, bias1, bias2));
    } else {
      Rounding rounding{options_.stochastic_rounding, options_.seed, static_cast<uint64_t>(t), a.index};
      dispatch_low_precision(p.dtype(), g.dtype(), [&](auto param_tag, auto grad_tag) {
        using P = typename decltype(param_tag)::type;
        using G = typename decltype(grad_tag)::type;
        adamw_update_low_precision<P, G>(p.data<P>(), a.master.defined() ? a.master.data<float>() : nullptr,
                                         g.data<G>(), factor, inputs.round_scaled_grads_to_f32, m.data<float>(),
                                         v.data<float>(), p.numel(),
                                         adamw_constants<float>(lr, a.weight_decay, options_, bias1, bias2), rounding);
      });
    }
    if (a.compute_copy.defined()) copy_(a.compute_copy, p);  // the cast the next forward reads
  }
}

int64_t AdamW::state_bytes_per_element(DType param_dtype) const {
  // Two moments (f64 for f64 parameters, else f32) and the f32 master copy of a low-precision one.
  const int64_t moment = param_dtype == DType::f64 ? 8 : 4;
  return 2 * moment + (is_low_precision(param_dtype) && options_.master_weights ? 4 : 0);
}

void AdamW::check_param(size_t index, const Tensor& p) const {
  const Tensor& g = p.grad();
  check_layout(index, p, "AdamW");
  PRECIS_CHECK(g.device() == p.device(), "AdamW: parameter ", index, " is on ", p.device(), " but its gradient on ",
               g.device());
  check_step_dtypes("AdamW", index, p.dtype(), g.dtype(), options_.stochastic_rounding);
}

}  // namespace precis::optim
