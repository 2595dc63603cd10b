// The math, per batch b and head h, with Q, K, V the [T, D] rows of the head, s = scale, and
// the causal mask hiding key j from query i when j > i. Queries and keys are taken in tiles
// of kTile positions, so what is stored is one kTile x kTile tile of scores, never T x T.
//
// Forward, the online softmax (FlashAttention): for a tile of queries keep per row the running
// maximum m, the running sum l of exp(score - m) and the running weighted sum A of values;
// for each tile of keys, with S = s Q_tile K_tile^T (masked entries -inf),
//   m' = max(m, rowmax S),  c = exp(m - m'),  P = exp(S - m'),
//   l <- c l + rowsum P,   A <- diag(c) A + P V_tile,   m <- m'
// then out = diag(1 / l) A and lse = m + log l.
//
// Backward (FlashAttention-2), each tile of probabilities recomputed from lse:
//   P = exp(s Q_tile K_tile^T - lse) (0 where masked),   Dr = rowsum(dOut_tile * Out_tile)
//   dV_tile += P^T dOut_tile,   dP = dOut_tile V_tile^T,   dS = P * (dP - Dr)
//   dQ_tile += s dS K_tile,   dK_tile += s dS^T Q_tile
//
// Heads are independent: one (b, h) pair per iteration of one OpenMP loop, and each pair
// writes only its own columns of out, lse and dqkv. Each product is an Eigen GEMM on tiles.
#include "ops/cpu/flash_attention.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dtype.h"

namespace precis::ops::cpu {

namespace {

constexpr int64_t kTile = 64;

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
using Tile = Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>;

// The key tiles query tile [i0, i0 + rows) reads: up to its last query when causal.
int64_t keys_seen(int64_t i0, int64_t rows, int64_t T, bool causal) { return causal ? i0 + rows : T; }

// Row r of a tile of scores for queries from i0 and keys [j0, j0 + cols), in place:
// exp(row - shift) over the keys query i0 + r sees, 0 over the ones it does not.
// Only the visible part is exponentiated: exp(-inf) through Eigen's exp is not 0 but a
// subnormal (it clamps its argument at -88.7), and subnormals are slow to make and to multiply.
template <typename T>
void exp_visible(Tile<T>& scores, int64_t r, T shift, int64_t visible) {
  auto row = scores.row(r);
  row.head(visible) = (row.head(visible).array() - shift).exp().matrix();
  row.tail(scores.cols() - visible).setZero();
}

// How many of the tile's keys [j0, j0 + cols) query i sees.
int64_t visible_in_tile(int64_t i, int64_t j0, int64_t cols, int64_t T, bool causal) {
  return std::min(cols, visible_keys(i, T, causal) - j0);
}

template <typename T>
void forward(const Tensor& qkv_t, const Dims& d, bool causal, T scale, const Tensor& out_t, const Tensor& lse_t) {
  const T* qkv = static_cast<const T*>(qkv_t.raw_data());
  T* out = static_cast<T*>(out_t.raw_data());
  T* lse = static_cast<T*>(lse_t.raw_data());
  const T infinity = std::numeric_limits<T>::infinity();
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
    const int64_t b = bh / d.H, h = bh % d.H;
    const HeadRows<T> q = head(qkv, d, 3 * d.C, b, h * d.D), k = head(qkv, d, 3 * d.C, b, d.C + h * d.D),
                      v = head(qkv, d, 3 * d.C, b, 2 * d.C + h * d.D);
    MutableHeadRows<T> o = mutable_head(out, d, d.C, b, h * d.D);
    Tile<T> S, A;
    Vector<T> m, m_new, l, c;
    for (int64_t i0 = 0; i0 < d.T; i0 += kTile) {
      const int64_t rows = std::min(kTile, d.T - i0), keys = keys_seen(i0, rows, d.T, causal);
      m.setConstant(rows, -infinity);
      m_new.resize(rows);
      l.setZero(rows);
      A.setZero(rows, d.D);
      for (int64_t j0 = 0; j0 < keys; j0 += kTile) {
        const int64_t cols = std::min(kTile, keys - j0);
        S.noalias() = scale * (q.middleRows(i0, rows) * k.middleRows(j0, cols).transpose());
        for (int64_t r = 0; r < rows; ++r) {  // P = exp(S - m'), in place
          const int64_t visible = visible_in_tile(i0 + r, j0, cols, d.T, causal);
          m_new(r) = std::max(m(r), S.row(r).head(visible).maxCoeff());
          exp_visible<T>(S, r, m_new(r), visible);
        }
        c = (m - m_new).array().exp().matrix();
        l = c.cwiseProduct(l) + S.rowwise().sum();
        A = c.asDiagonal() * A;
        A.noalias() += S * v.middleRows(j0, cols);
        m = m_new;
      }
      o.middleRows(i0, rows) = l.cwiseInverse().asDiagonal() * A;
      Eigen::Map<Vector<T>>(lse + bh * d.T + i0, rows) = (m.array() + l.array().log()).matrix();
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
    dq.setZero();
    dk.setZero();
    dv.setZero();
    Tile<T> P, dS;
    Vector<T> Dr;
    for (int64_t i0 = 0; i0 < d.T; i0 += kTile) {
      const int64_t rows = std::min(kTile, d.T - i0), keys = keys_seen(i0, rows, d.T, causal);
      const Eigen::Map<const Vector<T>> row_lse(lse + bh * d.T + i0, rows);
      Dr = g.middleRows(i0, rows).cwiseProduct(o.middleRows(i0, rows)).rowwise().sum();
      for (int64_t j0 = 0; j0 < keys; j0 += kTile) {
        const int64_t cols = std::min(kTile, keys - j0);
        P.noalias() = scale * (q.middleRows(i0, rows) * k.middleRows(j0, cols).transpose());
        for (int64_t r = 0; r < rows; ++r)
          exp_visible<T>(P, r, row_lse(r), visible_in_tile(i0 + r, j0, cols, d.T, causal));
        dv.middleRows(j0, cols).noalias() += P.transpose() * g.middleRows(i0, rows);
        dS.noalias() = g.middleRows(i0, rows) * v.middleRows(j0, cols).transpose();  // dP
        dS = P.cwiseProduct((dS.colwise() - Dr));
        dq.middleRows(i0, rows).noalias() += scale * (dS * k.middleRows(j0, cols));
        dk.middleRows(j0, cols).noalias() += scale * (dS.transpose() * q.middleRows(i0, rows));
      }
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
