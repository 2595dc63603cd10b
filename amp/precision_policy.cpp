#include "amp/precision_policy.h"

#include <sstream>

#include "core/error.h"

namespace precis::amp {

const char* loss_scaling_name(LossScaling scaling) {
  switch (scaling) {
    case LossScaling::none:
      return "none";
    case LossScaling::fixed:
      return "static";
    case LossScaling::dynamic:
      return "dynamic";
  }
  return "?";
}

PrecisionPolicy PrecisionPolicy::preset(const std::string& name) {
  PrecisionPolicy p;
  p.name = name;
  if (name == "fp32") return p;
  if (name == "tf32") {
    p.allow_tf32 = true;
    return p;
  }
  if (name == "fp16") {
    p.compute_dtype = DType::f16;
    p.loss_scaling = LossScaling::dynamic;
    return p;
  }
  if (name == "bf16") {
    p.compute_dtype = DType::bf16;
    return p;
  }
  if (name == "bf16-pure") {
    p.param_dtype = p.compute_dtype = p.output_dtype = DType::bf16;
    p.grad_reduce_dtype = DType::bf16;
    p.master_weights = true;
    return p;
  }
  PRECIS_FAIL("unknown precision preset '", name, "': use fp32, tf32, fp16, bf16, bf16-pure, or a string like ",
              "params=float32,compute=bfloat16,output=float32");
}

void PrecisionPolicy::check_grad_dtype() const {
  const bool low_precision_params = param_dtype == DType::f16 || param_dtype == DType::bf16;
  PRECIS_CHECK(grad_dtype == DType::f32 || (low_precision_params && grad_dtype == param_dtype), "precision '", name,
               "': precision.grad_dtype (grads=) ", dtype_name(grad_dtype), " is not allowed with parameters in ",
               dtype_name(param_dtype), ": use float32",
               low_precision_params ? std::string(" or ") + dtype_name(param_dtype) + " (the parameters' own dtype)"
                                    : std::string(" (gradients of float32/float64 parameters keep their dtype)"));
}

PrecisionPolicy PrecisionPolicy::parse(const std::string& text) {
  if (text.find('=') == std::string::npos) return preset(text);
  PrecisionPolicy p;
  p.name = text;
  bool output_given = false;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t eq = item.find('=');
    PRECIS_CHECK(eq != std::string::npos, "precision '", text, "': '", item, "' is not key=dtype");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    DType dtype = parse_dtype(value);
    PRECIS_CHECK(is_floating(dtype), "precision '", text, "': ", key, " must be a floating dtype, got ", value);
    if (key == "params") {
      p.param_dtype = dtype;
    } else if (key == "compute") {
      p.compute_dtype = dtype;
    } else if (key == "output") {
      p.output_dtype = dtype;
      output_given = true;
    } else if (key == "grads") {
      p.grad_dtype = dtype;
    } else {
      PRECIS_FAIL("precision '", text, "': unknown key '", key, "' (use params, compute, output, grads)");
    }
  }
  if (!output_given) p.output_dtype = p.compute_dtype;
  p.grad_reduce_dtype = p.param_dtype;
  p.check_grad_dtype();
  // Low-precision parameters are updated through f32 master copies (as jmp's mixed policies).
  p.master_weights = p.param_dtype == DType::f16 || p.param_dtype == DType::bf16;
  return p;
}

std::vector<std::string> PrecisionPolicy::validate(int compute_capability) const {
  std::vector<std::string> warnings;
  PRECIS_CHECK(param_dtype != DType::f64 && compute_dtype != DType::f64, "precision '", name,
               "': float64 is for gradient checks, not training policies");
  bool uses_bf16 = param_dtype == DType::bf16 || compute_dtype == DType::bf16 || output_dtype == DType::bf16;
  PRECIS_CHECK(!(uses_bf16 && compute_capability > 0 && compute_capability < 80), "precision '", name,
               "': bfloat16 needs a GPU of compute capability 8.0 or newer (Ampere); this GPU is ",
               compute_capability / 10, ".", compute_capability % 10, ". Use fp16 with dynamic loss scaling");
  check_grad_dtype();
  if (grad_dtype == DType::f16)
    warnings.push_back("precision '" + name +
                       "': float16 gradients (precision.grad_dtype): a gradient past 65504 overflows to inf; the "
                       "loss scaler's check (found_inf) skips such a step, so more steps may be skipped than with "
                       "float32 gradients");
  if (grad_dtype == DType::bf16)
    warnings.push_back(
        "precision '" + name +
        "': bfloat16 gradients (precision.grad_dtype): the contributions to a gradient (batch.grad_accum's "
        "micro-steps, a tied weight's two uses) are summed in bfloat16, rounded to 8 bits of mantissa "
        "at each add; use float32 gradients where that loses too much");
  bool f16 = compute_dtype == DType::f16 || param_dtype == DType::f16;
  if (f16 && loss_scaling == LossScaling::none)
    warnings.push_back("precision '" + name +
                       "': float16 without loss scaling: gradients smaller than 6e-8 "
                       "(float16's smallest subnormal) round to zero, so small gradients are lost. Use the fp16 "
                       "preset (dynamic loss scaling) unless you are demonstrating exactly that");
  if (allow_tf32 && compute_capability == 0)
    warnings.push_back("precision '" + name + "': TF32 is a GPU tensor-core mode; on the CPU this runs as fp32");
  return warnings;
}

std::string PrecisionPolicy::describe() const {
  std::ostringstream out;
  out << name << ": params " << dtype_name(param_dtype) << ", compute " << dtype_name(compute_dtype) << ", output "
      << dtype_name(output_dtype) << ", grads " << dtype_name(grad_dtype) << ", grad reduce "
      << dtype_name(grad_reduce_dtype) << (master_weights ? ", f32 master weights" : "")
      << (allow_tf32 ? ", tf32 matmuls" : "") << ", loss scaling " << loss_scaling_name(loss_scaling);
  return out.str();
}

}  // namespace precis::amp
