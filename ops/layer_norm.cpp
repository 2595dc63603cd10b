// layer_norm over the last dim, C values per row:
//   mean = sum x / C,  var = sum (x - mean)^2 / C (biased),  rstd = 1 / sqrt(var + eps)
//   xhat = (x - mean) rstd,  y = xhat w + b
// Gradients, with g the output gradient and dxhat = g w:
//   db = sum over rows of g,  dw = sum over rows of g xhat
//   dx_j = rstd (dxhat_j - mean(dxhat) - xhat_j mean(dxhat xhat))
// The last because d xhat_i / d x_j = rstd (δ_ij - 1/C - xhat_i xhat_j / C): x_j moves xhat_i
// directly, through the mean (d mean/d x_j = 1/C) and through rstd
// (d rstd/d x_j = -rstd^3 (x_j - mean) / C); then sum over i against dxhat_i.
//
// On the CPU, forward and backward are each one pass per row (rows in parallel). The forward
// saves mean and rstd per row in f32 (f64 for f64 inputs). dw and db are summed per thread and
// the partial sums added in thread order, so a run with the same threads is bit-exact.
// The CUDA kernels (ops/cuda/layer_norm.cu) save the same statistics and are deterministic too.
//
// On the GPU, dw and db are written into the parameters' .grad where the engine offers them
// (f32: the flat gradient buffer; core/autograd.h, take_grad_destination), not returned.
//
// add_layer_norm: s = x + r + rb, y = layer_norm(s), as a transformer block's residual add
// followed by its next norm (rb: the bias of the product that made the branch r, [C] added to
// every row, or none). s is used twice downstream (the residual stream, and y), so
//   ds = g_s + (layer_norm's dx from g_y),  dx = dr = ds  (each in its input's dtype),
//   drb = sum over rows of ds.
// On the GPU one kernel does the add and the norm, and one the backward with that sum, r's
// gradient in r's dtype and drb as a third column sum beside dw and db (so the product that
// leaves its bias here needs no bias-gradient pass of its own); on the CPU it is the
// composition of add and layer_norm.
#include <omp.h>

#include <cmath>
#include <optional>
#include <type_traits>
#include <vector>

#include "core/autograd.h"
#include "ops/autocast.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/elementwise.h"
#include "ops/nn_functional.h"
#include "ops/op_cost.h"
#include "ops/param_grad.h"
#include "ops/reduce.h"

#if PRECIS_WITH_CUDA
#include "ops/cuda/layer_norm.h"
#endif

