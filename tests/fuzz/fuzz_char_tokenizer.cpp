// The char tokenizer on arbitrary bytes, both ways in: a vocabulary made from the input
// encodes and decodes it losslessly, and the input read as a saved vocabulary (JSON) is a
// tokenizer or a precis::Error.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/json.h"
#include "data/char_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!text.empty()) {  // an empty text has no vocabulary (a precis::Error)
    const precis::CharTokenizer vocabulary = precis::CharTokenizer::from_text(text);
    if (vocabulary.decode(vocabulary.encode(text)) != text) std::abort();
  }
  try {
    const precis::CharTokenizer loaded = precis::CharTokenizer::from_json(precis::Json::parse(text, "fuzz"));
    const std::string round = loaded.decode(loaded.encode(loaded.chars()));
    if (round != loaded.chars()) std::abort();
  } catch (const precis::Error&) {
  }
  return 0;
}
