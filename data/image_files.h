// Image classification data sets, read whole into memory as uint8 pixels.
//
// MNIST: the IDX files (yann.lecun.com/exdb/mnist): images "idx3" = magic 2051, count, rows,
// columns (big-endian int32), then count*rows*columns uint8 pixels; labels "idx1" = magic
// 2049, count, then count uint8 labels. The shipped copy is assets/mnist.
// CIFAR-10, binary version (www.cs.toronto.edu/~kriz/cifar.html): data_batch_1..5.bin
// (training) and test_batch.bin, each a sequence of 3073-byte records: one label byte
// (0..9), then 1024 red, 1024 green and 1024 blue pixels of a 32x32 image, rows in order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace precis {

struct ImageSet {
  int64_t count = 0, channels = 0, height = 0, width = 0;
  int64_t num_classes = 0;
  std::vector<uint8_t> pixels;  // [count, channels, height, width]
  std::vector<int32_t> labels;  // [count], each in [0, num_classes)

  int64_t image_numel() const { return channels * height * width; }
  const uint8_t* image(int64_t i) const { return pixels.data() + i * image_numel(); }
};

// An IDX3 image file and its IDX1 label file (one channel, 10 classes).
ImageSet read_idx(const std::string& images_path, const std::string& labels_path);
// dir/{train,t10k}-images-idx3-ubyte and the matching labels.
ImageSet read_mnist(const std::string& dir, bool train);
// dir/data_batch_{1..5}.bin (train) or dir/test_batch.bin; an error names the files when absent.
ImageSet read_cifar10(const std::string& dir, bool train);
// CIFAR-10's file names for one split, as read_cifar10 expects them in its directory.
std::vector<std::string> cifar10_files(bool train);
// `count` images of uniform random pixels and labels, reproducible from `seed` (benchmarks).
ImageSet synthetic_images(int64_t count, int64_t channels, int64_t size, int64_t num_classes, uint64_t seed);

}  // namespace precis
