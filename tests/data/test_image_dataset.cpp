#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/source_dir.h"
#include "data/image_dataset.h"
#include "data/image_files.h"
#include "support/errors.h"

using namespace precis;
using precis::testing::expect_error;
namespace fs = std::filesystem;

namespace {

class ImageDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("precis_test_image_dataset_" +
                                        std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // CIFAR-10's binary format: per record a label byte, then 1024 red, 1024 green, 1024 blue
  // bytes. Record r of file f has label (f + r) % 10 and pixel value (f * 7 + r + channel * 3 + i) % 256.
  static uint8_t cifar_pixel(int file, int record, int channel, int i) {
    return static_cast<uint8_t>((file * 7 + record + channel * 3 + i) % 256);
  }
  void write_cifar_file(const std::string& name, int file, int records) {
    std::ofstream out(dir_ / name, std::ios::binary);
    for (int r = 0; r < records; ++r) {
      out.put(static_cast<char>((file + r) % 10));
      for (int c = 0; c < 3; ++c)
        for (int i = 0; i < 1024; ++i) out.put(static_cast<char>(cifar_pixel(file, r, c, i)));
    }
  }

  fs::path dir_;
};

// A set of `count` tiny images whose pixels say where they are: pixel (c, y, x) of image i is
// i * 16 + c * 8 + y * 3 + x (mod 256).
std::shared_ptr<ImageSet> numbered_set(int64_t count, int64_t C, int64_t side) {
  auto set = std::make_shared<ImageSet>();
  set->count = count;
  set->channels = C;
  set->height = set->width = side;
  set->num_classes = 10;
  for (int64_t i = 0; i < count; ++i) {
    set->labels.push_back(static_cast<int32_t>(i % 10));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < side; ++y)
        for (int64_t x = 0; x < side; ++x) set->pixels.push_back(static_cast<uint8_t>((i * 16 + c * 8 + y * 3 + x)));
  }
  return set;
}

ImageNormalization identity(int64_t channels) {
  return {std::vector<float>(channels, 0.0f), std::vector<float>(channels, 1.0f)};
}

}  // namespace

TEST_F(ImageDataTest, Cifar10ReadsTheBinaryFormat) {
  for (int f = 1; f <= 5; ++f) write_cifar_file("data_batch_" + std::to_string(f) + ".bin", f, 2);
  write_cifar_file("test_batch.bin", 0, 3);
  ImageSet train = read_cifar10(dir_.string(), true);
  EXPECT_EQ(train.count, 10);
  EXPECT_EQ(train.channels, 3);
  EXPECT_EQ(train.height, 32);
  EXPECT_EQ(train.width, 32);
  // Image 5 is record 1 of data_batch_3.bin.
  EXPECT_EQ(train.labels[5], (3 + 1) % 10);
  for (int c = 0; c < 3; ++c)
    for (int i : {0, 31, 32, 1023}) EXPECT_EQ(train.image(5)[c * 1024 + i], cifar_pixel(3, 1, c, i));
  ImageSet test = read_cifar10(dir_.string(), false);
  EXPECT_EQ(test.count, 3);
  EXPECT_EQ(test.labels[2], 2);
  EXPECT_EQ(test.image(2)[2 * 1024 + 7], cifar_pixel(0, 2, 2, 7));
}

TEST_F(ImageDataTest, Cifar10NamesTheMissingFiles) {
  write_cifar_file("data_batch_1.bin", 1, 1);
  expect_error([&] { read_cifar10(dir_.string(), true); },
               "lacks data_batch_2.bin, data_batch_3.bin, data_batch_4.bin, data_batch_5.bin");
  expect_error([&] { read_cifar10(dir_.string(), false); }, "lacks test_batch.bin");
  std::ofstream(dir_ / "test_batch.bin", std::ios::binary) << "short";
  expect_error([&] { read_cifar10(dir_.string(), false); }, "not a whole number of 3073-byte records");
}

