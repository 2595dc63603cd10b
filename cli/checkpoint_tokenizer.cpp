#include "cli/checkpoint_tokenizer.h"

#include "data/char_tokenizer.h"
#include "data/gpt2_tokenizer.h"

namespace precis::cli {

std::unique_ptr<Tokenizer> checkpoint_tokenizer(const Json& train_state) {
  if (train_state.is_object() && train_state.contains("tokenizer")) {
    const Json& t = train_state.at("tokenizer");
    if (t.contains("tokenizer") && t.at("tokenizer").as_string() == "char")
      return std::make_unique<CharTokenizer>(CharTokenizer::from_json(t, "the checkpoint's tokenizer"));
  }
  return std::make_unique<GPT2Tokenizer>();
}

}  // namespace precis::cli
