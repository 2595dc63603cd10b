// The tokenizer a checkpoint's run trained with (precis sample, precis eval).
#pragma once

#include <memory>

#include "core/json.h"
#include "data/tokenizer.h"

namespace precis::cli {

// The char vocabulary saved in the train state, else GPT-2 BPE.
std::unique_ptr<Tokenizer> checkpoint_tokenizer(const Json& train_state);

}  // namespace precis::cli
