// Flash attention (ops/cuda/flash_attention_*.cu) against the reference attention
// computed on the CPU in f64 from the very f16/bf16 values the GPU gets: forward
// output and log-sum-exp, and the q, k, v gradients, on odd lengths (tails of every
// tile size), causal and not, Tq != Tk, head sizes 64 and 128. The kernels are
// called directly with every output filled with NaN first, so an element left
// unwritten fails. Error measure: ||gpu - ref|| / ||ref||, bar 1e-2 for bf16 and
// 5e-3 for f16. Also: a backward over many query blocks whose dK and dV come out
// bit-identical run after run (a race detector), strided q, k, v (views of one qkv
// buffer, as in the model), a deterministic forward, the dispatch of
// scaled_dot_product_attention, and a tiny GPT-2 whose gradients with flash attention
// match those with the reference.
// Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/copy.h"
#include "models/gpt2.h"
#include "nn/flat_parameters.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gradcheck.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/flash_attention.h"
#endif

using namespace precis;
using precis::testing::random_f64;

namespace {

const Device kGpu = Device::cuda(0);

// ||got - want|| / ||want||, with ||want|| floored at 1e-3 sqrt(n): some exact gradients
// are zero (with one key, P = 1 and dS = dP - delta = 0), and then rounding is all there is.
double relative_error(const Tensor& got, const Tensor& want) {
  std::vector<double> g = got.to(Device::cpu()).to_vector<double>(), w = want.to(Device::cpu()).to_vector<double>();
  EXPECT_EQ(g.size(), w.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;  // unwritten (NaN poison) or overflowed
    diff += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-6 * static_cast<double>(w.size())));
}

double bar(DType dtype) { return dtype == DType::bf16 ? 1e-2 : 5e-3; }

struct Case {
  int64_t B, H, Tq, Tk, D;
  bool causal;
};

std::string name(const Case& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " B" + std::to_string(c.B) + " H" + std::to_string(c.H) + " Tq" +
         std::to_string(c.Tq) + " Tk" + std::to_string(c.Tk) + " D" + std::to_string(c.D) + (c.causal ? " causal" : "");
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true}) {
      for (int64_t T : {1, 17, 64, 100, 129, 257}) out.push_back({2, 3, T, T, D, causal});
      out.push_back({1, 2, 33, 70, D, causal});  // more keys than queries
      out.push_back({1, 2, 70, 33, D, causal});  // more queries than keys
    }
  return out;
}

// A [B, H, T, D] tensor of `dtype` on the GPU with values in [-2, 2) (so scores
// reach +-10 and the softmax is far from uniform).
Tensor random_heads(int64_t B, int64_t H, int64_t T, int64_t D, DType dtype, uint64_t seed) {
  return random_f64({B, H, T, D}, seed, -2.0, 2.0).to(dtype).to(kGpu);
}

// The reference in f64 on the CPU from the GPU's values: output, lse, and with
// `dout` the gradients of q, k, v.
struct Reference {
  Tensor out, lse, dq, dk, dv;
};
Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const Tensor& dout = Tensor()) {
  Tensor q64 = q.to(Device::cpu()).to(DType::f64), k64 = k.to(Device::cpu()).to(DType::f64),
         v64 = v.to(Device::cpu()).to(DType::f64);
  const bool grads = dout.defined();
  if (grads) {
    q64.set_requires_grad();
    k64.set_requires_grad();
    v64.set_requires_grad();
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  Reference r;
  r.out = ops::scaled_dot_product_attention(q64, k64, v64, causal, 0.0, std::nullopt, nullptr,
                                            ops::AttentionImpl::reference);
  // lse_i = log sum_{j visible} exp(scale q_i . k_j)
  Tensor scores = ops::mul(ops::matmul(q64.detach(), k64.detach().transpose(-2, -1)), scale);
  if (causal) {
    const int64_t Tq = q.size(2), Tk = k.size(2);
    Tensor mask = ops::causal_mask(std::max(Tq, Tk), Device::cpu()).narrow(0, 0, Tq).narrow(1, 0, Tk);
    scores = ops::masked_fill(scores, mask, -INFINITY);
  }
  Tensor row_max = ops::amax(scores, {-1}, true);
  r.lse = ops::add(ops::log(ops::sum(ops::exp(ops::sub(scores, row_max)), {-1})), row_max.squeeze(-1));
  if (grads) {
    r.out.backward(dout.to(Device::cpu()).to(DType::f64));
    r.dq = q64.grad();
    r.dk = k64.grad();
    r.dv = v64.grad();
  }
  return r;
}

}  // namespace

