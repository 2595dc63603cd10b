#include "data/gpt2_pretokenize.h"

#include "data/unicode_classes.h"

namespace precis {

namespace {

CharClass class_at(std::string_view text, size_t pos) { return char_class(decode_utf8(text, pos).code_point); }

// The end of the run of characters of class `cls` that starts at `pos`.
size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    Utf8Char c = decode_utf8(text, pos);
    if (char_class(c.code_point) != cls) break;
    pos += c.length;
  }
  return pos;
}

// 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, as in GPT-2): the end of the match, or 0.
size_t contraction_end(std::string_view text, size_t pos) {
  if (text[pos] != '\'') return 0;
  std::string_view rest = text.substr(pos + 1, 2);
  if (rest == "re" || rest == "ve" || rest == "ll") return pos + 3;
  if (!rest.empty() && (rest[0] == 's' || rest[0] == 't' || rest[0] == 'm' || rest[0] == 'd')) return pos + 2;
  return 0;
}

// The end of the piece that starts at `pos`: the regex's alternatives tried in order.
size_t piece_end(std::string_view text, size_t pos) {
  if (size_t end = contraction_end(text, pos)) return end;

  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : an optional space, then a run of one class.
  size_t run_start = text[pos] == ' ' ? pos + 1 : pos;
  if (run_start < text.size()) {
    CharClass cls = class_at(text, run_start);
    if (cls != CharClass::space) return run_end(text, run_start, cls);
  }

  // \s+(?!\S) | \s+ : a whitespace run. Followed by a non-space, the run gives up its last
  // character so that it can start the next piece (" word"), unless that leaves nothing.
  size_t last_start = pos, end = pos;
  while (end < text.size()) {
    Utf8Char c = decode_utf8(text, end);
    if (char_class(c.code_point) != CharClass::space) break;
    last_start = end;
    end += c.length;
  }
  if (end == text.size() || last_start == pos) return end;
  return last_start;
}

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = piece_end(text, pos);
    pieces.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

}  // namespace precis
