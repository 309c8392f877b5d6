"""``ddlsim calibrate first-touch``: the host's first-touch cost measured into a profile."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddlsim.calibration import CalibrationProfile
from ddlsim.calibration.firsttouch import (MIN_BYTES, PAGE_BYTES, add_first_touch,
                                          measure_first_touch)
from ddlsim.calibration.schema import CalibrationError
from ddlsim.errors import ConfigError


def test_a_fresh_mapping_costs_more_than_the_same_memory_again():
    e = measure_first_touch(MIN_BYTES, 5)
    pages = MIN_BYTES // PAGE_BYTES
    assert e.fresh_s > e.warm_s and e.page_bytes == PAGE_BYTES
    assert e.s_per_page == pytest.approx((e.fresh_s - e.warm_s) / pages)
    assert f"{MIN_BYTES} B copied" in e.source and "means of 5" in e.source


@pytest.mark.parametrize("nbytes, repeats, match", [
    (MIN_BYTES - 1, 5, "first-touch bytes"), (MIN_BYTES, 2, "first-touch repeats")])
def test_sizes_and_counts_out_of_range_are_refused(nbytes, repeats, match):
    with pytest.raises(CalibrationError, match=match):
        measure_first_touch(nbytes, repeats)


def test_the_measurement_goes_into_the_profile_once(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\n")
    e = measure_first_touch(MIN_BYTES, 3)
    add_first_touch(path, e)
    assert CalibrationProfile.load(path).doc.first_touch.s_per_page == pytest.approx(
        e.s_per_page, rel=1e-6)
    with pytest.raises(ConfigError, match="--force replaces it"):
        add_first_touch(path, e)


def test_cli_writes_and_shows_it_and_refuses_a_bad_size(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\n")
    run = [sys.executable, "-m", "ddlsim.cli", "calibrate"]
    ok = subprocess.run(run + ["first-touch", str(path), "--bytes", "256KiB", "--repeats", "3"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    shown = subprocess.run(run + ["show", str(path)], capture_output=True, text=True,
                           timeout=120)
    assert f"us per {PAGE_BYTES} B page" in shown.stdout and "mean of 3" in shown.stdout
    bad = subprocess.run(run + ["first-touch", str(path), "--bytes", "1KiB", "--force"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "first-touch bytes = 1024" in bad.stderr


def test_every_fresh_mapping_is_held_until_the_last_copy(monkeypatch):
    """The proxies never free their buffers, so each repetition must fault in pages the
    process never had, not the ones the previous repetition gave back."""
    import ddlsim.calibration.firsttouch as ft
    live, opened, seen = [], [], []

    class Mapping(bytearray):  # stands in for mmap.mmap: a buffer with close()
        def __init__(self, *args, **kwargs):
            super().__init__(MIN_BYTES)
            live.append(self)
            opened.append(self)

        def close(self):
            live.remove(self)

    monkeypatch.setattr(ft.mmap, "mmap", Mapping)
    monkeypatch.setattr(ft, "copy_twice", lambda dst, src: (seen.append(len(live)), (2.0, 1.0))[1])
    ft.measure_first_touch(MIN_BYTES, 4)
    assert seen == [1, 2, 3, 4] and len(opened) == 4 and not live


def test_the_cost_is_the_mean_not_the_median(monkeypatch):
    import ddlsim.calibration.firsttouch as ft
    times = iter([(1e-3, 1e-4), (1e-3, 1e-4), (13e-3, 1e-4)])  # one slow fresh copy
    monkeypatch.setattr(ft, "copy_twice", lambda dst, src: next(times))
    e = ft.measure_first_touch(MIN_BYTES, 3)
    assert e.statistic == "mean" and e.fresh_s == pytest.approx(5e-3)
    assert e.s_per_page == pytest.approx((5e-3 - 1e-4) / (MIN_BYTES // PAGE_BYTES))


def test_more_than_the_held_limit_is_refused():
    from ddlsim.calibration.firsttouch import MAX_HELD_BYTES
    with pytest.raises(CalibrationError, match="held at once"):
        measure_first_touch(MIN_BYTES, MAX_HELD_BYTES // MIN_BYTES + 1)
