"""Read the CSVs ddlsim writes (``calibrate comm``: :data:`COLUMNS`; ``calibrate compute``:
:data:`COMPUTE_COLUMNS`), row by row, so each row that cannot be used is reported with its
line: a wrong number of fields, a non-numeric, NaN or infinite number, a size that is not a
whole byte count, a zero or negative time, an unknown operation or scope, a duplicate of an
earlier row. A missing column in the header, or a line the CSV syntax cannot read, is an
error for the whole file. Empty cells (and ``nan``) in optional statistics mean "not
reported".
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from pathlib import Path

from ...textio import MAX_DATA_BYTES, read_text
from ..schema import (COLUMNS, COMPUTE_COLUMNS, MAX_RANKS, OPS, SCOPES, ReadResult,
                      ResultParseError, tidy_frame)
from .checks import Rows, RowSkipped, parse_float, parse_int, parse_size, parse_time

__all__ = ["read_ddlsim_csv", "read_compute_csv", "parse_ddlsim_csv", "parse_compute_csv"]

_TIMES = ("time_mean_s", "time_median_s", "time_min_s", "time_max_s")
_COMPUTE_KINDS = ("gemm", "attention")
#: Plausibility bounds of a compute row: FLOPs of one call, achieved FLOP/s of one device.
MAX_FLOPS, MAX_FLOPS_PER_S = 1e21, 1e18


def _records(text: str, path: Path):
    """(first line, fields) of every non-empty CSV record."""
    reader, start = csv.reader(io.StringIO(text)), 1
    try:
        for fields in reader:
            if any(f.strip() for f in fields):
                yield start, fields
            start = reader.line_num + 1
    except csv.Error as exc:
        raise ResultParseError(path, reader.line_num, f"malformed CSV: {exc}") from None


def _optional(token: str, parse: Callable[[str], float]) -> float:
    return math.nan if token.strip().lower() in ("", "nan") else parse(token)


def _std(token: str) -> float:
    value = parse_float(token, "time_std_s")
    if value < 0:
        raise RowSkipped(f"time_std_s {token} is negative")
    return value


def _stats(cell: dict[str, str]) -> dict:
    out = {c: _optional(cell[c], lambda t, c=c: parse_time(t, c)) for c in _TIMES}
    if math.isnan(out["time_mean_s"]) and math.isnan(out["time_median_s"]):
        raise RowSkipped("neither time_mean_s nor time_median_s is given")
    out["time_std_s"] = _optional(cell["time_std_s"], _std)
    return out


def _comm_row(cell: dict[str, str]) -> dict:
    for col, allowed in (("op", OPS), ("scope", SCOPES)):
        if cell[col] not in allowed:
            raise RowSkipped(f"{col} {cell[col]!r} is not one of {', '.join(allowed)}")
    if not cell["backend"].strip():
        raise RowSkipped("backend is empty")
    ints = {c: parse_int(cell[c], c, allow_float=True) for c in ("ranks", "nodes",
                                                                 "ranks_per_node")}
    if not 1 <= ints["nodes"] <= ints["ranks"] <= MAX_RANKS:
        raise RowSkipped(f"ranks {ints['ranks']} and nodes {ints['nodes']}: need "
                         f"1 <= nodes <= ranks <= {MAX_RANKS:,}")
    bw = {c: _optional(cell[c], lambda t, c=c: parse_float(t, c))
          for c in ("algbw_Bps", "busbw_Bps")}
    n = 0 if not cell["n"].strip() else parse_int(cell["n"], "n", allow_float=True)
    return {**cell, **ints, **_stats(cell), **bw, "n": n,
            "bytes": parse_size(cell["bytes"], "bytes", allow_float=True)}


def _compute_row(cell: dict[str, str]) -> dict:
    if cell["kind"] not in _COMPUTE_KINDS:
        raise RowSkipped(f"kind {cell['kind']!r} is not one of {', '.join(_COMPUTE_KINDS)}")
    ints = {c: parse_int(cell[c], c, allow_float=True)
            for c in ("m", "n", "k", "batch", "heads", "seq", "head_dim", "reps")}
    out = {**cell, **ints, **_stats(cell)}
    for col, top in (("flops", MAX_FLOPS), ("flops_per_s", MAX_FLOPS_PER_S)):
        out[col] = parse_float(cell[col], col)
        if not 0 < out[col] <= top:
            raise RowSkipped(f"{col} {cell[col]} must be in (0, {top:g}]")
    return out


def _parse(text: str, path: Path, columns: tuple[str, ...], row: Callable[[dict], dict],
           key: tuple[str, ...]) -> Rows:
    rows, header, seen = Rows(path), None, {}
    for line, fields in _records(text, path):
        if header is None:
            header = [f.strip() for f in fields]
            missing = [c for c in columns if c not in header]
            if missing:
                raise ResultParseError(path, line, f"missing columns: {', '.join(missing)}")
            continue
        shown = ",".join(fields)

        def parse(fields=fields, line=line) -> dict:
            if len(fields) != len(header):
                cut = "truncated: " if len(fields) < len(header) else ""
                raise RowSkipped(f"{cut}{len(fields)} fields, the header has {len(header)}")
            got = row(dict(zip(header, fields)))
            k = tuple(got[c] for c in key)
            if k in seen:
                raise RowSkipped(f"duplicate of line {seen[k]} (same {', '.join(key[:4])}, … "
                                 "and size); give repeated runs as separate files")
            seen[k] = line
            return {c: got[c] for c in columns}
        got = rows.attempt(line, shown, parse)
        if got is not None:
            rows.kept.append(got)
    if header is None:
        raise ResultParseError(path, 1, f"empty CSV; expected the header {','.join(columns)}")
    return rows


def parse_ddlsim_csv(text: str, path: str | Path) -> ReadResult:
    """Parse the text of a ``calibrate comm`` CSV (see :func:`read_ddlsim_csv`)."""
    path = Path(path)
    key = tuple(c for c in COLUMNS if c not in _TIMES + ("time_std_s", "n", "algbw_Bps",
                                                       "busbw_Bps"))
    rows = _parse(text, path, COLUMNS, _comm_row, key)
    return ReadResult(tidy_frame(rows.kept), tuple(rows.skipped), rows.records, str(path),
                      "ddlsim")


def parse_compute_csv(text: str, path: str | Path) -> ReadResult:
    """Parse the text of a ``calibrate compute`` CSV (see :func:`read_compute_csv`)."""
    import pandas as pd

    path = Path(path)
    key = ("backend", "device", "kind", "dtype", "m", "n", "k", "batch", "heads", "seq",
           "head_dim")
    rows = _parse(text, path, COMPUTE_COLUMNS, _compute_row, key)
    table = pd.DataFrame(rows.kept, columns=list(COMPUTE_COLUMNS))
    return ReadResult(table, tuple(rows.skipped), rows.records, str(path), "ddlsim-compute")


def read_ddlsim_csv(path: str | Path) -> ReadResult:
    """Read a CSV written by ``ddlsim calibrate comm``.

    Returns
    -------
    ReadResult
        The typed tidy table and the rows skipped (see the module docstring).
    """
    text = read_text(path, what="results CSV", max_bytes=MAX_DATA_BYTES)
    return parse_ddlsim_csv(text, path)


def read_compute_csv(path: str | Path) -> ReadResult:
    """Read a CSV written by ``ddlsim calibrate compute``.

    Returns
    -------
    ReadResult
        The typed compute table and the rows skipped (see the module docstring).
    """
    text = read_text(path, what="compute CSV", max_bytes=MAX_DATA_BYTES)
    return parse_compute_csv(text, path)
