// What conv2d's two cuDNN paths share (ops/cuda/conv.cu, the legacy convolution API;
// ops/cuda/conv_graph.cu, the graph API): the key of a problem whose choice is cached, the
// buffers of a direction, the workspace bound, and whether a first meeting may time its
// candidates. Include only from ops/cuda/*.cu files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cuda/runtime.h"
#include "core/tensor.h"
#include "ops/conv.h"
#include "ops/cuda/conv.h"
#include "ops/matmul.h"

namespace precis::ops::cuda {

inline constexpr const char* kConvOp = "conv2d";
// The largest workspace a convolution may take (an algorithm or engine needing more is skipped).
inline constexpr size_t kMaxWorkspaceBytes = size_t(1) << 30;

enum class Direction { forward, backward_data, backward_filter };

// One problem: its device, dtype, layout, direction, precision switches and geometry.
struct AlgoKey {
  int device, dtype, format, direction;
  bool tf32, benchmark;
  int64_t N, Cin, H, W, Cout, kH, kW, sh, sw, ph, pw, dh, dw, groups;
  auto operator<=>(const AlgoKey&) const = default;
};

// Whether an f32 convolution may run on TF32 tensor cores (the precision policy's allow_tf32).
inline bool uses_tf32(DType dtype) { return dtype == DType::f32 && allow_tf32(); }

inline AlgoKey key_of(const Conv2dShapes& s, MemoryFormat format, DType dtype, Direction direction, bool benchmark,
                      Device device) {
  const Conv2dOptions& o = s.options;
  return {device.index,
          static_cast<int>(dtype),
          static_cast<int>(format),
          static_cast<int>(direction),
          uses_tf32(dtype),
          benchmark,
          s.N,
          s.Cin,
          s.H,
          s.W,
          s.Cout,
          s.kH,
          s.kW,
          o.stride[0],
          o.stride[1],
          o.padding[0],
          o.padding[1],
          o.dilation[0],
          o.dilation[1],
          o.groups};
}

// The buffers a direction reads and writes, in cuDNN's argument order: forward x, w, y;
// backward-data w, dy, dx; backward-filter x, dy, dw.
struct Buffers {
  const void* a;
  const void* b;
  void* out;
  size_t out_bytes_to_keep = 0;  // out holds a sum being added to: timing writes into scratch of this size
};

// Whether the first meeting of a problem times its candidates on the GPU: with
// cudnn_benchmark(), unless a CUDA-graph capture is under way (it cannot take the timing
// runs, nor their waits on the host).
inline bool may_time(bool benchmark) { return benchmark && !precis::cuda::any_capture_underway(); }

// Before timing runs on `device`, where weight gradients run on the side stream
// (ops::conv_wgrad_stream, core/cuda/side_stream.h): waits for its compute and side streams, so
// that no work of the other one runs beside them. With the side stream off it waits for nothing,
// so the timing (and the plan it picks) is what it was before the side stream existed: a plain-f32
// problem was seen to get a less accurate plan on an H100 (bench/NOTES.md, seventh session,
// item 10), its cause not yet known.
inline void quiesce_for_timing(Device device) {
  if (ops::conv_wgrad_stream()) precis::cuda::synchronize(device);
}

// The buffers the timing runs use: io, with `out` moved into `scratch` (allocated here on the
// caching allocator) when io.out holds a sum that the timing runs must not add into.
inline Buffers timing_buffers(const Buffers& io, Device device, Tensor& scratch) {
  if (io.out_bytes_to_keep == 0) return io;
  scratch = empty({static_cast<int64_t>(io.out_bytes_to_keep)}, DType::u8, device);
  Buffers timing = io;
  timing.out = scratch.raw_data();
  return timing;
}

}  // namespace precis::ops::cuda
