#include "optim/sgd.h"

#include "core/strided_loop.h"
#include "optim/low_precision.h"

namespace precis::optim {

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options) : Optimizer(std::move(groups)), options_(options) {
  PRECIS_CHECK(options.lr >= 0, "SGD: lr must be >= 0, got ", options.lr);
  PRECIS_CHECK(options.momentum >= 0, "SGD: momentum must be >= 0, got ", options.momentum);
  PRECIS_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
               "SGD: nesterov needs momentum > 0 and dampening 0");
  lr_ = options.lr;
}

namespace {

// One element: returns x - lr d with d = grad + wd x, through the momentum buffer when there is one.
template <typename T>
inline T sgd_element(T x, T grad, T* buf, double lr, double wd, const SGDOptions& o, bool first) {
  T d = grad + static_cast<T>(wd) * x;
  if (buf) {
    *buf = first ? d : static_cast<T>(o.momentum) * *buf + static_cast<T>(1 - o.dampening) * d;
    d = o.nesterov ? d + static_cast<T>(o.momentum) * *buf : *buf;
  }
  return x - static_cast<T>(lr) * d;
}

// A parameter of the compute type T (f32 or f64), updated in place.
template <typename T>
void sgd_update(T* p, const T* g, T* buf, int64_t n, double lr, double wd, const SGDOptions& o, bool first) {
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) p[i] = sgd_element(p[i], g[i], buf ? buf + i : nullptr, lr, wd, o, first);
}

// A low-precision parameter P (f16/bf16) with gradient G (f32 or P), f32 momentum:
//   x = master ? master[i] : float(p[i]);  x <- sgd_element(x, float(g[i]))
//   master[i] = x (when kept);  p[i] = round(x) (nearest-even or stochastic)
template <typename P, typename G>
void sgd_update_low_precision(P* p, float* master, const G* g, float* buf, int64_t n, double lr, double wd,
                              const SGDOptions& o, bool first, const Rounding& rounding) {
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    float x = sgd_element(master ? master[i] : convert<float>(p[i]), convert<float>(g[i]), buf ? buf + i : nullptr,
                          lr, wd, o, first);
    if (master) master[i] = x;
    p[i] = round_to<P>(x, rounding, static_cast<uint64_t>(i));
  }
}

}  // namespace

void SGD::step() {
  ++step_count_;
  bool first = step_count_ == 1;
  for_each_param([&](size_t index, Tensor& p, double weight_decay) {
    const Tensor& g = p.grad();
    PRECIS_CHECK(p.is_cpu(), "SGD: parameter ", index, " is on ", p.device(), "; only the CPU SGD exists so far");
    PRECIS_CHECK(p.is_contiguous() && g.is_contiguous(), "SGD: parameter ", index, " and its gradient must be dense");
    if (p.dtype() == DType::f32 && g.dtype() == DType::f32) {
      float* buf = options_.momentum > 0 ? state_buffer(index, "momentum_buffer", p).data<float>() : nullptr;
      sgd_update<float>(p.data<float>(), g.data<float>(), buf, p.numel(), lr_, weight_decay, options_, first);
    } else if (p.dtype() == DType::f64 && g.dtype() == DType::f64) {
      double* buf = options_.momentum > 0 ? state_buffer(index, "momentum_buffer", p).data<double>() : nullptr;
      sgd_update<double>(p.data<double>(), g.data<double>(), buf, p.numel(), lr_, weight_decay, options_, first);
    } else {
      PRECIS_CHECK(is_low_precision(p.dtype()) && (g.dtype() == DType::f32 || g.dtype() == p.dtype()),
                   "SGD: parameter ", index, " is ", p.dtype(), " with a ", g.dtype(),
                   " gradient; supported: float32/float64 with a gradient of the same dtype, float16/bfloat16 with "
                   "a float32 or same-dtype gradient");
      PRECIS_CHECK(!options_.stochastic_rounding || p.dtype() == DType::bf16, "SGD: stochastic_rounding is for "
                   "bfloat16 parameters, but parameter ", index, " is ", p.dtype());
      float* master = options_.master_weights ? master_buffer(index, p).data<float>() : nullptr;
      float* buf = options_.momentum > 0 ? state_buffer(index, "momentum_buffer", p).data<float>() : nullptr;
      Rounding rounding{options_.stochastic_rounding, options_.seed, static_cast<uint64_t>(step_count_), index};
      dispatch_low_precision(p.dtype(), g.dtype(), [&](auto param_tag, auto grad_tag) {
        using P = typename decltype(param_tag)::type;
        using G = typename decltype(grad_tag)::type;
        sgd_update_low_precision<P, G>(p.data<P>(), master, g.data<G>(), buf, p.numel(), lr_, weight_decay, options_,
                                       first, rounding);
      });
    }
  });
}

}  // namespace precis::optim
