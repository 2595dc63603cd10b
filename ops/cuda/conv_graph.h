// conv2d's three directions on cuDNN's graph (backend) API (ops/cuda/conv_graph.cu), which
// ops/cuda/conv.cu dispatches to under ops::CudnnConvApi::graph. Include only from
// ops/cuda/*.cu files.
#pragma once

#include "ops/cuda/conv_problem.h"

namespace precis::ops::cuda {

// Runs one direction of the problem on `device`'s compute stream, on the buffers `io` (dense
// in `format`; the inputs of `dtype`, io.out of `out_dtype`: a 16-bit convolution may write an
// f32 output, such as a weight gradient straight into an f32 .grad), adding into io.out where
// io.out_bytes_to_keep says it holds a sum (beta = 1). Returns false, having run nothing, where
// no engine of the graph API runs this problem (said once on stderr): the caller takes the
// legacy path (for `out_dtype` == `dtype`) or writes a `dtype` output and converts it.
bool conv2d_graph(Direction direction, const Conv2dShapes& s, MemoryFormat format, DType dtype, DType out_dtype,
                  const Buffers& io, Device device);

}  // namespace precis::ops::cuda
