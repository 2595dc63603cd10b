#include "distributed/buckets.h"

#include "core/error.h"
#include "nn/flat_parameters.h"

namespace precis::distributed {

std::vector<Bucket> assign_buckets(const std::vector<BufferLayout>& buffers, const BucketSizes& sizes) {
  PRECIS_CHECK(sizes.first_bytes > 0 && sizes.bytes > 0, "distributed.bucket_mb: bucket sizes must be positive, got ",
               sizes.first_bytes, " and ", sizes.bytes, " bytes");
  std::vector<Bucket> buckets;
  for (size_t b = 0; b < buffers.size(); ++b) {
    const BufferLayout& buffer = buffers[b];
    if (!is_floating(buffer.grad_dtype)) continue;
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

std::vector<BufferLayout> layout_of(const nn::FlatParameters& flat) {
  std::vector<BufferLayout> layouts;
  for (const nn::FlatBuffer& buffer : flat.buffers()) {
    BufferLayout& layout = layouts.emplace_back();
    layout.grad_dtype = buffer.grad.dtype();
    for (const nn::FlatSlot& slot : buffer.slots) layout.slots.push_back({slot.offset, slot.numel});
  }
  return layouts;
}

}  // namespace precis::distributed