#if PRECIS_WITH_CUDA

TEST(FlashAttentionGpu, ForwardMatchesReferenceWithEveryOutputWritten) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (DType dtype : {DType::bf16, DType::f16})
    for (const Case& c : cases()) {
      SCOPED_TRACE(name(c, dtype));
      Tensor q = random_heads(c.B, c.H, c.Tq, c.D, dtype, ++seed), k = random_heads(c.B, c.H, c.Tk, c.D, dtype, ++seed),
             v = random_heads(c.B, c.H, c.Tk, c.D, dtype, ++seed);
      Tensor out = full({c.B, c.Tq, c.H, c.D}, NAN, dtype, kGpu).transpose(1, 2);
      Tensor lse = full({c.B, c.H, c.Tq}, NAN, DType::f32, kGpu);
      ops::cuda::flash_attention_forward(q, k, v, c.causal, 1.0 / std::sqrt(static_cast<double>(c.D)), out, lse);
      Reference r = reference(q, k, v, c.causal);
      EXPECT_LE(relative_error(out, r.out), bar(dtype));
      EXPECT_LE(relative_error(lse, r.lse), 1e-4);  // f32 statistics of the exact 16-bit inputs
    }
}

TEST(FlashAttentionGpu, BackwardMatchesReferenceWithEveryGradientWritten) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  for (DType dtype : {DType::bf16, DType::f16})
    for (const Case& c : cases()) {
      SCOPED_TRACE(name(c, dtype));
      Tensor q = random_heads(c.B, c.H, c.Tq, c.D, dtype, ++seed), k = random_heads(c.B, c.H, c.Tk, c.D, dtype, ++seed),
             v = random_heads(c.B, c.H, c.Tk, c.D, dtype, ++seed);
      Tensor dout = random_heads(c.B, c.H, c.Tq, c.D, dtype, ++seed);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      Tensor out = empty({c.B, c.Tq, c.H, c.D}, dtype, kGpu).transpose(1, 2);
      Tensor lse = empty({c.B, c.H, c.Tq}, DType::f32, kGpu);
      ops::cuda::flash_attention_forward(q, k, v, c.causal, scale, out, lse);
      auto poisoned = [&](const Tensor& like) {
        return full({like.size(0), like.size(2), like.size(1), like.size(3)}, NAN, dtype, kGpu).transpose(1, 2);
      };
      Tensor dq = poisoned(q), dk = poisoned(k), dv = poisoned(v);
      ops::cuda::flash_attention_backward(q, k, v, out, lse, dout, c.causal, scale, dq, dk, dv);
      Reference r = reference(q, k, v, c.causal, dout);
      EXPECT_LE(relative_error(dq, r.dq), bar(dtype)) << "dq";
      EXPECT_LE(relative_error(dk, r.dk), bar(dtype)) << "dk";
      EXPECT_LE(relative_error(dv, r.dv), bar(dtype)) << "dv";
    }
}

