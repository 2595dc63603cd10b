// conv2d's three directions on cuDNN's graph (backend) API (ops/cuda/conv_graph.cu), which
// ops/cuda/conv.cu dispatches to under ops::CudnnConvApi::graph. Include only from
// ops/cuda/*.cu files.
#pragma once

#include "ops/cuda/conv_problem.h"

namespace precis::ops::cuda {

// Runs one direction of the problem on `device`'s compute stream, on the buffers `io` (dense
// in `format`, of `dtype`), adding into io.out where io.out_bytes_to_keep says it holds a sum
// (backward-data's accumulate: beta = 1). Returns false, having run nothing, where no engine
// of the graph API runs this problem (said once on stderr): the caller takes the legacy path.
bool conv2d_graph(Direction direction, const Conv2dShapes& s, MemoryFormat format, DType dtype, const Buffers& io,
                  Device device);

}  // namespace precis::ops::cuda
