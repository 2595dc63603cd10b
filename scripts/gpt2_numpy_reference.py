#!/usr/bin/env python3
"""An independent GPT-2 forward in plain numpy, for tests/models/test_gpt2.cpp.

Reads a GPT-2 model.safetensors in Hugging Face GPT2LMHeadModel layout (parsed
by hand: 8-byte little-endian header length, JSON header, raw little-endian
tensors) and its config.json (Hugging Face GPT2Config keys), runs GPT-2's
forward in float64 -- learned position embeddings, pre-norm blocks with layer
norm (eps 1e-5), causal multi-head attention, tanh-approximation GELU MLP,
final layer norm, logits against the (tied) token embedding -- and writes the
token ids and the logits to a safetensors file:

    idx     I64 [B, T]       the token ids
    logits  F64 [B, T, V]    V = vocab_size (no padding)

It shares no code with the C++ model: Conv1D weights are used as HF stores them
([in, out], y = x @ W + b), so a transposition mistake on either side shows.

Usage (from the repository root; needs `pip install numpy`):
    python3 scripts/gpt2_numpy_reference.py \\
        --model tests/fixtures/gpt2_tiny/model.safetensors \\
        --config tests/fixtures/gpt2_tiny/config.json \\
        --out tests/fixtures/gpt2_tiny/logits.safetensors
"""
import argparse
import json
import os
import struct

import numpy as np

# A fixed [2, 11] batch for the tiny fixture (ids < 67), covering the first and last ids.
DEFAULT_TOKENS = [
    [0, 66, 5, 12, 33, 7, 7, 41, 60, 1, 19],
    [64, 3, 28, 50, 9, 14, 2, 65, 37, 21, 11],
]

NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1", "BOOL": "?"}
SAFETENSORS_DTYPES = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<i8"): "I64", np.dtype("<i4"): "I32"}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_length])
    metadata = header.pop("__metadata__", {})
    base = 8 + header_length
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = data[base + begin:base + end]
        if info["dtype"] == "BF16":
            # bfloat16 is the top half of a float32.
            array = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=NUMPY_DTYPES[info["dtype"]])
        tensors[name] = array.reshape(info["shape"]).copy()
    return tensors, metadata


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata} if metadata else {}
    chunks, offset = [], 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        header[name] = {"dtype": SAFETENSORS_DTYPES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        chunks.append(array.tobytes())
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for chunk in chunks:
            f.write(chunk)
    os.replace(tmp, path)


def layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, as torch.nn.LayerNorm
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def gpt2_logits(weights, config, idx):
    """idx: int array [B, T] -> float64 logits [B, T, vocab_size]."""
    def w(name):
        # GPT2LMHeadModel names carry "transformer.", GPT2Model files do not.
        for key in ("transformer." + name, name):
            if key in weights:
                return weights[key].astype(np.float64)
        raise KeyError(name)

    def b(name, size):
        # Precis models may be built without biases (config "bias": false).
        try:
            return w(name)
        except KeyError:
            if config.get("bias", True):
                raise
            return np.zeros(size)

    C, H = config["n_embd"], config["n_head"]
    D = C // H
    B, T = idx.shape
    x = w("wte.weight")[idx] + w("wpe.weight")[np.arange(T)]
    causal = np.triu(np.ones((T, T), dtype=bool), k=1)  # key j > query i is hidden
    for layer in range(config["n_layer"]):
        p = f"h.{layer}."
        h = layer_norm(x, w(p + "ln_1.weight"), b(p + "ln_1.bias", C))
        qkv = h @ w(p + "attn.c_attn.weight") + b(p + "attn.c_attn.bias", 3 * C)  # Conv1D: [C, 3C]
        q, k, v = np.split(qkv, 3, axis=-1)
        q, k, v = (t.reshape(B, T, H, D).transpose(0, 2, 1, 3) for t in (q, k, v))  # [B, H, T, D]
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
        scores = np.where(causal, -np.inf, scores)
        y = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ w(p + "attn.c_proj.weight") + b(p + "attn.c_proj.bias", C)
        h = layer_norm(x, w(p + "ln_2.weight"), b(p + "ln_2.bias", C))
        h = gelu_tanh(h @ w(p + "mlp.c_fc.weight") + b(p + "mlp.c_fc.bias", 4 * C))
        x = x + h @ w(p + "mlp.c_proj.weight") + b(p + "mlp.c_proj.bias", C)
    x = layer_norm(x, w("ln_f.weight"), b("ln_f.bias", C))
    head = w("wte.weight") if config.get("tie_word_embeddings", True) else weights["lm_head.weight"].astype(np.float64)
    return x @ head.T


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="model.safetensors in HF GPT-2 layout")
    parser.add_argument("--config", required=True, help="config.json with HF GPT2Config keys")
    parser.add_argument("--out", required=True, help="safetensors file to write idx and logits to")
    parser.add_argument("--tokens", default=json.dumps(DEFAULT_TOKENS), help="JSON list of equal-length id lists")
    args = parser.parse_args()

    weights, _ = read_safetensors(args.model)
    with open(args.config) as f:
        config = json.load(f)
    assert config.get("activation_function", "gelu_new") == "gelu_new", "only GPT-2's tanh GELU is implemented"
    idx = np.array(json.loads(args.tokens), dtype=np.int64)
    assert idx.ndim == 2 and idx.shape[1] <= config["n_positions"], idx.shape
    assert idx.min() >= 0 and idx.max() < config["vocab_size"], "token ids out of range"
    logits = gpt2_logits(weights, config, idx)
    write_safetensors(args.out, {"idx": idx, "logits": logits},
                      {"source": "scripts/gpt2_numpy_reference.py", "model": os.path.basename(args.model)})
    print(f"wrote {args.out}: idx {list(idx.shape)}, logits {list(logits.shape)} float64")


if __name__ == "__main__":
    main()
