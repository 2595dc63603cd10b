// cross_entropy: log-softmax and negative log-likelihood fused in one pass over each
// row of C logits, then the mean over the rows whose target is not ignore_index:
//   loss_r = lse_r - x_{r, t_r},   lse_r = m_r + log sum_j exp(x_{r,j} - m_r),  m_r = max_j x_{r,j}
//   loss   = sum_r loss_r / n_valid   (nan when every target is ignored, as in PyTorch)
// Gradient: d loss_r / d x_{r,j} = softmax(x_r)_j - [j == t_r] = exp(x_{r,j} - lse_r) - [j == t_r], so
//   dx_{r,j} = g (exp(x_{r,j} - lse_r) - [j == t_r]) / n_valid,  and 0 in ignored rows.
// The forward saves m_r and log_sum_r = lse_r - m_r per row (f32, f64 for f64 logits), so the
// backward is one pass too. They stay apart because m + log_sum rounds log_sum away when m is
// large; (x - m) - log_sum, as PyTorch computes log-softmax, does not.
//
// Targets are checked on the host on the CPU, and on the device by the forward kernel on the
// GPU (ops/cuda/cross_entropy.cu, which also keeps n_valid on the device so that neither
// pass needs it on the host); both raise the same error for the first bad target.
//
// Rows are read in place wherever they lie evenly spaced with unit column stride (a row stride
// ld >= C: a narrowed view, or the real columns of a padded classifier output), so no copy of
// the logits is made. With `classes` < the last dim, the columns past `classes` are padding:
// never read, and the backward writes their gradient (zero) in the same pass as the others, so
// the gradient comes out at the padded width with nothing to scatter.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/autograd.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/nn_functional.h"
#include "ops/op_cost.h"

#if PRECIS_WITH_CUDA
#include "ops/cuda/cross_entropy.h"
#endif

namespace precis::ops {

namespace {

// Per-row losses into `loss` (0 for ignored rows) and (m, log_sum) into the [rows, 2] `stats`.
// logits: [rows, C] with unit column stride, rows strides()[0] apart.
template <typename T>
void cross_entropy_forward(const Tensor& logits, const int64_t* targets, int64_t ignore_index, Tensor& stats,
                           std::vector<double>& loss) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t C = logits.shape().back(), rows = static_cast<int64_t>(loss.size()), ld = logits.strides()[0];
  const T* x = logits.data<T>();
  A* st = stats.data<A>();
#pragma omp parallel for schedule(static) if (rows * C >= kParallelGrain && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = targets[r];
    if (t == ignore_index) {
      st[2 * r] = st[2 * r + 1] = 0;
      loss[r] = 0;
      continue;
    }
    const T* xr = x + r * ld;
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t j = 0; j < C; ++j) m = std::max(m, convert<A>(xr[j]));
    A sum = 0;
    for (int64_t j = 0; j < C; ++j) sum += std::exp(convert<A>(xr[j]) - m);
    const A log_sum = std::log(sum);
    st[2 * r] = m;
    st[2 * r + 1] = log_sum;
    loss[r] = static_cast<double>(m - convert<A>(xr[t])) + static_cast<double>(log_sum);
  }
}

// dx: dense [rows, width], width >= C; its columns past C (padding) get zeros. dx may be the
// logits themselves (rows width apart): each element is read before it is written.
template <typename T>
void cross_entropy_backward(const Tensor& logits, const int64_t* targets, int64_t ignore_index, const Tensor& stats,
                            double scale, Tensor& dx) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t C = logits.shape().back(), rows = stats.numel() / 2, ld = logits.strides()[0];
  const int64_t width = dx.shape().back();
  const T* x = logits.data<T>();
  const A* st = stats.data<A>();
  T* d = dx.data<T>();
  const A s = static_cast<A>(scale);
#pragma omp parallel for schedule(static) if (rows * width >= kParallelGrain && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = targets[r];
    T* dr = d + r * width;
    if (t == ignore_index) {
      for (int64_t j = 0; j < width; ++j) dr[j] = T(0);
      continue;
    }
    const T* xr = x + r * ld;
    const A m = st[2 * r], log_sum = st[2 * r + 1];
    const A x_t = convert<A>(xr[t]);  // read first: dx may be the logits' own memory
    for (int64_t j = 0; j < C; ++j) dr[j] = convert<T>(std::exp((convert<A>(xr[j]) - m) - log_sum) * s);
    for (int64_t j = C; j < width; ++j) dr[j] = T(0);
    dr[t] = convert<T>((std::exp((x_t - m) - log_sum) - A(1)) * s);
  }
}

