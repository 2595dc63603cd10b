// batch_norm over dim 1 of x [N, C, ...], with M = N * (the product of the dims after C)
// values per channel:
//   training: mean_c = sum x / M,  var_c = sum (x - mean_c)^2 / M (biased), and the running
//             statistics r <- (1 - momentum) r + momentum s, with s = mean_c and the UNBIASED
//             var_c M / (M - 1) (PyTorch's rule);
//   eval:     mean_c, var_c = the running statistics.
//   invstd = 1 / sqrt(var_c + eps),  xhat = (x - mean_c) invstd,  y = xhat w_c + b_c.
// batch_norm_relu: y = max(0, that), the gradient g masked by y > 0 first (g' = g [y > 0]).
// batch_norm_add_relu: y = max(0, that + r); r's gradient is g'.
// Gradients, with g' the (masked) output gradient and sums over a channel's M values:
//   db = sum g',  dw = sum g' xhat,
//   training: dx = w invstd (g' - db / M - xhat dw / M)   (x moves the mean and var too)
//   eval:     dx = w invstd g'
// Statistics in f32 for f16/bf16/f32 x (f64 for f64); y in x's dtype; weight and bias may
// be f32 or x's dtype (their gradients come back in their own dtypes).
//
// The CPU works on a contiguous NCHW copy, channels in parallel, two passes per channel
// (mean, then the centred squares). The CUDA kernels (ops/cuda/batch_norm.cu) work in x's
// memory format: one pass for both statistics (a shifted variance), one to normalise, and
// the same two each way backward; batch_norm_relu applies the relu in the normalising pass
// and its mask in the backward's, so it costs nothing over batch_norm. batch_norm_add_relu reads
// r in the normalising pass, and its backward's statistics pass writes g' (r's gradient), which
// the dx pass then reads instead of g and y. On the GPU batch_norm_relu keeps the bias, not y,
// and its backward passes recompute the mask from x: they read a tensor less each, and y is
// freed with its last other use (a ResNet stem's y, which only a max-pool reads).
#include "ops/batch_norm.h"

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/memory_format.h"
#include "ops/op_cost.h"
#include "ops/param_grad.h"

#if PRECIS_WITH_CUDA
#include "ops/cuda/batch_norm.h"
#endif

