#include "data/unicode_classes.h"

#include <algorithm>
#include <iterator>

#include "data/unicode_class_table.h"

namespace precis {

CharClass char_class(char32_t code_point) {
  const auto* end = std::end(unicode_table::kRanges);
  // The first range whose last code point is >= code_point; a hit if it also starts at or before it.
  const auto* range = std::lower_bound(std::begin(unicode_table::kRanges), end, code_point,
                                       [](const unicode_table::Range& r, char32_t cp) { return r.last < cp; });
  if (range != end && range->first <= code_point) return range->cls;
  return CharClass::other;
}

Utf8Char decode_utf8(std::string_view text, size_t pos) {
  constexpr Utf8Char kInvalid{0xFFFD, 1};
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  auto continuation = [&](size_t i) { return pos + i < text.size() && (byte(i) & 0xC0) == 0x80; };
  unsigned char lead = byte(0);
  if (lead < 0x80) return {lead, 1};
  size_t length;
  char32_t code_point;
  // The lower bound of each length rejects overlong encodings (a shorter form exists).
  char32_t smallest;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, code_point = lead & 0x1F, smallest = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, code_point = lead & 0x0F, smallest = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, code_point = lead & 0x07, smallest = 0x10000;
  } else {
    return kInvalid;
  }
  for (size_t i = 1; i < length; ++i) {
    if (!continuation(i)) return kInvalid;
    code_point = (code_point << 6) | (byte(i) & 0x3F);
  }
  if (code_point < smallest || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) return kInvalid;
  return {code_point, length};
}

}  // namespace precis
