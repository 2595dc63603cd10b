#include "distributed/buckets.h"

#include <algorithm>

#include "core/error.h"
#include "nn/flat_parameters.h"

namespace precis::distributed {

namespace {

void check_sizes(const BucketSizes& sizes) {
  PRECIS_CHECK(sizes.first_bytes > 0 && sizes.bytes > 0, "distributed.bucket_mb: bucket sizes must be positive, got ",
               sizes.first_bytes, " and ", sizes.bytes, " bytes");
}

}  // namespace

std::vector<Bucket> assign_buckets(const std::vector<BufferLayout>& buffers, const BucketSizes& sizes) {
  check_sizes(sizes);
  std::vector<Bucket> buckets;
  for (size_t b = 0; b < buffers.size(); ++b) {
    const BufferLayout& buffer = buffers[b];
    if (!is_floating(buffer.grad_dtype)) continue;  // no gradients
    const int64_t element_bytes = static_cast<int64_t>(element_size(buffer.grad_dtype));
    int64_t limit = sizes.first_bytes;
    Bucket open{b, {}, 0, 0};
    int64_t open_bytes = 0;
    for (size_t s = buffer.slots.size(); s-- > 0;) {
      const SlotExtent& slot = buffer.slots[s];
      if (open.slots.empty()) open.end = slot.offset + slot.numel;
      open.slots.push_back(s);
      open.begin = slot.offset;
      open_bytes += slot.numel * element_bytes;
      if (open_bytes >= limit) {
        buckets.push_back(std::move(open));
        open = Bucket{b, {}, 0, 0};
        open_bytes = 0;
        limit = sizes.bytes;
      }
    }
    if (!open.slots.empty()) buckets.push_back(std::move(open));
  }
  return buckets;
}

std::vector<Bucket> assign_shard_buckets(const std::vector<BufferLayout>& buffers, const BucketSizes& sizes,
                                         int world_size) {
  check_sizes(sizes);
  std::vector<Bucket> buckets;
  for (size_t b = 0; b < buffers.size(); ++b) {
    const BufferLayout& buffer = buffers[b];
    if (!is_floating(buffer.grad_dtype)) continue;  // no gradients
    const int64_t granule = world_size * buffer.alignment;
    PRECIS_CHECK(buffer.numel % granule == 0, "zero-1 buckets: flat buffer ", b, " has ", buffer.numel,
                 " elements, not a multiple of ", granule, " (world size ", world_size, " x alignment ",
                 buffer.alignment, "); flatten the parameters with shards = world size (nn::flatten_parameters)");
    const int64_t element_bytes = static_cast<int64_t>(element_size(buffer.grad_dtype));
    int64_t limit = sizes.first_bytes;
    for (int64_t end = buffer.numel; end > 0;) {
      const int64_t elements = (limit / element_bytes + granule - 1) / granule * granule;
      Bucket bucket{b, {}, std::max<int64_t>(0, end - std::max(elements, granule)), end};
      for (size_t s = buffer.slots.size(); s-- > 0;) {
        const SlotExtent& slot = buffer.slots[s];
        if (slot.offset < bucket.end && slot.offset + slot.numel > bucket.begin) bucket.slots.push_back(s);
      }
      end = bucket.begin;
      buckets.push_back(std::move(bucket));
      limit = sizes.bytes;
    }
  }
  return buckets;
}

std::vector<BufferLayout> layout_of(const nn::FlatParameters& flat) {
  std::vector<BufferLayout> layouts;
  for (const nn::FlatBuffer& buffer : flat.buffers()) {
    BufferLayout& layout = layouts.emplace_back();
    layout.grad_dtype = buffer.grad.dtype();
    layout.numel = buffer.grad.numel();
    layout.alignment = nn::flat_alignment_elements(buffer.dtype, buffer.grad.dtype());
    for (const nn::FlatSlot& slot : buffer.slots) layout.slots.push_back({slot.offset, slot.numel});
  }
  return layouts;
}

}  // namespace precis::distributed
