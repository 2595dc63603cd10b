// The windows of the pooling ops (ops/pool.cpp), shared by the CPU loops and the CUDA
// kernels (ops/cuda/pool.cu) so both read the same cells in the same order.
//
// Fixed windows (max_pool2d, avg_pool2d): output row oh covers padded rows
// [oh sh - ph, oh sh - ph + kh), clipped to x's rows (padding is never read: max ignores it,
// and avg divides by kh kw whatever it covers, count_include_pad). Adaptive windows
// (adaptive_avg_pool2d): output row oh covers [floor(oh H / OH), ceil((oh + 1) H / OH)).
// Columns alike. The GPU backward gathers: an input row ih belongs to the windows of the output
// rows out_row_begin(ih) <= oh < out_row_end(ih) (for adaptive windows, a superset to test).
// The index type I is int64_t on the host (PoolWindows); the CUDA kernels take an int32_t copy
// (narrowed), whose products of sizes fit in 32 bits for any tensor cut below 2^31 elements.
#pragma once

#include <cstdint>

#include "core/philox.h"  // PRECIS_HOST_DEVICE

namespace precis::ops {

template <typename I>
struct BasicPoolWindows {
  I N, C, H, W, OH, OW;
  I kH, kW, sH, sW, pH, pW;  // fixed windows
  bool adaptive;

  // The same windows in index type J (the caller checks that the sizes fit).
  template <typename J>
  BasicPoolWindows<J> narrowed() const {
    return {J(N), J(C), J(H), J(W), J(OH), J(OW), J(kH), J(kW), J(sH), J(sW), J(pH), J(pW), adaptive};
  }

  PRECIS_HOST_DEVICE I row_begin(I oh) const { return adaptive ? oh * H / OH : clip(oh * sH - pH, H); }
  PRECIS_HOST_DEVICE I row_end(I oh) const {
    return adaptive ? ((oh + 1) * H + OH - 1) / OH : clip(oh * sH - pH + kH, H);
  }
  PRECIS_HOST_DEVICE I col_begin(I ow) const { return adaptive ? ow * W / OW : clip(ow * sW - pW, W); }
  PRECIS_HOST_DEVICE I col_end(I ow) const {
    return adaptive ? ((ow + 1) * W + OW - 1) / OW : clip(ow * sW - pW + kW, W);
  }
  PRECIS_HOST_DEVICE I out_row_begin(I ih) const {
    return adaptive ? ih * OH / H : (ih + pH < kH ? 0 : (ih + pH - kH) / sH + 1);
  }
  PRECIS_HOST_DEVICE I out_row_end(I ih) const {
    const I end = adaptive ? ((ih + 1) * OH + H - 1) / H : (ih + pH) / sH + 1;
    return end < OH ? end : OH;
  }
  PRECIS_HOST_DEVICE I out_col_begin(I iw) const {
    return adaptive ? iw * OW / W : (iw + pW < kW ? 0 : (iw + pW - kW) / sW + 1);
  }
  PRECIS_HOST_DEVICE I out_col_end(I iw) const {
    const I end = adaptive ? ((iw + 1) * OW + W - 1) / W : (iw + pW) / sW + 1;
    return end < OW ? end : OW;
  }
  // Whether output cell (oh, ow)'s window holds input cell (ih, iw).
  PRECIS_HOST_DEVICE bool covers(I oh, I ow, I ih, I iw) const {
    return row_begin(oh) <= ih && ih < row_end(oh) && col_begin(ow) <= iw && iw < col_end(ow);
  }
  // Input cell (ih, iw)'s place in output cell (oh, ow)'s fixed window, row by row from its
  // padded corner: what max pooling keeps of its maximum (0 <= place < kH kW).
  PRECIS_HOST_DEVICE I place_in_window(I oh, I ow, I ih, I iw) const {
    return (ih - (oh * sH - pH)) * kW + (iw - (ow * sW - pW));
  }
  // Whether every place fits a byte (max pooling then keeps u8 indices).
  PRECIS_HOST_DEVICE bool places_fit_a_byte() const { return kH * kW <= 256; }
  // The input row and column of `place` in output cell (oh, ow)'s window.
  PRECIS_HOST_DEVICE I row_of_place(I oh, I place) const { return oh * sH - pH + place / kW; }
  PRECIS_HOST_DEVICE I col_of_place(I ow, I place) const { return ow * sW - pW + place % kW; }
  // What avg pooling divides output cell (oh, ow)'s sum by.
  PRECIS_HOST_DEVICE I divisor(I oh, I ow) const {
    return adaptive ? (row_end(oh) - row_begin(oh)) * (col_end(ow) - col_begin(ow)) : kH * kW;
  }

 private:
  PRECIS_HOST_DEVICE static I clip(I v, I size) { return v < 0 ? 0 : (v > size ? size : v); }
};

using PoolWindows = BasicPoolWindows<int64_t>;

}  // namespace precis::ops
