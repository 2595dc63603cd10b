// Dropout from Philox numbers (core/philox.h), so that a CUDA kernel given the
// same generator state draws the same mask.
//
// Element i (row-major) of a draw starting at `offset` is kept iff
// uniform(word i) >= p; kept elements are scaled by 1/(1-p), so the expected
// output equals x. Backward: y = x * m / (1-p) with m fixed, so dx = g * m / (1-p),
// the same mask and scale (the mask is saved as a bool tensor).
#include "ops/cuda/dropout.h"

#include "core/autograd.h"
#include "core/philox.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/elementwise.h"

namespace precis::ops {

namespace {

// A contiguous bool tensor of `shape`: element i is uniform(philox_word(seed, offset, i)) >= p.
// One Philox block gives the words of four consecutive elements.
Tensor keep_mask(const Shape& shape, double p, uint64_t seed, uint64_t offset) {
  Tensor mask = empty(shape, DType::boolean);
  bool* m = mask.data<bool>();
  const int64_t n = mask.numel(), blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t block = 0; block < blocks; ++block) {
    Philox4 words = philox4x32(offset + static_cast<uint64_t>(block), 0, seed);
    for (int64_t k = 0; k < 4 && block * 4 + k < n; ++k)
      m[block * 4 + k] = static_cast<double>(uniform_from_bits(words.x[k])) >= p;
  }
  return mask;
}

// out[i] = mask[i] ? t[i] * scale : 0, in t's dtype (f16/bf16 computed in f32).
Tensor apply_mask(const Tensor& t, const Tensor& mask, double scale) {
#if PRECIS_WITH_CUDA
  if (t.is_cuda()) return cuda::apply_dropout_mask(t, mask, scale);
#endif
  Tensor out = empty(t.shape(), t.dtype());
  cpu::dispatch_floating(t.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_type_t<T>;
    const C s = static_cast<C>(scale);
    const T* tp = static_cast<const T*>(t.storage()->data()) + t.offset();
    const bool* mp = mask.data<bool>();
    T* o = out.data<T>();
    for_each_row<3>(t.shape(), {out.strides(), t.strides(), mask.strides()}, [&](auto base, int64_t n, auto inner) {
      T* oo = o + base[0];
      const T* tt = tp + base[1];
      const bool* mm = mp + base[2];
      for (int64_t i = 0; i < n; ++i) oo[i] = mm[i] ? convert<T>(convert<C>(tt[i * inner[1]]) * s) : convert<T>(C(0));
    });
  });
  return out;
}

// (out, mask) on x's device: one fused CUDA kernel, or the CPU's mask and then its application.
std::pair<Tensor, Tensor> drop(const Tensor& x, double p, double scale, uint64_t seed, uint64_t offset) {
#if PRECIS_WITH_CUDA
  if (x.is_cuda()) return cuda::dropout(x, p, scale, seed, offset);
#endif
  Tensor mask = keep_mask(x.shape(), p, seed, offset);
  return {apply_mask(x, mask, scale), mask};
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  require_defined("dropout", x);
  require_floating("dropout", x);
  PRECIS_CHECK(p >= 0.0 && p <= 1.0, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  Generator& g = gen ? *gen : default_generator();
  const uint64_t offset = g.reserve(static_cast<uint64_t>(x.numel()));
  // p == 1 keeps nothing, and its scale 1/(1-p) would be inf: it is never applied.
  const double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  std::pair<Tensor, Tensor> dropped = drop(x, p, scale, g.seed(), offset);
  Tensor out = dropped.first, mask = dropped.second;
  autograd::record("dropout", {x}, {out}, [mask, scale](const BackwardArgs& grads) {
    return std::vector<Tensor>{apply_mask(grads.grad(), mask, scale)};
  });
  return out;
}

}  // namespace precis::ops
