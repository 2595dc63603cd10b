#include "core/copy.h"

#include "core/convert.h"
#include "core/half_convert.h"
#include "core/strided_loop.h"

namespace precis {

#if PRECIS_WITH_CUDA
namespace cuda {
// Defined in core/cuda/copy.cu.
void copy_(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& dst, double value);
void accumulate_(const Tensor& dst, const Tensor& src);
}  // namespace cuda
#endif

namespace {

void copy_cpu(const Tensor& dst, const Tensor& src) {
  dispatch_all(dst.dtype(), "copy", [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    dispatch_all(src.dtype(), "copy", [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      D* out = static_cast<D*>(dst.storage()->data());
      const S* in = static_cast<const S*>(src.storage()->data());
      for_each_row<2>(dst.shape(), {dst.strides(), src.strides()}, [&](auto base, int64_t n, auto inner) {
        D* o = out + dst.offset() + base[0];
        const S* s = in + src.offset() + base[1];
        if constexpr (has_convert_n<D, S>) {
          if (inner[0] == 1 && inner[1] == 1) return convert_n(s, o, n);  // f32 <-> f16/bf16, vectorised
        }
        for (int64_t i = 0; i < n; ++i) o[i * inner[0]] = convert<D>(s[i * inner[1]]);
      });
    });
  });
}

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  PRECIS_CHECK(dst.shape() == src.shape(), "copy: destination shape ", dst.shape(), " differs from source shape ",
               src.shape());
  if (dst.is_cpu() && src.is_cpu()) return copy_cpu(dst, src);
#if PRECIS_WITH_CUDA
  cuda::copy_(dst, src);
#else
  PRECIS_FAIL("copy: a CUDA tensor in a build without CUDA");
#endif
}

void fill_(const Tensor& dst, double value) {
  if (!dst.is_cpu()) {
#if PRECIS_WITH_CUDA
    return cuda::fill_(dst, value);
#endif
  }
  dispatch_all(dst.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v = convert<T>(value);
    T* out = static_cast<T*>(dst.storage()->data()) + dst.offset();
    for_each_row<1>(dst.shape(), {dst.strides()}, [&](auto base, int64_t n, auto inner) {
      for (int64_t i = 0; i < n; ++i) out[base[0] + i * inner[0]] = v;
    });
  });
}

void accumulate_(const Tensor& dst, const Tensor& src) {
  PRECIS_CHECK(dst.shape() == src.shape(), "accumulate: gradient shape ", src.shape(), " differs from ", dst.shape());
  if (!dst.is_cpu()) {
#if PRECIS_WITH_CUDA
    return cuda::accumulate_(dst, src);
#endif
  }
  PRECIS_CHECK(src.is_cpu(), "accumulate: source on ", src.device(), ", destination on cpu");
  dispatch_all(dst.dtype(), "accumulate", [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    dispatch_all(src.dtype(), "accumulate", [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      D* out = static_cast<D*>(dst.storage()->data()) + dst.offset();
      const S* in = static_cast<const S*>(src.storage()->data()) + src.offset();
      for_each_row<2>(dst.shape(), {dst.strides(), src.strides()}, [&](auto base, int64_t n, auto inner) {
        for (int64_t i = 0; i < n; ++i) {
          D& o = out[base[0] + i * inner[0]];
          if constexpr (std::is_same_v<D, bool>) {
            o = o || convert<bool>(in[base[1] + i * inner[1]]);
          } else {
            o = convert<D>(convert<double>(o) + convert<double>(in[base[1] + i * inner[1]]));
          }
        }
      });
    });
  });
}

Tensor converted(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : dense(t, dtype); }

Tensor dense(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t;
  Tensor out = empty(t.shape(), dtype, t.device());
  copy_(out, t);
  return out;
}

Tensor dense(const Tensor& t) { return dense(t, t.dtype()); }

}  // namespace precis
