// The cost model (ops/op_cost.h) against values computed by hand from its stated formulas.
#include <gtest/gtest.h>

#include "ops/op_cost.h"

using namespace precis;
namespace cost = precis::ops::cost;

TEST(OpCost, MatmulIsTwoMnkFlopsAndReadsEachOperandOnce) {
  // [3, 5] @ [5, 7] in f32: 2*3*7*5 = 210 FLOPs; (15 + 35 + 21) * 4 = 284 bytes.
  OpWork w = cost::matmul(1, 3, 7, 5, DType::f32, DType::f32, DType::f32);
  EXPECT_DOUBLE_EQ(w.forward.flops, 210);
  EXPECT_DOUBLE_EQ(w.forward.bytes, 284);
  EXPECT_TRUE(w.forward.matrix);
  // backward: two products of the forward's size; every operand read or written twice.
  EXPECT_DOUBLE_EQ(w.backward.flops, 420);
  EXPECT_DOUBLE_EQ(w.backward.bytes, 568);
  // batched bf16: 4 * 2*64*64*32 FLOPs; 4 * (64*32 + 32*64 + 64*64) * 2 bytes.
  OpWork b = cost::matmul(4, 64, 64, 32, DType::bf16, DType::bf16, DType::bf16);
  EXPECT_DOUBLE_EQ(b.forward.flops, 4.0 * 2 * 64 * 64 * 32);
  EXPECT_DOUBLE_EQ(b.forward.bytes, 4.0 * (64 * 32 + 32 * 64 + 64 * 64) * 2);
}

TEST(OpCost, LinearAddsItsEpilogues) {
  // x [8, 16] W [32, 16] + b, bf16: 2*8*32*16 + 8*32 FLOPs; bytes x, W, y and b.
  OpWork w = cost::linear(8, 32, 16, true, false, DType::bf16);
  EXPECT_DOUBLE_EQ(w.forward.flops, 2.0 * 8 * 32 * 16 + 8 * 32);
  EXPECT_DOUBLE_EQ(w.forward.bytes, (8 * 16 + 32 * 16 + 8 * 32 + 32) * 2.0);
  // the bias gradient: one add per dy element, written in f32.
  EXPECT_DOUBLE_EQ(w.backward.flops, 4.0 * 8 * 32 * 16 + 8 * 32);
  EXPECT_DOUBLE_EQ(w.backward.bytes, 2 * (8 * 16 + 32 * 16 + 8 * 32) * 2.0 + 32 * 4);
  OpWork g = cost::linear(8, 32, 16, true, true, DType::bf16);
  EXPECT_DOUBLE_EQ(g.forward.flops - w.forward.flops, cost::kGeluFlops * 8 * 32);
  EXPECT_DOUBLE_EQ(g.backward.bytes - w.backward.bytes, 8 * 32 * 2.0);
  // the MLP: both linears.
  OpWork mlp = cost::linear_gelu_linear(8, 16, 64, 16, DType::bf16);
  EXPECT_DOUBLE_EQ(mlp.forward.flops, cost::linear(8, 64, 16, true, true, DType::bf16).forward.flops +
                                          cost::linear(8, 16, 64, true, false, DType::bf16).forward.flops);
}

TEST(OpCost, FlashAttentionCountsFourProductsForwardAndTenBackward) {
  // B=2, H=3, T=128, D=64, bf16, not causal: 4*B*H*T*T*D + 5*B*H*T*T FLOPs.
  const double scores = 2.0 * 3 * 128 * 128, qkvo = 2.0 * 3 * 128 * 64 * 2;
  OpWork w = cost::attention(2, 3, 128, 128, 64, false, false, DType::bf16);
  EXPECT_DOUBLE_EQ(w.forward.flops, 4 * scores * 64 + 5 * scores);
  EXPECT_DOUBLE_EQ(w.forward.bytes, 4 * qkvo + 2.0 * 3 * 128 * 4);  // q, k, v, o and the f32 log-sum-exp
  EXPECT_DOUBLE_EQ(w.backward.flops, 10 * scores * 64 + 4 * scores);
  EXPECT_DOUBLE_EQ(w.backward.bytes, 8 * qkvo + 2.0 * 3 * 128 * 4);
  // causal: half the scores.
  OpWork c = cost::attention(2, 3, 128, 128, 64, true, false, DType::bf16);
  EXPECT_DOUBLE_EQ(c.forward.flops, w.forward.flops / 2);
  // the reference path writes and reads the score matrices and does no recomputation.
  OpWork r = cost::attention(2, 3, 128, 128, 64, false, true, DType::bf16);
  EXPECT_DOUBLE_EQ(r.forward.bytes - w.forward.bytes, 4 * scores * 2);
  EXPECT_DOUBLE_EQ(r.backward.flops, 8 * scores * 64 + 4 * scores);
}

