// scripts/kernel_categories.py, which groups Precis's and PyTorch's ResNet profiles into the same
// categories (bench/run-resnet-profile.sh): kernel names of both (cuDNN, nvjet, CUTLASS, Inductor's
// Triton kernels, ATen's, Precis's by name and by the op that launched them) and CPU ops land in
// the category they were assigned here by hand, each with a distinct power-of-two time so every
// category's sum tells which rows it took. Needs python3 only.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/source_dir.h"
#include "support/cli.h"

namespace {

namespace fs = std::filesystem;
using precis::testing::python_available;
using precis::testing::run_command;

struct Row {
  const char* kind;
  const char* op;
  const char* name;
  double ms;
};

fs::path write_profile(const std::string& file, double step_ms, const std::vector<Row>& rows) {
  const fs::path dir = fs::temp_directory_path() / "precis_kernel_categories";
  fs::create_directories(dir);
  std::ofstream out(dir / file);
  out << "# a hand-written profile\nkind\top\tname\tcalls\tms\nstep\t-\t-\t1\t" << step_ms << "\n";
  for (const Row& r : rows) out << r.kind << '\t' << r.op << '\t' << r.name << "\t1\t" << r.ms << "\n";
  return dir / file;
}

// The table's rows: category (its first 28 columns) -> the numbers after it.
std::map<std::string, std::vector<double>> table_rows(const std::string& output) {
  std::map<std::string, std::vector<double>> rows;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() <= 28) continue;
    std::string title = line.substr(0, 28);
    title.erase(title.find_last_not_of(' ') + 1);
    std::istringstream rest(line.substr(28));
    std::vector<double> values;
    std::string word;
    while (rest >> word) {
      if (word.back() == '%') word.pop_back();
      try {
        values.push_back(std::stod(word));
      } catch (const std::exception&) {
        values.clear();
        break;
      }
    }
    if (!values.empty()) rows[title] = values;
  }
  return rows;
}

}  // namespace