namespace precis::ops {

namespace {

// The parameter as `C` values in `dtype` (f32 or f64) on `device`, or `fill` everywhere when undefined.
Tensor parameter_or(const Tensor& p, int64_t C, DType dtype, double fill, Device device) {
  return p.defined() ? dense(p, dtype) : full({C}, fill, dtype, device);
}

// The weight and bias as the GPU kernels read them: as given (dense) where both are in x's
// f16/bf16 dtype, and so is r's bias where there is one (a policy with f16/bf16 parameters:
// the kernels widen them as they read, so no pass casts three vectors per norm), else as
// parameter_or makes them, in the statistics dtype.
bool gpu_reads_as_given(DType x_dtype, const Tensor& weight, const Tensor& bias, const Tensor& residual_bias = {}) {
  return (x_dtype == DType::f16 || x_dtype == DType::bf16) && weight.defined() && bias.defined() &&
         weight.dtype() == x_dtype && bias.dtype() == x_dtype &&
         (!residual_bias.defined() || residual_bias.dtype() == x_dtype);
}

struct Saved {
  Tensor x, weight, mean, rstd;  // x dense; weight [C] in the statistics dtype (on the GPU perhaps in x's: above)
};

// The sum of value(j) over j < n, in kLanes interleaved partial sums added together at the
// end. One running sum is a chain of dependent adds (one value per add's latency) that the
// compiler may not reorder; independent lanes vectorise. A row's statistics are sums of C
// values, so this sets the per-row cost of both passes.
template <typename A, typename Value>
[[gnu::always_inline]] inline A lane_sum(int64_t n, Value value) {
  constexpr int64_t kLanes = 8;
  A lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += value(j + l);
  for (int64_t l = 0; j < n; ++j, ++l) lanes[l] += value(j);
  A total = 0;
  for (const A lane : lanes) total += lane;
  return total;
}

template <typename T>
void layer_norm_forward(const Saved& s, const Tensor& bias, double eps, Tensor& y) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t C = s.x.shape().back(), rows = C == 0 ? 0 : s.x.numel() / C;
  const T* x = s.x.data<T>();
  const A* w = s.weight.data<A>();
  const A* b = bias.data<A>();
  A* mean = s.mean.data<A>();
  A* rstd = s.rstd.data<A>();
  T* out = y.data<T>();
#pragma omp parallel for schedule(static) if (rows * C >= kParallelGrain && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;
    T* yr = out + r * C;
    const A mu = lane_sum<A>(C, [&](int64_t j) { return convert<A>(xr[j]); }) / static_cast<A>(C);
    const A squares = lane_sum<A>(C, [&](int64_t j) {
      const A d = convert<A>(xr[j]) - mu;
      return d * d;
    });
    const A rs = A(1) / std::sqrt(squares / static_cast<A>(C) + static_cast<A>(eps));
    for (int64_t j = 0; j < C; ++j) yr[j] = convert<T>((convert<A>(xr[j]) - mu) * rs * w[j] + b[j]);
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// dx (when wanted) into `dx`; dw and db (when wanted) into the [C] tensors `dw`, `db`.
template <typename T>
void layer_norm_backward(const Saved& s, const Tensor& grad, Tensor* dx, Tensor* dw, Tensor* db) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t C = s.x.shape().back(), rows = C == 0 ? 0 : s.x.numel() / C;
  const T* x = s.x.data<T>();
  const T* g = grad.data<T>();
  const A* w = s.weight.data<A>();
  const A* mean = s.mean.data<A>();
  const A* rstd = s.rstd.data<A>();
  T* dxp = dx ? dx->data<T>() : nullptr;
  const bool parallel = rows * C >= kParallelGrain && rows > 1;
  const int threads = parallel ? omp_get_max_threads() : 1;
  std::vector<A> dw_partial(dw ? threads * C : 0, A(0)), db_partial(db ? threads * C : 0, A(0));
#pragma omp parallel if (parallel)
  {
    const int64_t t = omp_get_thread_num();
    A* dw_t = dw ? dw_partial.data() + t * C : nullptr;
    A* db_t = db ? db_partial.data() + t * C : nullptr;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * C;
      const T* gr = g + r * C;
      const A mu = mean[r], rs = rstd[r];
      const A sum_dxhat = lane_sum<A>(C, [&](int64_t j) { return convert<A>(gr[j]) * w[j]; });
      const A sum_dxhat_xhat =
          lane_sum<A>(C, [&](int64_t j) { return convert<A>(gr[j]) * w[j] * ((convert<A>(xr[j]) - mu) * rs); });
      if (dw_t)
        for (int64_t j = 0; j < C; ++j) dw_t[j] += convert<A>(gr[j]) * (convert<A>(xr[j]) - mu) * rs;
      if (db_t)
        for (int64_t j = 0; j < C; ++j) db_t[j] += convert<A>(gr[j]);
      if (dxp) {
        const A mean_dxhat = sum_dxhat / static_cast<A>(C), mean_dxhat_xhat = sum_dxhat_xhat / static_cast<A>(C);
        T* dr = dxp + r * C;
        for (int64_t j = 0; j < C; ++j) {
          const A xhat = (convert<A>(xr[j]) - mu) * rs;
          dr[j] = convert<T>(rs * (convert<A>(gr[j]) * w[j] - mean_dxhat - xhat * mean_dxhat_xhat));
        }
      }
    }
  }
  auto reduce_partials = [&](const std::vector<A>& partial, Tensor* out) {
    A* o = out->data<A>();
    for (int64_t j = 0; j < C; ++j) {
      A total = 0;
      for (int t = 0; t < threads; ++t) total += partial[t * C + j];
      o[j] = total;
    }
  };
  if (dw) reduce_partials(dw_partial, dw);
  if (db) reduce_partials(db_partial, db);
}

