// DDP gradient buckets: which slices of the flat gradient buffers
// (nn/flat_parameters.h) are all-reduced together.
//
// Gradients become ready roughly in reverse registration order (the last layer's
// first), so buckets are filled from the last parameter backwards: a bucket is
// the slots of one buffer (one dtype: a bucket never mixes them) from its lowest
// slot's offset to the end of its highest, a dense slice of the gradient buffer,
// and it closes once its gradients reach the size limit. The first bucket of each
// buffer closes at the small `first_bytes` (about 1 MB), so the first all-reduce
// starts early in the backward; the others at `bytes` (about 25 MB, PyTorch DDP's
// default). A parameter larger than the limit is a bucket of its own. Bytes count
// elements of the gradient buffer's dtype. Buckets are listed buffer by buffer,
// each buffer's from its last parameter to its first: the order their gradients
// are expected, and the order every rank launches their all-reduces in.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace precis::nn {
class FlatParameters;
}

namespace precis::distributed {

struct BucketSizes {
  int64_t first_bytes = int64_t{1} << 20;
  int64_t bytes = int64_t{25} << 20;
};

// Where a parameter's gradient lies in its buffer, in elements.
struct SlotExtent {
  int64_t offset = 0;
  int64_t numel = 0;
};

// One flat buffer as bucketing sees it: its gradient dtype and its slots in registration
// order; for ZeRO-1, its elements (padding included) and the alignment of its slots, in elements.
struct BufferLayout {
  DType grad_dtype = DType::f32;
  std::vector<SlotExtent> slots;
  int64_t numel = 0;
  int64_t alignment = 1;
};

struct Bucket {
  size_t buffer = 0;          // index of the flat buffer
  std::vector<size_t> slots;  // indices into the buffer's slots, last registered first
  int64_t begin = 0;          // the slice [begin, end) of the buffer's gradient, in elements
  int64_t end = 0;
};

// The buckets of `buffers` (only floating ones: other parameters have no gradient).
std::vector<Bucket> assign_buckets(const std::vector<BufferLayout>& buffers, const BucketSizes& sizes);
// ZeRO-1's buckets (distributed/zero.h): slices that tile each floating buffer from its end
// backwards, the first of about `first_bytes`, then about `bytes`, each rounded up to a
// multiple of world_size * alignment elements (the buffer's numel is one: nn::flatten_parameters'
// `shards`), so every rank's chunk of a bucket starts aligned. A bucket's slots are those it
// overlaps, last registered first: a parameter may straddle two buckets, and a bucket of
// padding only has none.
std::vector<Bucket> assign_shard_buckets(const std::vector<BufferLayout>& buffers, const BucketSizes& sizes,
                                         int world_size);
// The layouts of a model's flat buffers.
std::vector<BufferLayout> layout_of(const nn::FlatParameters& flat);

}  // namespace precis::distributed