namespace precis::ops {

namespace {

struct Arguments {
  Tensor x, weight, bias, running_mean, running_var;
  Tensor residual;             // batch_norm_add_relu's (relu is then true), else undefined
  Tensor num_batches_tracked;  // i64 scalar counted by a training forward, or undefined
  bool training, relu;
  double momentum, eps;
  const char* op;
};

// x seen as [N, C, S]: N samples, C channels of S values each.
struct Extent {
  int64_t N, C, S;
  int64_t M() const { return N * S; }
};

Extent extent_of(const Tensor& x) {
  Extent e{x.size(0), x.size(1), 1};
  for (int64_t d = 2; d < x.dim(); ++d) e.S *= x.size(d);
  return e;
}

DType statistics_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

// What the backward needs.
struct Saved {
  // x and y (the relu's mask) as the kernels read and wrote them: contiguous on the CPU, dense in
  // the memory format on the GPU; weight in the statistics dtype (on the GPU f32 ones where
  // undefined). On the GPU batch_norm_relu keeps the f32 bias instead of y and recomputes the
  // mask from x (ops/cuda/batch_norm.h): y is then freed with its last other use.
  Tensor x, weight, mean, invstd, y, bias;
  MemoryFormat format;
  bool training, residual;  // residual: r's gradient is wanted (batch_norm_add_relu)
};

void check(const Arguments& a) {
  require_defined(a.op, a.x);
  require_floating(a.op, a.x);
  PRECIS_CHECK(a.x.dim() >= 2, a.op, ": input must be [N, C, ...], got ", describe(a.x));
  const int64_t C = a.x.size(1);
  for (const auto& [t, what] : {std::pair{&a.weight, "weight"}, std::pair{&a.bias, "bias"},
                                std::pair{&a.running_mean, "running_mean"}, std::pair{&a.running_var, "running_var"}}) {
    if (!t->defined()) continue;
    require_floating(a.op, *t, what);
    PRECIS_CHECK(t->shape() == Shape{C}, a.op, ": ", what, " must be [", C, "] (the channels of input ", describe(a.x),
                 "), got ", describe(*t));
  }
  if (a.residual.defined())
    PRECIS_CHECK(a.residual.shape() == a.x.shape() && a.residual.dtype() == a.x.dtype(), a.op, ": residual ",
                 describe(a.residual), " and input ", describe(a.x), " must have one shape and dtype");
  if (a.num_batches_tracked.defined())
    PRECIS_CHECK(a.num_batches_tracked.dtype() == DType::i64 && a.num_batches_tracked.numel() == 1 &&
                     a.num_batches_tracked.is_contiguous(),
                 a.op, ": num_batches_tracked must be one int64 count, got ", describe(a.num_batches_tracked));
  PRECIS_CHECK(a.running_mean.defined() == a.running_var.defined(), a.op,
               ": running_mean and running_var go together (give both or neither)");
  PRECIS_CHECK(a.training || a.running_mean.defined(), a.op,
               ": eval mode normalises with the running statistics; give running_mean and running_var");
  PRECIS_CHECK(!a.training || extent_of(a.x).M() > 1, a.op,
               ": training needs more than one value per channel to estimate a variance, got input ", describe(a.x));
  common_device(a.op, {&a.x, &a.residual, &a.weight, &a.bias, &a.running_mean, &a.running_var, &a.num_batches_tracked});
}

// ---- CPU

template <typename T, typename A>
void forward_cpu(const T* x, const T* r, T* y, const A* w, const A* b, A* mean, A* invstd, A* running_mean,
                 A* running_var, const Extent& e, const Arguments& a) {
  const int64_t M = e.M();
#pragma omp parallel for schedule(static) if (e.N * e.C * e.S >= kParallelGrain && e.C > 1)
  for (int64_t c = 0; c < e.C; ++c) {
    auto for_each = [&](auto fn) {
      for (int64_t n = 0; n < e.N; ++n) {
        const int64_t base = (n * e.C + c) * e.S;
        for (int64_t s = 0; s < e.S; ++s) fn(base + s);
      }
    };
    A mu, var;
    if (a.training) {
      // The sums run in f64 whatever A is: a naive f32 sum of M values near 100 drifts by
      // ~M ulp(100 M) and moves the mean by more than the f32 output can tolerate.
      double sum = 0;
      for_each([&](int64_t i) { sum += convert<double>(x[i]); });
      const double mean_exact = sum / static_cast<double>(M);
      double squares_exact = 0;
      for_each([&](int64_t i) {
        const double d = convert<double>(x[i]) - mean_exact;
        squares_exact += d * d;
      });
      mu = static_cast<A>(mean_exact);
      const A squares = static_cast<A>(squares_exact);
      var = squares / static_cast<A>(M);
      if (running_mean) {
        const A m = static_cast<A>(a.momentum);
        running_mean[c] = (A(1) - m) * running_mean[c] + m * mu;
        running_var[c] = (A(1) - m) * running_var[c] + m * squares / static_cast<A>(M - 1);
      }
    } else {
      mu = running_mean[c];
      var = running_var[c];
    }
    const A rs = A(1) / std::sqrt(var + static_cast<A>(a.eps));
    // (x - mean) scale + bias, not x scale + (bias - mean scale): with |mean| >> std the two
    // large terms of the latter cancel (the CUDA kernel computes it the same way).
    const A scale = (w ? w[c] : A(1)) * rs, bias = b ? b[c] : A(0);
    for_each([&](int64_t i) {
      const A v = (convert<A>(x[i]) - mu) * scale + bias + (r ? convert<A>(r[i]) : A(0));
      y[i] = convert<T>(a.relu ? std::max(v, A(0)) : v);
    });
    mean[c] = mu;
    invstd[c] = rs;
  }
}

// dr (batch_norm_add_relu's residual gradient, else null) gets g'.
template <typename T, typename A>
void backward_cpu(const Saved& s, const T* g, const T* y, T* dx, T* dr, A* dw, A* db, const Extent& e) {
  const T* x = s.x.data<T>();
  const A* w = s.weight.defined() ? s.weight.data<A>() : nullptr;
  const A* mean = s.mean.data<A>();
  const A* invstd = s.invstd.data<A>();
  const A M = static_cast<A>(e.M());
#pragma omp parallel for schedule(static) if (e.N * e.C * e.S >= kParallelGrain && e.C > 1)
  for (int64_t c = 0; c < e.C; ++c) {
    auto for_each = [&](auto fn) {
      for (int64_t n = 0; n < e.N; ++n) {
        const int64_t base = (n * e.C + c) * e.S;
        for (int64_t i = base; i < base + e.S; ++i) fn(i);
      }
    };
    // g masked by the relu where there is one
    auto grad = [&](int64_t i) { return y && !(convert<A>(y[i]) > A(0)) ? A(0) : convert<A>(g[i]); };
    const A mu = mean[c], rs = invstd[c];
    A sum_g = 0, sum_g_xhat = 0;
    for_each([&](int64_t i) {
      const A gi = grad(i);
      if (dr) dr[i] = convert<T>(gi);
      sum_g += gi;
      sum_g_xhat += gi * (convert<A>(x[i]) - mu) * rs;
    });
    if (dw) dw[c] = sum_g_xhat;
    if (db) db[c] = sum_g;
    if (!dx) continue;
    const A scale = (w ? w[c] : A(1)) * rs;
    if (s.training) {
      const A mean_g = sum_g / M, mean_g_xhat = sum_g_xhat / M;
      for_each([&](int64_t i) {
        const A xhat = (convert<A>(x[i]) - mu) * rs;
        dx[i] = convert<T>(scale * (grad(i) - mean_g - xhat * mean_g_xhat));
      });
    } else {
      for_each([&](int64_t i) { dx[i] = convert<T>(scale * grad(i)); });
    }
  }
}

template <typename Fn>
void dispatch_statistics(DType dtype, Fn fn) {
  if (dtype == DType::f64)
    fn(double{});
  else
    fn(float{});
}

// The parameter in dtype `A`, dense; undefined stays undefined.
Tensor dense_or_none(const Tensor& t, DType dtype) { return t.defined() ? dense(t, dtype) : Tensor(); }

Tensor forward_cpu(const Arguments& a, Saved& saved) {
  const Extent e = extent_of(a.x);
  const DType stats = statistics_dtype(a.x.dtype());
  const Tensor x = a.x.dim() == 4 ? dense_in(a.x, MemoryFormat::contiguous, a.x.dtype()) : dense(a.x);
  const Tensor r = !a.residual.defined() ? Tensor()
                   : a.x.dim() == 4      ? dense_in(a.residual, MemoryFormat::contiguous, a.x.dtype())
                                         : dense(a.residual);
  Tensor y = empty(x.shape(), x.dtype());
  saved.x = x;
  saved.weight = dense_or_none(a.weight, stats);
  saved.mean = empty({e.C}, stats);
  saved.invstd = empty({e.C}, stats);
  const Tensor bias = dense_or_none(a.bias, stats);
  Tensor running_mean = dense_or_none(a.running_mean, stats), running_var = dense_or_none(a.running_var, stats);
  // the running statistics are written in place: into copies when they are not already dense and of `stats`
  if (running_mean.defined() && a.training) {
    if (running_mean.same(a.running_mean)) running_mean = running_mean.clone();
    if (running_var.same(a.running_var)) running_var = running_var.clone();
  }
  cpu::dispatch_floating(x.dtype(), a.op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_statistics(stats, [&](auto stats_tag) {
      using A = decltype(stats_tag);
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data<A>() : nullptr; };
      forward_cpu<T, A>(x.data<T>(), r.defined() ? r.data<T>() : nullptr, y.data<T>(), ptr(saved.weight), ptr(bias),
                        saved.mean.data<A>(), saved.invstd.data<A>(), ptr(running_mean), ptr(running_var), e, a);
    });
  });
  if (running_mean.defined() && a.training) {
    copy_(a.running_mean, running_mean);
    copy_(a.running_var, running_var);
  }
  if (a.num_batches_tracked.defined() && a.training) ++a.num_batches_tracked.data<int64_t>()[0];
  if (a.relu) saved.y = y.detach();  // the relu's mask
  return a.x.dim() == 4 ? dense_in(y, saved.format, a.x.dtype()) : y;
}

