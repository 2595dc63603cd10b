#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/copy.h"
#include "core/json.h"
#include "core/random.h"
#include "support/errors.h"
#include "train/safetensors.h"

using namespace precis;
using namespace precis::train;
using precis::testing::error_of;
namespace fs = std::filesystem;

namespace {

// A fresh, empty directory for one test.
fs::path scratch_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("precis_test_safetensors_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file made by hand: the 8-byte length, `header` as given, then `data`.
void write_raw(const fs::path& path, const std::string& header, const std::string& data, uint64_t length_field) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(length_field >> (8 * i));
  write_bytes(path, bytes + header + data);
}
void write_raw(const fs::path& path, const std::string& header, const std::string& data) {
  write_raw(path, header, data, header.size());
}

// The bytes of a tensor (any strides) in row-major order.
std::string bytes_of(const Tensor& t) {
  Tensor dense = empty(t.shape(), t.dtype());
  copy_(dense, t);
  return std::string(static_cast<const char*>(dense.raw_data()), dense.nbytes());
}

}  // namespace

TEST(Safetensors, RoundTripsEveryDTypeAndShape) {
  fs::path dir = scratch_dir("round_trip");
  Generator gen(3);
  std::vector<nn::NamedTensor> tensors = {
      {"f32.matrix", randn({2, 3}, DType::f32, &gen)},
      {"f64.scalar", scalar_tensor(-2.5, DType::f64)},
      {"f16.vector", randn({5}, DType::f32, &gen).to(DType::f16)},
      {"bf16.cube", randn({3, 1, 2}, DType::f32, &gen).to(DType::bf16)},
      {"i32.empty", empty({0}, DType::i32)},
      {"i64.empty_middle", empty({2, 0, 3}, DType::i64)},
      {"i64.values", from_vector<int64_t>({-1, 0, int64_t(1) << 40, INT64_MIN}, {2, 2})},
      {"i32.values", from_vector<int32_t>({7, -7, INT32_MAX}, {3})},
      {"u8.values", from_vector<uint8_t>({0, 1, 200, 255}, {4})},
      {"bool.values", from_vector<uint8_t>({1, 0, 0, 1, 1, 0}, {2, 3}).to(DType::boolean)},
      // A non-contiguous view: written in row-major order of the view.
      {"f32.transposed", randn({3, 4}, DType::f32, &gen).t()},
  };
  SafetensorsMetadata metadata = {{"format", "pt"}, {"note", "h\u00e9llo \"quoted\" \\ \n"}};
  fs::path path = dir / "all.safetensors";
  write_safetensors(path.string(), tensors, metadata);
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));

  SafetensorsFile file = read_safetensors(path.string());
  EXPECT_EQ(file.metadata, metadata);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(tensors[i].name);
    const Tensor& got = file.tensors[i].tensor;
    EXPECT_EQ(file.tensors[i].name, tensors[i].name);
    EXPECT_EQ(got.dtype(), tensors[i].tensor.dtype());
    EXPECT_EQ(got.shape(), tensors[i].tensor.shape());
    EXPECT_TRUE(got.is_cpu());
    EXPECT_EQ(bytes_of(got), bytes_of(tensors[i].tensor));
  }
  EXPECT_EQ(file.tensors[1].tensor.dim(), 0);
  EXPECT_EQ(file.tensors[1].tensor.item(), -2.5);
  EXPECT_EQ(read_safetensors_metadata(path.string()), metadata);
}

TEST(Safetensors, WritesTheReferenceLayout) {
  fs::path dir = scratch_dir("layout");
  fs::path path = dir / "layout.safetensors";
  write_safetensors(path.string(),
                    {{"b", from_vector<float>({1, 2, 3}, {3})}, {"a", from_vector<double>({4, 5}, {1, 2})}},
                    {{"format", "pt"}});
  std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data section should start 8-byte aligned";
  Json header = Json::parse(bytes.substr(8, n));
  ASSERT_TRUE(header.is_object());
  const Json::Object& entries = header.as_object();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].first, "__metadata__");
  EXPECT_EQ(entries[0].second.at("format").as_string(), "pt");
  EXPECT_EQ(entries[1].first, "b");
  EXPECT_EQ(entries[1].second.at("dtype").as_string(), "F32");
  EXPECT_EQ(entries[1].second.at("shape").dump(), "[3]");
  EXPECT_EQ(entries[1].second.at("data_offsets").dump(), "[0,12]");
  EXPECT_EQ(entries[2].first, "a");
  EXPECT_EQ(entries[2].second.at("dtype").as_string(), "F64");
  EXPECT_EQ(entries[2].second.at("shape").dump(), "[1,2]");
  EXPECT_EQ(entries[2].second.at("data_offsets").dump(), "[12,28]");
  ASSERT_EQ(bytes.size(), 8 + n + 28);
  float first;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  EXPECT_EQ(first, 1.0f);
  double last;
  std::memcpy(&last, bytes.data() + 8 + n + 20, 8);
  EXPECT_EQ(last, 5.0);
}