void check_target(int64_t target, int64_t position, int64_t C, int64_t ignore_index) {
  PRECIS_CHECK(target >= 0 && target < C, "cross_entropy: target ", target, " (at flat index ", position,
               ") is out of range for ", C, " classes; expected a class in [0, ", C - 1, "] or ignore_index (",
               ignore_index, ")");
}

// `t` ([..., C], its first `classes` columns wanted) as [rows, classes] with unit column
// stride, rows evenly spaced: a view when t lies so, else a dense copy. No autograd.
Tensor as_rows(const Tensor& t, int64_t rows, int64_t classes) {
  const int64_t C = t.shape().back();
  bool even = C <= 1 || t.strides().back() == 1;
  int64_t ld = C, next = 0;  // next: the stride the next outer dim of size > 1 must have
  for (int64_t d = t.dim() - 2; d >= 0 && even; --d) {
    if (t.shape()[d] == 1) continue;
    if (next == 0) ld = t.strides()[d];
    even = next == 0 ? ld >= C : t.strides()[d] == next;
    next = t.strides()[d] * t.shape()[d];
  }
  const Tensor source = even ? t.detach() : dense(t, t.dtype()).detach();
  return source.as_strided({rows, classes}, {even ? ld : C, 1}, source.offset());
}

// What the backward needs: the logits' real columns in their dtype ([rows, classes], row
// stride >= classes), the targets, the per-row (m, log_sum), and the number of rows not
// ignored (on the host for the CPU, as an i64 scalar on the device for the GPU).
struct Saved {
  Tensor logits, targets, stats;
  Shape grad_shape;  // the logits argument's shape: the gradient's, padding included
  int64_t ignore_index = 0;
  int64_t n_valid = 0;
  Tensor valid_count;
};

Tensor cross_entropy_forward_cpu(Saved& s) {
  const int64_t rows = s.targets.numel(), C = s.logits.shape().back();
  const int64_t* t = s.targets.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == s.ignore_index) continue;
    check_target(t[r], r, C, s.ignore_index);
    ++s.n_valid;
  }
  std::vector<double> loss(rows);
  cpu::dispatch_floating(s.logits.dtype(), "cross_entropy", [&](auto tag) {
    cross_entropy_forward<typename decltype(tag)::type>(s.logits, t, s.ignore_index, s.stats, loss);
  });
  double total = 0;
  for (double l : loss) total += l;  // in row order: the same result on any number of threads
  return scalar_tensor(total / static_cast<double>(s.n_valid), s.stats.dtype());
}

Tensor cross_entropy_backward_cpu(const Saved& s, const Tensor& grad) {
  const int64_t rows = s.logits.shape()[0];
  Tensor dx = empty({rows, s.grad_shape.back()}, s.logits.dtype());
  const double scale = grad.item<double>() / static_cast<double>(s.n_valid);
  cpu::dispatch_floating(s.logits.dtype(), "cross_entropy", [&](auto tag) {
    cross_entropy_backward<typename decltype(tag)::type>(s.logits, s.targets.data<int64_t>(), s.ignore_index, s.stats,
                                                         scale, dx);
  });
  return dx.view(s.grad_shape);
}

#if PRECIS_WITH_CUDA
Tensor cross_entropy_forward_cuda(Saved& s) {
  const Device device = s.logits.device();
  Tensor out = empty({}, s.stats.dtype(), device);
  s.valid_count = empty({}, DType::i64, device);
  const cuda::BadIndex bad =
      cuda::cross_entropy_forward(s.logits, s.targets, s.ignore_index, s.stats, out, s.valid_count);
  if (bad.position >= 0) check_target(bad.value, bad.position, s.logits.shape().back(), s.ignore_index);
  return out;
}

Tensor cross_entropy_backward_cuda(const Saved& s, const Tensor& grad) {
  Tensor dx = empty({s.logits.shape()[0], s.grad_shape.back()}, s.logits.dtype(), s.logits.device());
  cuda::cross_entropy_backward(s.logits, s.targets, s.ignore_index, s.stats, s.valid_count,
                               dense(grad, s.stats.dtype()), dx);
  return dx.view(s.grad_shape);
}
#endif