TEST(KernelCategories, GroupsBothFrameworksKernelsBySideAndCategory) {
  if (!python_available()) GTEST_SKIP() << "no python3 here; scripts/kernel_categories.py needs it";
  const fs::path precis = write_profile(
      "precis.tsv", 16,
      {
          {"kernel", "conv2d fwd",
           "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_"
           "execute_segment_k_off_kernel__5x_cudnn",
           1},
          {"kernel", "conv2d bwd", "sm90_xmma_wgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 2},
          {"kernel", "linear fwd", "nvjet_hsh_64x8_64x16_4x1_v_bz_TNN", 4},
          {"kernel", "conv2d bwd", "precis::cuda::copy_strided_kernel<float, __nv_bfloat16>", 0.5},
          {"kernel", "conv2d bwd", "precis::cuda::accumulate_strided_kernel<float, __nv_bfloat16>", 0.25},
          {"kernel", "batch_norm_relu fwd", "precis::ops::cuda::forward_apply_kernel<__nv_bfloat16>", 0.125},
          {"kernel", "batch_norm_add_relu bwd", "precis::ops::cuda::backward_finalize_kernel", 0.0625},
          {"kernel", "sgd step", "precis::optim::cuda::step_kernel<float>", 8},
          {"kernel", "(outside ops)", "precis::optim::cuda::norm_and_factor_kernel", 0.03125},
          {"copy", "(outside ops)", "Memcpy DtoD", 0.015625},
          {"kernel", "(outside ops)", "mystery_kernel", 0.0078125},
          {"op", "conv2d fwd", "-", 100},  // the op rows are left out where there are kernels
      });
  const fs::path torch = write_profile(
      "torch.tsv", 32,
      {
          {"kernel", "-", "cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, true>", 1},
          {"kernel", "-", "triton_poi_fused__native_batch_norm_legit_functional_relu_3", 2},
          {"kernel", "-", "triton_red_fused__native_batch_norm_legit_functional_native_batch_norm_backward_9", 4},
          {"kernel", "-", "triton_poi_fused__to_copy_7", 8},
          {"kernel", "-", "triton_tem_fused_convolution_0", 16},
          {"kernel", "-", "cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>",
           0.5},
          {"kernel", "-", "cudnn::bn_fw_tr_1C11_kernel_NCHW<__nv_bfloat16, float, float, 512, true, 1, true>", 0.25},
          {"kernel", "-",
           "at::native::multi_tensor_apply_kernel<at::native::TensorListMetadata<3>, "
           "at::native::FusedSgdMathFunctor<float, 3>, float>",
           0.125},
          {"kernel", "-",
           "at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
           "{lambda()#3}::operator()() const::{lambda(float)#1}>",
           0.0625},
          {"kernel", "-", "at::native::vectorized_elementwise_kernel<4, at::native::launch_clamp_scalar>", 0.03125},
          {"copy", "-", "Memset (Device)", 0.015625},
      });
  const auto r = run_command("python3 " + std::string(PRECIS_SOURCE_DIR) + "/scripts/kernel_categories.py " +
                             precis.string() + " " + torch.string() + " --labels Precis,PyTorch --step-ms 20,");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rows = table_rows(r.output);
  // category -> {Precis ms, Precis %, PyTorch ms, PyTorch %, difference}
  const std::map<std::string, std::pair<double, double>> expected = {
      {"convolution & fc", {1 + 2 + 4, 16 + 0.5}},
      {"batch norm / elementwise", {0.125 + 0.0625, 2 + 4 + 0.25 + 0.03125}},
      {"optimizer", {8 + 0.03125, 0.125}},
      {"copies & layout", {0.5 + 0.25 + 0.015625, 1 + 8 + 0.0625 + 0.015625}},
      {"other", {0.0078125, 0}},
  };
  double precis_sum = 0, torch_sum = 0;
  for (const auto& [category, ms] : expected) {
    ASSERT_EQ(rows[category].size(), 5u) << category << "\n" << r.output;
    EXPECT_NEAR(rows[category][0], ms.first, 1e-3) << category << "\n" << r.output;
    EXPECT_NEAR(rows[category][1], 100 * ms.first / 20, 0.05) << category << ": % of the --step-ms step";
    EXPECT_NEAR(rows[category][2], ms.second, 1e-3) << category << "\n" << r.output;
    EXPECT_NEAR(rows[category][3], 100 * ms.second / 32, 0.05) << category << ": % of the profile's step";
    EXPECT_NEAR(rows[category][4], ms.first - ms.second, 2e-3) << category;
    precis_sum += ms.first, torch_sum += ms.second;
  }
  EXPECT_NEAR(rows["step"][0], 20, 1e-3) << r.output;
  EXPECT_NEAR(rows["step"][2], 32, 1e-3) << r.output;
  EXPECT_NEAR(rows["step - sum (gaps, host)"][0], 20 - precis_sum, 2e-3) << r.output;
  EXPECT_NEAR(rows["step - sum (gaps, host)"][2], 32 - torch_sum, 2e-3) << r.output;
  // One call each: 11 kernels and copies a side (Precis's op row is not a launch).
  EXPECT_EQ(rows["launches (calls) per step"], (std::vector<double>{11, 11, 0})) << r.output;
}

// Without kernels (a CPU run) each side's ops are grouped: Precis's by op name, PyTorch's ATen
// ops by self time, those under optimizer.step() marked "optimizer".
TEST(KernelCategories, GroupsCpuOpsWhenThereAreNoKernels) {
  if (!python_available()) GTEST_SKIP() << "no python3 here; scripts/kernel_categories.py needs it";
  const fs::path precis = write_profile("precis_cpu.tsv", 100,
                                        {{"op", "conv2d fwd", "-", 1},
                                         {"op", "conv2d bwd", "-", 2},
                                         {"op", "batch_norm_relu bwd", "-", 4},
                                         {"op", "sgd step", "-", 8},
                                         {"op", "grad_norm step", "-", 16},
                                         {"op", "AccumulateGrad bwd", "-", 32}});
  const fs::path torch = write_profile("torch_cpu.tsv", 100,
                                       {{"op", "-", "aten::mkldnn_convolution", 1},
                                        {"op", "-", "aten::native_batch_norm", 2},
                                        {"op", "optimizer", "aten::add_", 4},
                                        {"op", "-", "aten::add_", 8},
                                        {"op", "-", "aten::copy_", 16},
                                        {"op", "-", "aten::empty", 32}});
  const auto r = run_command("python3 " + std::string(PRECIS_SOURCE_DIR) + "/scripts/kernel_categories.py " +
                             precis.string() + " " + torch.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rows = table_rows(r.output);
  const std::map<std::string, std::pair<double, double>> expected = {
      {"convolution & fc", {3, 1}}, {"batch norm / elementwise", {4, 2 + 8}},
      {"optimizer", {24, 4}},       {"copies & layout", {32, 16}},
      {"other", {0, 32}},
  };
  for (const auto& [category, ms] : expected) {
    ASSERT_EQ(rows[category].size(), 5u) << category << "\n" << r.output;
    EXPECT_NEAR(rows[category][0], ms.first, 1e-3) << category << "\n" << r.output;
    EXPECT_NEAR(rows[category][2], ms.second, 1e-3) << category << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("sum (ops/ops)"), std::string::npos) << r.output;
}

// scripts/torch_resnet_profile.py reads the profiler's Chrome trace: on a GPU the kernels and
// copies (names shortened as Precis's kernel table does, flow events and CPU ops left out); on
// the CPU the ops by self time (less their direct children), optimizer.step()'s marked.
TEST(KernelCategories, TorchProfileReadsTheTraceAsPrecisReadsItsSteps) {
  if (std::system("python3 -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 cannot import torch, which scripts/torch_resnet_profile.py needs";
  const fs::path dir = fs::temp_directory_path() / "precis_kernel_categories";
  fs::create_directories(dir);
  const std::string kernel =
      "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::F>"
      "(int, at::native::F, at::detail::Array<char*, 2>)";
  std::ofstream(dir / "gpu.json")
      << "{\"traceEvents\": [\n"
      << "{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"" << kernel << "\", \"ts\": 0, \"dur\": 10},\n"
      << "{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"" << kernel << "\", \"ts\": 20, \"dur\": 30},\n"
      << R"json({"ph": "X", "cat": "kernel", "name": "triton_poi_fused_relu_0", "ts": 60, "dur": 4},
{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 70, "dur": 2},
{"ph": "s", "cat": "ac2g", "name": "ac2g", "ts": 0},
{"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 0, "dur": 100}
]})json";
  std::ofstream(dir / "cpu.json") << R"json({"traceEvents": [
{"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
{"ph": "X", "cat": "cpu_op", "name": "aten::convolution", "pid": 1, "tid": 1, "ts": 10, "dur": 80},
{"ph": "X", "cat": "cpu_op", "name": "aten::mkldnn_convolution", "pid": 1, "tid": 1, "ts": 20, "dur": 60},
{"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1, "ts": 200, "dur": 50},
{"ph": "X", "cat": "cpu_op", "name": "aten::add_", "pid": 1, "tid": 1, "ts": 210, "dur": 20},
{"ph": "X", "cat": "cpu_op", "name": "aten::add_", "pid": 1, "tid": 2, "ts": 210, "dur": 6}
]})json";
  auto rows = [&](const std::string& trace) {
    const std::string program =
        "import torch_resnet_profile as t\n"
        "rows = t.profile_rows('" +
        (dir / trace).string() +
        "', 2)\n"
        "for r in sorted(rows, key=lambda r: (r['kind'], r['op'], r['name'])):\n"
        "    print('%s|%s|%s|%g|%g' % (r['kind'], r['op'], r['name'], r['calls'], r['ms']))\n";
    std::ofstream(dir / "rows.py") << program;
    const auto r = run_command("PYTHONPATH=" + std::string(PRECIS_SOURCE_DIR) + "/scripts python3 " +
                               (dir / "rows.py").string() + " 2>/dev/null");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  // Two steps: each row is halved. Durations are in microseconds.
  EXPECT_EQ(rows("gpu.json"),
            "copy|-|Memcpy DtoD (Device -> Device)|0.5|0.001\n"
            "kernel|-|at::native::vectorized_elementwise_kernel<4, at::native::F>|1|0.02\n"
            "kernel|-|triton_poi_fused_relu_0|0.5|0.002\n");
  EXPECT_EQ(rows("cpu.json"),
            "op|-|aten::add_|0.5|0.003\n"
            "op|-|aten::conv2d|0.5|0.01\n"
            "op|-|aten::convolution|0.5|0.01\n"
            "op|-|aten::mkldnn_convolution|0.5|0.03\n"
            "op|optimizer|aten::add_|0.5|0.01\n");
}