// A parameter gradient of C values in the statistics dtype (ops/param_grad.h), or written into
// a .grad of x's dtype `narrow` (a 16-bit parameter's 16-bit gradient: the kernel rounds its
// f32 sum once, added to what the .grad holds where it adds).
ParamGrad param_grad(const BackwardArgs& g, size_t input, int64_t C, DType stats, DType narrow, Device device) {
  return ops::param_grad(g, input, {stats, narrow}, {C}, stats, device);
}

// {dx, dweight, dbias}, each undefined where not needed (or written into .grad), dweight and dbias
// in the parameters' dtypes; y_dtype is the output's (and so its gradient's) dtype.
std::vector<Tensor> layer_norm_grads(const Saved& s, const BackwardArgs& g, DType y_dtype, DType weight_dtype,
                                     DType bias_dtype) {
  const int64_t C = s.x.shape().back();
  const DType stats = s.mean.dtype();
  Tensor dx;
  const Device device = s.x.device();
  if (g.needs(0)) dx = empty(s.x.shape(), s.x.dtype(), device);
  const Tensor grad = dense(g.grad(), y_dtype);
  const ParamGrad dw = param_grad(g, 1, C, stats, s.x.dtype(), device),
                  db = param_grad(g, 2, C, stats, s.x.dtype(), device);
  if (device.is_cpu()) {
    Tensor dw_values = dw.values, db_values = db.values;
    cpu::dispatch_floating(s.x.dtype(), "layer_norm", [&](auto tag) {
      layer_norm_backward<typename decltype(tag)::type>(s, grad, dx.defined() ? &dx : nullptr,
                                                        dw_values.defined() ? &dw_values : nullptr,
                                                        db_values.defined() ? &db_values : nullptr);
    });
  } else {
#if PRECIS_WITH_CUDA
    cuda::layer_norm_backward(s.x, grad, s.weight, s.mean, s.rstd, dx, dw.values, db.values, Tensor(), Tensor(),
                              dw.destination.accumulate, db.destination.accumulate);
#endif
  }
  return {dx, dw.returned_as(weight_dtype), db.returned_as(bias_dtype)};
}

// Checks the input (floating, at least 1 dim) and weight and bias ([C] or undefined); returns C.
int64_t check_arguments(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  require_floating(op, x);
  PRECIS_CHECK(x.dim() >= 1, op, ": input must have at least 1 dim (the normalised one), got ", describe(x));
  const int64_t C = x.shape().back();
  for (const auto& [p, what] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!p->defined()) continue;
    require_floating(op, *p, what);
    PRECIS_CHECK(p->shape() == Shape{C}, op, ": ", what, " must be [", C, "] (the last dim of input ", describe(x),
                 "), got ", describe(*p));
  }
  return C;
}

DType statistics_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

