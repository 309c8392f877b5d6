"""benchmarks/loader_pipeline.py: the CPU time per image of DLE's PyTorch data backend, timed
on two synthetic images (the figures themselves are this machine's; what is checked is that
the pipeline is the one the script names and that bad options are refused)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image

from benchscripts import load_script

lp = load_script("loader_pipeline")


def test_synthetic_images_have_imagenets_size_and_bytes_per_pixel():
    (jpeg,) = lp.synthetic_jpegs(1)
    img = lp.decode(jpeg)
    assert img.size == (500, 375) and img.mode == "RGB"
    assert 0.4 < len(jpeg) / (500 * 375) < 0.9        # ImageNet validation: about 0.67


def test_the_crop_follows_random_resized_crop():
    rnd = random.Random(1)
    for _ in range(200):
        left, top, right, bottom = lp.crop_box(500, 375, rnd)
        w, h = right - left, bottom - top
        assert 0 <= left < right <= 500 and 0 <= top < bottom <= 375
        # scale 0.08-1 of the area (rounding aside), aspect 3/4-4/3, or the whole image
        assert (w, h) == (500, 375) or (0.07 * 500 * 375 <= w * h <= 500 * 375
                                        and 0.74 <= w / h <= 1.35)


def test_the_transform_fills_one_chw_image_of_the_batch():
    out = np.zeros((3, 224, 224), np.uint8)
    img = Image.new("RGB", (500, 375), (10, 20, 30))
    lp.transform(img, (0, 0, 250, 200), True, out)
    assert out[:, 100, 100].tolist() == [10, 20, 30]


def test_measure_times_decode_and_the_rest():
    dec, rest = lp.measure(lp.synthetic_jpegs(2), repeats=2)
    assert dec > 0 and rest > 0


def test_bad_options_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        lp.main(["--count", "0"])
    assert exc.value.code == 2
    assert "--count 0" in capsys.readouterr().err
