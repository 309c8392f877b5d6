"""proxies_check.py --first-touch: recorded rows predicted with a first-touch measurement."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest

from benchscripts import BENCH  # puts benchmarks/ on sys.path
import proxies_calib as calib

_spec = importlib.util.spec_from_file_location("proxies_check", BENCH / "proxies_check.py")
pc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pc)

DATA = BENCH / "data" / "proxies_2026-11-29"
TOUCH = DATA / "firsttouch" / "profile.yaml"


def test_first_touch_needs_profiles():
    proc = subprocess.run([sys.executable, str(BENCH / "proxies_check.py"), "--rows",
                           str(DATA / "run9" / "rows.json"), "--first-touch", str(TOUCH)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--first-touch" in proc.stderr and "--profiles" in proc.stderr


def test_a_profile_without_the_measurement_is_refused():
    with pytest.raises(ValueError, match="no first_touch measurement"):
        calib.first_touch_sets(DATA / "run9" / "profile2-gpt2_large.yaml")


def test_the_recorded_gpt2_row_pays_two_first_receives():
    # run9's gpt2_large at 2 ranks (4 2 2): stage 1's first forward and stage 0's first
    # backward receive each write ceil(808960·4 / 4096) = 790 fresh pages
    row = next(r for r in json.loads((DATA / "run9" / "rows.json").read_text())
               if r["proxy"] == "gpt2_large")
    before = pc.repredict([row], DATA / "run9")[0]
    after = pc.repredict([row], DATA / "run9", TOUCH)[0]
    s_per_page = float(calib.first_touch_sets(TOUCH)[0].split("=")[1])
    for engine in ("analytical", "des"):
        assert after[f"predicted_{engine}_s"] - before[f"predicted_{engine}_s"] == \
            pytest.approx(2 * math.ceil(808_960 * 4 / 4096) * s_per_page, rel=1e-6)
