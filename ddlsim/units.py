"""Parse quantities with units at the edge; everything inside ddlsim is an SI float.

Inside the package: seconds, bytes, bytes/s (``_Bps``), FLOP/s. Users may write
``"200 Gb/s"``, ``"25 GB/s"``, ``"5 us"``, ``"80 GiB"``, ``"312 TFLOP/s"`` or a bare number
(already SI). Bits are converted to bytes (1 byte = 8 bits); decimal prefixes are powers of
1000, binary prefixes (Ki, Mi, Gi, Ti) powers of 1024.
"""

from __future__ import annotations

import math
import re

__all__ = ["UnitError", "ALLOWED", "parse_quantity", "parse_bandwidth", "parse_bytes", "parse_time", "parse_flops",
           "format_bytes", "format_time", "format_rate"]

_DEC = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
# "µs" is U+00B5 MICRO SIGN, "μs" U+03BC GREEK SMALL LETTER MU: keyboards give either.
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ns": 1e-9,
         "min": 60.0, "h": 3600.0}

_NUM = r"(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_RE = re.compile(rf"^\s*{_NUM}\s*(?P<unit>[A-Za-z\u00b5\u03bc/]*)\s*$")

#: What a message lists as the allowed forms, per quantity.
ALLOWED = {
    "size in bytes": "B, kB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024), "
                     "or bits: b, kb, Mb, Gb, Tb (e.g. '64 MiB', '80 GB')",
    "bandwidth": "B/s, kB/s, MB/s, GB/s, TB/s, b/s, kb/s, Mb/s, Gb/s, Tb/s, with 'ps' for '/s' "
                 "(Gbps, GBps), case-insensitive for bits (gbps = Gb/s), and binary GiB/s, MiB/s "
                 "(e.g. '200 Gb/s', '25 GB/s')",
    "time": "s, ms, us, \u00b5s, \u03bcs, ns, min, h (e.g. '5 us')",
    "FLOP/s rate": "FLOP/s or FLOPS with a prefix k, M, G, T, P, E (e.g. '312 TFLOP/s')",
}


class UnitError(ValueError):
    """A quantity string could not be parsed in the expected dimension."""


def _split(text: str | float | int, what: str) -> tuple[float, str]:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise UnitError(f"expected a {what} (a number, or a string such as "
                        f"{ALLOWED[what].rpartition('e.g. ')[2].rstrip(')')}), got {text!r}")
    if isinstance(text, int) and abs(text) > 1e300:
        raise UnitError(f"a {text.bit_length()}-bit integer is not a finite {what}")
    if isinstance(text, (int, float)):
        return _finite(float(text), text, what), ""
    m = _RE.match(text)
    if not m:
        raise UnitError(f"cannot read {text!r} as a {what}: write a number and a unit, one of "
                        f"{ALLOWED[what]}")
    return _finite(float(m["num"]), text, what), m["unit"]


def _finite(value: float, text: object, what: str) -> float:
    if not math.isfinite(value):
        raise UnitError(f"{text!r} is not a finite {what}; infinity and NaN are not allowed")
    return value


def _prefix(prefix: str, text: object, what: str) -> float:
    if prefix in _BIN:
        return _BIN[prefix]
    if prefix in _DEC:
        return _DEC[prefix]
    raise UnitError(f"unknown prefix {prefix!r} in {text!r}; a {what} takes {ALLOWED[what]}")


def _scaled_value(value: float, scale: float, text: object, what: str) -> float:
    return _finite(value * scale, text, what)


def _byte_scale(unit: str) -> float | None:
    """Bytes per ``unit`` (``"GiB"`` → 2**30, ``"Gb"`` → 1.25e8), or None if not a size."""
    for suffix, scale in (("B", 1.0), ("b", 0.125), ("bit", 0.125), ("bits", 0.125)):
        prefix = unit[: -len(suffix)]
        if unit.endswith(suffix) and (prefix in _DEC or prefix in _BIN):
            return scale * (_BIN[prefix] if prefix in _BIN else _DEC[prefix])
    return None


def parse_bytes(text: str | float | int) -> float:
    """``"80 GiB"`` → 85899345920.0; ``"1 Gb"`` → 1.25e8 (bits are divided by 8)."""
    value, unit = _split(text, "size in bytes")
    if unit == "":
        return value
    scale = _byte_scale(unit)
    if scale is None:
        raise UnitError(f"cannot read {text!r} as a size in bytes: unknown unit {unit!r}; "
                        f"allowed: {ALLOWED['size in bytes']}")
    return _scaled_value(value, scale, text, "size in bytes")


def _bits_any_case(size: str) -> str:
    """Bits written in any case, as in "gbps" or "Mbit", spelt the canonical way ("Gb")."""
    low = size.lower()
    for tail in ("bits", "bit", "b"):
        if low.endswith(tail) and size.endswith(tail) and low[: -len(tail)] in ("", "k", "m", "g",
                                                                                "t", "p"):
            head = low[: -len(tail)]
            return (head if head == "k" else head.upper()) + "b"
    return size


def parse_bandwidth(text: str | float | int) -> float:
    """Bandwidth in bytes/s: ``"200 Gb/s"``, ``"200 Gbps"``, ``"200 gbps"`` → 2.5e10;
    ``"25 GB/s"``, ``"25 GBps"`` → 2.5e10. A bare number is already B/s."""
    value, unit = _split(text, "bandwidth")
    if unit == "":
        return value
    size = unit[:-2] if unit.endswith(("/s", "ps")) else None
    scale = _byte_scale(_bits_any_case(size)) if size else None
    if scale is None:
        raise UnitError(f"cannot read {text!r} as a bandwidth: unknown unit {unit!r}; allowed: "
                        f"{ALLOWED['bandwidth']}")
    return _scaled_value(value, scale, text, "bandwidth")


def parse_time(text: str | float | int) -> float:
    """``"5 us"``, ``"5 µs"``, ``"5 μs"`` → 5e-6 seconds. A bare number is already seconds."""
    value, unit = _split(text, "time")
    if unit == "":
        return value
    if unit not in _TIME:
        raise UnitError(f"cannot read {text!r} as a time: unknown unit {unit!r}; allowed: "
                        f"{ALLOWED['time']}")
    return _scaled_value(value, _TIME[unit], text, "time")


def parse_flops(text: str | float | int) -> float:
    """``"312 TFLOP/s"`` or ``"312 TFLOPS"`` → 3.12e14 FLOP/s."""
    value, unit = _split(text, "FLOP/s rate")
    if unit == "":
        return value
    for suffix in ("FLOP/s", "FLOPS", "FLOPs", "flop/s", "flops"):
        if unit.endswith(suffix):
            return _scaled_value(value, _prefix(unit[: -len(suffix)], text, "FLOP/s rate"),
                                 text, "FLOP/s rate")
    raise UnitError(f"cannot read {text!r} as a FLOP/s rate: unknown unit {unit!r}; allowed: "
                    f"{ALLOWED['FLOP/s rate']}")


def parse_quantity(text: str | float | int, kind: str) -> float:
    """Dispatch on ``kind`` in {'bytes', 'bandwidth', 'time', 'flops'}.

    Raises
    ------
    UnitError
        For a unit that is not one of the quantity's (listing those allowed), a value that is
        not finite (``inf``, ``1e400 s``) or not a number or string.
    """
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
