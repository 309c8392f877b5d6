"""Row checks shared by the readers: numbers, sizes, times, and the order of sizes in a sweep.

A check that fails raises :class:`RowSkipped` with the reason; the reader's loop turns it into
a :class:`~ddlsim.calibration.schema.SkippedRow` (file, line, reason, text), so no row is left
out without a report. Nothing here raises for the file as a whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TypeVar

from ..schema import (MAX_BYTES, MAX_RECORDS, MAX_TIME_S, MIN_TIME_S, CalibrationError,
                      SkippedRow)

__all__ = ["RowSkipped", "parse_int", "parse_size", "parse_float", "parse_time", "SizeOrder",
           "looks_like_row", "Rows"]

T = TypeVar("T")
_DIGITS = re.compile(r"[+]?\d+")
#: Largest whole number a row may hold (exact as a float, and far inside int64).
MAX_INT = 2 ** 53
#: A result row starts with a number (or a sign or dot and a number: ``-16``, ``8K``,
#: ``.5``); log lines such as ``host:pid:tid [0] NCCL INFO …`` have a colon in the first word.
_ROW_START = re.compile(r"[+-]?\.?\d")


class RowSkipped(CalibrationError):
    """One data row cannot be used; the reader records it and goes on."""


def looks_like_row(first_token: str) -> bool:
    """Whether a line starting with ``first_token`` is meant as a result row."""
    return bool(_ROW_START.match(first_token)) and ":" not in first_token


def parse_int(token: str, what: str, *, allow_float: bool = False) -> int:
    """A whole number >= 0 (``allow_float``: also ``8.0``, as pandas writes integers)."""
    tok = str(token).strip()
    if _DIGITS.fullmatch(tok):
        if len(tok) > 24 or int(tok) > MAX_INT:
            raise RowSkipped(f"{what} {tok[:24]} is too large (more than 2**53)")
        return int(tok)
    try:
        value = float(tok)
    except ValueError:
        raise RowSkipped(f"{what} {tok!r} is not a whole number") from None
    if not math.isfinite(value):
        raise RowSkipped(f"{what} {tok!r} is not a finite number")
    if value < 0:
        raise RowSkipped(f"{what} {tok} is negative")
    if not allow_float or value != int(value):
        raise RowSkipped(f"{what} {tok!r} is not a whole number")
    if value > MAX_INT:
        raise RowSkipped(f"{what} {tok} is too large (more than 2**53)")
    return int(value)


def parse_size(token: str, what: str = "size", *, allow_float: bool = False) -> int:
    """A message size in bytes: a whole number in 0 … :data:`MAX_BYTES` (``8K``, ``-16`` and
    ``1e400`` are refused with the reason)."""
    try:
        size = parse_int(token, what, allow_float=allow_float)
    except RowSkipped as exc:
        raise RowSkipped(f"{exc} of bytes") if "whole number" in str(exc) else exc from None
    if size > MAX_BYTES:
        raise RowSkipped(f"{what} {size} B is larger than 1 PiB ({MAX_BYTES} B); not a "
                         "message size")
    return size


def parse_float(token: str, what: str) -> float:
    """A finite number (NaN and ±inf refused)."""
    tok = str(token).strip()
    try:
        value = float(tok)
    except ValueError:
        raise RowSkipped(f"{what} {tok!r} is not a number") from None
    if not math.isfinite(value):
        raise RowSkipped(f"{what} is {tok!r}, not a finite number")
    return value


def parse_time(token: str, what: str, scale: float = 1.0) -> float:
    """A duration ``token × scale`` in seconds: finite, at least a nanosecond (one call of
    anything takes longer) and at most an hour."""
    if str(token).strip().upper() in ("N/A", "-"):
        raise RowSkipped(f"{what} is {str(token).strip()!r} (not measured)")
    value = parse_float(token, what) * scale
    if not value > 0:
        raise RowSkipped(f"{what} {token} must be > 0")
    if value < MIN_TIME_S:
        raise RowSkipped(f"{what} {token} is {value:.3g} s, shorter than a nanosecond; not "
                         "the time of one call")
    if value > MAX_TIME_S:
        raise RowSkipped(f"{what} {token} is {value:.3g} s, longer than an hour; not the time "
                         "of one call")
    return value


class SizeOrder:
    """Sizes of one sweep must rise: nccl-tests and OSU print each size once, in increasing
    order, per (operation, type, …) key. A repeated size is a duplicate row; a smaller one
    than the last row kept means a damaged line. :meth:`reset` starts a new run (a new
    header in the file), whose sizes may repeat the last run's."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[int, int]] = {}

    def reset(self) -> None:
        """Forget every key (a new run begins)."""
        self._last.clear()

    def check(self, key: Hashable, size: int, line: int) -> None:
        """Raise :class:`RowSkipped` unless ``size`` exceeds the last kept size of ``key``."""
        if key in self._last:
            prev, prev_line = self._last[key]
            if size == prev:
                raise RowSkipped(f"duplicate size {size} B (already on line {prev_line})")
            if size < prev:
                raise RowSkipped(f"size {size} B is smaller than {prev} B on line {prev_line} "
                                 "before it; a sweep's sizes rise")

    def keep(self, key: Hashable, size: int, line: int) -> None:
        """Record a kept row."""
        self._last[key] = (size, line)


class Rows:
    """Collects the rows a reader keeps and the ones it skips, with counts."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.kept: list = []
        self.skipped: list[SkippedRow] = []
        self.records = 0

    def skip(self, line: int, reason: str, text: str) -> None:
        """Record a skipped row (or part of one)."""
        self.skipped.append(SkippedRow(self.path, line, reason, " ".join(str(text).split())))

    def attempt(self, line: int, text: str, parse: Callable[[], T]) -> T | None:
        """Count a record and return ``parse()``, or None after recording why it failed.

        Raises :class:`CalibrationError` for the whole file past :data:`MAX_RECORDS` rows.
        """
        self.records += 1
        if self.records > MAX_RECORDS:
            raise CalibrationError(f"{self.path}:{line}: more than {MAX_RECORDS:,} result rows; "
                                   "a benchmark sweep has tens to thousands, so this is not "
                                   "one (split it into one file per run)")
        try:
            return parse()
        except RowSkipped as exc:
            self.skip(line, str(exc), text)
            return None