std::vector<Tensor> backward_cpu(const Saved& s, const Tensor& grad, bool want_dx, bool want_dw, bool want_db,
                                 bool want_dr) {
  const Extent e = extent_of(s.x);
  const DType stats = s.mean.dtype();
  const Tensor g = dense(grad, s.x.dtype());  // s.x and s.y are contiguous
  const Tensor& y = s.y;
  Tensor dx = want_dx ? empty(s.x.shape(), s.x.dtype()) : Tensor();
  Tensor dw = want_dw ? empty({e.C}, stats) : Tensor(), db = want_db ? empty({e.C}, stats) : Tensor();
  Tensor dr = want_dr ? empty(s.x.shape(), s.x.dtype()) : Tensor();
  cpu::dispatch_floating(s.x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_statistics(stats, [&](auto stats_tag) {
      using A = decltype(stats_tag);
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      backward_cpu<T, A>(s, g.data<T>(), ptr(y), ptr(dx), ptr(dr), dw.defined() ? dw.data<A>() : nullptr,
                         db.defined() ? db.data<A>() : nullptr, e);
    });
  });
  if (s.x.dim() == 4) {
    if (dx.defined()) dx = dense_in(dx, s.format, s.x.dtype());
    if (dr.defined()) dr = dense_in(dr, s.format, s.x.dtype());
  }
  return {dx, dw, db, dr};
}

