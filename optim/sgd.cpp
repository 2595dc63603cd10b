#include "optim/sgd.h"

#include "core/strided_loop.h"

namespace precis::optim {

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options) : Optimizer(std::move(groups)), options_(options) {
  PRECIS_CHECK(options.lr >= 0, "SGD: lr must be >= 0, got ", options.lr);
  PRECIS_CHECK(options.momentum >= 0, "SGD: momentum must be >= 0, got ", options.momentum);
  PRECIS_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
               "SGD: nesterov needs momentum > 0 and dampening 0");
  lr_ = options.lr;
}

namespace {
template <typename T>
void sgd_update(T* p, const T* g, T* buf, int64_t n, double lr, double wd, const SGDOptions& o, bool first) {
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i] + static_cast<T>(wd) * p[i];
    if (buf) {
      buf[i] = first ? d : static_cast<T>(o.momentum) * buf[i] + static_cast<T>(1 - o.dampening) * d;
      d = o.nesterov ? d + static_cast<T>(o.momentum) * buf[i] : buf[i];
    }
    p[i] -= static_cast<T>(lr) * d;
  }
}
}  // namespace

void SGD::step() {
  ++step_count_;
  bool first = step_count_ == 1;
  for_each_param([&](size_t index, Tensor& p, double weight_decay) {
    PRECIS_CHECK(p.is_cpu(), "SGD: parameter ", index, " is on ", p.device(), "; only the CPU SGD exists so far");
    PRECIS_CHECK((p.dtype() == DType::f32 || p.dtype() == DType::f64) && p.is_contiguous() &&
                     p.grad().is_contiguous() && p.grad().dtype() == p.dtype(),
                 "SGD: parameter ", index, " must be a dense f32/f64 tensor with a gradient of its dtype");
    if (p.dtype() == DType::f32) {
      float* buf = options_.momentum > 0 ? state_buffer(index, "momentum_buffer", p).data<float>() : nullptr;
      sgd_update<float>(p.data<float>(), p.grad().data<float>(), buf, p.numel(), lr_, weight_decay, options_, first);
    } else {
      double* buf = options_.momentum > 0 ? state_buffer(index, "momentum_buffer", p).data<double>() : nullptr;
      sgd_update<double>(p.data<double>(), p.grad().data<double>(), buf, p.numel(), lr_, weight_decay, options_,
                         first);
    }
  });
}

}  // namespace precis::optim