TEST(FlashAttentionGpu, BackwardOverManyQueryBlocksIsRightAndReproducible) {
  PRECIS_SKIP_WITHOUT_GPU();
  // T = 700: 11 query blocks per key block, so the backward's pipeline (its probability
  // warps one block ahead, three query-block stages, two hand-over slots) wraps around
  // several times. dK and dV take no atomics: a race between its warps would show as
  // bits that change from one run to the next. dQ's atomic sums may differ in the last bits.
  uint64_t seed = 300;
  for (int64_t D : {64, 128})
    for (bool causal : {true, false}) {
      const Case c{1, 2, 700, 700, D, causal};
      SCOPED_TRACE(name(c, DType::bf16));
      Tensor q = random_heads(c.B, c.H, c.Tq, D, DType::bf16, ++seed),
             k = random_heads(c.B, c.H, c.Tk, D, DType::bf16, ++seed),
             v = random_heads(c.B, c.H, c.Tk, D, DType::bf16, ++seed),
             dout = random_heads(c.B, c.H, c.Tq, D, DType::bf16, ++seed);
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      Tensor out = empty({c.B, c.Tq, c.H, D}, DType::bf16, kGpu).transpose(1, 2);
      Tensor lse = empty({c.B, c.H, c.Tq}, DType::f32, kGpu);
      ops::cuda::flash_attention_forward(q, k, v, causal, scale, out, lse);
      auto backward = [&] {
        auto poisoned = [&](const Tensor& like) {
          return full({like.size(0), like.size(2), like.size(1), like.size(3)}, NAN, DType::bf16, kGpu).transpose(1, 2);
        };
        std::vector<Tensor> grads{poisoned(q), poisoned(k), poisoned(v)};
        ops::cuda::flash_attention_backward(q, k, v, out, lse, dout, causal, scale, grads[0], grads[1], grads[2]);
        return grads;
      };
      std::vector<Tensor> first = backward();
      Reference r = reference(q, k, v, causal, dout);
      EXPECT_LE(relative_error(first[0], r.dq), bar(DType::bf16)) << "dq";
      EXPECT_LE(relative_error(first[1], r.dk), bar(DType::bf16)) << "dk";
      EXPECT_LE(relative_error(first[2], r.dv), bar(DType::bf16)) << "dv";
      for (int run = 0; run < 3; ++run) {
        std::vector<Tensor> again = backward();
        EXPECT_EQ(again[1].to(Device::cpu()).to_vector<double>(), first[1].to(Device::cpu()).to_vector<double>())
            << "dk, run " << run;
        EXPECT_EQ(again[2].to(Device::cpu()).to_vector<double>(), first[2].to(Device::cpu()).to_vector<double>())
            << "dv, run " << run;
        EXPECT_LE(relative_error(again[0], first[0]), 1e-3) << "dq, run " << run;
      }
    }
}

TEST(FlashAttentionGpu, OpWithAutogradOnStridedViewsOfOneQkvBuffer) {
  PRECIS_SKIP_WITHOUT_GPU();
  // As in the transformer: one [B, T, 3C] product split into q, k, v, each viewed [B, H, T, D].
  const int64_t B = 2, T = 77, H = 4, D = 64, C = H * D;
  Tensor qkv = random_f64({B, T, 3 * C}, 7, -2.0, 2.0).to(DType::bf16).to(kGpu).set_requires_grad();
  std::vector<Tensor> parts = ops::split(qkv, C, 2);
  auto heads = [&](const Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
  Tensor y = ops::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), true);
  Tensor dy = random_f64({B, H, T, D}, 8).to(DType::bf16).to(kGpu);
  y.backward(dy);

  Tensor q = heads(parts[0]).detach(), k = heads(parts[1]).detach(), v = heads(parts[2]).detach();
  Reference r = reference(q, k, v, true, dy);
  EXPECT_LE(relative_error(y, r.out), bar(DType::bf16));
  Tensor grad = qkv.grad().to(Device::cpu()).to(DType::f64);
  std::vector<Tensor> grads = ops::split(grad, C, 2);
  EXPECT_LE(relative_error(heads(grads[0]), r.dq), bar(DType::bf16));
  EXPECT_LE(relative_error(heads(grads[1]), r.dk), bar(DType::bf16));
  EXPECT_LE(relative_error(heads(grads[2]), r.dv), bar(DType::bf16));
}

TEST(FlashAttentionGpu, ForwardIsDeterministic) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor q = random_heads(2, 3, 300, 64, DType::bf16, 1), k = random_heads(2, 3, 300, 64, DType::bf16, 2),
         v = random_heads(2, 3, 300, 64, DType::bf16, 3);
  std::vector<double> first = ops::flash_attention(q, k, v, true).to(Device::cpu()).to_vector<double>();
  for (int run = 0; run < 3; ++run)
    EXPECT_EQ(ops::flash_attention(q, k, v, true).to(Device::cpu()).to_vector<double>(), first);
}