// ---- GPU

#if PRECIS_WITH_CUDA
// A [C] f32 parameter for the kernels: t dense in f32, or `fill` everywhere where undefined.
Tensor f32_parameter(const Tensor& t, int64_t C, double fill, Device device) {
  return t.defined() ? dense(t, DType::f32) : full({C}, fill, DType::f32, device);
}

// t dense in the memory format (4-D) or contiguous (other ranks), of `dtype`.
Tensor dense_as(const Tensor& t, MemoryFormat format, DType dtype) {
  return t.dim() == 4 ? dense_in(t, format, dtype) : dense(t, dtype);
}

Tensor forward_cuda(const Arguments& a, Saved& saved) {
  const int64_t C = a.x.size(1);
  const Device device = a.x.device();
  for (const Tensor* r : {&a.running_mean, &a.running_var})
    PRECIS_CHECK(!r->defined() || (r->dtype() == DType::f32 && r->is_contiguous()), a.op,
                 ": on the GPU the running statistics must be dense float32, got ", describe(*r));
  saved.x = dense_as(a.x, saved.format, a.x.dtype());
  Tensor y = a.x.dim() == 4 ? empty_in(a.x.shape(), saved.format, a.x.dtype(), device)
                            : empty(a.x.shape(), a.x.dtype(), device);
  saved.weight = f32_parameter(a.weight, C, 1.0, device);
  saved.mean = empty({C}, DType::f32, device);
  saved.invstd = empty({C}, DType::f32, device);
  const Tensor residual = a.residual.defined() ? dense_as(a.residual, saved.format, a.x.dtype()) : Tensor();
  const Tensor bias = f32_parameter(a.bias, C, 0.0, device);
  cuda::batch_norm_forward({saved.x, residual, y, saved.weight, bias, a.running_mean, a.running_var,
                            a.training ? a.num_batches_tracked : Tensor(), saved.mean, saved.invstd, a.momentum, a.eps,
                            saved.format, a.training, a.relu});
  // The relu's mask: batch_norm_add_relu's needs y (its residual is not kept); batch_norm_relu's
  // is recomputed from x and the bias, which reads a tensor less and lets y go with its last use
  // (a ResNet's stem keeps its pooled output, not y).
  if (a.relu && residual.defined()) saved.y = y.detach();
  if (a.relu && !residual.defined()) saved.bias = bias;
  return y;
}

