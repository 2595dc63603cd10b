// The Unicode facts GPT-2's pre-tokeniser needs: UTF-8 decoding and whether a
// code point is a letter (\p{L}), a number (\p{N}), whitespace (\s) or other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/utf8.h"  // append_utf8, used with these classes

namespace precis {

enum class CharClass : uint8_t { other, letter, number, space };

CharClass char_class(char32_t code_point);

struct Utf8Char {
  char32_t code_point;
  size_t length;  // in bytes, 1 to 4
};

// The code point starting at text[pos] (pos < text.size()). A byte that does
// not begin a valid UTF-8 sequence decodes as U+FFFD of length 1, so any bytes
// can be tokenised: GPT-2's BPE is byte-level and still encodes them exactly.
Utf8Char decode_utf8(std::string_view text, size_t pos);

}  // namespace precis
