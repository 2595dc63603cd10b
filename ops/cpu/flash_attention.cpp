// The math, per batch b and head h, with q_i, k_j, v_j the D-vectors of positions i and j,
// s = scale, and j running over the keys query i sees (j <= i when causal):
//
// Forward, keys taken a tile at a time with the online softmax (FlashAttention): keep the
// running maximum m, the running sum l of exp(score - m) and the running weighted sum a of
// values; for each tile of scores x_j = s q_i . k_j,
//   m' = max(m, max_j x_j),  c = exp(m - m'),
//   l <- c l + sum_j exp(x_j - m'),   a <- c a + sum_j exp(x_j - m') v_j,   m <- m'
// then out_i = a / l and lse_i = m + log l. (On the GPU a tile of queries shares each tile of
// keys; here one query row at a time, so a thread's scratch is one tile of scores.)
//
// Backward (FlashAttention-2), each row of probabilities recomputed from lse:
//   p_ij = exp(s q_i . k_j - lse_i),   D_i = dout_i . out_i
//   dv_j += p_ij dout_i,   dp_ij = dout_i . v_j,   ds_ij = p_ij (dp_ij - D_i)
//   dq_i = s sum_j ds_ij k_j,   dk_j += s ds_ij q_i
//
// Heads are independent: one (b, h) pair per iteration of one OpenMP loop, and each pair
// writes only its own columns of out, lse and dqkv.
#include "ops/cpu/flash_attention.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu/loops.h"