// dw and db go straight into the parameters' f32 .grad where the engine offers it
// (ops/param_grad.h), else into new f32 tensors that are returned.
std::vector<Tensor> backward_cuda(const Saved& s, const BackwardArgs& g) {
  const int64_t C = s.x.size(1);
  const Device device = s.x.device();
  Tensor dx =
      s.x.dim() == 4 ? empty_in(s.x.shape(), s.format, s.x.dtype(), device) : empty(s.x.shape(), s.x.dtype(), device);
  const ParamGrad dw = param_grad(g, 1, {DType::f32}, {C}, DType::f32, device),
                  db = param_grad(g, 2, {DType::f32}, {C}, DType::f32, device);
  // the kernels write both sums: scratch for one nobody wants
  auto values_or_scratch = [&](const ParamGrad& p) {
    return p.values.defined() ? p.values : empty({C}, DType::f32, device);
  };
  // the residual's gradient g', written by the statistics pass (which the dx pass then reads)
  Tensor dr = !s.residual      ? Tensor()
              : s.x.dim() == 4 ? empty_in(s.x.shape(), s.format, s.x.dtype(), device)
                               : empty(s.x.shape(), s.x.dtype(), device);
  cuda::batch_norm_backward({s.x, s.y, s.bias, dense_as(g.grad(), s.format, s.x.dtype()), s.weight, s.mean, s.invstd,
                             dx, values_or_scratch(dw), values_or_scratch(db), dr, s.format, s.training,
                             dw.destination.accumulate, db.destination.accumulate});
  return {g.needs(0) ? dx : Tensor(), dw.returned(), db.returned(), g.needs(3) ? dr : Tensor()};
}
#endif

Tensor batch_norm_impl(const Arguments& a) {
  check(a);
  OpScope timed(a.op, [&] {
    const int64_t C = a.x.size(1);
    OpWork w = cost::batch_norm(a.x.numel() / std::max<int64_t>(C, 1), C, a.x.dtype(), a.relu);
    if (a.residual.defined()) {  // the add (1 FLOP), r read forward and g' written backward
      const double e = static_cast<double>(a.x.numel()), s = static_cast<double>(element_size(a.x.dtype()));
      w.forward.flops += e;
      w.forward.bytes += e * s;
      w.backward.bytes += e * s;
    }
    return w;
  });
  Saved saved;
  saved.format = a.x.dim() == 4 ? suggest_memory_format(a.x) : MemoryFormat::contiguous;
  saved.training = a.training;
  saved.residual = a.residual.defined();
  Tensor y;
  if (a.x.is_cpu()) {
    y = forward_cpu(a, saved);
  } else {
#if PRECIS_WITH_CUDA
    y = forward_cuda(a, saved);
#endif
  }
  if (autograd::any_requires_grad({&a.x, &a.weight, &a.bias, &a.residual})) {
    autograd::record(a.op, {a.x, a.weight, a.bias, a.residual}, {y},
                     [saved, weight_dtype = a.weight.defined() ? a.weight.dtype() : DType::f32,
                      bias_dtype = a.bias.defined() ? a.bias.dtype() : DType::f32](const BackwardArgs& g) {
                       std::vector<Tensor> grads;
                       if (saved.x.is_cpu()) {
                         grads = backward_cpu(saved, g.grad(), g.needs(0), g.needs(1), g.needs(2), g.needs(3));
                       } else {
#if PRECIS_WITH_CUDA
                         grads = backward_cuda(saved, g);
#endif
                       }
                       if (grads[1].defined()) grads[1] = converted(grads[1], weight_dtype);
                       if (grads[2].defined()) grads[2] = converted(grads[2], bias_dtype);
                       return grads;
                     });
  }
  return y;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps,
                  const Tensor& num_batches_tracked) {
  return batch_norm_impl({x, weight, bias, running_mean, running_var, Tensor(), num_batches_tracked, training, false,
                          momentum, eps, "batch_norm"});
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, bool training, double momentum, double eps,
                       const Tensor& num_batches_tracked) {
  return batch_norm_impl({x, weight, bias, running_mean, running_var, Tensor(), num_batches_tracked, training, true,
                          momentum, eps, "batch_norm_relu"});
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                           const Tensor& running_mean, const Tensor& running_var, bool training, double momentum,
                           double eps, const Tensor& num_batches_tracked) {
  require_defined("batch_norm_add_relu", residual, "residual");
  return batch_norm_impl({x, weight, bias, running_mean, running_var, residual, num_batches_tracked, training, true,
                          momentum, eps, "batch_norm_add_relu"});
}

}  // namespace precis::ops