TEST(Safetensors, EmptyFileHasNoTensorsAndNoMetadata) {
  fs::path path = scratch_dir("empty") / "empty.safetensors";
  write_safetensors(path.string(), {});
  SafetensorsFile file = read_safetensors(path.string());
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.metadata.empty());
}

TEST(Safetensors, ReportsMissingAndShortFiles) {
  fs::path dir = scratch_dir("short");
  std::string missing = (dir / "nope.safetensors").string();
  std::string message = error_of([&] { read_safetensors(missing); });
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  EXPECT_NE(message.find("no such file"), std::string::npos) << message;

  fs::path tiny = dir / "tiny.safetensors";
  write_bytes(tiny, "abc");
  message = error_of([&] { read_safetensors(tiny.string()); });
  EXPECT_NE(message.find(tiny.string()), std::string::npos) << message;
  EXPECT_NE(message.find("only 3 bytes long"), std::string::npos) << message;

  message = error_of([&] { read_safetensors(dir.string()); });
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;
}

TEST(Safetensors, ReportsCorruptHeaders) {
  fs::path dir = scratch_dir("corrupt");
  auto error_for = [&](const std::string& header, const std::string& data) {
    fs::path path = dir / "bad.safetensors";
    write_raw(path, header, data);
    std::string message = error_of([&] { read_safetensors(path.string()); });
    EXPECT_NE(message.find(path.string()), std::string::npos) << "the message should name the file: " << message;
    return message;
  };
  auto expect_contains = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  };

  {
    fs::path path = dir / "long_header.safetensors";
    write_raw(path, "{}", "", 1000);
    std::string message = error_of([&] { read_safetensors(path.string()); });
    expect_contains(message, path.string());
    expect_contains(message, "header length (1000 bytes) is larger than the file (10 bytes)");
  }
  expect_contains(error_for("{\"x\": [1,", ""), "the header is not valid JSON");
  expect_contains(error_for("[1, 2]", ""), "the header must be a JSON object");
  expect_contains(error_for(R"({"x": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}})", "a"),
                  "tensor 'x': unknown dtype 'F8'");
  expect_contains(error_for(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", "abcd"),
                  "tensor 'x': data_offsets [0, 4] hold 4 bytes but shape [2] of F32 needs 8 bytes");
  expect_contains(error_for(R"({"x": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}})", "abcd"),
                  "tensor 'x': data_offsets [4, 0] are out of range");
  expect_contains(error_for(R"({"x": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                "y": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})",
                            "abcd"),
                  "tensor 'y' has data_offsets [2, 4] out of range: they overlap");
  expect_contains(error_for(R"({"x": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})", "abcd"),
                  "out of range: they leave a gap");
  expect_contains(error_for(R"({"x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", "abcd"),
                  "2 bytes follow the last tensor's data");
  expect_contains(error_for(R"({"x": {"dtype": "U8", "shape": [-2], "data_offsets": [0, 2]}})", "ab"),
                  "must be a non-negative integer");
  expect_contains(error_for(R"({"x": {"dtype": "U8", "shape": [2]}})", "ab"), "has no \"data_offsets\"");
  expect_contains(error_for(R"({"x": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}})", "\x01\x07"),
                  "BOOL but holds the byte 7");
  expect_contains(error_for(R"({"__metadata__": {"step": 3}})", ""), "__metadata__ value for 'step' must be a string");
}

TEST(Safetensors, ReportsTruncatedFiles) {
  fs::path dir = scratch_dir("truncated");
  fs::path path = dir / "model.safetensors";
  write_safetensors(path.string(), {{"a", zeros({4, 4})}, {"b", ones({16})}});
  std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 3));
  std::string message = error_of([&] { read_safetensors(path.string()); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("tensor 'b' has data_offsets [64, 128] but only 125 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("the file is truncated"), std::string::npos) << message;
}

TEST(Safetensors, RejectsBadNamesWhenWriting) {
  fs::path dir = scratch_dir("bad_names");
  std::string path = (dir / "x.safetensors").string();
  EXPECT_NE(error_of([&] {
              write_safetensors(path, {{"a", zeros({1})}, {"a", zeros({1})}});
            }).find("given twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_safetensors(path, {{"__metadata__", zeros({1})}});
            }).find("bad tensor name"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_safetensors(path, {{"a", Tensor()}}); }).find("undefined"), std::string::npos);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// A write that fails half way (here: the temporary file is /dev/full, so the
// data cannot be flushed) must leave the previous file whole and no temporary behind.
TEST(Safetensors, FailedWriteLeavesThePreviousFileIntact) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "needs /dev/full to simulate a full disk";
  fs::path dir = scratch_dir("atomic");
  fs::path path = dir / "model.safetensors";
  write_safetensors(path.string(), {{"weights", full({4}, 3.0)}}, {{"version", "old"}});
  const std::string old_bytes = read_bytes(path);

  fs::path tmp = path.string() + ".tmp";
  fs::create_symlink("/dev/full", tmp);
  Generator gen(1);
  std::string message = error_of([&] {
    write_safetensors(path.string(), {{"weights", randn({64, 1024}, DType::f32, &gen)}}, {{"version", "new"}});
  });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("failed"), std::string::npos) << message;
  EXPECT_NE(message.find("the previous file (if any) is unchanged"), std::string::npos) << message;

  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp))) << "the temporary file should be removed";
  EXPECT_EQ(read_bytes(path), old_bytes);
  SafetensorsFile file = read_safetensors(path.string());
  EXPECT_EQ(file.metadata.at("version"), "old");
  EXPECT_EQ(file.tensors.at(0).tensor.to_vector<float>(), std::vector<float>(4, 3.0f));

  // The next write succeeds and replaces it.
  write_safetensors(path.string(), {{"weights", full({2}, 5.0)}}, {{"version", "new"}});
  EXPECT_EQ(read_safetensors(path.string()).metadata.at("version"), "new");
}

