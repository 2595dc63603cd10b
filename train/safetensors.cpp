#include "train/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/copy.h"
#include "core/crc32c.h"
#include "core/json.h"

namespace precis::train {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this writer and reader copy bytes as they are in memory");

namespace {

namespace fs = std::filesystem;

struct DTypeCode {
  DType dtype;
  const char* code;
};
constexpr DTypeCode kDTypeCodes[] = {{DType::f32, "F32"},   {DType::f64, "F64"},     {DType::f16, "F16"},
                                     {DType::bf16, "BF16"}, {DType::i32, "I32"},     {DType::i64, "I64"},
                                     {DType::u8, "U8"},     {DType::boolean, "BOOL"}};

const char* dtype_code(DType dtype) {
  for (const auto& c : kDTypeCodes)
    if (c.dtype == dtype) return c.code;
  PRECIS_FAIL("safetensors: no dtype code for ", dtype_name(dtype));
}

std::string prefix(const std::string& path) { return "safetensors file '" + path + "': "; }

constexpr const char* kChecksumKey = "precis.crc32c";

std::string hex32(uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", value);
  return text;
}

// One tensor as the header describes it.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

struct Header {
  std::vector<Entry> entries;  // header order
  SafetensorsMetadata metadata;
  uint64_t data_start;  // byte offset of the data section in the file
};

uint64_t checked_nonnegative_int(const Json& value, const std::string& path, const std::string& what) {
  PRECIS_CHECK(value.is_integer() && value.as_int() >= 0, prefix(path), what, " must be a non-negative integer, got ",
               value.dump());
  return static_cast<uint64_t>(value.as_int());
}

Entry parse_entry(const std::string& name, const Json& info, const std::string& path) {
  const std::string where = "tensor '" + name + "'";
  PRECIS_CHECK(info.is_object(), prefix(path), where, ": expected an object with dtype, shape and data_offsets, got ",
               info.dump());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    PRECIS_CHECK(info.contains(key), prefix(path), where, ": the header entry has no \"", key, "\"");
  Entry e;
  e.name = name;

  const Json& dtype = info.at("dtype");
  PRECIS_CHECK(dtype.is_string(), prefix(path), where, ": dtype must be a string, got ", dtype.dump());
  bool known = false;
  for (const auto& c : kDTypeCodes)
    if (dtype.as_string() == c.code) e.dtype = c.dtype, known = true;
  PRECIS_CHECK(known, prefix(path), where, ": unknown dtype '", dtype.as_string(),
               "' (Precis reads F32, F64, F16, BF16, I32, I64, U8 and BOOL)");

  const Json& shape = info.at("shape");
  PRECIS_CHECK(shape.is_array(), prefix(path), where, ": shape must be an array, got ", shape.dump());
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& d : shape.as_array()) {
    uint64_t size = checked_nonnegative_int(d, path, where + ": each shape entry");
    e.shape.push_back(static_cast<int64_t>(size));
    overflow |= __builtin_mul_overflow(numel, size, &numel);
  }
  uint64_t nbytes = 0;
  overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(element_size(e.dtype)), &nbytes);
  PRECIS_CHECK(!overflow, prefix(path), where, ": shape ", e.shape, " is too large");

  const Json& offsets = info.at("data_offsets");
  PRECIS_CHECK(offsets.is_array() && offsets.size() == 2, prefix(path), where,
               ": data_offsets must be [begin, end], got ", offsets.dump());
  e.begin = checked_nonnegative_int(offsets.at(0), path, where + ": data_offsets");
  e.end = checked_nonnegative_int(offsets.at(1), path, where + ": data_offsets");
  PRECIS_CHECK(e.begin <= e.end, prefix(path), where, ": data_offsets [", e.begin, ", ", e.end,
               "] are out of range (begin is after end)");
  PRECIS_CHECK(e.end - e.begin == nbytes, prefix(path), where, ": data_offsets [", e.begin, ", ", e.end, "] hold ",
               e.end - e.begin, " bytes but shape ", e.shape, " of ", dtype.as_string(), " needs ", nbytes, " bytes");
  return e;
}

