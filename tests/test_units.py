"""Quantities with units, in the forms people write; SI floats out, clear errors otherwise."""

from __future__ import annotations

import pytest

from ddlsim.units import UnitError, parse_bandwidth, parse_bytes, parse_flops, parse_time

GBIT = 1e9 / 8  # 1 Gb/s in B/s


@pytest.mark.parametrize("text, expected", [
    ("200 Gb/s", 200 * GBIT), ("200 Gbps", 200 * GBIT), ("200 gbps", 200 * GBIT),
    ("200Gbps", 200 * GBIT), ("200 Gbit/s", 200 * GBIT), ("200 gbit/s", 200 * GBIT),
    ("25 GB/s", 25e9), ("25 GBps", 25e9), ("100 Mbps", 100e6 / 8), ("100 mbps", 100e6 / 8),
    ("10 kbps", 10e3 / 8), ("1 GiB/s", 2.0**30), ("1 MiBps", 2.0**20), ("7 B/s", 7.0),
    (12.5e9, 12.5e9), ("12.5e9", 12.5e9),
])
def test_bandwidth_forms(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["5 us", "5 µs", "5 μs", "5us", "5e-6", "0.005 ms", "5000 ns"])
def test_time_forms_micro_sign_and_greek_mu(text):
    assert parse_time(text) == pytest.approx(5e-6)


def test_micro_sign_and_greek_mu_are_different_characters():
    assert "\u00b5" != "\u03bc"
    assert parse_time("1 \u00b5s") == parse_time("1 \u03bcs") == parse_time("1 us")


@pytest.mark.parametrize("text, expected", [
    ("80 GiB", 80 * 2.0**30), ("80 GB", 80e9), ("8 Gb", 1e9), ("64 MiB", 2.0**26), (4096, 4096.0),
])
def test_byte_forms(text, expected):
    assert parse_bytes(text) == pytest.approx(expected)


def test_flops_forms():
    assert parse_flops("312 TFLOP/s") == parse_flops("312 TFLOPS") == pytest.approx(3.12e14)


@pytest.mark.parametrize("parse, text, allowed", [
    (parse_bandwidth, "200 gb", "Gb/s"),  # a size, not a rate: the message lists the rates
    (parse_bandwidth, "5 fast", "GB/s"),
    (parse_time, "5 sec", "s, ms, us, \u00b5s, \u03bcs, ns, min, h"),
    (parse_bytes, "1 XB", "KiB, MiB, GiB"),
    (parse_flops, "3 TOPS", "FLOP/s"),
])
def test_unknown_unit_lists_the_allowed_ones(parse, text, allowed):
    with pytest.raises(UnitError) as err:
        parse(text)
    assert f"unknown unit {text.split()[1]!r}" in str(err.value) and allowed in str(err.value)
    assert "as a size" not in str(err.value) or parse is parse_bytes


@pytest.mark.parametrize("parse, value", [
    (parse_time, "1e400 s"), (parse_bandwidth, "1e400 Gb/s"), (parse_bandwidth, "1e300 Tb/s"),
    (parse_bandwidth, float("inf")), (parse_bytes, float("nan")), (parse_time, float("-inf")),
    (parse_bandwidth, "inf Gb/s"), (parse_bytes, "nan GB"),
])
def test_non_finite_values_are_refused(parse, value):
    with pytest.raises(UnitError):
        parse(value)


@pytest.mark.parametrize("value", [True, False, None, [1], {"a": 1}])
def test_non_numbers_are_refused(value):
    with pytest.raises(UnitError, match="expected a bandwidth"):
        parse_bandwidth(value)
