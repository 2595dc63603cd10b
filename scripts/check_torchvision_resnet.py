"""Loads a Precis ResNet checkpoint into torchvision's ResNet with
load_state_dict(strict=True) and checks that torchvision computes the logits Precis
computed on the same images (issue 18: "a ResNet checkpoint loads with
torchvision.models.resnet18().load_state_dict").

Usage:
  python3 scripts/check_torchvision_resnet.py --checkpoint STEP/model.safetensors \
      --reference REFERENCE.safetensors --model resnet18|resnet34|resnet50 [--cifar-stem]

REFERENCE.safetensors holds what Precis computed from the checkpoint's weights
(tests/models/test_torchvision_resnet.cpp writes both files and runs this script):
  images        [N, 3, H, W] f32, the input
  eval_logits   the logits in eval mode (the running statistics)
  train_logits  the logits of one training-mode forward (the batch's statistics)
  after.NAME    every running_mean / running_var after that training forward
Checked: eval logits, train logits, and the running statistics PyTorch's update rule
gives, each within --rtol of its scale (max(1, max |value|)); torchvision runs in f64, so
what is left is Precis's f32 rounding (~1e-6 in eval; up to ~1e-4 in ResNet-50's training
forward, whose layer4 batch statistics average 16 values). Exit 0 when all agree, 1 when not.
Needs torch and torchvision (CPU is enough); the safetensors files are parsed here, so the
safetensors package is not needed.
"""
import argparse
import json
import struct
import sys

import torch
import torchvision

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    """name -> tensor, from the format's [u64 header size][JSON header][data]."""
    with open(path, "rb") as f:
        blob = f.read()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    data = blob[8 + size:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        flat = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype) if end > begin else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(entry["shape"]).clone()
    return tensors


def torchvision_model(name, num_classes, cifar_stem):
    model = getattr(torchvision.models, name)(num_classes=num_classes)
    if cifar_stem:  # the usual CIFAR stem: a 3x3 stride-1 conv1 and no max-pool
        model.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = torch.nn.Identity()
    return model


def relative_error(got, want):
    """max |got - want| over max(1, max |want|): the error relative to the tensor's scale."""
    return (got.double() - want.double()).abs().max().item() / max(1.0, want.abs().max().item())


def compare(what, got, want, rtol):
    error = relative_error(got, want)
    print(f"{what}: max |torchvision - precis| / scale = {error:.3g} (allowed {rtol:.3g})"
          f" {'ok' if error <= rtol else 'MISMATCH'}")
    return error <= rtol


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a Precis step folder's model.safetensors")
    parser.add_argument("--reference", required=True, help="images and Precis's outputs (see above)")
    parser.add_argument("--model", required=True, choices=["resnet18", "resnet34", "resnet50"])
    parser.add_argument("--cifar-stem", action="store_true")
    parser.add_argument("--rtol", type=float, default=1e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.backends.mkldnn.enabled = False  # plain f32 convolutions
    state = read_safetensors(args.checkpoint)
    reference = read_safetensors(args.reference)
    model = torchvision_model(args.model, state["fc.weight"].shape[0], args.cifar_stem).double()
    model.load_state_dict(state, strict=True)  # raises on a missing, extra or misshapen tensor
    print(f"{args.model}{' (CIFAR stem)' if args.cifar_stem else ''}: {len(state)} tensors loaded with "
          f"load_state_dict(strict=True)")

    images = reference["images"].double()
    ok = True
    with torch.no_grad():
        model.eval()
        ok &= compare("eval logits", model(images), reference["eval_logits"], args.rtol)
        model.train()
        ok &= compare("train logits", model(images), reference["train_logits"], args.rtol)
    after = {k[len("after."):]: v for k, v in reference.items() if k.startswith("after.")}
    model_state = model.state_dict()
    worst = max(after, key=lambda name: relative_error(model_state[name], after[name]))
    ok &= compare(f"running statistics after the training forward ({len(after)} tensors; worst {worst})",
                  model_state[worst], after[worst], args.rtol)
    print("torchvision agrees with precis" if ok else "torchvision DISAGREES with precis")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
