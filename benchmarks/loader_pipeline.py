"""CPU time per image of the PyTorch data backend of NVIDIA DeepLearningExamples' ResNet-50
(``image_classification/dataloaders.py``, ``get_pytorch_train_loader``): torchvision
``ImageFolder``'s ``pil_loader`` (open, decode, ``convert("RGB")``), ``RandomResizedCrop(224)``
bilinear, ``RandomHorizontalFlip`` and ``fast_collate``'s copy into the uint8 batch, against the
decode alone, on one thread of this machine.

Run:  python benchmarks/loader_pipeline.py [--images DIR] [--count N] [--repeats R]

``--images``: JPEGs to read (ImageNet's train or validation set where you have it); without
it, synthetic 500×375 JPEGs of ImageNet's bytes per pixel (smooth colour fields with grain,
quality 90). The decode is each image's fastest of ``R`` runs (robust to a loaded machine);
the rest of the transform takes a random crop each run, so it is the mean over crops of each
crop's fastest of 5. Prints the two times and their ratio: what a worker pays per image
(docs/validation.md, "ResNet-50 v1.5 with PyTorch DDP", the loader estimate). The crop box
follows torchvision's ``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3, ten
tries, then the whole image). Needs Pillow and numpy only (no torch).
"""

from __future__ import annotations

import argparse
import io
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

#: the crop's output side (DLE ``image_size``) and the synthetic images' size (ImageNet's
#: typical 500×375)
CROP, SYNTHETIC = 224, (500, 375)


def synthetic_jpegs(count: int, seed: int = 0) -> list[bytes]:
    """``count`` synthetic JPEGs: a bicubic-upsampled 16×12 colour field plus Gaussian grain
    (σ 26), quality 90 (about 0.6 bytes a pixel; ImageNet's validation set: 6.3 GB over
    50,000 images of about 0.19 Mpx, 0.67)."""
    rng = np.random.default_rng(seed)
    out = []
    w, h = SYNTHETIC
    for _ in range(count):
        base = Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8))
        a = np.asarray(base.resize((w, h), Image.BICUBIC)).astype(np.int16)
        a += rng.normal(0, 26, (h, w, 3)).astype(np.int16)
        buf = io.BytesIO()
        Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def decode(data: bytes) -> Image.Image:
    """torchvision's ``pil_loader``: open and convert to RGB (the decode happens here)."""
    return Image.open(io.BytesIO(data)).convert("RGB")


def crop_box(w: int, h: int, rnd: random.Random) -> tuple[int, int, int, int]:
    """``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3) as a PIL box."""
    for _ in range(10):
        area = w * h * rnd.uniform(0.08, 1.0)
        ratio = math.exp(rnd.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            top, left = rnd.randint(0, h - ch), rnd.randint(0, w - cw)
            return left, top, left + cw, top + ch
    return 0, 0, w, h


def transform(img: Image.Image, box, flip: bool, out: np.ndarray) -> None:
    """Crop, bilinear resize to 224², flip, and ``fast_collate``'s copy into the batch."""
    img = img.crop(box).resize((CROP, CROP), Image.BILINEAR)
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    out[...] = np.rollaxis(np.asarray(img, dtype=np.uint8), 2)


def _fastest(fn, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(images: list[bytes], repeats: int = 30, seed: int = 0) -> tuple[float, float]:
    """(decode, rest of the transform) in seconds per image, averaged over ``images``."""
    rnd = random.Random(seed)
    out = np.zeros((3, CROP, CROP), np.uint8)
    dec = rest = 0.0
    for data in images:
        img = decode(data)
        dec += _fastest(lambda: decode(data), repeats)
        crops = [(crop_box(*img.size, rnd), rnd.random() < 0.5) for _ in range(repeats)]
        rest += sum(_fastest(lambda: transform(img, b, f, out), 5) for b, f in crops) / repeats
    return dec / len(images), rest / len(images)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, help="a folder of JPEGs (default: synthetic)")
    ap.add_argument("--count", type=int, default=40, help="images to time (default 40)")
    ap.add_argument("--repeats", type=int, default=30, help="runs per image (default 30)")
    args = ap.parse_args(argv)
    if args.count < 1 or args.repeats < 1:
        ap.error(f"--count {args.count} and --repeats {args.repeats} must be >= 1")
    if args.images is None:
        images = synthetic_jpegs(args.count)
    else:
        files = sorted(args.images.rglob("*.JPEG")) + sorted(args.images.rglob("*.jpg"))
        if not files:
            ap.error(f"--images {args.images}: no .JPEG or .jpg file under it")
        images = [f.read_bytes() for f in files[:args.count]]
    dec, rest = measure(images, args.repeats)
    print(f"{len(images)} images: decode {dec * 1e3:.3f} ms, rest of the transform "
          f"{rest * 1e3:.3f} ms, (decode + rest) / decode {(dec + rest) / dec:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
