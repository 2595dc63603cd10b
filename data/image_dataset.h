// ImageDataset: batches of normalised, augmented images from an ImageSet.
//
// The examples form one stream, epoch after epoch, in file order or in a seeded
// random order per epoch (data/window_order.h: the set is one shard whose windows are
// the examples). A batch takes the next B (under data parallelism, rank r takes rows
// r*B..r*B+B-1 of every B*world_size). Each image is made as torchvision's
// RandomCrop(size, padding) + RandomHorizontalFlip + ToTensor + Normalize would: the image
// padded with `crop_padding` zero pixels on each side, a size x size window cropped at a
// random offset, mirrored left-right with probability 1/2, scaled to [0, 1], then
// (x - mean[c]) / std[c]. The crop offset and the flip come from Philox on (seed, epoch,
// example), so a batch depends only on its place in the stream, not on threads or resumes.
//
// A background thread (data/prefetch_queue.h) keeps `prefetch_depth` batches ready,
// in pinned memory when `pinned` (a GPU run), so a batch's copy to the device is
// queued at once and the next batch is made while the step runs.
//
// position() says where the next batch starts; saved with a checkpoint and given to
// restore(), the dataset continues with exactly the batches it would have produced.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/json.h"
#include "core/tensor.h"
#include "data/image_files.h"
#include "data/prefetch_queue.h"
#include "data/window_order.h"

namespace precis {

// Per-channel normalisation on the [0, 1] pixel scale: (x - mean[c]) / std[c].
struct ImageNormalization {
  std::vector<float> mean, std;  // one per channel
};

struct ImageDatasetOptions {
  int64_t batch_size = 1;  // B, rows per rank
  bool shuffle = true;
  uint64_t seed = 0;
  ImageNormalization normalization;
  int64_t crop_padding = 0;  // 0: no random crop
  bool flip = false;         // random horizontal flip
  bool prefetch = true;
  int64_t prefetch_depth = 2;
  bool pinned = false;  // batches in pinned memory
  int64_t rank = 0;
  int64_t world_size = 1;
};

struct ImageBatch {
  Tensor images;  // f32 [B, C, H, W] on the CPU, contiguous (pinned when asked)
  Tensor labels;  // i32 [B]
};

struct ImageDatasetPosition {
  WindowCursor cursor;
  bool shuffle = false;
  uint64_t seed = 0;
  int64_t count = 0;  // examples in the set; restore() checks it

  // {"epoch", "example", "shuffle", "seed", "count"}; the seed as its int64 bit pattern.
  Json to_json() const;
  static ImageDatasetPosition from_json(const Json& json);
  friend bool operator==(const ImageDatasetPosition&, const ImageDatasetPosition&) = default;
};

// Images [first, first + count) of `set` in order, normalised, not augmented (evaluation).
ImageBatch image_batch(const ImageSet& set, int64_t first, int64_t count, const ImageNormalization& normalization,
                       bool pinned = false);

class ImageDataset {
 public:
  ImageDataset(std::shared_ptr<const ImageSet> set, const ImageDatasetOptions& options);
  ~ImageDataset();
  ImageDataset(const ImageDataset&) = delete;
  ImageDataset& operator=(const ImageDataset&) = delete;

  ImageBatch next_batch();
  ImageDatasetPosition position() const;
  void restore(const ImageDatasetPosition& position);

  const ImageSet& set() const { return *set_; }
  const ImageDatasetOptions& options() const { return options_; }

 private:
  ImageBatch make_batch(WindowCursor& cursor);

  std::shared_ptr<const ImageSet> set_;
  ImageDatasetOptions options_;
  WindowOrder order_;  // used by one thread at a time: the prefetcher while it runs
  WindowCursor next_;  // where the next batch returned by next_batch() starts
  std::unique_ptr<PrefetchQueue<ImageBatch, WindowCursor>> prefetch_;  // with options_.prefetch
};

}  // namespace precis
