#!/usr/bin/env python3
"""PyTorch's side of issue 18's ResNet bars, with `precis bench resnet`'s settings.

torchvision's ResNet (the CIFAR stem: a 3x3 stride-1 first convolution and no max-pool, 10
classes, for --image 32; the ImageNet stem and 1000 classes for 224) trained on one fixed
synthetic batch with SGD (lr 0.1, momentum 0.9, weight decay 5e-4, as the bench), under
autocast for bf16/fp16 (fp16 with a GradScaler), TF32 for tf32, cudnn.benchmark on,
optionally channels-last and torch.compile. Prints one line as the bench's last line:
    result: bench=torch-resnet model=... images_per_s=... ms_per_step=... peak_gib=... start_peak_gib=...
peak_gib is max_memory_allocated over the measured steps (reset after the warm-up);
start_peak_gib is the most allocated from the process's start to the end of the warm-up
(cudnn.benchmark's trials, torch.compile's graph recording), as `precis bench resnet`'s peak_gib.

    python3 scripts/torch_resnet_reference.py --model resnet18 --image 32 --batch 256 \\
        --precision bf16 [--channels-last] [--compile [--compile-mode reduce-overhead]] [--steps 20] [--warmup 5]
        [--device cuda|cpu]

--compile-mode is torch.compile's mode: default, reduce-overhead (the step's kernels replayed
from CUDA graphs, as Precis's graphs runs) or max-autotune (also Triton's product autotuning).
scripts/torch_resnet_profile.py profiles the same step (add_arguments, make_step).
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


def add_arguments(p):
    """The bench's options (scripts/torch_resnet_profile.py adds its own to the same parser)."""
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image", type=int, default=32)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "fp16", "bf16"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead", "max-autotune"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: for checking the scripts on a machine without a GPU (tiny batches)")


def make_step(a):
    """One training step of the bench's model on one fixed synthetic batch, as a function."""
    torch.backends.cudnn.benchmark = True
    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model, classes = build(a.model, a.image)
    model = model.to(a.device).to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(a.batch, 3, a.image, a.image, device=a.device).to(memory_format=fmt)
    y = torch.randint(0, classes, (a.batch,), device=a.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(a.device, enabled=a.precision == "fp16")
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward_loss(inputs, targets):
        with torch.autocast(a.device, dtype=dtype or torch.float32, enabled=dtype is not None):
            return loss_fn(model(inputs), targets)

    run = torch.compile(forward_loss, mode=a.compile_mode) if a.compile else forward_loss

    def step():
        opt.zero_grad(set_to_none=True)
        loss = run(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(a, step):
    """Milliseconds per step over a.steps steps after a.warmup warm-up steps."""
    for _ in range(a.warmup):
        step()
    synchronize(a.device)
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    synchronize(a.device)
    return (time.perf_counter() - start) * 1000 / a.steps


def main():
    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args()
    step = make_step(a)
    start_peak = 0.0
    if a.device == "cuda":
        for _ in range(a.warmup):  # the peak is the measured steps'
            step()
        torch.cuda.synchronize()
        start_peak = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
        a.warmup = 0
    ms = time_steps(a, step)
    peak = torch.cuda.max_memory_allocated() / 2**30 if a.device == "cuda" else 0.0
    layout = "channels-last" if a.channels_last else "nchw"
    print(f"result: bench=torch-resnet model={a.model} image={a.image} batch={a.batch} precision={a.precision} "
          f"layout={layout} compile={a.compile_mode if a.compile else 'false'} torch={torch.__version__} "
          f"images_per_s={a.batch * 1000 / ms:.0f} ms_per_step={ms:.3f} peak_gib={peak:.3f} "
          f"start_peak_gib={max(start_peak, peak):.3f}")


if __name__ == "__main__":
    main()
