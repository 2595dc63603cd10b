// UTF-8 encoding of one code point (used by the JSON reader and the GPT-2 byte-to-unicode table).
#pragma once

#include <string>

namespace precis {

// Appends the 1-4 byte UTF-8 encoding of `code_point` (which must be a valid scalar value).
void append_utf8(std::string& out, char32_t code_point);

}  // namespace precis