Header read_header(std::ifstream& file, const std::string& path) {
  std::error_code ec;
  PRECIS_CHECK(fs::exists(path, ec), prefix(path), "no such file; check the path");
  PRECIS_CHECK(!fs::is_directory(path, ec), prefix(path), "is a directory, not a file");
  uint64_t file_size = fs::file_size(path, ec);
  PRECIS_CHECK(!ec, prefix(path), "cannot read its size: ", ec.message());
  PRECIS_CHECK(file, prefix(path), "cannot open it for reading: ", std::strerror(errno));
  PRECIS_CHECK(file_size >= 8, prefix(path), "not a safetensors file: it is only ", file_size,
               " bytes long, shorter than the 8-byte header length");

  unsigned char length_bytes[8];
  file.read(reinterpret_cast<char*>(length_bytes), 8);
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];
  PRECIS_CHECK(header_length <= file_size - 8, prefix(path), "the header length (", header_length,
               " bytes) is larger than the file (", file_size,
               " bytes): the file is truncated or not a safetensors file");

  std::string text(header_length, '\0');
  file.read(text.data(), static_cast<std::streamsize>(header_length));
  PRECIS_CHECK(file, prefix(path), "could not read the ", header_length, "-byte header");
  Json header;
  try {
    header = Json::parse(text, "header");
  } catch (const Error& e) {
    PRECIS_FAIL(prefix(path), "the header is not valid JSON (", e.what(), "); the file is corrupt");
  }
  PRECIS_CHECK(header.is_object(), prefix(path), "the header must be a JSON object, got a ",
               json_type_name(header.type()));

  Header out;
  out.data_start = 8 + header_length;
  std::set<std::string> names;
  for (const auto& [name, info] : header.as_object()) {
    PRECIS_CHECK(names.insert(name).second, prefix(path), "tensor '", name, "' appears twice in the header");
    if (name == "__metadata__") {
      PRECIS_CHECK(info.is_object(), prefix(path), "__metadata__ must be an object of strings, got ", info.dump());
      for (const auto& [key, value] : info.as_object()) {
        PRECIS_CHECK(value.is_string(), prefix(path), "__metadata__ value for '", key, "' must be a string, got ",
                     value.dump());
        out.metadata[key] = value.as_string();
      }
      continue;
    }
    out.entries.push_back(parse_entry(name, info, path));
  }

  // The tensors must tile the data section: sorted by offset, each starts where the last ended.
  const uint64_t data_size = file_size - out.data_start;
  for (const Entry& e : out.entries)
    PRECIS_CHECK(e.end <= data_size, prefix(path), "tensor '", e.name, "' has data_offsets [", e.begin, ", ", e.end,
                 "] but only ", data_size, " bytes of tensor data follow the header: the file is truncated");
  std::vector<const Entry*> by_offset;
  for (const Entry& e : out.entries) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  for (const Entry* e : by_offset) {
    PRECIS_CHECK(e->begin >= expected, prefix(path), "tensor '", e->name, "' has data_offsets [", e->begin, ", ",
                 e->end, "] out of range: they overlap the tensor before it, which ends at ", expected);
    PRECIS_CHECK(e->begin == expected, prefix(path), "tensor '", e->name, "' has data_offsets [", e->begin, ", ",
                 e->end, "] out of range: they leave a gap after byte ", expected,
                 " (tensors must cover the data contiguously)");
    expected = e->end;
  }
  PRECIS_CHECK(expected == data_size, prefix(path), data_size - expected,
               " bytes follow the last tensor's data; the header does not describe the whole file");
  return out;
}

// The host bytes of `t`: the tensor itself when it is a contiguous CPU tensor, else a dense
// copy (made on the tensor's own device first: device-to-host copies must be contiguous).
Tensor host_contiguous(const Tensor& t) {
  Tensor dense = t.is_contiguous() ? t : t.detach().contiguous();
  if (dense.is_cpu()) return dense;
  Tensor host = empty(dense.shape(), dense.dtype(), Device::cpu());
  copy_(host, dense);
  return host;
}

// The checksums of the file's tensors (an empty object for files of other writers), removed
// from the metadata the caller sees.
Json take_checksums(SafetensorsMetadata& metadata, const std::string& path) {
  auto it = metadata.find(kChecksumKey);
  if (it == metadata.end()) return Json::object();
  Json checksums;
  try {
    checksums = Json::parse(it->second, kChecksumKey);
  } catch (const Error& e) {
    PRECIS_FAIL(prefix(path), "the tensor checksums in its metadata are damaged (", e.what(),
                "); the file is corrupt. Use an older copy (another step_XXXXXXXX folder of the run)");
  }
  PRECIS_CHECK(checksums.is_object(), prefix(path), "the tensor checksums in its metadata are damaged; the ",
               "file is corrupt. Use an older copy (another step_XXXXXXXX folder of the run)");
  metadata.erase(it);
  return checksums;
}

void verify_checksum(const Json& checksums, const std::string& name, const Tensor& t, const std::string& path) {
  if (checksums.as_object().empty()) return;
  PRECIS_CHECK(checksums.contains(name) && checksums.at(name).is_string(), prefix(path), "tensor '", name,
               "' has no checksum in the metadata; the header is damaged. Use an older copy (another ",
               "step_XXXXXXXX folder of the run)");
  const std::string computed = hex32(crc32c(t.raw_data(), t.nbytes()));
  PRECIS_CHECK(computed == checksums.at(name).as_string(), prefix(path), "tensor '", name,
               "' does not match its checksum (stored ", checksums.at(name).as_string(), ", computed ", computed,
               "): its bytes were changed after it was written; the file is damaged. Use an older copy (another "
               "step_XXXXXXXX folder of the run)");
}

