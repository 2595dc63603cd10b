// The kernel table of a traced step: names shortened, time summed per kernel,
// sorted, and shares of the step, checked against hand-computed values.
#include <gtest/gtest.h>

#include "train/kernel_table.h"

using namespace precis;

namespace {

GpuActivity kernel(const std::string& name, int64_t start_ns, int64_t end_ns) {
  return {GpuActivity::Kind::kernel, name, start_ns, end_ns, 7, 0};
}

}  // namespace

TEST(KernelTable, DemanglesCppSymbols) {
  EXPECT_EQ(demangle("_Z3addPfi"), "add(float*, int)");
  EXPECT_EQ(demangle("sm90_xmma_gemm_bf16bf16_bf16f32"), "sm90_xmma_gemm_bf16bf16_bf16f32");
}

TEST(KernelTable, ShortNamesDropReturnTypeParametersAndAnonymousNamespaces) {
  EXPECT_EQ(train::short_kernel_name(
                "void precis::cuda::(anonymous namespace)::layer_norm_forward<__nv_bfloat16, 4>(__nv_bfloat16 "
                "const*, float*, int)"),
            "precis::cuda::layer_norm_forward<__nv_bfloat16, 4>");
  EXPECT_EQ(train::short_kernel_name("void f<(int)2>(void (*)(int), int)"), "f<(int)2>");
  EXPECT_EQ(train::short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"),
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n");
}

TEST(KernelTable, SumsPerKernelMostTimeFirstAndLeavesCopiesOut) {
  std::vector<GpuActivity> activities = {
      kernel("void gelu<float>(float*, int)", 0, 1'000'000),                // 1 ms
      kernel("gemm_kernel", 1'000'000, 4'000'000),                          // 3 ms
      kernel("void gelu<float>(float const*, int)", 5'000'000, 6'500'000),  // 1.5 ms, the same kernel
      {GpuActivity::Kind::memcpy, "Memcpy HtoD", 0, 50'000'000, 7, 4096},
  };
  std::vector<train::KernelTotal> totals = train::kernel_totals(activities);
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_EQ(totals[0].name, "gemm_kernel");
  EXPECT_EQ(totals[0].calls, 1);
  EXPECT_DOUBLE_EQ(totals[0].total_ms, 3.0);
  EXPECT_EQ(totals[1].name, "gelu<float>");
  EXPECT_EQ(totals[1].calls, 2);
  EXPECT_DOUBLE_EQ(totals[1].total_ms, 2.5);

  std::string table = train::kernel_table(totals, 10.0, 1);
  EXPECT_NE(table.find("gemm_kernel"), std::string::npos) << table;
  EXPECT_NE(table.find("3.000"), std::string::npos) << table;
  EXPECT_NE(table.find("30.0%"), std::string::npos) << table;
  EXPECT_EQ(table.find("gelu"), std::string::npos) << "only the top 1 by name:\n" << table;
  EXPECT_NE(table.find("1 other kernels"), std::string::npos) << table;
  EXPECT_NE(table.find("25.0%"), std::string::npos) << table;
}
