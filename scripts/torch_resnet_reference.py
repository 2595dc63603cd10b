#!/usr/bin/env python3
"""PyTorch's side of issue 18's ResNet bars, with `precis bench resnet`'s settings.

torchvision's ResNet (the CIFAR stem: a 3x3 stride-1 first convolution and no max-pool, 10
classes, for --image 32; the ImageNet stem and 1000 classes for 224) trained on one fixed
synthetic batch with SGD (lr 0.1, momentum 0.9, weight decay 5e-4, as the bench), under
autocast for bf16/fp16 (fp16 with a GradScaler), TF32 for tf32, cudnn.benchmark on,
optionally channels-last and torch.compile. Prints one line as the bench's last line:
    result: bench=torch-resnet model=... images_per_s=... ms_per_step=... peak_gib=...

    python3 scripts/torch_resnet_reference.py --model resnet18 --image 32 --batch 256 \\
        --precision bf16 [--channels-last] [--compile [--compile-mode reduce-overhead]] [--steps 20] [--warmup 5]

--compile-mode is torch.compile's mode: default, reduce-overhead (the step's kernels replayed
from CUDA graphs, as Precis's graphs runs) or max-autotune (also Triton's product autotuning).
"""
import argparse
import time

import torch
import torchvision


def build(model_name, image):
    classes = 10 if image == 32 else 1000
    model = getattr(torchvision.models, model_name)(num_classes=classes)
    if image == 32:
        model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        model.maxpool = torch.nn.Identity()
    return model, classes


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image", type=int, default=32)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "fp16", "bf16"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead", "max-autotune"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()

    torch.backends.cudnn.benchmark = True
    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model, classes = build(a.model, a.image)
    model = model.cuda().to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(a.batch, 3, a.image, a.image, device="cuda").to(memory_format=fmt)
    y = torch.randint(0, classes, (a.batch,), device="cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=a.precision == "fp16")
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward_loss(inputs, targets):
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            return loss_fn(model(inputs), targets)

    run = torch.compile(forward_loss, mode=a.compile_mode) if a.compile else forward_loss

    def step():
        opt.zero_grad(set_to_none=True)
        loss = run(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) * 1000 / a.steps
    peak = torch.cuda.max_memory_allocated() / 2**30
    layout = "channels-last" if a.channels_last else "nchw"
    print(f"result: bench=torch-resnet model={a.model} image={a.image} batch={a.batch} precision={a.precision} "
          f"layout={layout} compile={a.compile_mode if a.compile else 'false'} torch={torch.__version__} "
          f"images_per_s={a.batch * 1000 / ms:.0f} ms_per_step={ms:.3f} peak_gib={peak:.3f}")


if __name__ == "__main__":
    main()
