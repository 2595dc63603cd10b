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
              "precision 'params=float32,gradients=float16': unknown key 'gradients' (use params, compute, output, "
              "grads)");
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

// precision.grad_dtype: f32 in every preset (the gradients of 16-bit parameters summed
// unrounded); a policy string names it with grads=; it is f32 or the 16-bit parameters' own.
TEST(PrecisionPolicy, GradDtypeIsFloat32InPresetsAndTheParametersOwnOrFloat32Otherwise) {
  for (const char* name : {"fp32", "tf32", "fp16", "bf16", "bf16-pure"})
    EXPECT_EQ(PrecisionPolicy::preset(name).grad_dtype, DType::f32) << name;
  EXPECT_EQ(PrecisionPolicy::parse("params=bf16,compute=bf16").grad_dtype, DType::f32);
  const PrecisionPolicy bf16_grads = PrecisionPolicy::parse("params=bfloat16,compute=bfloat16,grads=bfloat16");
  EXPECT_EQ(bf16_grads.grad_dtype, DType::bf16);
  EXPECT_EQ(bf16_grads.grad_reduce_dtype, DType::bf16);
  EXPECT_NE(bf16_grads.describe().find("grads bfloat16"), std::string::npos) << bf16_grads.describe();
  EXPECT_NE(PrecisionPolicy::preset("bf16-pure").describe().find("grads float32"), std::string::npos);
  EXPECT_EQ(PrecisionPolicy::parse("params=f16,compute=f16,grads=f16").grad_dtype, DType::f16);
  EXPECT_EQ(PrecisionPolicy::parse("params=f32,compute=bf16,grads=f32").grad_dtype, DType::f32);

  auto error_of = [](const char* text) {
    try {
      PrecisionPolicy::parse(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("params=bfloat16,compute=bfloat16,grads=float16"),
            "precision 'params=bfloat16,compute=bfloat16,grads=float16': precision.grad_dtype (grads=) float16 is not "
            "allowed with parameters in bfloat16: use float32 or bfloat16 (the parameters' own dtype)");
  EXPECT_EQ(error_of("params=float32,compute=bfloat16,grads=bfloat16"),
            "precision 'params=float32,compute=bfloat16,grads=bfloat16': precision.grad_dtype (grads=) bfloat16 is "
            "not allowed with parameters in float32: use float32 (gradients of float32/float64 parameters keep their "
            "dtype)");
  // A policy refined field by field (the config's precision.grad_dtype) is checked by validate().
  PrecisionPolicy refined = PrecisionPolicy::preset("bf16");
  refined.grad_dtype = DType::bf16;
  EXPECT_THROW(refined.validate(), Error);
  refined.grad_dtype = DType::f64;
  EXPECT_THROW(refined.validate(), Error);
}

TEST(PrecisionPolicy, ValidateWarnsOnceAboutSixteenBitGradients) {
  PrecisionPolicy pure = PrecisionPolicy::preset("bf16-pure");
  EXPECT_TRUE(pure.validate(90).empty());
  pure.grad_dtype = DType::bf16;
  auto warnings = pure.validate(90);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("bfloat16 gradients"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("grad_accum"), std::string::npos) << "it names the micro-steps' sum: " << warnings[0];

  PrecisionPolicy half = PrecisionPolicy::parse("params=f16,compute=f16,grads=f16");
  half.loss_scaling = LossScaling::dynamic;
  warnings = half.validate();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("found_inf"), std::string::npos) << warnings[0];
}
