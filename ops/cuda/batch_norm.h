// The CUDA kernels of batch_norm and batch_norm_relu (ops/batch_norm.cpp), on x seen as
// [N, C, S] (S the product of the dims after C) dense in `format` (channels-last: 4-D only),
// f32, f16 or bf16, with the [C] parameters and statistics in f32.
#pragma once

#include "core/tensor.h"
#include "ops/conv.h"

namespace precis::ops::cuda {

struct BatchNormForward {
  Tensor x, residual, y, weight, bias;  // residual: batch_norm_add_relu's, laid out as x (else undefined)
                                        // weight, bias: f32 [C]
  Tensor running_mean, running_var;     // f32 [C]: read in eval, updated in place in training (may be undefined then)
  Tensor num_batches_tracked;           // i64 scalar: 1 added (training), or undefined
  Tensor save_mean, save_invstd;        // f32 [C], written: the statistics used
  double momentum, eps;
  MemoryFormat format;
  bool training, relu;
};
void batch_norm_forward(const BatchNormForward& f);

// dx, and dw, db (f32 [C]), from gy, the forward's x and statistics, and the relu's mask: from y
// where y is defined, else from x where relu_bias is (the forward's value (x - mean) weight
// invstd + bias recomputed bit for bit and rounded as y was: the same mask); with dr defined
// (batch_norm_add_relu), dr = g' = gy [y > 0] too.
struct BatchNormBackward {
  Tensor x, y, relu_bias, gy, weight, save_mean, save_invstd;  // y, relu_bias: f32 [C]: relu variants only
                                                               // (else undefined); gy laid out as x
  Tensor dx, dw, db, dr;
  MemoryFormat format;
  bool training;
  bool accumulate_dw = false, accumulate_db = false;  // add to what dw, db hold (a parameter's .grad) instead
};
void batch_norm_backward(const BatchNormBackward& b);

// The channels-last statistics passes with their loads staged through shared memory by
// cp.async (batch_norm.cu's staged_sums_kernel; bench/NOTES.md, eighteenth and nineteenth
// sessions), the same sums bit for bit as the register-batched kernel's under 40 MB. On by
// default where a block's ring fits the device's shared memory; until set,
// PRECIS_BN_STAGED_STATS=0 turns it off.
void set_staged_batch_norm_statistics(bool on);
// The staged statistics passes launched so far in this process (for the tests).
int64_t staged_batch_norm_statistics_launches();

}  // namespace precis::ops::cuda