bool is_half(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

// The CUDA kernels store y in x's dtype, in f32 beside f16/bf16 x, or in f16/bf16 beside
// f32 x; elsewhere (and on the CPU) y is computed in x's dtype and cast.
bool kernel_stores(Device device, DType x, DType y) {
  return device.is_cuda() && (y == x || (is_half(x) && y == DType::f32) || (x == DType::f32 && is_half(y)));
}

#if PRECIS_WITH_CUDA
// The kernels read an f16/bf16 residual beside an f32 sum; other mixes are cast to the sum's dtype first.
bool kernel_reads_residual(DType sum, DType residual) {
  return residual == sum || (sum == DType::f32 && is_half(residual));
}

// add_layer_norm on the GPU: `wide` is the operand in the sum's dtype, `narrow` the other
// (wide_index says which of x and r `wide` is, for the gradients' order).
AddLayerNorm add_layer_norm_cuda(const char* op, Tensor wide, Tensor narrow, int wide_index, const Tensor& weight,
                                 const Tensor& bias, double eps, std::optional<DType> out_dtype,
                                 const Tensor& residual_bias) {
  const DType S = promote_types(wide.dtype(), narrow.dtype());
  if (wide.dtype() != S) wide = wide.to(S);
  if (!kernel_reads_residual(S, narrow.dtype())) narrow = narrow.to(S);
  const int64_t C = check_arguments(op, wide, weight, bias);
  // autocast: the norm runs in f32, and its result is in f32 unless the caller asks for a dtype.
  const DType stats = statistics_dtype(S), wanted = out_dtype.value_or(autocast::fp32_dtype(S));
  const DType y_dtype = kernel_stores(wide.device(), S, wanted) ? wanted : autocast::fp32_dtype(S);
  const Device device = wide.device();
  Shape row_shape(wide.shape().begin(), wide.shape().end() - 1);
  Tensor sum = empty(wide.shape(), S, device), y = empty(wide.shape(), y_dtype, device);
  // The saved sum is a detached alias of the output, so the node holds no reference to itself.
  const DType params = gpu_reads_as_given(S, weight, bias, residual_bias) ? S : stats;
  Saved saved{sum.detach(), parameter_or(weight, C, params, 1.0, device), empty(row_shape, stats, device),
              empty(row_shape, stats, device)};
  cuda::layer_norm_forward(dense(wide, S), saved.weight, parameter_or(bias, C, params, 0.0, device), eps, y, saved.mean,
                           saved.rstd, dense(narrow, narrow.dtype()), saved.x,
                           residual_bias.defined() ? dense(residual_bias, params) : Tensor());
  const Tensor x = wide_index == 0 ? wide : narrow, r = wide_index == 0 ? narrow : wide;
  if (autograd::any_requires_grad({&x, &r, &weight, &bias, &residual_bias})) {
    autograd::record(
        op, {x, r, weight, bias, residual_bias}, {sum, y},
        [saved, wide_index, narrow_dtype = narrow.dtype(), y_dtype,
         weight_dtype = weight.defined() ? weight.dtype() : stats, bias_dtype = bias.defined() ? bias.dtype() : stats,
         residual_bias_dtype = residual_bias.defined() ? residual_bias.dtype() : stats](const BackwardArgs& g) {
          const DType S = saved.x.dtype();
          const int narrow_index = 1 - wide_index;
          const bool split = narrow_dtype != S;  // the narrow operand's gradient in its own dtype
          const Tensor g_sum = g.grad(0).defined() ? dense(g.grad(0), S) : Tensor();
          const Device device = saved.x.device();
          const int64_t C = saved.x.shape().back();
          const DType stats = saved.mean.dtype();
          std::vector<Tensor> grads(5);
          if (!g.grad(1).defined()) {  // only the sum's gradient flowed: it is each operand's
            if (g_sum.defined() && g.needs(wide_index)) grads[wide_index] = g_sum;
            if (g_sum.defined() && g.needs(narrow_index)) grads[narrow_index] = g_sum.to(narrow_dtype);
            if (g_sum.defined() && g.needs(4))  // rb's: its column sums, in the statistics dtype
              grads[4] = converted(sum_to_shape(dense(g_sum, stats), Shape{C}), residual_bias_dtype);
            return grads;
          }
          Tensor ds, dr;
          if (g.needs(wide_index) || (g.needs(narrow_index) && !split)) ds = empty(saved.x.shape(), S, device);
          if (g.needs(narrow_index) && split) dr = empty(saved.x.shape(), narrow_dtype, device);
          const Tensor g_y = dense(g.grad(1), y_dtype);
          const ParamGrad dw = param_grad(g, 2, C, stats, S, device), db = param_grad(g, 3, C, stats, S, device),
                          drb = param_grad(g, 4, C, stats, S, device);
          cuda::layer_norm_backward(saved.x, g_y, saved.weight, saved.mean, saved.rstd, ds, dw.values, db.values, g_sum,
                                    dr, dw.destination.accumulate, db.destination.accumulate, drb.values,
                                    drb.destination.accumulate);
          if (g.needs(wide_index)) grads[wide_index] = ds;
          if (g.needs(narrow_index)) grads[narrow_index] = split ? dr : ds;
          grads[2] = dw.returned_as(weight_dtype);
          grads[3] = db.returned_as(bias_dtype);
          grads[4] = drb.returned_as(residual_bias_dtype);
          return grads;
        });
  }
  return {sum, y.dtype() == wanted ? y : y.to(wanted)};
}
#endif

}  // namespace