TEST_F(ImageDataTest, MnistShippedCopy) {
  const std::string dir = PRECIS_SOURCE_DIR "/assets/mnist";
  ImageSet test = read_mnist(dir, false);
  EXPECT_EQ(test.count, 10000);
  EXPECT_EQ(test.channels, 1);
  EXPECT_EQ(test.height, 28);
  EXPECT_EQ(test.width, 28);
  // The first test digits, as every MNIST loader shows them: 7 2 1 0 4.
  EXPECT_EQ(std::vector<int32_t>(test.labels.begin(), test.labels.begin() + 5), (std::vector<int32_t>{7, 2, 1, 0, 4}));
  // Pixels are ink on a zero background: corners blank, some ink in the middle.
  EXPECT_EQ(test.image(0)[0], 0);
  int ink = 0;
  for (int i = 0; i < 784; ++i) ink += test.image(0)[i] > 128;
  EXPECT_GT(ink, 50);
  ImageSet train = read_mnist(dir, true);
  EXPECT_EQ(train.count, 60000);
  EXPECT_EQ(std::vector<int32_t>(train.labels.begin(), train.labels.begin() + 5),
            (std::vector<int32_t>{5, 0, 4, 1, 9}));
}

TEST_F(ImageDataTest, IdxChecksItsHeader) {
  std::ofstream(dir_ / "images", std::ios::binary) << std::string(16, '\0');
  std::ofstream(dir_ / "labels", std::ios::binary) << std::string(8, '\0');
  expect_error([&] { read_idx((dir_ / "images").string(), (dir_ / "labels").string()); }, "is not an IDX3 image file");
  expect_error([&] { read_mnist((dir_ / "nothing").string(), true); }, "cannot read");
}

TEST_F(ImageDataTest, BatchNormalisesPerChannel) {
  auto set = numbered_set(3, 2, 4);
  ImageNormalization norm{{0.5f, 0.25f}, {0.2f, 0.4f}};
  ImageBatch batch = image_batch(*set, 1, 2, norm);
  ASSERT_EQ(batch.images.shape(), (Shape{2, 2, 4, 4}));
  std::vector<float> values = batch.images.to_vector<float>();
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t p = 0; p < 16; ++p) {
        const float pixel = set->image(1 + row)[c * 16 + p];
        EXPECT_NEAR(values[(row * 2 + c) * 16 + p], (pixel / 255.0f - norm.mean[c]) / norm.std[c], 1e-5);
      }
  EXPECT_EQ(batch.labels.to_vector<int32_t>(), (std::vector<int32_t>{1, 2}));
  expect_error([&] { image_batch(*set, 0, 1, {{0.5f}, {0.2f}}); }, "one mean and one std per channel (2)");
}

// Every augmented image is the original shifted by (dy - p, dx - p) with dy, dx in [0, 2p],
// zero outside, mirrored or not; both flips and several shifts occur.
TEST_F(ImageDataTest, RandomCropAndFlipAreShiftsAndMirrorsOfTheImage) {
  const int64_t side = 6, padding = 2, count = 40;
  auto set = numbered_set(count, 1, side);
  ImageDatasetOptions o;
  o.batch_size = count;
  o.shuffle = false;
  o.seed = 5;
  o.normalization = identity(1);
  o.crop_padding = padding;
  o.flip = true;
  o.prefetch = false;
  ImageDataset data(set, o);
  std::vector<float> images = data.next_batch().images.to_vector<float>();
  int flips = 0;
  std::set<std::pair<int64_t, int64_t>> shifts;
  for (int64_t i = 0; i < count; ++i) {
    const float* out = images.data() + i * side * side;
    bool matched = false;
    for (int64_t dy = 0; dy <= 2 * padding && !matched; ++dy)
      for (int64_t dx = 0; dx <= 2 * padding && !matched; ++dx)
        for (bool flip : {false, true}) {
          bool same = true;
          for (int64_t y = 0; y < side && same; ++y)
            for (int64_t x = 0; x < side && same; ++x) {
              int64_t sy = y + dy - padding, sx = (flip ? side - 1 - x : x) + dx - padding;
              float expected =
                  sy >= 0 && sy < side && sx >= 0 && sx < side ? set->image(i)[sy * side + sx] / 255.0f : 0;
              same = std::abs(out[y * side + x] - expected) < 1e-6;
            }
          if (same) {
            matched = true;
            flips += flip;
            shifts.insert({dy, dx});
            break;
          }
        }
    EXPECT_TRUE(matched) << "image " << i << " is no crop of the original";
  }
  EXPECT_GT(flips, 5);
  EXPECT_LT(flips, 35);
  EXPECT_GT(shifts.size(), 5u);
}

