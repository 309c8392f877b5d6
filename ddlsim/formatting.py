"""One way to print a number: fixed significant digits, a unit that fits, no ``-0``.

Every report (tables, comparisons, links) formats through these functions, so the same
quantity always reads the same way: ``23.0 s`` next to ``22.5 s``, never ``23 s``;
``1.39e+03 s`` reads ``23.2 min``; a small but non-zero MFU reads ``0.0123%``, not ``0.0%``.

The rule (:func:`format_number`): round to ``digits`` significant digits (3 by default), then
print every digit kept, trailing zeros included, without an exponent between 10⁻⁴ and 10¹⁵.
A value that rounds to zero prints without a sign. Unit choice happens *after* rounding, so
59.97 s is ``1.00 min`` rather than ``60.0 s``.
"""

from __future__ import annotations

import math

__all__ = ["DIGITS", "format_number", "format_time", "format_bytes", "format_bandwidth",
           "format_flops", "format_percent", "format_change", "format_count"]

#: Significant digits of every number in a report.
DIGITS = 3
#: Relative differences smaller than this are floating-point noise and print as ``0%``.
NOISE = 1e-9

_TIME = ((3600.0, "h"), (60.0, "min"), (1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))
_BYTES = ((2.0**50, "PiB"), (2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"),
          (2.0**10, "KiB"), (1.0, "B"))
_BANDWIDTH = ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s"))
_FLOPS = ((1e18, "EFLOP/s"), (1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"),
          (1e6, "MFLOP/s"), (1.0, "FLOP/s"))


def _round_sig(x: float, digits: int) -> tuple[float, int]:
    """``x`` rounded to ``digits`` significant digits, and the decimals that shows."""
    if x == 0 or not math.isfinite(x):  # also a subnormal divided into underflow
        return x, 0
    exp = math.floor(math.log10(abs(x)))
    rounded = round(x, digits - 1 - exp)
    if rounded and math.floor(math.log10(abs(rounded))) > exp:  # 9.996 → 10.0: one digit up
        exp += 1
        rounded = round(x, digits - 1 - exp)
    return rounded, max(digits - 1 - exp, 0)


def format_number(x: float, digits: int = DIGITS) -> str:
    """``x`` with ``digits`` significant digits: 22.5 → ``'22.5'``, 23 → ``'23.0'``,
    2514 → ``'2,510'``, 0.000123 → ``'0.000123'``, 1.2e20 → ``'1.20e+20'``, -0.0 → ``'0'``.

    Parameters
    ----------
    x : float
        Any float; ``nan`` and ``±inf`` print as ``'nan'``, ``'inf'``, ``'-inf'``.
    digits : int
        Significant digits kept (trailing zeros are printed).
    """
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    rounded, decimals = _round_sig(x, digits)
    if rounded == 0:
        return "0"
    if not 1e-4 <= abs(rounded) < 1e15:
        return f"{rounded:.{digits - 1}e}"
    return f"{rounded:,.{decimals}f}"


def _scaled(x: float, units: tuple[tuple[float, str], ...], digits: int) -> str:
    """``x`` in the largest unit in which it rounds to at least 1."""
    if not math.isfinite(x):
        return str(x)
    for i, (scale, name) in enumerate(units):
        rounded = _round_sig(x / scale, digits)[0]
        if abs(rounded) >= 1 or i == len(units) - 1:
            break
    if i > 0 and abs(rounded) * scale >= units[i - 1][0]:  # 59.97 s rounds to 1.00 min
        scale, name = units[i - 1]
        return f"{format_number(rounded * units[i][0] / scale, digits)} {name}"
    return f"{format_number(x / scale, digits)} {name}"


def format_time(seconds: float, digits: int = DIGITS) -> str:
    """Seconds as ns, µs, ms, s, min or h: 1390 → ``'23.2 min'``, 0.0123 → ``'12.3 ms'``,
    0 → ``'0 s'``. Hours stay hours however many (``'1,230 h'``)."""
    if seconds == 0:
        return "0 s"
    return _scaled(seconds, _TIME, digits)


def format_bytes(n: float, digits: int = DIGITS) -> str:
    """Bytes with binary prefixes: 85899345920 → ``'80.0 GiB'``, 1000 → ``'1,000 B'``."""
    if n == 0:
        return "0 B"
    return _scaled(n, _BYTES, digits)


def format_bandwidth(bytes_per_s: float, digits: int = DIGITS) -> str:
    """Bytes per second with decimal prefixes: 1.25e9 → ``'1.25 GB/s'``."""
    if bytes_per_s == 0:
        return "0 B/s"
    return _scaled(bytes_per_s, _BANDWIDTH, digits)


def format_flops(flops_per_s: float, digits: int = DIGITS) -> str:
    """FLOP/s in GFLOP/s, TFLOP/s, PFLOP/s as fits: 1.38e14 → ``'138 TFLOP/s'``,
    2e11 → ``'200 GFLOP/s'``."""
    if flops_per_s == 0:
        return "0 FLOP/s"
    return _scaled(flops_per_s, _FLOPS, digits)


def format_percent(fraction: float, digits: int = DIGITS) -> str:
    """A fraction as a percentage with ``digits`` significant digits: 0.869 → ``'86.9%'``,
    0.00012 → ``'0.0120%'``, 1.0 → ``'100%'``, -0.0 → ``'0%'``."""
    return f"{format_number(100 * fraction, digits)}%"


def format_change(new: float, old: float, digits: int = DIGITS) -> str:
    """The relative change ``new / old − 1`` with its sign: ``'+5.23%'``, ``'-12.0%'``;
    ``'0%'`` when the values agree to 1e-9 (floating-point noise), ``''`` when ``old`` is 0."""
    if old == 0 or not (math.isfinite(new) and math.isfinite(old)):
        return ""
    rel = new / old - 1
    if abs(rel) < NOISE:
        return "0%"
    text = format_percent(rel, digits)
    return text if text.startswith("-") or text == "0%" else "+" + text


def format_count(x: float, digits: int = DIGITS) -> str:
    """A count or rate without unit (samples/s, tokens/s): :func:`format_number`."""
    return format_number(x, digits)