Tensor layer_norm(const Tensor& x_arg, const Tensor& weight, const Tensor& bias, double eps,
                  std::optional<DType> out_dtype) {
  const Tensor x_in = autocast::to_fp32(x_arg);  // autocast: layer norm runs in f32
  const char* op = "layer_norm";
  require_defined(op, x_in);
  const Device device = common_device(op, {&x_in, &weight, &bias});
  const int64_t C = check_arguments(op, x_in, weight, bias);
  OpScope timed(op, [&] {
    return cost::layer_norm(x_in.numel() / std::max<int64_t>(C, 1), C, x_in.dtype(), out_dtype.value_or(x_in.dtype()));
  });
  const DType stats = statistics_dtype(x_in.dtype());
  Shape row_shape(x_in.shape().begin(), x_in.shape().end() - 1);
  const DType params = device.is_cuda() && gpu_reads_as_given(x_in.dtype(), weight, bias) ? x_in.dtype() : stats;
  Saved saved{dense(x_in, x_in.dtype()), parameter_or(weight, C, params, 1.0, device), empty(row_shape, stats, device),
              empty(row_shape, stats, device)};
  const Tensor bias_values = parameter_or(bias, C, params, 0.0, device);
  const DType wanted = out_dtype.value_or(x_in.dtype());
  Tensor y = empty(x_in.shape(), kernel_stores(device, x_in.dtype(), wanted) ? wanted : x_in.dtype(), device);
  if (device.is_cpu()) {
    cpu::dispatch_floating(x_in.dtype(), op, [&](auto tag) {
      layer_norm_forward<typename decltype(tag)::type>(saved, bias_values, eps, y);
    });
  } else {
#if PRECIS_WITH_CUDA
    cuda::layer_norm_forward(saved.x, saved.weight, bias_values, eps, y, saved.mean, saved.rstd);
#endif
  }
  if (autograd::any_requires_grad({&x_in, &weight, &bias})) {
    autograd::record(op, {x_in, weight, bias}, {y},
                     [saved, y_dtype = y.dtype(), weight_dtype = weight.defined() ? weight.dtype() : stats,
                      bias_dtype = bias.defined() ? bias.dtype() : stats](const BackwardArgs& g) {
                       return layer_norm_grads(saved, g, y_dtype, weight_dtype, bias_dtype);
                     });
  }
  return y.dtype() == wanted ? y : y.to(wanted);
}

AddLayerNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                            double eps, std::optional<DType> out_dtype, const Tensor& residual_bias) {
  const char* op = "add_layer_norm";
  require_defined(op, x, "input");
  require_defined(op, residual, "residual");
  [[maybe_unused]] const Device device = common_device(op, {&x, &residual, &weight, &bias, &residual_bias});
  require_floating(op, x, "input");
  require_floating(op, residual, "residual");
  PRECIS_CHECK(x.shape() == residual.shape(), op, ": input ", describe(x), " and residual ", describe(residual),
               " must have one shape");
  if (residual_bias.defined()) {
    require_floating(op, residual_bias, "residual_bias");
    PRECIS_CHECK(x.dim() >= 1 && residual_bias.shape() == Shape{x.shape().back()}, op, ": residual_bias must be [",
                 x.dim() >= 1 ? x.shape().back() : 0, "] (the last dim of input ", describe(x), "), got ",
                 describe(residual_bias));
  }
  OpScope timed(op, [&] {
    const int64_t C = x.dim() >= 1 ? x.shape().back() : 1;
    const DType sum = promote_types(x.dtype(), residual.dtype());
    return cost::add_layer_norm(x.numel() / std::max<int64_t>(C, 1), C, sum, out_dtype.value_or(sum));
  });
#if PRECIS_WITH_CUDA
  if (device.is_cuda()) {
    const bool x_wide = promote_types(x.dtype(), residual.dtype()) == x.dtype();
    return x_wide ? add_layer_norm_cuda(op, x, residual, 0, weight, bias, eps, out_dtype, residual_bias)
                  : add_layer_norm_cuda(op, residual, x, 1, weight, bias, eps, out_dtype, residual_bias);
  }
#endif
  Tensor sum = x + residual;
  if (residual_bias.defined()) sum = sum + residual_bias.to(sum.dtype());  // in the sum's dtype, as on the GPU
  return {sum, layer_norm(sum, weight, bias, eps, out_dtype)};
}

}  // namespace precis::ops