// The checks both entry points make, and what the passes need: the logits' real columns as
// rows, the targets as the kernels read them, the per-row statistics to fill.
Saved prepare(const char* op, const Tensor& logits_in, const Tensor& targets_in, int64_t ignore_index,
              int64_t classes) {
  require_defined(op, logits_in, "logits");
  require_defined(op, targets_in, "targets");
  const Device device = common_device(op, {&logits_in, &targets_in});
  require_floating(op, logits_in, "logits");
  PRECIS_CHECK(targets_in.dtype() == DType::i32 || targets_in.dtype() == DType::i64, op,
               ": targets must be an int32 or int64 tensor of class indices, got ", describe(targets_in));
  PRECIS_CHECK(logits_in.dim() >= 1, op, ": logits must have a class dim (the last), got ", describe(logits_in));
  const Shape rows_shape(logits_in.shape().begin(), logits_in.shape().end() - 1);
  PRECIS_CHECK(targets_in.shape() == rows_shape, op, ": targets ", targets_in.shape(),
               " must have the shape of logits ", logits_in.shape(), " without the class dim, ", rows_shape);
  const int64_t rows = shape_numel(rows_shape), width = logits_in.shape().back();
  if (classes < 0) classes = width;
  PRECIS_CHECK(classes <= width, op, ": ", classes, " classes do not fit logits ", logits_in.shape(),
               " (the classes are the first columns of the last dim)");
  Saved saved;
  saved.logits = as_rows(logits_in, rows, classes);
  saved.grad_shape = logits_in.shape();
  saved.stats = empty({rows, 2}, logits_in.dtype() == DType::f64 ? DType::f64 : DType::f32, device);
  saved.ignore_index = ignore_index;
  // The CPU kernels read i64 targets; the GPU kernels read i32 or i64 as they are.
  saved.targets = dense(targets_in, device.is_cpu() ? DType::i64 : targets_in.dtype());
  return saved;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in, int64_t ignore_index, int64_t classes) {
  Saved saved = prepare("cross_entropy", logits_in, targets_in, ignore_index, classes);
  OpScope timed("cross_entropy", [&] {
    return cost::cross_entropy(saved.logits.size(0), classes > 0 ? classes : saved.logits.size(1), saved.logits.dtype(),
                               false);
  });
  Tensor out;
  if (saved.logits.is_cpu()) {
    out = cross_entropy_forward_cpu(saved);
  } else {
#if PRECIS_WITH_CUDA
    out = cross_entropy_forward_cuda(saved);
#endif
  }

  if (autograd::any_requires_grad({&logits_in})) {
    autograd::record("cross_entropy", {logits_in}, {out}, [saved](const BackwardArgs& g) {
      Tensor dx;
      if (saved.logits.is_cpu()) {
        dx = cross_entropy_backward_cpu(saved, g.grad());
      } else {
#if PRECIS_WITH_CUDA
        dx = cross_entropy_backward_cuda(saved, g.grad());
#endif
      }
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

LossAndGradient cross_entropy_with_grad(const Tensor& logits_in, const Tensor& targets_in, const Tensor& grad_factor,
                                        int64_t ignore_index, int64_t classes, bool overwrite_logits) {
  const char* op = "cross_entropy_with_grad";
  Saved saved = prepare(op, logits_in, targets_in, ignore_index, classes);
  OpScope timed(op, [&] {
    return cost::cross_entropy(saved.logits.size(0), classes > 0 ? classes : saved.logits.size(1), saved.logits.dtype(),
                               true);
  });
  require_defined(op, grad_factor, "grad_factor");
  const Device device = saved.logits.device();
  PRECIS_CHECK(grad_factor.numel() == 1 && grad_factor.device() == device, op,
               ": grad_factor must be a scalar on the logits' device (", device, "), got ", describe(grad_factor));
  PRECIS_CHECK(!overwrite_logits || logits_in.is_contiguous(), op,
               ": overwrite_logits needs dense logits to write the gradient over, got ", describe(logits_in),
               "; pass overwrite_logits = false for a separate gradient tensor");
  const int64_t rows = saved.logits.shape()[0], width = saved.grad_shape.back();
  // The gradient as dense rows of the padded width: over the logits, or new memory.
  const Tensor dx =
      overwrite_logits ? logits_in.detach().view({rows, width}) : empty({rows, width}, logits_in.dtype(), device);
  LossAndGradient out;
  if (device.is_cpu()) {
    out.loss = cross_entropy_forward_cpu(saved);
    Tensor dx_rows = dx;
    const double scale = grad_factor.item<double>() / static_cast<double>(saved.n_valid);
    cpu::dispatch_floating(saved.logits.dtype(), op, [&](auto tag) {
      cross_entropy_backward<typename decltype(tag)::type>(saved.logits, saved.targets.data<int64_t>(), ignore_index,
                                                           saved.stats, scale, dx_rows);
    });
  } else {
#if PRECIS_WITH_CUDA
    out.loss = empty({}, saved.stats.dtype(), device);
    const cuda::BadIndex bad = cuda::cross_entropy_with_grad(saved.logits, saved.targets, ignore_index,
                                                             dense(grad_factor, saved.stats.dtype()), out.loss, dx);
    if (bad.position >= 0) check_target(bad.value, bad.position, saved.logits.shape().back(), ignore_index);
#endif
  }
  out.grad = dx.view(saved.grad_shape);
  return out;
}

}  // namespace precis::ops
