// GPT-2's pre-tokenisation: the pieces that OpenAI's regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// finds in a text, written out by hand. BPE then runs inside each piece, so no
// token crosses a piece boundary.
#pragma once

#include <string_view>
#include <vector>

namespace precis {

// The pieces in order; they are views into `text` and concatenate back to it.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace precis