TEST(Safetensors, UnwritableDirectoryIsAnErrorAndLeavesNothing) {
  fs::path dir = scratch_dir("unwritable");
  std::string path = (dir / "missing_folder" / "model.safetensors").string();
  std::string message = error_of([&] { write_safetensors(path, {{"a", zeros({2})}}); });
  EXPECT_NE(message.find("cannot create"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(path));
}

// Every byte of the data section is covered: flipping any one bit of a tensor's bytes is an
// error naming the file and that tensor.
TEST(Safetensors, AFlippedByteIsCaughtByTheTensorChecksum) {
  fs::path dir = scratch_dir("checksum");
  const fs::path file = dir / "t.safetensors";
  write_safetensors(file.string(), {{"a", arange(0, 6, 1, DType::f32)}, {"b", arange(0, 3, 1, DType::i64)}},
                    {{"note", "kept"}});
  const std::string good = read_bytes(file);
  SafetensorsFile read = read_safetensors(file.string());
  EXPECT_EQ(read.metadata, (SafetensorsMetadata{{"note", "kept"}})) << "the checksums are not user metadata";
  EXPECT_EQ(read_safetensors_metadata(file.string()), (SafetensorsMetadata{{"note", "kept"}}));

  uint64_t header_length = 0;
  std::memcpy(&header_length, good.data(), 8);
  const size_t data_start = 8 + header_length;
  ASSERT_EQ(good.size() - data_start, 6 * 4 + 3 * 8u);
  for (size_t offset = data_start; offset < good.size(); ++offset) {
    std::string bad = good;
    bad[offset] ^= 0x10;
    write_bytes(file, bad);
    const std::string message = error_of([&] { read_safetensors(file.string()); });
    const char* tensor = offset - data_start < 24 ? "'a'" : "'b'";
    EXPECT_NE(message.find(file.string()), std::string::npos) << message;
    EXPECT_NE(message.find(std::string("tensor ") + tensor + " does not match its checksum"), std::string::npos)
        << offset << ": " << message;
  }
}

// Files of other writers (Hugging Face's) have no checksums and read as before.
TEST(Safetensors, FilesWithoutChecksumsStillRead) {
  fs::path dir = scratch_dir("no_checksum");
  const std::string data(8, '\0');
  write_raw(dir / "hf.safetensors", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data);
  EXPECT_EQ(read_safetensors((dir / "hf.safetensors").string()).tensors.size(), 1u);
}
