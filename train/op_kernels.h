// The kernels of a traced profiled step matched to the ops that launched them
// (CUPTI external correlation: each op's scope tags what the host launches inside
// it, core/op_profile.h), so the per-op table and the per-kernel table reconcile:
// the kernels summed by op plus those outside ops are the kernel table's total.
#pragma once

#include <string>
#include <vector>

#include "core/op_profile.h"

namespace precis::train {

struct OpKernel {
  std::string kernel;        // short_kernel_name
  std::string tensor_cores;  // tensor_core_label
  double calls = 0, ms = 0;  // per step
};

struct OpKernels {
  std::string op;                 // "matmul fwd", or "(outside ops)"
  double event_ms = 0;            // the op's time in the op table (per step)
  double kernel_ms = 0;           // its kernels' sum (per step)
  std::vector<OpKernel> kernels;  // the most time first
};

// Per op and pass, the most kernel time first; the last entry is "(outside ops)" (kernels
// launched outside any op: the optimizer's bookkeeping, the gradient clip, casts). Copies and
// memsets are left out, as in the kernel table. Empty when no step was traced.
std::vector<OpKernels> kernels_by_op(const std::vector<ProfiledStep>& steps);

// The listing: each op, its event time and its kernels' sum, its `top` kernels; then the
// reconciliation with the kernel table's total.
std::string format_kernels_by_op(const std::vector<OpKernels>& ops, size_t top_ops = 20, size_t top_kernels = 4);

}  // namespace precis::train
