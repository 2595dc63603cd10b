// The GPT-2 BPE tokenizer on arbitrary bytes: byte-level BPE is lossless, so decoding the
// ids gives back the input exactly, and every id is in the vocabulary.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "data/gpt2_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const precis::GPT2Tokenizer tokenizer;  // the shipped assets/gpt2 files, read once
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tokenizer.encode_ordinary(text);
  for (int32_t id : ids)
    if (id < 0 || id >= tokenizer.vocab_size()) std::abort();
  if (tokenizer.decode(ids) != text) std::abort();
  tokenizer.encode(text);  // with <|endoftext|> as the special token
  return 0;
}
