#include "optim/adamw.h"

#include <cmath>

#include "core/strided_loop.h"

namespace precis::optim {

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options) : Optimizer(std::move(groups)), options_(options) {
  PRECIS_CHECK(options.lr >= 0, "AdamW: lr must be >= 0, got ", options.lr);
  PRECIS_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
               "AdamW: betas must be in [0, 1), got (", options.beta1, ", ", options.beta2, ")");
  PRECIS_CHECK(options.eps > 0, "AdamW: eps must be > 0, got ", options.eps);
  lr_ = options.lr;
}

namespace {

// One parameter's update on the CPU; T is the parameter's type (f32 or f64), state in S.
template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, double lr, double wd, double b1, double b2, double eps,
                  double bias1, double bias2) {
  const T decay = static_cast<T>(1.0 - lr * wd);
  const T step_size = static_cast<T>(lr / bias1);
  const T inv_sqrt_bias2 = static_cast<T>(1.0 / std::sqrt(bias2));
  const T tb1 = static_cast<T>(b1), tb2 = static_cast<T>(b2), teps = static_cast<T>(eps);
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    T grad = g[i];
    m[i] = tb1 * m[i] + (1 - tb1) * grad;
    v[i] = tb2 * v[i] + (1 - tb2) * grad * grad;
    p[i] = p[i] * decay - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bias2 + teps);
  }
}

}  // namespace

void AdamW::step() {
  ++step_count_;
  const double bias1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_count_));
  const double bias2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_count_));
  for_each_param([&](size_t index, Tensor& p, double weight_decay) {
    PRECIS_CHECK(p.is_cpu(), "AdamW: parameter ", index, " is on ", p.device(), "; the CUDA AdamW kernel is not built yet");
    PRECIS_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64, "AdamW: parameter ", index, " is ", p.dtype(),
                 "; low-precision parameters need master weights (precision policy bf16-pure)");
    PRECIS_CHECK(p.is_contiguous() && p.grad().is_contiguous() && p.grad().dtype() == p.dtype(),
                 "AdamW: parameter ", index, " and its gradient must be dense and of one dtype");
    Tensor& m = state_buffer(index, "exp_avg", p);
    Tensor& v = state_buffer(index, "exp_avg_sq", p);
    if (p.dtype() == DType::f32) {
      adamw_update<float>(p.data<float>(), p.grad().data<float>(), m.data<float>(), v.data<float>(), p.numel(), lr_,
                          weight_decay, options_.beta1, options_.beta2, options_.eps, bias1, bias2);
    } else {
      adamw_update<double>(p.data<double>(), p.grad().data<double>(), m.data<double>(), v.data<double>(), p.numel(),
                           lr_, weight_decay, options_.beta1, options_.beta2, options_.eps, bias1, bias2);
    }
  });
}

}  // namespace precis::optim
