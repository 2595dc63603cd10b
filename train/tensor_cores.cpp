#include "train/tensor_cores.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <vector>

namespace precis::train {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Rule 1: our kernels on mma.sync / wgmma (ops/cuda/flash_attention_*.cu).
const char* const kOurTensorCoreKernels[] = {"flash_forward_kernel", "flash_backward_kernel",
                                             "flash_forward_sm90_kernel", "flash_backward_sm90_kernel"};

// Rule 2: the library markers, and the MMA shape tokens (letter = h fp16, s f32, i int8).
const char* const kLibraryMarkers[] = {"xmma", "gmma", "hmma", "imma", "tensorop", "nvjet"};
const std::regex kMmaShape("(^|_)([hsi])(884|1688|16816|8816|16832|161616)");

// The type words of xmma's "<A><B>_<math><accumulator>" tokens, mapped to the table's names.
struct TypeWord {
  const char* word;
  const char* type;
};
const TypeWord kPairWords[] = {{"bf16", "bf16"}, {"tf32", "tf32"}, {"e4m3", "fp8"}, {"e5m2", "fp8"}, {"f16", "fp16"},
                               {"f32", "f32"},   {"f64", "f64"},   {"s32", "s32"},  {"s8", "int8"},  {"i8", "int8"}};

// The types of a token made only of type words ("bf16bf16" -> {bf16, bf16}); empty otherwise.
std::vector<std::string> type_pair(const std::string& token) {
  std::vector<std::string> types;
  size_t at = 0;
  while (at < token.size()) {
    bool matched = false;
    for (const TypeWord& w : kPairWords) {
      if (token.compare(at, std::char_traits<char>::length(w.word), w.word) == 0) {
        types.push_back(w.type);
        at += std::char_traits<char>::length(w.word);
        matched = true;
        break;
      }
    }
    if (!matched) return {};
  }
  return types.size() >= 2 ? types : std::vector<std::string>{};
}

// Rule 3a: the math type of an xmma/cuDNN name, from its first two type-pair tokens.
std::string xmma_math_type(const std::string& name) {
  std::vector<std::string> tokens;
  size_t start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '_') {
      tokens.push_back(name.substr(start, i - start));
      start = i + 1;
    }
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<std::string> inputs = type_pair(tokens[i]);
    if (inputs.empty()) continue;
    std::vector<std::string> math = i + 1 < tokens.size() ? type_pair(tokens[i + 1]) : std::vector<std::string>{};
    const std::string& type = math.empty() ? inputs[0] : math[0];
    return type == "f32" || type == "f64" || type == "s32" ? "?" : type;  // no Tensor Core input of those
  }
  return "";
}

// Rule 3b: the first type word of the name, by position.
std::string first_type_word(const std::string& name) {
  const TypeWord words[] = {{"nv_bfloat16", "bf16"}, {"bfloat16", "bf16"}, {"bf16", "bf16"}, {"e4m3", "fp8"},
                            {"e5m2", "fp8"},         {"fp8", "fp8"},       {"tf32", "tf32"}, {"fp16", "fp16"},
                            {"__half", "fp16"},      {"f16", "fp16"},      {"int8", "int8"}};
  size_t best = std::string::npos;
  std::string type;
  for (const TypeWord& w : words) {
    for (size_t at = name.find(w.word); at != std::string::npos; at = name.find(w.word, at + 1)) {
      // "f16" inside "bf16" is bf16's, found by its own word.
      if (std::string(w.word) == "f16" && at > 0 && name[at - 1] == 'b') continue;
      if (at < best) best = at, type = w.type;
      break;
    }
  }
  return type;
}

}  // namespace

TensorCoreUse tensor_core_use(const std::string& kernel_name) {
  const std::string name = lower(kernel_name);
  TensorCoreUse use;
  for (const char* ours : kOurTensorCoreKernels) {
    if (contains(name, ours)) {
      use.tensor_cores = true;
      const std::string type = first_type_word(name);
      use.input_type = type.empty() ? "?" : type;
      return use;
    }
  }
  std::smatch shape;
  const bool has_shape = std::regex_search(name, shape, kMmaShape);
  bool marked = has_shape;
  for (const char* marker : kLibraryMarkers) marked = marked || contains(name, marker);
  if (!marked) return use;
  use.tensor_cores = true;
  use.input_type = xmma_math_type(name);
  if (use.input_type.empty()) use.input_type = first_type_word(name);
  if (use.input_type.empty() && has_shape) {
    const char letter = shape[2].str()[0];
    use.input_type = letter == 'h' ? "fp16" : letter == 'i' ? "int8" : "tf32";
  }
  if (use.input_type.empty()) use.input_type = "?";
  return use;
}

std::string tensor_core_label(const TensorCoreUse& use) { return use.tensor_cores ? use.input_type : "no"; }

}  // namespace precis::train
