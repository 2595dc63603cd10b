// PrecisionPolicy: which dtype each kind of tensor has during training
// (docs/architecture.md, "Precision policies"), as one value object.
//
//   param_dtype        the model's parameters (what the optimizer updates, unless master weights)
//   compute_dtype      matmuls, linear layers and attention (autocast's lower-precision list)
//   output_dtype       what the model's outputs (logits, loss inputs) are cast to
//   grad_dtype         the flat gradient buffer of f16/bf16 parameters: float32 (the default:
//                      gradients summed unrounded) or the parameters' own dtype (half the
//                      bytes, as llm.c and PyTorch keep a bf16 parameter's .grad); f32 and
//                      f64 parameters' gradients keep their own dtype
//   grad_reduce_dtype  gradients as they are all-reduced across ranks
//   master_weights     keep an f32 copy of low-precision parameters in the optimizer
//   allow_tf32         let f32 matmuls use TF32 tensor cores (GPU only)
//   loss_scaling       none | static (a fixed factor) | dynamic (GradScaler)
//
// Presets: fp32, tf32, fp16 (f32 params, f16 compute, dynamic scaling), bf16
// (f32 params, bf16 compute), bf16-pure (bf16 params, f32 master weights).
// jmp-style strings name the dtypes directly:
// "params=float32,compute=bfloat16,output=float32" (no loss scaling), and
// "params=bfloat16,compute=bfloat16,grads=bfloat16" for the gradient buffer's dtype.
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"

namespace precis::amp {

enum class LossScaling { none, fixed, dynamic };

struct PrecisionPolicy {
  std::string name = "fp32";
  DType param_dtype = DType::f32;
  DType compute_dtype = DType::f32;
  DType output_dtype = DType::f32;
  DType grad_dtype = DType::f32;
  DType grad_reduce_dtype = DType::f32;
  bool master_weights = false;
  bool allow_tf32 = false;
  LossScaling loss_scaling = LossScaling::none;
  double static_scale = 1.0;  // with LossScaling::fixed

  static PrecisionPolicy preset(const std::string& name);
  // A preset name or a jmp-style string; errors say what is accepted.
  static PrecisionPolicy parse(const std::string& text);

  // Whether ops autocast (compute dtype differs from the parameters').
  bool autocasts() const { return compute_dtype != param_dtype; }
  // Checks the combination; returns warnings to print (e.g. f16 compute without
  // loss scaling). `compute_capability` is the GPU's (major*10+minor), 0 on the CPU.
  std::vector<std::string> validate(int compute_capability = 0) const;
  // grad_dtype is float32 or the f16/bf16 parameters' own dtype; the error names the field and what is allowed.
  void check_grad_dtype() const;
  // One line: "bf16: params float32, compute bfloat16, output float32, ..."
  std::string describe() const;
};

const char* loss_scaling_name(LossScaling scaling);

}  // namespace precis::amp
