// The token-shard reader on arbitrary bytes: a shard opens (its count matching its size) and
// its tokens are checked against a vocabulary, or it is a precis::Error naming the file.
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "data/token_file.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz_input_file(data, size, ".bin");
  try {
    precis::TokenFileView view(path);
    if (precis::kTokenFileHeaderBytes + 2 * view.size() != static_cast<int64_t>(size)) std::abort();
    uint16_t largest = 0;
    for (int64_t i = 0; i < view.size(); ++i) largest = view.tokens()[i] > largest ? view.tokens()[i] : largest;
    precis::check_token_ids(view, 65536);  // every uint16 is below it
    try {
      precis::check_token_ids(view, 50257);
      if (largest >= 50257) std::abort();  // an out-of-range token went unnoticed
    } catch (const precis::Error&) {
      if (largest < 50257) std::abort();  // an in-range shard was refused
    }
  } catch (const precis::Error&) {
  }
  return 0;
}
