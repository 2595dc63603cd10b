#include "data/image_files.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/philox.h"

namespace precis {

namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PRECIS_CHECK(in.is_open(), "cannot read '", path, "': ", std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  PRECIS_CHECK(!in.bad(), "reading '", path, "' failed: ", std::strerror(errno));
  return bytes;
}

// IDX headers are big-endian int32s.
int64_t big_endian_int(const std::vector<uint8_t>& bytes, size_t at) {
  return (static_cast<int64_t>(bytes[at]) << 24) | (static_cast<int64_t>(bytes[at + 1]) << 16) |
         (static_cast<int64_t>(bytes[at + 2]) << 8) | static_cast<int64_t>(bytes[at + 3]);
}

constexpr int64_t kIdxImagesMagic = 2051, kIdxLabelsMagic = 2049;
constexpr int64_t kCifarSide = 32, kCifarRecordBytes = 1 + 3 * kCifarSide * kCifarSide;

}  // namespace

ImageSet read_idx(const std::string& images_path, const std::string& labels_path) {
  const std::vector<uint8_t> images = read_bytes(images_path), labels = read_bytes(labels_path);
  PRECIS_CHECK(images.size() >= 16 && big_endian_int(images, 0) == kIdxImagesMagic, "'", images_path,
               "' is not an IDX3 image file (it should start with the magic number ", kIdxImagesMagic,
               "); give the unpacked MNIST files");
  PRECIS_CHECK(labels.size() >= 8 && big_endian_int(labels, 0) == kIdxLabelsMagic, "'", labels_path,
               "' is not an IDX1 label file (it should start with the magic number ", kIdxLabelsMagic, ")");
  ImageSet set;
  set.count = big_endian_int(images, 4);
  set.channels = 1;
  set.height = big_endian_int(images, 8);
  set.width = big_endian_int(images, 12);
  set.num_classes = 10;
  const size_t expected = 16 + static_cast<size_t>(set.count * set.image_numel());
  PRECIS_CHECK(images.size() == expected, "'", images_path, "' holds ", images.size(), " bytes but its header (",
               set.count, " images of ", set.height, "x", set.width, ") needs ", expected, "; the file is damaged");
  PRECIS_CHECK(big_endian_int(labels, 4) == set.count && labels.size() == 8 + static_cast<size_t>(set.count), "'",
               labels_path, "' does not hold one label for each of the ", set.count, " images of '", images_path, "'");
  set.pixels.assign(images.begin() + 16, images.end());
  set.labels.reserve(set.count);
  for (size_t i = 8; i < labels.size(); ++i) {
    PRECIS_CHECK(labels[i] < set.num_classes, "'", labels_path, "': label ", int(labels[i]), " of image ", i - 8,
                 " is not a digit 0..9");
    set.labels.push_back(labels[i]);
  }
  return set;
}

ImageSet read_mnist(const std::string& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  return read_idx((fs::path(dir) / (prefix + "-images-idx3-ubyte")).string(),
                  (fs::path(dir) / (prefix + "-labels-idx1-ubyte")).string());
}

std::vector<std::string> cifar10_files(bool train) {
  if (!train) return {"test_batch.bin"};
  std::vector<std::string> files;
  for (int i = 1; i <= 5; ++i) files.push_back("data_batch_" + std::to_string(i) + ".bin");
  return files;
}

ImageSet read_cifar10(const std::string& dir, bool train) {
  const std::vector<std::string> names = cifar10_files(train);
  std::string missing;
  for (const std::string& name : names)
    if (!fs::is_regular_file(fs::path(dir) / name)) missing += (missing.empty() ? "" : ", ") + name;
  PRECIS_CHECK(missing.empty(), "CIFAR-10: '", dir, "' lacks ", missing,
               ". Set data.dir to a folder with the binary version's files (data_batch_1.bin .. data_batch_5.bin and ",
               "test_batch.bin, from cifar-10-binary.tar.gz at https://www.cs.toronto.edu/~kriz/cifar.html)");
  ImageSet set;
  set.channels = 3;
  set.height = set.width = kCifarSide;
  set.num_classes = 10;
  for (const std::string& name : names) {
    const std::string path = (fs::path(dir) / name).string();
    const std::vector<uint8_t> bytes = read_bytes(path);
    PRECIS_CHECK(!bytes.empty() && bytes.size() % kCifarRecordBytes == 0, "CIFAR-10: '", path, "' holds ", bytes.size(),
                 " bytes, not a whole number of ", kCifarRecordBytes,
                 "-byte records (a label byte and 3x32x32 pixels); is it the binary version?");
    for (size_t at = 0; at < bytes.size(); at += kCifarRecordBytes) {
      PRECIS_CHECK(bytes[at] < set.num_classes, "CIFAR-10: '", path, "': record ", at / kCifarRecordBytes,
                   " has label ", int(bytes[at]), ", not a class 0..9; is it the binary version?");
      set.labels.push_back(bytes[at]);
      set.pixels.insert(set.pixels.end(), bytes.begin() + at + 1, bytes.begin() + at + kCifarRecordBytes);
    }
  }
  set.count = static_cast<int64_t>(set.labels.size());
  return set;
}

ImageSet synthetic_images(int64_t count, int64_t channels, int64_t size, int64_t num_classes, uint64_t seed) {
  PRECIS_CHECK(count > 0 && channels > 0 && size > 0 && num_classes > 1,
               "synthetic images: count, channels and size must be positive and num_classes > 1, got ", count, ", ",
               channels, ", ", size, ", ", num_classes);
  ImageSet set{count, channels, size, size, num_classes, {}, {}};
  set.pixels.resize(static_cast<size_t>(count * set.image_numel()));
  // Pixel i is a byte of word i % 4 of Philox block i / 4 (philox_word's numbering, one block per four pixels).
  for (size_t block = 0; block * 4 < set.pixels.size(); ++block) {
    const Philox4 words = philox4x32(block, 0, seed);
    for (size_t k = 0; k < 4 && block * 4 + k < set.pixels.size(); ++k)
      set.pixels[block * 4 + k] = static_cast<uint8_t>(words.x[k]);
  }
  for (int64_t i = 0; i < count; ++i)
    set.labels.push_back(static_cast<int32_t>(philox_word(seed, 1ull << 40, i) % num_classes));
  return set;
}

}  // namespace precis
