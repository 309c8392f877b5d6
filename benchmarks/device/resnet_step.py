"""Time one training step of ResNet-50 v1.5 on one GPU as NVIDIA DeepLearningExamples' PyTorch
recipe runs it, data already on the device: the per-GPU ground truth behind
``benchmarks/validate_resnet.py`` (issue 29), a microbenchmark, no ddlsim needed.

Run on a machine with a CUDA GPU, PyTorch and torchvision:

    python benchmarks/device/resnet_step.py --out OUTDIR [--steps 10]

The model is torchvision's ``resnet50`` (v1.5, as DLE's), trained with DLE's settings
(``PyTorch/Classification/ConvNets``: ``configs.yml`` and ``image_classification/training.py``):
SGD with momentum 0.875 and weight decay 3.0517578125e-05, ``cudnn.benchmark`` on, gradients
zeroed in place, cross-entropy with label smoothing 0.1; AMP runs under ``torch.autocast(fp16)``
with a ``GradScaler`` and channels-last tensors, TF32 runs in fp32 with TF32 matmuls and
convolutions, contiguous. Synthetic 224 × 224 images and labels, made once on the device (no
loader, no mixup: what ddlsim's ``input_pipeline`` adds is measured separately).

Variants (``precision_layout_batch``): ``amp_nhwc_256``, ``amp_nhwc_128``, ``tf32_nchw_256``
(DLE's A100 rows: AMP and TF32 at 256 per GPU). Each is ``--steps`` timed steps after 5
warm-ups (cuDNN's autotuning happens in the first): the median step between host
synchronisations, and the median forward and backward + update between CUDA events. Written to
``OUTDIR/resnet_step.json`` with the environment; with ``--trace``, one more step of each variant
under the PyTorch profiler, ``OUTDIR/resnet_<variant>_trace.json.gz``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def run(variant: str, steps: int, trace_dir: str | None = None) -> dict:
    import torchvision
    precision, layout, batch = variant.split("_")
    batch = int(batch)
    amp = precision == "amp"
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.256, momentum=0.875,
                          weight_decay=3.0517578125e-05)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)

    def step():
        e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        e[0].record()
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        e[1].record()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=False)
        e[2].record()
        return e

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    walls, parts = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        e = step()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        parts.append((e[0].elapsed_time(e[1]) / 1e3, e[1].elapsed_time(e[2]) / 1e3))
    step_s = statistics.median(walls)
    if trace_dir:   # one more step under the PyTorch profiler (Kineto): host time per op
        from h100_kernels import profiled_step
        profiled_step(step, os.path.join(trace_dir, f"resnet_{variant}_trace.json.gz"), True)
    res = {"variant": variant, "batch": batch, "step_s": step_s, "step_samples_s": walls,
           "forward_s": statistics.median(p[0] for p in parts),
           "backward_update_s": statistics.median(p[1] for p in parts),
           "images_per_s": batch / step_s,
           "peak_allocated_GiB": torch.cuda.max_memory_allocated() / 2 ** 30}
    del model, opt, x
    torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--variants", default="amp_nhwc_256,amp_nhwc_128,tf32_nchw_256")
    ap.add_argument("--trace", action="store_true",
                    help="also write a Kineto trace of one step per variant (OUTDIR/*.json.gz)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from h100_kernels import env
    result = {"env": env("cuda"), "variants": []}
    for variant in args.variants.split(","):
        try:
            res = run(variant, args.steps, args.out if args.trace else None)
        except Exception as exc:  # noqa: BLE001 - keep what was measured
            res = {"variant": variant, "error": repr(exc)[:500]}
        print(json.dumps(res), flush=True)
        result["variants"].append(res)
        with open(os.path.join(args.out, "resnet_step.json"), "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
