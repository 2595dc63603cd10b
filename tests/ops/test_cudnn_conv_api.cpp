// The switch between cuDNN's two convolution APIs (ops::cudnn_conv_api): PRECIS_CUDNN_CONV is
// read once, an unknown value is an error naming the known ones, and a setting made in code
// wins. Alone in its program, so that nothing has read the switch before.
#include <gtest/gtest.h>

#include <cstdlib>

#include "ops/conv.h"
#include "support/errors.h"

using namespace precis;

TEST(CudnnConvApi, ReadsTheEnvironmentOnceUntilSetInCode) {
  ASSERT_EQ(setenv("PRECIS_CUDNN_CONV", "fast", 1), 0);
  precis::testing::expect_error([] { ops::cudnn_conv_api(); }, "set it to legacy");
  ASSERT_EQ(setenv("PRECIS_CUDNN_CONV", "graph", 1), 0);
  EXPECT_EQ(ops::cudnn_conv_api(), ops::CudnnConvApi::graph);
  ASSERT_EQ(setenv("PRECIS_CUDNN_CONV", "legacy", 1), 0);
  EXPECT_EQ(ops::cudnn_conv_api(), ops::CudnnConvApi::graph) << "read once";
  ops::set_cudnn_conv_api(ops::CudnnConvApi::legacy);
  EXPECT_EQ(ops::cudnn_conv_api(), ops::CudnnConvApi::legacy);
  ops::set_cudnn_conv_api(ops::CudnnConvApi::graph);
  EXPECT_EQ(ops::cudnn_conv_api(), ops::CudnnConvApi::graph);
  unsetenv("PRECIS_CUDNN_CONV");
}