TEST_F(ImageDataTest, StreamIsReproducibleResumableAndTheSameWithPrefetch) {
  auto set = numbered_set(23, 3, 5);
  ImageDatasetOptions o;
  o.batch_size = 4;
  o.seed = 11;
  o.normalization = {{0.1f, 0.2f, 0.3f}, {0.5f, 0.6f, 0.7f}};
  o.crop_padding = 1;
  o.flip = true;
  o.prefetch = false;
  ImageDataset plain(set, o);
  std::vector<std::vector<float>> expected;
  std::vector<std::vector<int32_t>> labels;
  ImageDatasetPosition middle;
  for (int b = 0; b < 14; ++b) {  // more than two epochs
    if (b == 7) middle = plain.position();
    ImageBatch batch = plain.next_batch();
    expected.push_back(batch.images.to_vector<float>());
    labels.push_back(batch.labels.to_vector<int32_t>());
  }
  EXPECT_NE(expected[0], expected[6]) << "epoch 2 should differ from epoch 1 (order and augmentation)";

  o.prefetch = true;
  ImageDataset prefetched(set, o);
  for (int b = 0; b < 14; ++b) {
    ImageBatch batch = prefetched.next_batch();
    EXPECT_EQ(batch.images.to_vector<float>(), expected[b]) << "batch " << b;
    EXPECT_EQ(batch.labels.to_vector<int32_t>(), labels[b]) << "batch " << b;
  }

  ImageDataset resumed(set, o);
  resumed.next_batch();
  resumed.restore(ImageDatasetPosition::from_json(middle.to_json()));
  for (int b = 7; b < 14; ++b) EXPECT_EQ(resumed.next_batch().images.to_vector<float>(), expected[b]) << b;

  ImageDatasetOptions other = o;
  other.seed = 12;
  ImageDataset different(set, other);
  expect_error([&] { different.restore(middle); }, "resume with the same data order and seed");
}

TEST_F(ImageDataTest, RanksTakeTheirRowsOfTheGlobalBatch) {
  auto set = numbered_set(16, 1, 3);
  ImageDatasetOptions o;
  o.batch_size = 4;
  o.shuffle = true;
  o.seed = 3;
  o.normalization = identity(1);
  o.prefetch = false;
  ImageDatasetOptions whole = o;
  whole.batch_size = 8;
  ImageDataset all(set, whole);
  std::vector<float> global = all.next_batch().images.to_vector<float>();
  for (int64_t rank = 0; rank < 2; ++rank) {
    ImageDatasetOptions mine = o;
    mine.rank = rank;
    mine.world_size = 2;
    ImageDataset data(set, mine);
    std::vector<float> rows = data.next_batch().images.to_vector<float>();
    EXPECT_EQ(rows, std::vector<float>(global.begin() + rank * 4 * 9, global.begin() + (rank + 1) * 4 * 9));
  }
}

TEST_F(ImageDataTest, SyntheticImagesAreReproducible) {
  ImageSet a = synthetic_images(8, 3, 4, 10, 1), b = synthetic_images(8, 3, 4, 10, 1),
           c = synthetic_images(8, 3, 4, 10, 2);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.pixels, c.pixels);
  EXPECT_EQ(a.pixels.size(), 8u * 3 * 4 * 4);
  for (int32_t label : a.labels) EXPECT_TRUE(label >= 0 && label < 10);
}
