"""Ranges of values for ``ddlsim sweep --set-range`` and ``ddlsim search --axis``.

Range syntax (:func:`parse_values`), the value part of ``PATH=VALUES``:

* a comma list of YAML scalars: ``1,2,4``, ``ring,tree``, ``true,false``;
* when the last item carries a unit, every bare number before it takes the same unit:
  ``100,200,400 Gb/s`` is ``100 Gb/s, 200 Gb/s, 400 Gb/s`` (``10 Gb/s,1 GB/s`` mixes units);
* an inclusive integer range ``START:STOP[:STEP]``: ``1:8`` is 1, 2, …, 8, ``0:12:4`` is
  0, 4, 8, 12, and ``1:64:*2`` is geometric: 1, 2, 4, …, 64;
* a YAML flow list of values, for values that are lists or mappings themselves:
  ``[[1,1,1],[2,2,1]]`` (CosmoFlow spatial grids), ``[megatron-core-2024, {stack:
  deepspeed, what_if: true}]``.

A range's length is counted against ``Limits.axis_values`` before it is expanded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .errors import ConfigError

__all__ = ["parse_range", "parse_ranges", "parse_values", "SweepError", "RANGE_FORMS"]

#: The allowed forms, as every message about a range states them.
RANGE_FORMS = ("a comma list of YAML values (1,2,4 or ring,tree or true,false), where a unit "
               "on the last item applies to every bare number (100,200,400 Gb/s), or an "
               "inclusive integer range START:STOP[:STEP] (1:8 is 1..8, 0:12:4 is 0,4,8,12, "
               "1:64:*2 is 1,2,4,...,64), or a YAML flow list of values that are lists or "
               "mappings ([[1,1,1],[2,2,1]])")

_INT_RANGE = re.compile(r"^\s*([-+]?\d+)\s*:\s*([-+]?\d+)\s*(?::\s*(\*?)\s*(\d+)\s*)?$")
_WITH_UNIT = re.compile(r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*"
                        r"(?P<unit>[A-Za-z\u00b5\u03bc][A-Za-z\u00b5\u03bc/]*)\s*$")
_RANGE_LIKE = re.compile(r"^[-+\d.*\s]*:[-+\d.*:\s]*[A-Za-z\u00b5\u03bc/\s]*$")
_PLAIN_INT = re.compile(r"^[-+]?[1-9]\d{0,17}$|^0$")
_NUMBER = re.compile(r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*$")


class SweepError(ConfigError):
    """A range that cannot be read, a path the config does not have, or a sweep too large."""


def _refuse(option: str, problem: str) -> SweepError:
    return SweepError(f"{option}: {problem}; a range is {RANGE_FORMS}")


def _int_range(spec: str, option: str, limits: Any = None) -> list[int] | None:
    from .limits import check_budget

    m = _INT_RANGE.match(spec)
    if m is None:
        return None
    start, stop = int(m[1]), int(m[2])
    geometric, step = m[3] == "*", int(m[4] or 1)
    if step >= 1 and not geometric:  # counted before the list is built
        check_budget({"axis_values": max(stop - start, 0) // step + 1}, limits, option)
    if stop < start:
        raise _refuse(option, f"the integer range {spec!r} ends ({stop}) before it starts "
                              f"({start})")
    if geometric:
        if start < 1 or step < 2:
            raise _refuse(option, f"the geometric range {spec!r} needs START >= 1 and a factor "
                                  f">= 2")
        out = [start]
        while out[-1] * step <= stop:
            out.append(out[-1] * step)
        return out
    if step < 1:
        raise _refuse(option, f"the integer range {spec!r} needs a step >= 1")
    return list(range(start, stop + 1, step))


def _scalar(item: str, option: str) -> Any:
    from .documents import DocumentError, parse_yaml

    if _PLAIN_INT.match(item):  # the common case, without a YAML parser per item
        return int(item)
    if item.lstrip()[:1] in ("[", "{", "&", "*", "!", "|", ">"):
        raise _refuse(option, f"the item {item.strip()!r} is not a scalar value")
    try:
        value = parse_yaml(item, f"{option} item")
    except DocumentError:
        raise _refuse(option, f"the item {item.strip()!r} is not a YAML value") from None
    if isinstance(value, (list, dict)):
        raise _refuse(option, f"the item {item.strip()!r} is not a scalar value")
    return value


def parse_values(spec: str, option: str = "--set-range", limits: Any = None) -> list[Any]:
    """The values a range string names (the forms are in the module docstring).

    Parameters
    ----------
    spec : the text after ``PATH=``, e.g. ``"100,200,400 Gb/s"`` or ``"1:64:*2"``.
    option : how messages name the range.
    limits : :class:`ddlsim.limits.Limits` whose ``axis_values`` bounds the values, counted
        before any is built (default ``Limits()``).

    Returns
    -------
    list
        Integers for an integer range; YAML scalars (numbers, booleans, strings, null) for
        a list, numbers with a unit as strings (``"100 Gb/s"``).

    Raises
    ------
    SweepError
        An empty item, a collection, duplicated values, a bad integer range.
    WorkTooLargeError
        More values than ``limits.axis_values``.
    """
    from .limits import check_budget

    spec = str(spec)
    if spec.lstrip().startswith("["):
        return _flow_list(spec, option, limits)
    numbers = _int_range(spec, option, limits)
    if numbers is not None:
        return numbers
    check_budget({"axis_values": spec.count(",") + 1}, limits, option)
    items = [s.strip() for s in spec.split(",")]
    if not spec.strip() or any(not s for s in items):
        raise _refuse(option, f"{spec!r} has an empty item")
    ranged = [s for s in items if _RANGE_LIKE.match(s)]
    if ranged:
        raise _refuse(option, f"{ranged[0]!r} is not an integer range START:STOP[:STEP] "
                              "(integers without a unit, STEP >= 1 or *FACTOR >= 2, one range "
                              "alone)")
    unit = _WITH_UNIT.match(items[-1])
    if unit is not None:
        stray = [s for s in items if not (_NUMBER.match(s) or _WITH_UNIT.match(s))]
        if stray:
            raise _refuse(option, f"the unit {unit['unit']!r} of the last item applies to "
                                  f"numbers, but {stray[0]!r} is not one")
        values: list[Any] = [f"{s} {unit['unit']}" if _NUMBER.match(s) else s for s in items]
    else:
        values = [_scalar(s, option) for s in items]
    return _once(values, option)


def _once(values: list[Any], option: str) -> list[Any]:
    """``values``, refused where one is given twice (by type and value: 1, true and 1.0 are
    three values; lists and mappings by their text)."""
    seen: set = set()
    for v in values:
        key = (type(v).__name__, repr(v))
        if key in seen:
            raise _refuse(option, f"the value {v!r} is given twice")
        seen.add(key)
    return values


def _flow_list(spec: str, option: str, limits: Any) -> list[Any]:
    """A YAML flow list of values (which may be lists or mappings), each given once."""
    from .documents import DocumentError, parse_yaml
    from .limits import check_budget

    try:
        values = parse_yaml(spec, f"{option} list")
    except DocumentError:
        raise _refuse(option, f"{spec.strip()!r} is not a YAML list") from None
    if not isinstance(values, list) or not values:
        raise _refuse(option, f"{spec.strip()!r} is not a non-empty YAML list")
    check_budget({"axis_values": len(values)}, limits, option)
    return _once(values, option)


def parse_range(text: str, option: str = "--set-range",
                limits: Any = None) -> tuple[str, list[Any]]:
    """``'PATH=VALUES'`` → ``(PATH, values)`` (:func:`parse_values`); PATH is
    ``section.key[.key…]`` as for ``--set``, or a section alone whose values are preset
    names (``model=llama-3.1-8b,llama-3.1-70b``: :func:`ddlsim.configpresets.preset_section`)."""
    from .configpresets import preset_section

    path, sep, spec = str(text).partition("=")
    path = path.strip()
    keys = path.split(".")
    if not sep or not all(k.strip() for k in keys) or (len(keys) < 2
                                                         and preset_section(path) is None):
        raise _refuse(f"{option} {_short(text)}", "write PATH=VALUES with PATH a section and one or "
                                            "more keys joined by dots, e.g. "
                                            "'system.nic.bandwidth_Bps=100,200,400 Gb/s', or a "
                                            "section alone and preset names, e.g. "
                                            "'model=llama-3.1-8b,llama-3.1-70b'")
    return path, parse_values(spec, f"{option} {_short(text)}", limits)


def _short(text: str, most: int = 60) -> str:
    """``text`` quoted, cut to ``most`` characters for a message."""
    text = str(text)
    return repr(text if len(text) <= most else f"{text[:most]}…")


def parse_ranges(texts: Iterable[str], option: str = "--set-range",
                 limits: Any = None) -> dict[str, list[Any]]:
    """``{PATH: values}`` of several ``PATH=VALUES`` strings (:func:`parse_range`), in order;
    a path given twice is refused."""
    ranges: dict[str, list[Any]] = {}
    for text in texts:
        path, values = parse_range(text, option, limits)
        if path in ranges:
            raise SweepError(f"{option} names {path!r} twice; give each field one range")
        ranges[path] = values
    return ranges
