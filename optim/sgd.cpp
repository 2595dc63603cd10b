#include "optim/sgd.h"

#include "core/copy.h"
#include "core/op_profile.h"
#include "core/strided_loop.h"
#include "ops/op_cost.h"
#include "optim/cuda/sgd.h"  // plain C++: the parameter table both steps use
#include "optim/low_precision.h"

namespace precis::optim {

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options)
    : Optimizer(std::move(groups), options.lr), options_(options) {
  PRECIS_CHECK(options.lr >= 0, "SGD: lr must be >= 0, got ", options.lr);
  PRECIS_CHECK(options.momentum >= 0, "SGD: momentum must be >= 0, got ", options.momentum);
  PRECIS_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
               "SGD: nesterov needs momentum > 0 and dampening 0");
}

namespace {

// A parameter of the compute type T (f32 or f64), updated in place.
template <typename T>
void sgd_update(T* p, const T* g, double grad_factor, T* buf, int64_t n, double lr, double wd, const SGDRule& r,
                bool first) {
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i)
    p[i] = sgd_element(p[i], scaled_gradient<T>(g[i], grad_factor), buf ? buf + i : nullptr, lr, wd, r, first);
}

// A parameter P with gradient G (each f32, f16 or bf16; not both f32), f32 momentum:
//   x = master ? master[i] : float(p[i]);  x <- sgd_element(x, float(g[i]))
//   master[i] = x (when kept);  p[i] = round(x) (nearest-even or stochastic)
template <typename P, typename G>
void sgd_update_low_precision(P* p, float* master, const G* g, double grad_factor, bool grad_in_f32, float* buf,
                              int64_t n, double lr, double wd, const SGDRule& r, bool first, const Rounding& rounding) {
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    float x =
        sgd_element(master ? master[i] : convert<float>(p[i]), scaled_gradient<float>(g[i], grad_factor, grad_in_f32),
                    buf ? buf + i : nullptr, lr, wd, r, first);
    if (master) master[i] = x;
    p[i] = round_to<P>(x, rounding, static_cast<uint64_t>(i));
  }
}

template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

void SGD::step(const StepInputs& inputs) {
  check_inputs(inputs, "SGD");
  std::vector<cuda::SGDTensors> params;
  for_each_param([&](size_t index, Tensor& p, double weight_decay) {
    const Tensor& g = p.grad();
    check_layout(index, p, "SGD");
    check_step_dtypes("SGD", index, p.dtype(), g.dtype(), options_.stochastic_rounding);
    const Tensor buf = options_.momentum > 0 ? state_buffer(index, "momentum_buffer", p) : Tensor();
    const Tensor master = is_low_precision(p.dtype()) && options_.master_weights ? master_buffer(index, p) : Tensor();
    params.push_back({p, g, buf, master, compute_copy(index), weight_decay, index});
  });
  const SGDRule rule{options_.momentum, options_.dampening, options_.nesterov};
  OpScope timed(
      "sgd",
      [&] {
        OpCost cost;
        for (const cuda::SGDTensors& a : params) {
          const OpCost one = ops::cost::sgd(a.param.numel(), a.param.dtype(), a.grad.dtype(),
                                            a.momentum_buffer.defined(), a.master.defined());
          cost.flops += one.flops, cost.bytes += one.bytes + compute_copy_bytes(a.compute_copy);
        }
        return OpWork{cost, {}};
      },
      OpPass::step);
#if PRECIS_WITH_CUDA
  if (device().is_cuda()) {
    cuda::sgd_step(
        params, {rule, options_.stochastic_rounding, options_.seed},
        {lr_tensor_.data<double>(), step_tensor_.data<int64_t>(),
         inputs.grad_factor.defined() ? inputs.grad_factor.data<double>() : nullptr,
         inputs.skip_if.defined() ? inputs.skip_if.data<double>() : nullptr, inputs.round_scaled_grads_to_f32});
    return;
  }
#endif
  PRECIS_CHECK(device().is_cpu(), "SGD: parameters on ", device(), ", but this build of Precis has no CUDA backend");
  int64_t t = 0;
  double factor = 1;
  if (!begin_cpu_step(inputs, t, factor)) return;
  const double lr = lr_tensor_.item<double>();
  const bool first = t == 1;
  for (const cuda::SGDTensors& a : params) {
    const Tensor &p = a.param, &g = a.grad;
    if (p.dtype() == DType::f32 && g.dtype() == DType::f32) {
      sgd_update<float>(p.data<float>(), g.data<float>(), factor, data_or_null<float>(a.momentum_buffer), p.numel(), lr,
                        a.weight_decay, rule, first);
    } else if (p.dtype() == DType::f64) {
      sgd_update<double>(p.data<double>(), g.data<double>(), factor, data_or_null<double>(a.momentum_buffer), p.numel(),
                         lr, a.weight_decay, rule, first);
    } else {
      Rounding rounding{options_.stochastic_rounding, options_.seed, static_cast<uint64_t>(t), a.index};
      dispatch_low_precision(p.dtype(), g.dtype(), [&](auto param_tag, auto grad_tag) {
        using P = typename decltype(param_tag)::type;
        using G = typename decltype(grad_tag)::type;
        sgd_update_low_precision<P, G>(p.data<P>(), data_or_null<float>(a.master), g.data<G>(), factor,
                                       inputs.round_scaled_grads_to_f32, data_or_null<float>(a.momentum_buffer),
                                       p.numel(), lr, a.weight_decay, rule, first, rounding);
      });
    }
    if (a.compute_copy.defined()) copy_(a.compute_copy, p);  // the cast the next forward reads
  }
}

int64_t SGD::state_bytes_per_element(DType param_dtype) const {
  // The momentum buffer (f64 for f64 parameters, else f32) and the f32 master copy of a low-precision one.
  const int64_t momentum = options_.momentum > 0 ? (param_dtype == DType::f64 ? 8 : 4) : 0;
  return momentum + (is_low_precision(param_dtype) && options_.master_weights ? 4 : 0);
}

}  // namespace precis::optim
