#!/usr/bin/env python3
"""Reference GPT-2 encodings for tests/data/test_gpt2_tokenizer.cpp.

Encodes with a copy of OpenAI's gpt-2/src/encoder.py (byte-level BPE over the
`regex` pre-tokenisation pattern) reading assets/gpt2, and, where `tiktoken`
is installed, checks that tiktoken's "gpt2" encoding (built from the same
local files) gives the same ids. Prints the cases as C++ initialisers, plus
the token count and FNV-1a checksum of the whole of tinyshakespeare.

Usage: python3 scripts/gpt2_reference.py   (from the repository root; needs `pip install regex`)
"""
import json
import os

import regex

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
ENCODER_JSON = os.path.join(ROOT, "assets/gpt2/encoder.json")
VOCAB_BPE = os.path.join(ROOT, "assets/gpt2/vocab.bpe")
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"

# Each case: (name, text, allow_special). Keep in step with the C++ test.
CASES = [
    ("hello_world", "Hello world", False),
    ("contractions", "I'm sure you'll say it's what we've done, they're here and I'd go. DON'T 'tis' x's", False),
    ("whitespace_runs", "a  b   c\n\nd \n e\t\tf   \n   x\r\n\r\ny   ", False),
    ("leading_and_trailing_spaces", "   indented\n\n\n    code()  ", False),
    ("numbers_and_punctuation", "In 1999, pi=3.14159... costs $100!!! (test) -- ok?! [a]{b}<c> #42 @home", False),
    ("latin_greek_cyrillic", "h\u00e9llo w\u00f6rld na\u00efve caf\u00e9 \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 "
                             "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!", False),
    ("cjk_and_emoji", "\u4f60\u597d\u4e16\u754c \u65e5\u672c\u8a9e\u3067\u3059\u3002 \U0001f600\U0001f44d ok", False),
    ("unicode_numbers_and_spaces", "\u0661\u0662\u0663 \u00bd x\u00a0y z\u3000w \u2163 \u00b2", False),
    ("special_token", "Hello<|endoftext|> world<|endoftext|>", True),
    ("special_token_as_text", "Hello<|endoftext|> world", False),
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(n) for n in cs]))


def get_pairs(word):
    return set(zip(word, word[1:]))


class Encoder:
    """OpenAI's gpt-2/src/encoder.py Encoder, unchanged in behaviour."""

    def __init__(self, encoder, bpe_merges):
        self.encoder = encoder
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = dict(zip(bpe_merges, range(len(bpe_merges))))
        self.cache = {}
        self.pat = regex.compile(PATTERN)

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        word = " ".join(word)
        self.cache[token] = word
        return word

    def encode(self, text):
        bpe_tokens = []
        for token in regex.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            bpe_tokens.extend(self.encoder[bpe_token] for bpe_token in self.bpe(token).split(" "))
        return bpe_tokens


def encode(enc, text, allow_special):
    # encoder.py has no special tokens; split around <|endoftext|> as tiktoken does when it is allowed.
    if not allow_special:
        return enc.encode(text)
    ids = []
    for i, part in enumerate(text.split(EOT)):
        if i > 0:
            ids.append(enc.encoder[EOT])
        ids.extend(enc.encode(part))
    return ids


def tiktoken_encoding():
    try:
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    except ImportError:
        return None
    return tiktoken.Encoding(name="gpt2-local", pat_str=PATTERN,
                             mergeable_ranks=data_gym_to_mergeable_bpe_ranks(VOCAB_BPE, ENCODER_JSON),
                             special_tokens={EOT: 50256}, explicit_n_vocab=50257)


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        h ^= i
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def cpp_string(text):
    out = []
    for b in text.encode("utf-8"):
        c = chr(b)
        if c == '"' or c == "\\":
            out.append("\\" + c)
        elif 0x20 <= b < 0x7F:
            # A hex escape swallows following hex digits, so close the literal after one.
            if out and out[-1].startswith("\\x") and c in "0123456789abcdefABCDEF":
                out.append('" "')
            out.append(c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        else:
            out.append("\\x%02X" % b)
    return '"' + "".join(out) + '"'


def main():
    with open(ENCODER_JSON, encoding="utf-8") as f:
        encoder = json.load(f)
    with open(VOCAB_BPE, encoding="utf-8") as f:
        bpe_data = f.read()
    merges = [tuple(line.split()) for line in bpe_data.split("\n")[1:-1]]
    enc = Encoder(encoder, merges)
    tik = tiktoken_encoding()

    for name, text, allow_special in CASES:
        ids = encode(enc, text, allow_special)
        if tik is not None:
            expected = tik.encode(text, allowed_special={EOT}) if allow_special else tik.encode_ordinary(text)
            assert ids == expected, (name, ids, expected)
        print(f'    {{"{name}", {cpp_string(text)}, {"true" if allow_special else "false"},')
        print(f'     {{{", ".join(map(str, ids))}}}}},')

    with open(os.path.join(ROOT, "assets/tinyshakespeare.txt"), encoding="utf-8") as f:
        shakespeare = f.read()
    ids = enc.encode(shakespeare)
    if tik is not None:
        assert ids == tik.encode_ordinary(shakespeare)
    print(f"tinyshakespeare: {len(ids)} tokens, fnv1a64 0x{fnv1a64(ids):016X}, first 8 {ids[:8]}")
    print("checked against tiktoken" if tik is not None else "tiktoken not installed: not cross-checked")


if __name__ == "__main__":
    main()