// Makes a rename in `dir` durable.
void fsync_directory(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some file systems do not allow opening directories
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<nn::NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata) {
  // The checksums go in the header, which precedes the data: one pass over the tensors for
  // them, one to write (a GPU tensor is copied to the host twice, one at a time).
  Json checksums = Json::object();
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) continue;  // an error below
    Tensor host = host_contiguous(t);
    checksums[name] = hex32(crc32c(host.raw_data(), host.nbytes()));
  }
  Json header = Json::object();
  Json meta = Json::object();
  for (const auto& [key, value] : metadata) meta[key] = value;
  meta[kChecksumKey] = checksums.dump();
  header["__metadata__"] = meta;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    PRECIS_CHECK(!name.empty() && name != "__metadata__", prefix(path), "bad tensor name '", name, "'");
    PRECIS_CHECK(names.insert(name).second, prefix(path), "tensor '", name, "' is given twice");
    PRECIS_CHECK(t.defined(), prefix(path), "tensor '", name, "' is undefined");
    Json shape = Json::array();
    for (int64_t d : t.shape()) shape.push_back(d);
    Json info = Json::object();
    info["dtype"] = dtype_code(t.dtype());
    info["shape"] = shape;
    info["data_offsets"] =
        Json(Json::Array{Json(static_cast<int64_t>(offset)), Json(static_cast<int64_t>(offset + t.nbytes()))});
    header[name] = info;
    offset += t.nbytes();
  }
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the reference implementation does.
  text.append((8 - text.size() % 8) % 8, ' ');

  // The temporary file is closed and removed on every way out but the successful rename.
  struct TmpFile {
    std::string path;
    std::FILE* file;
    bool renamed = false;
    ~TmpFile() {
      if (file) std::fclose(file);
      std::error_code ignored;
      if (!renamed) fs::remove(path, ignored);
    }
  } tmp{path + ".tmp", std::fopen((path + ".tmp").c_str(), "wb")};
  PRECIS_CHECK(tmp.file, prefix(path), "cannot create '", tmp.path, "': ", std::strerror(errno));
  auto check = [&](bool ok, const char* what) {
    PRECIS_CHECK(ok, prefix(path), what, " '", tmp.path, "' failed: ", std::strerror(errno),
                 "; the previous file (if any) is unchanged");
  };
  auto write = [&](const void* bytes, size_t n) {
    check(n == 0 || std::fwrite(bytes, 1, n, tmp.file) == n, "writing");
  };

  unsigned char length_bytes[8];
  const uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>(length >> (8 * i));
  write(length_bytes, 8);
  write(text.data(), text.size());
  for (const auto& named : tensors) {
    Tensor host = host_contiguous(named.tensor);
    write(host.raw_data(), host.nbytes());
  }
  check(std::fflush(tmp.file) == 0, "flushing");
  check(::fsync(::fileno(tmp.file)) == 0, "fsync of");
  std::FILE* file = tmp.file;
  tmp.file = nullptr;
  check(std::fclose(file) == 0, "closing");
  check(std::rename(tmp.path.c_str(), path.c_str()) == 0, "renaming");
  tmp.renamed = true;
  fsync_directory(fs::path(path).parent_path());
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  Header header = read_header(file, path);
  const Json checksums = take_checksums(header.metadata, path);
  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  for (const Entry& e : header.entries) {
    Tensor t = empty(e.shape, e.dtype, Device::cpu());
    const uint64_t nbytes = e.end - e.begin;
    if (nbytes > 0) {
      file.seekg(static_cast<std::streamoff>(header.data_start + e.begin));
      file.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(nbytes));
      PRECIS_CHECK(file, prefix(path), "could not read the data of tensor '", e.name, "'");
    }
    if (e.dtype == DType::boolean) {
      const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
      for (uint64_t i = 0; i < nbytes; ++i)
        PRECIS_CHECK(bytes[i] <= 1, prefix(path), "tensor '", e.name, "' is BOOL but holds the byte ", int(bytes[i]),
                     " (only 0 and 1 are booleans)");
    }
    verify_checksum(checksums, e.name, t, path);
    out.tensors.push_back({e.name, t});
  }
  return out;
}

SafetensorsMetadata read_safetensors_metadata(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  SafetensorsMetadata metadata = read_header(file, path).metadata;
  metadata.erase(kChecksumKey);
  return metadata;
}

}  // namespace precis::train