namespace precis::ops::cpu {

namespace {

constexpr int64_t kKeyTile = 64;

using Eigen::Dynamic;
template <typename T>
using HeadRows = Eigen::Map<const Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
template <typename T>
using MutableHeadRows = Eigen::Map<Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
template <typename T>
using Vector = Eigen::Matrix<T, Dynamic, 1>;

// The shapes of one call: B sequences of T positions, H heads of D values, C = H D.
struct Dims {
  int64_t B, T, H, D, C;
};
Dims dims_of(const Tensor& qkv, int64_t n_head) {
  const int64_t C = qkv.size(2) / 3;
  return {qkv.size(0), qkv.size(1), n_head, C / n_head, C};
}

// The [T, D] rows of head h of sequence b in a [B, T, width] buffer, starting at column `column`.
template <typename T>
HeadRows<T> head(const T* data, const Dims& d, int64_t width, int64_t b, int64_t column) {
  return HeadRows<T>(data + b * d.T * width + column, d.T, d.D, Eigen::OuterStride<>(width));
}
template <typename T>
MutableHeadRows<T> mutable_head(T* data, const Dims& d, int64_t width, int64_t b, int64_t column) {
  return MutableHeadRows<T>(data + b * d.T * width + column, d.T, d.D, Eigen::OuterStride<>(width));
}

// How many keys query i sees.
int64_t visible_keys(int64_t i, int64_t T, bool causal) { return causal ? i + 1 : T; }

template <typename T>
void forward(const Tensor& qkv_t, const Dims& d, bool causal, T scale, const Tensor& out_t, const Tensor& lse_t) {
  const T* qkv = static_cast<const T*>(qkv_t.raw_data());
  T* out = static_cast<T*>(out_t.raw_data());
  T* lse = static_cast<T*>(lse_t.raw_data());
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
    const int64_t b = bh / d.H, h = bh % d.H;
    const HeadRows<T> q = head(qkv, d, 3 * d.C, b, h * d.D), k = head(qkv, d, 3 * d.C, b, d.C + h * d.D),
                      v = head(qkv, d, 3 * d.C, b, 2 * d.C + h * d.D);
    MutableHeadRows<T> o = mutable_head(out, d, d.C, b, h * d.D);
    Eigen::Map<Vector<T>> scores(scratch<T>(kKeyTile), kKeyTile);
    Vector<T> acc(d.D);
    for (int64_t i = 0; i < d.T; ++i) {
      T m = -std::numeric_limits<T>::infinity(), l = 0;
      acc.setZero();
      const int64_t keys = visible_keys(i, d.T, causal);
      for (int64_t j0 = 0; j0 < keys; j0 += kKeyTile) {
        const int64_t n = std::min(kKeyTile, keys - j0);
        auto x = scores.head(n);
        x.noalias() = scale * (k.middleRows(j0, n) * q.row(i).transpose());
        const T m_new = std::max(m, x.maxCoeff());
        const T c = std::exp(m - m_new);
        x = (x.array() - m_new).exp().matrix();
        l = c * l + x.sum();
        acc = c * acc;
        acc.noalias() += v.middleRows(j0, n).transpose() * x;
        m = m_new;
      }
      o.row(i) = (acc / l).transpose();
      lse[bh * d.T + i] = m + std::log(l);
    }
  }
}

template <typename T>
void backward(const Tensor& qkv_t, const Tensor& out_t, const Tensor& lse_t, const Tensor& dout_t, const Dims& d,
              bool causal, T scale, const Tensor& dqkv_t) {
  const T* qkv = static_cast<const T*>(qkv_t.raw_data());
  const T* out = static_cast<const T*>(out_t.raw_data());
  const T* lse = static_cast<const T*>(lse_t.raw_data());
  const T* dout = static_cast<const T*>(dout_t.raw_data());
  T* dqkv = static_cast<T*>(dqkv_t.raw_data());
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
    const int64_t b = bh / d.H, h = bh % d.H;
    const HeadRows<T> q = head(qkv, d, 3 * d.C, b, h * d.D), k = head(qkv, d, 3 * d.C, b, d.C + h * d.D),
                      v = head(qkv, d, 3 * d.C, b, 2 * d.C + h * d.D);
    const HeadRows<T> o = head(out, d, d.C, b, h * d.D), g = head(dout, d, d.C, b, h * d.D);
    MutableHeadRows<T> dq = mutable_head(dqkv, d, 3 * d.C, b, h * d.D),
                       dk = mutable_head(dqkv, d, 3 * d.C, b, d.C + h * d.D),
                       dv = mutable_head(dqkv, d, 3 * d.C, b, 2 * d.C + h * d.D);
    dk.setZero();
    dv.setZero();
    T* row = scratch<T>(2 * d.T);
    Eigen::Map<Vector<T>> p_row(row, d.T), ds_row(row + d.T, d.T);
    for (int64_t i = 0; i < d.T; ++i) {
      const int64_t n = visible_keys(i, d.T, causal);
      auto p = p_row.head(n);
      auto ds = ds_row.head(n);
      p.noalias() = scale * (k.topRows(n) * q.row(i).transpose());
      p = (p.array() - lse[bh * d.T + i]).exp().matrix();
      dv.topRows(n).noalias() += p * g.row(i);
      const T D_i = g.row(i).dot(o.row(i));
      ds.noalias() = v.topRows(n) * g.row(i).transpose();
      ds = p.cwiseProduct((ds.array() - D_i).matrix());
      dq.row(i).noalias() = scale * (ds.transpose() * k.topRows(n));
      dk.topRows(n).noalias() += scale * (ds * q.row(i));
    }
  }
}

}  // namespace

void flash_attention_forward(const Tensor& qkv, int64_t n_head, bool causal, double scale, const Tensor& out,
                             const Tensor& lse) {
  const Dims d = dims_of(qkv, n_head);
  dispatch_f32_f64(qkv.dtype(), "flash_attention (cpu)", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward<T>(qkv, d, causal, static_cast<T>(scale), out, lse);
  });
}

void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              int64_t n_head, bool causal, double scale, const Tensor& dqkv) {
  const Dims d = dims_of(qkv, n_head);
  dispatch_f32_f64(qkv.dtype(), "flash_attention (cpu)", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward<T>(qkv, out, lse, dout, d, causal, static_cast<T>(scale), dqkv);
  });
}

}  // namespace precis::ops::cpu
