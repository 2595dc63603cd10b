#include "data/image_dataset.h"

#include <utility>

#include "core/error.h"
#include "core/philox.h"
#include "core/pinned.h"

namespace precis {

Json ImageDatasetPosition::to_json() const {
  Json json;
  json["epoch"] = cursor.epoch;
  json["shard"] = cursor.shard;
  json["example"] = cursor.window;
  json["shuffle"] = shuffle;
  json["seed"] = static_cast<int64_t>(seed);
  json["count"] = count;
  return json;
}

ImageDatasetPosition ImageDatasetPosition::from_json(const Json& json) {
  for (const char* key : {"epoch", "shard", "example", "shuffle", "seed", "count"})
    PRECIS_CHECK(json.is_object() && json.contains(key), "image data position: the key \"", key, "\" is missing in ",
                 json.dump(), "; the checkpoint's data position is damaged");
  ImageDatasetPosition position;
  position.cursor = {json.at("epoch").as_int(), json.at("shard").as_int(), json.at("example").as_int()};
  position.shuffle = json.at("shuffle").as_bool();
  position.seed = static_cast<uint64_t>(json.at("seed").as_int());
  position.count = json.at("count").as_int();
  return position;
}

namespace {

// Where an output pixel reads from: the image is padded by `padding` on each side, the
// crop starts at (dy, dx) of the padded image, and a flipped crop reads its columns
// right to left. Pixels that fall in the padding are 0 (before normalisation), as
// torchvision's RandomCrop(padding, fill=0).
struct Crop {
  int64_t dy = 0, dx = 0, padding = 0;
  bool flip = false;
};

void write_image(const ImageSet& set, int64_t index, const Crop& crop, const ImageNormalization& norm, float* out) {
  const int64_t C = set.channels, H = set.height, W = set.width;
  const uint8_t* image = set.image(index);
  for (int64_t c = 0; c < C; ++c) {
    const float scale = 1.0f / (255.0f * norm.std[c]);
    const float shift = -norm.mean[c] / norm.std[c];
    for (int64_t y = 0; y < H; ++y) {
      const int64_t sy = y + crop.dy - crop.padding;
      for (int64_t x = 0; x < W; ++x) {
        const int64_t cx = crop.flip ? W - 1 - x : x;
        const int64_t sx = cx + crop.dx - crop.padding;
        const bool inside = sy >= 0 && sy < H && sx >= 0 && sx < W;
        const float pixel = inside ? static_cast<float>(image[(c * H + sy) * W + sx]) : 0.0f;
        out[(c * H + y) * W + x] = pixel * scale + shift;
      }
    }
  }
}

const ImageNormalization& checked_normalization(const ImageSet& set, const ImageNormalization& norm) {
  PRECIS_CHECK(
      static_cast<int64_t>(norm.mean.size()) == set.channels && static_cast<int64_t>(norm.std.size()) == set.channels,
      "image normalisation: give one mean and one std per channel (", set.channels, "), got ", norm.mean.size(),
      " and ", norm.std.size());
  for (float s : norm.std) PRECIS_CHECK(s > 0, "image normalisation: every std must be > 0, got ", s);
  return norm;
}

ImageBatch allocate_batch(const ImageSet& set, int64_t rows, bool pinned) {
  const Shape shape{rows, set.channels, set.height, set.width};
  return {pinned ? empty_pinned(shape, DType::f32) : empty(shape, DType::f32),
          pinned ? empty_pinned({rows}, DType::i32) : empty({rows}, DType::i32)};
}

const ImageDatasetOptions& checked(const ImageSet& set, const ImageDatasetOptions& options) {
  PRECIS_CHECK(options.batch_size >= 1, "ImageDataset: batch_size must be >= 1, got ", options.batch_size);
  PRECIS_CHECK(options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size, "ImageDataset: rank ",
               options.rank, " is not in [0, world_size = ", options.world_size, ")");
  PRECIS_CHECK(options.prefetch_depth >= 1, "ImageDataset: prefetch_depth must be >= 1, got ", options.prefetch_depth);
  PRECIS_CHECK(options.crop_padding >= 0, "ImageDataset: crop_padding must be >= 0, got ", options.crop_padding);
  PRECIS_CHECK(set.count > 0, "ImageDataset: the image set is empty");
  checked_normalization(set, options.normalization);
  return options;
}

}  // namespace

ImageBatch image_batch(const ImageSet& set, int64_t first, int64_t count, const ImageNormalization& normalization,
                       bool pinned) {
  PRECIS_CHECK(first >= 0 && count >= 1 && first + count <= set.count, "image_batch: images [", first, ", ",
               first + count, ") are not all in a set of ", set.count);
  checked_normalization(set, normalization);
  ImageBatch batch = allocate_batch(set, count, pinned);
  float* images = batch.images.data<float>();
  int32_t* labels = batch.labels.data<int32_t>();
  for (int64_t row = 0; row < count; ++row) {
    write_image(set, first + row, Crop{}, normalization, images + row * set.image_numel());
    labels[row] = set.labels[first + row];
  }
  return batch;
}

ImageDataset::ImageDataset(std::shared_ptr<const ImageSet> set, const ImageDatasetOptions& options)
    : set_(std::move(set)), options_(checked(*set_, options)), order_({set_->count}, options_.shuffle, options_.seed) {
  if (options_.prefetch) {
    prefetch_ = std::make_unique<PrefetchQueue<ImageBatch, WindowCursor>>(
        [this](WindowCursor& cursor) { return make_batch(cursor); }, options_.prefetch_depth);
    prefetch_->start(next_);
  }
}

ImageDataset::~ImageDataset() = default;

ImageBatch ImageDataset::make_batch(WindowCursor& cursor) {
  const ImageSet& set = *set_;
  const int64_t B = options_.batch_size, padding = options_.crop_padding;
  ImageBatch batch = allocate_batch(set, B, options_.pinned);
  float* images = batch.images.data<float>();
  int32_t* labels = batch.labels.data<int32_t>();
  // Every rank walks the whole global batch, so that all ranks' cursors stay equal.
  for (int64_t rank = 0; rank < options_.world_size; ++rank) {
    for (int64_t row = 0; row < B; ++row) {
      const int64_t epoch = cursor.epoch;
      const int64_t index = order_.take(cursor).window;
      if (rank != options_.rank) continue;
      // One Philox block per (epoch, example): word 0 the crop's row, 1 its column, 2 the flip.
      const Philox4 bits = philox4x32(static_cast<uint64_t>(index), static_cast<uint64_t>(epoch), options_.seed);
      Crop crop;
      crop.padding = padding;
      if (padding > 0) {
        crop.dy = bits.x[0] % (2 * padding + 1);
        crop.dx = bits.x[1] % (2 * padding + 1);
      }
      crop.flip = options_.flip && (bits.x[2] & 1u);
      write_image(set, index, crop, options_.normalization, images + row * set.image_numel());
      labels[row] = set.labels[index];
    }
  }
  return batch;
}

ImageBatch ImageDataset::next_batch() {
  if (!prefetch_) return make_batch(next_);
  auto [batch, after] = prefetch_->take();
  next_ = after;
  return std::move(batch);
}

ImageDatasetPosition ImageDataset::position() const { return {next_, options_.shuffle, options_.seed, set_->count}; }

void ImageDataset::restore(const ImageDatasetPosition& position) {
  PRECIS_CHECK(position.count == set_->count, "ImageDataset: the data position was saved for a set of ", position.count,
               " images, but this one has ", set_->count, "; resume with the same data");
  PRECIS_CHECK(position.shuffle == options_.shuffle && (!position.shuffle || position.seed == options_.seed),
               "ImageDataset: the data position was saved for ", position.shuffle ? "shuffled" : "sequential",
               " order with seed ", position.seed, ", but this dataset uses ",
               options_.shuffle ? "shuffled" : "sequential", " order with seed ", options_.seed,
               "; resume with the same data order and seed");
  const WindowCursor& cursor = position.cursor;
  PRECIS_CHECK(cursor.epoch >= 0 && (cursor.shard == 0 || cursor.shard == 1) && cursor.window >= 0 &&
                   cursor.window <= set_->count,
               "ImageDataset: the data position (epoch ", cursor.epoch, ", example ", cursor.window,
               ") lies outside a set of ", set_->count, " images; it is damaged");
  if (prefetch_) prefetch_->stop();
  next_ = cursor;
  if (prefetch_) prefetch_->start(next_);
}

}  // namespace precis
