// Programmatic dependent launch (core/cuda/launch.cuh) is only correct if every
// kernel launched with it waits for the previous grid before touching global
// memory. These tests read the CUDA sources and check, crudely, that every launch
// goes through precis::cuda::launch and that every kernel calls
// wait_for_previous_grid(). They run without a GPU (and without CUDA).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/source_dir.h"

namespace {

namespace fs = std::filesystem;

// The library's kernel folders. (Test-only kernels, such as the wgmma probes in tests/ops/,
// are launched only by their tests and may use plain <<<>>> launches.)
const char* const kKernelDirs[] = {"core/cuda", "ops/cuda", "amp/cuda", "optim/cuda"};

struct Source {
  std::string path;  // relative to the source dir
  std::string code;  // comments and string literals blanked, newlines kept
};

// `text` with comments and the contents of string and character literals turned
// into spaces, so that neither "<<<" in a comment nor a brace in a string counts.
std::string code_only(const std::string& text) {
  std::string out = text;
  enum { kCode, kLine, kBlock, kString, kChar } state = kCode;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i], next = i + 1 < text.size() ? text[i + 1] : '\0';
    switch (state) {
      case kCode:
        if (c == '/' && next == '/')
          state = kLine;
        else if (c == '/' && next == '*')
          state = kBlock;
        else if (c == '"')
          state = kString;
        else if (c == '\'' && !(i > 0 && std::isxdigit(static_cast<unsigned char>(text[i - 1]))))
          state = kChar;
        if (state == kLine || state == kBlock) out[i] = ' ';
        break;
      case kLine:
        if (c == '\n')
          state = kCode;
        else
          out[i] = ' ';
        break;
      case kBlock:
        if (c == '*' && next == '/') {
          out[i] = out[i + 1] = ' ';
          ++i;
          state = kCode;
        } else if (c != '\n') {
          out[i] = ' ';
        }
        break;
      case kString:
      case kChar:
        if (c == '\\') {
          out[i] = ' ';
          if (i + 1 < text.size() && text[i + 1] != '\n') out[++i] = ' ';
        } else if ((state == kString && c == '"') || (state == kChar && c == '\'')) {
          state = kCode;
        } else if (c != '\n') {
          out[i] = ' ';
        }
        break;
    }
  }
  return out;
}

int line_of(const std::string& code, size_t pos) {
  return 1 + static_cast<int>(std::count(code.begin(), code.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
}

std::vector<Source> kernel_sources() {
  std::vector<Source> sources;
  for (const char* dir : kKernelDirs) {
    const fs::path folder = fs::path(PRECIS_SOURCE_DIR) / dir;
    if (!fs::is_directory(folder)) continue;
    for (const auto& entry : fs::directory_iterator(folder)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cu" && ext != ".cuh" && ext != ".h")) continue;
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      sources.push_back({std::string(dir) + "/" + entry.path().filename().string(), code_only(text.str())});
    }
  }
  std::sort(sources.begin(), sources.end(), [](const Source& a, const Source& b) { return a.path < b.path; });
  return sources;
}

struct Kernel {
  std::string name;
  int line;
  std::string body;  // from the opening brace to the matching closing one
};

// Every __global__ function defined in `code`: its body runs from the first '{'
// outside parentheses after __global__ to the brace that closes it.
std::vector<Kernel> kernels_in(const std::string& code) {
  std::vector<Kernel> kernels;
  const std::string marker = "__global__";
  for (size_t at = code.find(marker); at != std::string::npos; at = code.find(marker, at + marker.size())) {
    size_t i = at + marker.size();
    int parens = 0;
    size_t name_end = std::string::npos;  // the '(' of the parameter list: the last one opened at depth 0
    for (; i < code.size(); ++i) {
      if (code[i] == '(' && parens++ == 0)
        name_end = i;
      else if (code[i] == ')')
        --parens;
      else if ((code[i] == '{' || code[i] == ';') && parens == 0)
        break;
    }
    if (i == code.size() || code[i] == ';') continue;  // a declaration, not a definition
    size_t name_begin = name_end;
    while (name_begin > 0 && std::isspace(static_cast<unsigned char>(code[name_begin - 1]))) --name_begin;
    size_t name_stop = name_begin;
    while (name_begin > 0 &&
           (std::isalnum(static_cast<unsigned char>(code[name_begin - 1])) || code[name_begin - 1] == '_'))
      --name_begin;
    size_t end = i;
    for (int braces = 0; end < code.size(); ++end) {
      if (code[end] == '{')
        ++braces;
      else if (code[end] == '}' && --braces == 0)
        break;
    }
    kernels.push_back(
        {code.substr(name_begin, name_stop - name_begin), line_of(code, at), code.substr(i, end - i + 1)});
  }
  return kernels;
}

// The kernels in `code` whose bodies do not call wait_for_previous_grid().
std::vector<std::string> kernels_without_wait(const std::string& code) {
  std::vector<std::string> missing;
  for (const Kernel& kernel : kernels_in(code))
    if (kernel.body.find("wait_for_previous_grid()") == std::string::npos)
      missing.push_back(kernel.name + " (line " + std::to_string(kernel.line) + ")");
  return missing;
}

TEST(DependentLaunch, FindsTheKernelSources) {
  const std::vector<Source> sources = kernel_sources();
  ASSERT_GE(sources.size(), 10u) << "kernel sources not found under " << PRECIS_SOURCE_DIR;
  size_t kernels = 0;
  for (const Source& source : sources) kernels += kernels_in(source.code).size();
  EXPECT_GE(kernels, 40u);
}

TEST(DependentLaunch, NoTripleChevronLaunchIsLeft) {
  for (const Source& source : kernel_sources()) {
    for (size_t at = source.code.find("<<<"); at != std::string::npos; at = source.code.find("<<<", at + 3))
      ADD_FAILURE() << source.path << ":" << line_of(source.code, at)
                    << ": a <<<...>>> launch; use precis::cuda::launch (core/cuda/launch.cuh) so the kernel gets "
                       "programmatic dependent launch";
  }
}

TEST(DependentLaunch, EveryKernelWaitsForThePreviousGrid) {
  for (const Source& source : kernel_sources())
    for (const std::string& kernel : kernels_without_wait(source.code))
      ADD_FAILURE() << source.path << ": kernel " << kernel
                    << " never calls precis::cuda::wait_for_previous_grid(); launched with PDL it may read its "
                       "inputs before the previous kernel has written them (core/cuda/launch.cuh)";
}

// The checks above would pass vacuously if the parsing found nothing; here it
// must find the kernel that lacks the wait, and ignore what comments and strings say.
TEST(DependentLaunch, ParsingFindsAKernelWithoutTheWait) {
  const std::string code = code_only(R"(
template <typename T>
__global__ void __launch_bounds__(256) good_kernel(T* out, int64_t n) {
  precis::cuda::wait_for_previous_grid();
  if (n > 0) { out[0] = T{}; }
}
// __global__ void commented_kernel() { }
__global__ void bad_kernel(float* out) {
  const char* text = "wait_for_previous_grid() { } <<<";
  if (out) { out[0] = 1.0f; }
}
__global__ void declared_only(float* out);
void host() { /* kernel<<<1, 1>>>(); */ }
)");
  EXPECT_EQ(kernels_in(code).size(), 2u);
  EXPECT_EQ(kernels_without_wait(code), std::vector<std::string>{"bad_kernel (line 8)"});
  EXPECT_EQ(code.find("<<<"), std::string::npos);
}

}  // namespace
