// The CUDA cross entropy (ops/cuda/cross_entropy.cu), plain C++ launchers on Tensors:
// ops/cross_entropy.cpp validates, allocates the outputs on the device and calls them; they
// run on the compute stream of their tensors' device.
#pragma once

#include <atomic>

#include "core/tensor.h"
#include "ops/cuda/bad_index.h"

namespace precis::ops::cuda {

// Fused log-softmax + NLL over the logits [rows, C] (unit column stride, rows strides()[0]
// >= C apart) and the dense targets [rows] (i32/i64):
// stats [rows, 2] gets (max, log-sum) per row, loss (a scalar in the statistics dtype)
// the mean over the rows whose target is not ignore_index, valid_count (i64 scalar)
// their number. Synchronises once, to read back the target check (not while a CUDA
// graph is being captured: then a bad target only turns the loss into NaN).
BadIndex cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& stats,
                               const Tensor& loss, const Tensor& valid_count);
// dlogits (the logits' dtype, dense [rows, width >= C]) = grad * (softmax - onehot) / valid_count,
// softmax recomputed from the logits and stats; zero rows where the target is ignored, and
// zeros in the columns past C (padding). grad: scalar on the device.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& stats,
                            const Tensor& valid_count, const Tensor& grad, const Tensor& dlogits);
// Both in one pass over the logits (the fused classifier): loss as cross_entropy_forward's,
// and dlogits = grad_factor * (softmax - onehot) / valid_count, grad_factor an f32 scalar on
// the device (the gradient the loss will receive: loss scale / micro-batches). dlogits may
// be the logits' own memory (rows `width` = ld apart). f16/bf16/f32 logits in 16-byte
// aligned rows take the fused kernel; others the forward and backward passes. Synchronises
// once to read back the target check, as cross_entropy_forward, before anything is written.
BadIndex cross_entropy_with_grad(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                 const Tensor& grad_factor, const Tensor& loss, const Tensor& dlogits);

// True: cross_entropy_with_grad's long rows take the staged kernel (the threads load the row),
// which GPUs before compute capability 9.0 run, instead of the bulk-copy one. False unless a
// test sets it, to check the staged kernel on a newer GPU too.
std::atomic<bool>& staged_classifier_forced();

// An experiment (issue 19): the bulk-copy kernel's long rows with one exponential a logit
// instead of two (cross_entropy_fused_one_exp_kernel: the row's max first, then exp(x - m) kept
// in the staged row for the gradient; rounded twice, so a unit or two in the last place of the
// logits' dtype from the bulk kernel's gradient). Until set, PRECIS_EXP_CE_ONE_EXP=1 turns it
// on (read once); off by default.
void set_one_exp_classifier(bool on);
bool one_exp_classifier();

}  // namespace precis::ops::cuda
