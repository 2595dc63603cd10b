#include <gtest/gtest.h>

#include "amp/precision_policy.h"

using namespace precis;
using amp::LossScaling;
using amp::PrecisionPolicy;

TEST(PrecisionPolicy, Presets) {
  PrecisionPolicy fp32 = PrecisionPolicy::preset("fp32");
  EXPECT_EQ(fp32.compute_dtype, DType::f32);
  EXPECT_FALSE(fp32.allow_tf32);
  EXPECT_FALSE(fp32.autocasts());
  EXPECT_TRUE(PrecisionPolicy::preset("tf32").allow_tf32);
  PrecisionPolicy fp16 = PrecisionPolicy::preset("fp16");
  EXPECT_EQ(fp16.param_dtype, DType::f32);
  EXPECT_EQ(fp16.compute_dtype, DType::f16);
  EXPECT_EQ(fp16.loss_scaling, LossScaling::dynamic);
  EXPECT_TRUE(fp16.autocasts());
  PrecisionPolicy bf16 = PrecisionPolicy::preset("bf16");
  EXPECT_EQ(bf16.compute_dtype, DType::bf16);
  EXPECT_EQ(bf16.loss_scaling, LossScaling::none);
  PrecisionPolicy pure = PrecisionPolicy::preset("bf16-pure");
  EXPECT_EQ(pure.param_dtype, DType::bf16);
  EXPECT_TRUE(pure.master_weights);
  EXPECT_FALSE(pure.autocasts());
}

TEST(PrecisionPolicy, JmpStrings) {
  PrecisionPolicy p = PrecisionPolicy::parse("params=float32,compute=bfloat16,output=float32");
  EXPECT_EQ(p.param_dtype, DType::f32);
  EXPECT_EQ(p.compute_dtype, DType::bf16);
  EXPECT_EQ(p.output_dtype, DType::f32);
  EXPECT_FALSE(p.master_weights);
  PrecisionPolicy half = PrecisionPolicy::parse("params=bf16,compute=bf16");
  EXPECT_TRUE(half.master_weights);
  EXPECT_EQ(half.output_dtype, DType::bf16) << "output defaults to the compute dtype";
  EXPECT_EQ(PrecisionPolicy::parse("params=float32,compute=float16").loss_scaling, LossScaling::none);
}

TEST(PrecisionPolicy, ErrorsSayWhatIsAccepted) {
  try {
    PrecisionPolicy::parse("fp8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "unknown precision preset 'fp8': use fp32, tf32, fp16, bf16, bf16-pure, or a string like "
              "params=float32,compute=bfloat16,output=float32");
  }
  try {
    PrecisionPolicy::parse("params=float32,gradients=float16");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "precision 'params=float32,gradients=float16': unknown key 'gradients' (use params, compute, output)");
  }
  EXPECT_THROW(PrecisionPolicy::parse("params=int32"), Error);
  EXPECT_THROW(PrecisionPolicy::parse("params=float64").validate(), Error);
}

TEST(PrecisionPolicy, ValidateWarnsOnFp16WithoutScalingAndRejectsBf16OnOldGpus) {
  auto warnings = PrecisionPolicy::parse("params=float32,compute=float16").validate();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("float16 without loss scaling"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("6e-8"), std::string::npos) << "the warning explains underflow";
  EXPECT_TRUE(PrecisionPolicy::preset("fp16").validate().empty());
  EXPECT_TRUE(PrecisionPolicy::preset("bf16").validate(90).empty());
  try {
    PrecisionPolicy::preset("bf16").validate(75);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16 needs a GPU of compute capability 8.0"), std::string::npos);
  }
  EXPECT_EQ(PrecisionPolicy::preset("tf32").validate(0).size(), 1u) << "tf32 on the CPU is noted";
}
