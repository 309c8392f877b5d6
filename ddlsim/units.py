"""Parse quantities with units at the edge; everything inside ddlsim is an SI float.

Inside the package: seconds, bytes, bytes/s (``_Bps``), FLOP/s. Users may write
``"200 Gb/s"``, ``"25 GB/s"``, ``"5 us"``, ``"80 GiB"``, ``"312 TFLOP/s"`` or a bare number
(already SI). Bits are converted to bytes (1 byte = 8 bits); decimal prefixes are powers of
1000, binary prefixes (Ki, Mi, Gi, Ti) powers of 1024.
"""

from __future__ import annotations

import re

__all__ = ["parse_quantity", "parse_bandwidth", "parse_bytes", "parse_time", "parse_flops",
           "format_bytes", "format_time", "format_rate"]

_DEC = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}

_NUM = r"(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_RE = re.compile(rf"^\s*{_NUM}\s*(?P<unit>[A-Za-zµ/]*)\s*$")


class UnitError(ValueError):
    """A quantity string could not be parsed in the expected dimension."""


def _split(text: str | float | int, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"expected a {what}, got {text!r}")
    if isinstance(text, (int, float)):
        return float(text), ""
    m = _RE.match(str(text))
    if not m:
        raise UnitError(f"cannot read {text!r} as a {what}")
    return float(m["num"]), m["unit"]


def _prefix(prefix: str, text: object, what: str) -> float:
    if prefix in _BIN:
        return _BIN[prefix]
    if prefix in _DEC:
        return _DEC[prefix]
    raise UnitError(f"unknown prefix {prefix!r} in {text!r} (a {what})")


def parse_bytes(text: str | float | int) -> float:
    """``"80 GiB"`` → 85899345920.0; ``"1 Gb"`` → 1.25e8 (bits are divided by 8)."""
    value, unit = _split(text, "size in bytes")
    if unit == "":
        return value
    for suffix, scale in (("B", 1.0), ("b", 0.125), ("bit", 0.125), ("bits", 0.125)):
        if unit.endswith(suffix) and (unit[: -len(suffix)] in _DEC or unit[: -len(suffix)] in _BIN):
            return value * scale * _prefix(unit[: -len(suffix)], text, "size")
    raise UnitError(f"cannot read {text!r} as a size; use e.g. '64 MiB', '1 GB', '8 Gb'")


def parse_bandwidth(text: str | float | int) -> float:
    """Bandwidth in bytes/s: ``"200 Gb/s"`` → 2.5e10, ``"25 GB/s"`` → 2.5e10, ``"10GbE"`` no."""
    value, unit = _split(text, "bandwidth")
    if unit == "":
        return value
    low = unit.replace("ps", "/s")
    if not low.endswith("/s"):
        raise UnitError(f"cannot read {text!r} as a bandwidth; use e.g. '200 Gb/s' or '25 GB/s'")
    return parse_bytes(f"{value} {low[:-2]}")


def parse_time(text: str | float | int) -> float:
    """``"5 us"`` → 5e-6 seconds."""
    value, unit = _split(text, "time")
    if unit == "":
        return value
    if unit not in _TIME:
        raise UnitError(f"cannot read {text!r} as a time; units allowed: {', '.join(_TIME)}")
    return value * _TIME[unit]


def parse_flops(text: str | float | int) -> float:
    """``"312 TFLOP/s"`` or ``"312 TFLOPS"`` → 3.12e14 FLOP/s."""
    value, unit = _split(text, "FLOP/s rate")
    if unit == "":
        return value
    for suffix in ("FLOP/s", "FLOPS", "FLOPs", "flop/s", "flops"):
        if unit.endswith(suffix):
            return value * _prefix(unit[: -len(suffix)], text, "FLOP/s rate")
    raise UnitError(f"cannot read {text!r} as a FLOP/s rate; use e.g. '312 TFLOP/s'")


def parse_quantity(text: str | float | int, kind: str) -> float:
    """Dispatch on ``kind`` in {'bytes', 'bandwidth', 'time', 'flops'}."""
    return {"bytes": parse_bytes, "bandwidth": parse_bandwidth, "time": parse_time,
            "flops": parse_flops}[kind](text)


def _scaled(value: float, units: tuple[tuple[float, str], ...]) -> str:
    for scale, name in units:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {name}"
    return f"{value / units[-1][0]:.3g} {units[-1][1]}"


def format_bytes(n: float) -> str:
    """Human-readable binary size: 85899345920 → '80 GiB'."""
    return _scaled(n, ((2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")))


def format_time(t: float) -> str:
    """Human-readable time: 0.0123 → '12.3 ms'."""
    return _scaled(t, ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")))


def format_rate(bps: float) -> str:
    """Bandwidth in bytes/s shown as GB/s (decimal)."""
    return _scaled(bps, ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s")))
