// The numerics report: what the numbers in a training step look like, per layer
// and per kind of tensor, so a learner can see why fp16 needs loss scaling and
// bf16 does not.
//
// For activations (block outputs and logits), gradients (of those activations,
// and of every parameter, as stored, i.e. still multiplied by the loss scale)
// and weight updates it records:
//   max |x|          the largest magnitude (fp16 overflows above 65504)
//   zero             fraction exactly zero
//   fp16 sub         fraction nonzero but below 2^-14 = 6.1e-5: subnormal in fp16 (precision lost)
//   fp16 under       fraction nonzero but below 2^-25 = 3.0e-8: would round to zero in fp16
//   inf / nan        fractions that overflowed or are NaN
// and for updates, `lost`: the fraction of parameters whose gradient was nonzero
// but whose stored value did not change, because the update was smaller than
// half the weight's ulp in its dtype (lost to rounding).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/tensor.h"

namespace precis::amp {

// The thresholds, in double (the CPU loop and the CUDA kernels, amp/cuda/numerics.cu, compare with these).
inline constexpr double kFp16MinNormal = 6.103515625e-05;                 // 2^-14
inline constexpr double kFp16HalfMinSubnormal = 2.98023223876953125e-08;  // 2^-25: rounds to zero below

// On the CPU a loop over the values in double (the reference); on the GPU one kernel pass per
// call that reads back only the counters (amp/cuda/numerics.h), with the same results.
struct TensorNumerics {
  int64_t count = 0;
  double max_abs = 0;
  int64_t zero = 0;
  int64_t fp16_subnormal = 0;
  int64_t fp16_underflow = 0;
  int64_t inf = 0;
  int64_t nan = 0;
  int64_t lost = 0;      // updates only
  int64_t eligible = 0;  // updates only: elements whose gradient was nonzero

  void add_values(const Tensor& t);
  // Compares a parameter before and after an update, given its gradient.
  void add_update(const Tensor& before, const Tensor& after, const Tensor& grad);
  Json json() const;
};

enum class NumericsKind { activation, activation_grad, gradient, update };
const char* numerics_kind_name(NumericsKind kind);

class NumericsReport {
 public:
  // Stats of one tensor of `kind` under `name` ("transformer.h.3", ...), added to
  // what that name already has this report.
  void record(NumericsKind kind, const std::string& name, const Tensor& t);
  void record_update(const std::string& name, const Tensor& before, const Tensor& after, const Tensor& grad);
  bool empty() const { return rows_.empty(); }

  // A fixed-width table, one row per (kind, name) in the order first recorded.
  std::string table(int64_t step, double loss_scale) const;
  // One JSON object per row: {"step", "kind", "name", "count", "max_abs", "zero", ...}.
  std::vector<Json> json(int64_t step, double loss_scale) const;
  void clear() { rows_.clear(); }

 private:
  struct Row {
    NumericsKind kind;
    std::string name;
    TensorNumerics stats;
  };
  Row& row(NumericsKind kind, const std::string& name);
  std::vector<Row> rows_;
};

// The layer a parameter belongs to: "transformer.h.3.attn.c_attn.weight" -> "transformer.h.3".
std::string layer_of(const std::string& parameter_name);

}  // namespace precis::amp
