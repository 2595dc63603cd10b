"""Loads a Precis checkpoint step folder with Hugging Face transformers'
GPT2LMHeadModel and prints its greedy continuation of a prompt, so it can be
compared with `precis sample STEP_FOLDER --top-k 1 --prompt ...`.

Usage: python3 scripts/check_hf_checkpoint.py STEP_FOLDER "prompt" N_TOKENS
(needs torch, transformers and regex; the GPU machines have them).
"""
import sys

import torch
from transformers import GPT2LMHeadModel


def main():
    folder, prompt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model = GPT2LMHeadModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ids = tokenizer_encode(prompt)
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            logits = model(x).logits[0, -1]
            x = torch.cat([x, logits.argmax().view(1, 1)], dim=1)
    print(decode(x[0, len(ids):].tolist()))


def tokenizer_encode(text):
    # The GPT-2 BPE files Precis ships, loaded without network access.
    import json
    import os
    root = os.path.join(os.path.dirname(__file__), "..", "assets", "gpt2")
    with open(os.path.join(root, "vocab.bpe"), encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n")[1:] if line]
    with open(os.path.join(root, "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    byte_encoder = bytes_to_unicode()
    ranks = {m: i for i, m in enumerate(merges)}
    import regex
    pat = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    out = []
    for piece in pat.findall(text):
        word = tuple(byte_encoder[b] for b in piece.encode("utf-8"))
        while len(word) > 1:
            pairs = [(ranks.get((word[i], word[i + 1]), 1 << 30), i) for i in range(len(word) - 1)]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            word = word[:i] + (word[i] + word[i + 1],) + word[i + 2:]
        out.extend(encoder[t] for t in word)
    return out


def decode(ids):
    import json
    import os
    with open(os.path.join(os.path.dirname(__file__), "..", "assets", "gpt2", "encoder.json"), encoding="utf-8") as f:
        decoder = {v: k for k, v in json.load(f).items()}
    byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(byte_decoder[c] for c in "".join(decoder[i] for i in ids)).decode("utf-8", errors="replace")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


if __name__ == "__main__":
    main()
