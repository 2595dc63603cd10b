// Whether a GPU kernel ran on Tensor Cores, and in which input type, told from
// its name: the rules of the kernel table's "tensor cores" column, all here.
//
// Library kernels spell their instruction and types in the name (cuBLAS, cuBLASLt,
// cuDNN, CUTLASS); ours are known by name. A name matching no rule is a kernel of
// the CUDA cores ("no"). The rules, first match wins:
//  1. Our kernels built on mma.sync or wgmma: precis's flash_forward_kernel,
//     flash_backward_kernel and their _sm90 variants; the type from the template
//     argument (__nv_bfloat16 -> bf16, __half -> fp16).
//  2. Library markers of a Tensor Core kernel: xmma, gmma, hmma, imma, tensorop, nvjet,
//     wgmma, or an MMA shape token (h884, h1688, h16816, s1688, s16816, i8816, i16832;
//     the letter is the accumulator or the input: h fp16, s f32 with fp16/bf16/tf32
//     inputs, i int8).
//  3. The input type: xmma and cuDNN names carry "<A><B>_<math><accumulator>" after
//     gemm_/fprop_/dgrad_/wgrad_ (sm80_xmma_gemm_f32f32_tf32f32_... ran tf32 on f32
//     inputs), so the math type is read first; else the first type word of the name
//     (bf16, e4m3/e5m2 -> fp8, tf32, f16/fp16/half or an h-shape -> fp16, i8/s8/int8 or
//     an i-shape -> int8); else an s-shape with no type word (cutlass's
//     tensorop_s1688gemm) -> tf32; else "?" (nvjet names do not spell their types).
#pragma once

#include <string>

namespace precis::train {

struct TensorCoreUse {
  bool tensor_cores = false;
  std::string input_type;  // "bf16", "fp16", "tf32", "fp8", "int8" or "?"; empty when no Tensor Cores
};

// From a kernel's name (mangled, demangled or shortened by short_kernel_name).
TensorCoreUse tensor_core_use(const std::string& kernel_name);

// "bf16", "tf32", ... for a Tensor Core kernel, "no" for the others: the table's column.
std::string tensor_core_label(const TensorCoreUse& use);

}  // namespace precis::train