TEST(OpCost, NormsSoftmaxAndLossesByTheirStatedCounts) {
  // layer norm of 10 rows of 48, bf16 in, f32 out: 8 FLOPs per element.
  OpWork ln = cost::layer_norm(10, 48, DType::bf16, DType::f32);
  EXPECT_DOUBLE_EQ(ln.forward.flops, 8.0 * 480);
  EXPECT_DOUBLE_EQ(ln.forward.bytes, 480 * (2.0 + 4.0) + 2 * 48 * 4 + 2 * 10 * 4);
  EXPECT_DOUBLE_EQ(ln.backward.flops, 14.0 * 480);
  EXPECT_FALSE(ln.forward.matrix);
  OpWork aln = cost::add_layer_norm(10, 48, DType::f32, DType::f32);
  EXPECT_DOUBLE_EQ(aln.forward.flops, 9.0 * 480);
  EXPECT_DOUBLE_EQ(aln.forward.bytes, 480 * 4.0 * 4 + 2 * 48 * 4 + 2 * 10 * 4);
  // softmax: 5 per element, reads and writes once.
  OpWork sm = cost::softmax(6, 100, DType::f32);
  EXPECT_DOUBLE_EQ(sm.forward.flops, 3000);
  EXPECT_DOUBLE_EQ(sm.forward.bytes, 2 * 600 * 4.0);
  EXPECT_DOUBLE_EQ(sm.backward.bytes, 3 * 600 * 4.0);
  // cross-entropy of 4 rows of 50 classes, f32, i64 targets.
  OpWork ce = cost::cross_entropy(4, 50, DType::f32, false);
  EXPECT_DOUBLE_EQ(ce.forward.flops, 4.0 * 200 + 4);
  EXPECT_DOUBLE_EQ(ce.forward.bytes, 200 * 4.0 + 4 * 8 + 4);
  OpWork fused = cost::cross_entropy(4, 50, DType::f32, true);
  EXPECT_DOUBLE_EQ(fused.forward.flops, 7.0 * 200);
  EXPECT_DOUBLE_EQ(fused.backward.flops, 0);
}

TEST(OpCost, ElementwiseEmbeddingConvNormPoolAndAdamW) {
  OpWork add = cost::binary(100, DType::f32, DType::f32, DType::f32);
  EXPECT_DOUBLE_EQ(add.forward.flops, 100);
  EXPECT_DOUBLE_EQ(add.forward.bytes, 1200);
  OpWork gelu = cost::unary(10, cost::kGeluFlops, cost::kGeluBackwardFlops, DType::bf16);
  EXPECT_DOUBLE_EQ(gelu.forward.flops, 80);
  EXPECT_DOUBLE_EQ(gelu.forward.bytes, 40);
  EXPECT_DOUBLE_EQ(gelu.backward.bytes, 60);
  // embedding: 12 i64 indices of 8-wide f32 rows: no FLOPs; rows read and written.
  OpWork emb = cost::embedding(12, 8, DType::f32, DType::i64);
  EXPECT_DOUBLE_EQ(emb.forward.flops, 0);
  EXPECT_DOUBLE_EQ(emb.forward.bytes, 2 * 96 * 4.0 + 12 * 8);
  EXPECT_DOUBLE_EQ(emb.backward.flops, 96);
  // conv 3x3, 2 images of 4x8x8 -> 6x8x8 (padding 1), f32: 2 * N Cout Ho Wo Cin kh kw.
  OpWork conv = cost::conv2d({2, 4, 8, 8, 6, 3, 3, 8, 8}, DType::f32);
  EXPECT_DOUBLE_EQ(conv.forward.flops, 2.0 * 2 * 6 * 64 * 4 * 9);
  EXPECT_DOUBLE_EQ(conv.forward.bytes, (2 * 4 * 64 + 6 * 4 * 9 + 2 * 6 * 64) * 4.0);
  EXPECT_DOUBLE_EQ(conv.backward.flops, 2 * conv.forward.flops);
  // grouped (depthwise): Cin/groups = 1 input channel per output.
  OpWork depthwise = cost::conv2d({1, 4, 8, 8, 4, 3, 3, 8, 8, 4}, DType::f32);
  EXPECT_DOUBLE_EQ(depthwise.forward.flops, 2.0 * 4 * 64 * 9);
  OpWork bn = cost::batch_norm(50, 4, DType::f32, true);
  EXPECT_DOUBLE_EQ(bn.forward.flops, 9.0 * 200);
  // max pool 2x2 of 1x1x4x4 -> 2x2: 4 windows of 4 compares.
  OpWork mp = cost::pool(16, 4, 4, true, DType::f32);
  EXPECT_DOUBLE_EQ(mp.forward.flops, 16);
  EXPECT_DOUBLE_EQ(mp.forward.bytes, 16 * 4.0 + 4 * 4.0 + 4 * 4.0);
  // AdamW on 1000 bf16 parameters with bf16 gradients and f32 master weights, 16 FLOPs each:
  // g read (2 B), m and v read and written (16 B), the master read and written (8 B), p written
  // (2 B): 28 B, as llm.c's kernel moves.
  OpCost adam = cost::adamw(1000, DType::bf16, DType::bf16, true);
  EXPECT_DOUBLE_EQ(adam.flops, 16000);
  EXPECT_DOUBLE_EQ(adam.bytes, 1000 * (2 + 16 + 8 + 2.0));
  // Without a master copy, f32: p read and written, g read, m and v read and written, 4 B each.
  EXPECT_DOUBLE_EQ(cost::adamw(10, DType::f32, DType::f32, false).bytes, 10 * 7 * 4.0);
  // SGD with momentum on 1000 bf16 parameters, f32 gradients and master weights: p written
  // (2 B), g read (4 B), the momentum buffer and the master read and written (4 x 4 B).
  OpCost sgd = cost::sgd(1000, DType::bf16, DType::f32, true, true);
  EXPECT_DOUBLE_EQ(sgd.flops, 6000);
  EXPECT_DOUBLE_EQ(sgd.bytes, 1000 * (2 + 4 + 8 + 8.0));
  // Plain f64 SGD without momentum: p read and written, g read, 8 B each.
  EXPECT_DOUBLE_EQ(cost::sgd(10, DType::f64, DType::f64, false, false).bytes, 10 * 3 * 8.0);
}
