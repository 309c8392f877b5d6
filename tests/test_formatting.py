"""ddlsim.formatting: one rule for every number a report prints (3 significant digits)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddlsim.formatting import (format_bandwidth, format_bytes, format_change, format_flops,
                               format_number, format_percent, format_time)
from ddlsim.units import parse_bytes, parse_time


@pytest.mark.parametrize("seconds, text", [
    (3.3e-10, "0.330 ns"), (4.2e-9, "4.20 ns"), (1e-7, "100 ns"), (2.5e-6, "2.50 µs"),
    (0.0123, "12.3 ms"), (0.9997, "1.00 s"),          # rounds up into the next unit
    (22.5, "22.5 s"), (23.0, "23.0 s"),                # same digits for the same quantity
    (59.94, "59.9 s"), (59.97, "1.00 min"),            # 60.0 s would be the next unit
    (1390.0, "23.2 min"),                              # the "1.39e+03 s"
    (7200.0, "2.00 h"), (3.6e6, "1,000 h"), (0.0, "0 s"), (-0.5, "-500 ms"),
    (5e-324, "4.94e-315 ns"),                          # underflows in the larger units
])
def test_time_regimes(seconds, text):
    assert format_time(seconds) == text


@pytest.mark.parametrize("fraction, text", [
    (0.869, "86.9%"), (0.029146, "2.91%"), (1.0, "100%"),
    (0.00012, "0.0120%"),   # a small non-zero MFU is never "0.0%"
    (1.5e-7, "1.50e-05%"), (0.0, "0%"), (-0.0, "0%"), (-1e-30, "-1.00e-28%"),
])
def test_percent_regimes(fraction, text):
    assert format_percent(fraction) == text


def test_change_has_a_sign_and_no_noise():
    assert format_change(1.05, 1.0) == "+5.00%"
    assert format_change(0.88, 1.0) == "-12.0%"
    assert format_change(1.0 + 1e-13, 1.0) == "0%"   # floating-point noise, not "-0.0%"
    assert format_change(1.0 - 1e-13, 1.0) == "0%"
    assert format_change(1.0, 0.0) == ""


@pytest.mark.parametrize("fn, value, text", [
    (format_flops, 2.0e11, "200 GFLOP/s"), (format_flops, 1.38e14, "138 TFLOP/s"),
    (format_flops, 2.1e15, "2.10 PFLOP/s"), (format_flops, 999.96e9, "1.00 TFLOP/s"),
    (format_bytes, 80 * 2**30, "80.0 GiB"), (format_bytes, 1000, "1,000 B"),
    (format_bytes, 1023.99 * 2**10, "1.00 MiB"), (format_bytes, 512, "512 B"),
    (format_bytes, 0, "0 B"), (format_bandwidth, 1.25e9, "1.25 GB/s"),
    (format_bandwidth, 3e11, "300 GB/s"),
])
def test_unit_regimes(fn, value, text):
    assert fn(value) == text


@pytest.mark.parametrize("x, text", [(2514.0, "2,510"), (39.27, "39.3"), (9.996, "10.0"),
                                     (1.2e20, "1.20e+20"), (-0.0, "0"), (0.000123, "0.000123")])
def test_number(x, text):
    assert format_number(x) == text


def _digits(text: str) -> int:
    mantissa = re.sub(r"e[-+]\d+$", "", text.split(" ")[0]).replace(",", "").lstrip("-")
    return len(mantissa.replace(".", "").lstrip("0")) if "." in mantissa else len(
        mantissa.rstrip("0") or "0")


@given(st.floats(1e-11, 3.5e6))
def test_time_reads_back_to_three_digits(seconds):
    text = format_time(seconds)
    assert abs(parse_time(text) / seconds - 1) <= 5e-3 + 1e-12
    assert "." not in text or _digits(text) == 3


@given(st.floats(1.0, 2.0**60))
def test_bytes_read_back_to_three_digits(n):
    text = format_bytes(n).replace(",", "")
    assert abs(parse_bytes(text) / n - 1) <= 5e-3 + 1e-12


@given(st.floats(-1e6, 1e6, allow_nan=False))
def test_no_negative_zero_anywhere(x):
    for text in (format_number(x), format_percent(x), format_time(x)):
        assert not re.match(r"^-[0.,]+(\s|%|$)", text), text