TEST(FlashAttentionGpu, DispatchSaysWhyTheReferenceRuns) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor q = random_heads(1, 2, 16, 64, DType::bf16, 1);
  EXPECT_FALSE(ops::flash_attention_unsupported(q, q, q, 0.0).has_value());
  Tensor f32 = q.to(DType::f32);
  EXPECT_NE(ops::flash_attention_unsupported(f32, f32, f32, 0.0).value_or("").find("f16 or bf16"), std::string::npos);
  EXPECT_NE(ops::flash_attention_unsupported(q, q, q, 0.1).value_or("").find("dropout"), std::string::npos);
  Tensor d32 = random_heads(1, 2, 16, 32, DType::bf16, 2);
  EXPECT_NE(ops::flash_attention_unsupported(d32, d32, d32, 0.0).value_or("").find("64 or 128"), std::string::npos);
  // The reference still serves what flash cannot: head size 32 in bf16.
  Tensor y = ops::scaled_dot_product_attention(d32, d32, d32, true);
  EXPECT_LE(relative_error(y, reference(d32, d32, d32, true).out), bar(DType::bf16));
}

TEST(FlashAttentionGpu, TinyGpt2GradientsMatchTheReferenceAttention) {
  PRECIS_SKIP_WITHOUT_GPU();
  // Gradients of a tiny GPT-2 (head size 64) under bf16 autocast, with flash and with the
  // reference attention, each against an f32 run of the reference: flash must be as close.
  models::GPT2Config config;
  config.vocab_size = 97;
  config.block_size = 96;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 128;
  std::vector<int32_t> ids(2 * 96), next(2 * 96);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((i * 37 + 11) % 97);
    next[i] = static_cast<int32_t>((i * 37 + 48) % 97);
  }
  Tensor inputs = from_vector(ids, {2, 96}).to(kGpu), targets = from_vector(next, {2, 96}).to(kGpu);
  auto gradients = [&](const std::string& attention, bool bf16) {
    config.attention = attention;
    models::GPT2 model(config, /*seed=*/5);
    auto flat = nn::flatten_parameters(model, kGpu);
    ops::autocast::Scope autocast(DType::bf16, bf16);
    model.forward(inputs, targets).loss.backward();
    std::vector<Tensor> grads;
    for (const Tensor& p : model.parameters()) grads.push_back(p.grad().to(Device::cpu()).to(DType::f64));
    return grads;
  };
  std::vector<Tensor> exact = gradients("reference", false), flash = gradients("flash", true),
                      plain = gradients("reference", true);
  ASSERT_EQ(flash.size(), exact.size());
  for (size_t i = 0; i < exact.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    EXPECT_LE(relative_error(flash[i], exact[i]), 2.0 * relative_error(plain[i], exact[i]) + 2e-3);
  }
}

#endif  // PRECIS_WITH_CUDA

#if PRECIS_WITH_CUDA
TEST(FlashAttentionGpu, PackedQkvMatchesTheReferenceAndWritesTheWholeGradient) {
  PRECIS_SKIP_WITHOUT_GPU();
  // flash_attention_packed on the fused c_attn product [B, T, 3C]: output [B, T, C] and
  // d(qkv) against the reference on the q, k, v parts.
  for (int64_t T : {1, 77, 200}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const int64_t B = 2, H = 3, D = 64, C = H * D;
    Tensor qkv = random_f64({B, T, 3 * C}, 11 + T, -2.0, 2.0).to(DType::bf16).to(kGpu).set_requires_grad();
    Tensor y = ops::flash_attention_packed(qkv, H, true);
    ASSERT_EQ(y.shape(), (Shape{B, T, C}));
    Tensor dy = random_f64({B, T, C}, 12 + T).to(DType::bf16).to(kGpu);
    y.backward(dy);
    auto heads = [&](const Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
    std::vector<Tensor> parts = ops::split(qkv.detach(), C, 2);
    Reference r = reference(heads(parts[0]), heads(parts[1]), heads(parts[2]), true, heads(dy));
    EXPECT_LE(relative_error(heads(y), r.out), bar(DType::bf16));
    std::vector<Tensor> grads = ops::split(qkv.grad().to(Device::cpu()).to(DType::f64), C, 2);
    EXPECT_LE(relative_error(heads(grads[0]), r.dq), bar(DType::bf16)) << "dq";
    EXPECT_LE(relative_error(heads(grads[1]), r.dk), bar(DType::bf16)) << "dk";
    EXPECT_LE(relative_error(heads(grads[2]), r.dv), bar(DType::bf16)) << "dv";
  }
}
#endif
