// Tensor Core detection from kernel names (train/tensor_cores.h), over names of
// real kernels: cuBLAS/cuBLASLt and cuDNN of several GPU generations, CUTLASS,
// and ours (the ones the kernel table of a traced step shows, bench/NOTES.md).
#include <gtest/gtest.h>

#include "train/kernel_table.h"
#include "train/tensor_cores.h"

using precis::train::tensor_core_label;
using precis::train::tensor_core_use;

namespace {

std::string label(const std::string& name) { return tensor_core_label(tensor_core_use(name)); }

}  // namespace

TEST(TensorCores, CublasAndCudnnHopperNamesGiveTheirMathType) {
  EXPECT_EQ(label("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_"
                  "off_kernel__5x_cublas"),
            "bf16");
  EXPECT_EQ(label("sm90_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x256x64_cgasize1x2x1_warpgroupsize2x1x1"), "fp16");
  EXPECT_EQ(label("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel"),
            "tf32");
  EXPECT_EQ(label("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1"
                  "x1_g1_execute_kernel__5x_cudnn"),
            "bf16");
  EXPECT_EQ(label("sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x64x32"), "tf32");
  EXPECT_EQ(label("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_kernel__5x_cublas"),
            "fp8");
}

TEST(TensorCores, AmpereVoltaTuringAndCutlassNamesByShapeAndTypeWords) {
  EXPECT_EQ(label("ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_nn"), "bf16");
  EXPECT_EQ(label("ampere_h16816gemm_256x128_ldg8_stages_32x3_nn"), "fp16");
  EXPECT_EQ(label("volta_h884gemm_128x128_ldg8_nn"), "fp16");
  EXPECT_EQ(label("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn"), "fp16");
  EXPECT_EQ(
      label("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(cutlass_80_"
            "tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8::Params)"),
      "bf16");
  EXPECT_EQ(label("cutlass_80_tensorop_s1688gemm_64x64_16x3_nn_align4"), "tf32");
  EXPECT_EQ(label("cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_tn_align8"), "fp16");
  EXPECT_EQ(label("ampere_int8_i16832gemm_int8_256x128_ldg16_stages_64x3_nt"), "int8");
}

TEST(TensorCores, NvjetKernelsRunOnTensorCoresWithTheirTypeUnnamed) {
  EXPECT_EQ(label("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNT"), "?");
  EXPECT_TRUE(tensor_core_use("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN").tensor_cores);
}

TEST(TensorCores, OurFlashKernelsFromTheirTemplateArgument) {
  using precis::train::short_kernel_name;
  EXPECT_EQ(
      label(short_kernel_name("void precis::cuda::(anonymous namespace)::flash_forward_sm90_kernel<__nv_bfloat16, "
                              "64, 2, 128, 1>(precis::cuda::HeadsView<__nv_bfloat16 const>, float*)")),
      "bf16");
  EXPECT_EQ(label("void precis::cuda::(anonymous namespace)::flash_backward_kernel<__half>(float*, int)"), "fp16");
  EXPECT_EQ(label("precis::cuda::flash_forward_kernel<__nv_bfloat16, 64>"), "bf16");
}

TEST(TensorCores, CudaCoreKernelsAreNot) {
  for (const char* name :
       {"ampere_sgemm_128x64_nn", "gemmSN_TN_kernel",
        "gemv2T_kernel_val<int, int, float, float, float, float, 128, 16>",
        "cublasLt::splitKreduce_kernel<32, 16, int, float, float, float>",
        "implicit_convolve_sgemm<float, float, 1024>", "ampere_scudnn_128x64_relu_interior_nn_v1",
        "precis::cuda::layer_norm_forward<__nv_bfloat16, 4>", "precis::cuda::flash_delta_kernel<__nv_bfloat16>",
        "precis::cuda::flash_dq_kernel<__half>", "precis::cuda::column_sums<__nv_bfloat16>"}) {
    EXPECT_EQ(label(name), "no") << name;
  }
}

TEST(TensorCores, KernelTableShowsTheColumn) {
  using namespace precis;
  std::vector<GpuActivity> activities = {
      {GpuActivity::Kind::kernel, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 0, 2'000'000, 7, 0},
      {GpuActivity::Kind::kernel, "void precis::cuda::gelu<float>(float*, int)", 2'000'000, 3'000'000, 7, 0}};
  std::vector<train::KernelTotal> totals = train::kernel_totals(activities);
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_EQ(totals[0].tensor_cores, "bf16");
  EXPECT_EQ(totals[1].tensor_cores, "no");
  const std::string table = train::kernel_table(totals, 3.0);
  EXPECT_NE(table.find(" TC "), std::string::npos) << table;
  EXPECT_NE(table.find(" bf16 "), std::string::npos) << table;
}
