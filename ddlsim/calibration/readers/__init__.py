"""Readers for results users already have; each returns the tidy table of
:data:`~ddlsim.calibration.schema.COLUMNS` (compute CSVs: :data:`COMPUTE_COLUMNS`).

Formats: ``ddlsim`` (CSV written by ``ddlsim calibrate comm``), ``ddlsim-compute`` (CSV of
``ddlsim calibrate compute``), ``nccl-tests`` (text), ``nccl-tests-json`` (``-J`` output) and
``osu`` (OSU micro-benchmarks). :func:`detect_format` tells them apart from the content.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pandas as pd

from ..schema import (COLUMNS, COMPUTE_COLUMNS, CalibrationError, ResultParseError,
                      tidy_frame)
from .nccl_tests import read_nccl_tests_json, read_nccl_tests_text
from .osu import read_osu

__all__ = ["FORMATS", "detect_format", "read_results", "read_ddlsim_csv", "read_compute_csv",
           "read_nccl_tests_text", "read_nccl_tests_json", "read_osu"]

FORMATS = ("ddlsim", "ddlsim-compute", "nccl-tests", "nccl-tests-json", "osu")


def detect_format(path: str | Path) -> str:
    """Guess the format of a results file from its first 200 lines."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"results file {path} does not exist")
    with open(path, encoding="utf-8", errors="replace") as fh:
        head = [line for _, line in zip(range(200), fh)]
    text = "".join(head)
    first = next((ln.strip() for ln in head if ln.strip()), "")
    header = {c.strip() for c in first.split(",")}
    if set(COLUMNS) <= header:
        return "ddlsim"
    if set(COMPUTE_COLUMNS) <= header:
        return "ddlsim-compute"
    if first.startswith(("{", "[")):
        return "nccl-tests-json"
    if "OSU " in text and " Test" in text:
        return "osu"
    if "algbw" in text or "busbw" in text or "nThread" in text:
        return "nccl-tests"
    raise CalibrationError(f"cannot tell the format of {path}; pass --format, one of "
                           f"{', '.join(FORMATS)}")


def _check_numbers(df: pd.DataFrame, columns: tuple[str, ...], path: Path) -> None:
    for col in columns:
        values = pd.to_numeric(df[col], errors="coerce")
        bad = values.isna() & df[col].notna() & (df[col].astype(str).str.strip() != "")
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise ResultParseError(path, i + 2, f"column {col!r}: {df[col].iloc[i]!r} is not "
                                   "a number")


def _read_csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, csv.Error) as exc:
        raise ResultParseError(path, None, f"malformed CSV: {exc}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ResultParseError(path, 1, f"missing columns: {', '.join(missing)}")
    return df


def read_ddlsim_csv(path: str | Path) -> pd.DataFrame:
    """Read a CSV written by ``ddlsim calibrate comm`` (validated, typed)."""
    path = Path(path)
    df = _read_csv(path, COLUMNS)
    numeric = tuple(c for c in COLUMNS if c.startswith(("time_", "algbw", "busbw"))
                    or c in ("ranks", "nodes", "ranks_per_node", "bytes", "n"))
    _check_numbers(df, numeric, path)
    for col in numeric:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df["n"] = df["n"].fillna(0)
    return tidy_frame(df.to_dict("records"))


def read_compute_csv(path: str | Path) -> pd.DataFrame:
    """Read a CSV written by ``ddlsim calibrate compute`` (validated, typed)."""
    path = Path(path)
    df = _read_csv(path, COMPUTE_COLUMNS)
    numeric = tuple(c for c in COMPUTE_COLUMNS
                    if c not in ("backend", "library_version", "device", "kind", "dtype"))
    _check_numbers(df, numeric, path)
    for col in numeric:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("flops", "flops_per_s"):
        bad = ~(df[col] > 0)
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise ResultParseError(path, i + 2, f"column {col!r} must be > 0, got "
                                   f"{df[col].iloc[i]!r}")
    return df[list(COMPUTE_COLUMNS)].reset_index(drop=True)


def read_results(path: str | Path, format: str = "auto", *, op: str | None = None,
                 backend: str | None = None, ranks: int | None = None,
                 nodes: int | None = None, scope: str | None = None) -> pd.DataFrame:
    """Read one results file of any supported format into the tidy table.

    The keyword overrides supply what a format does not record (OSU: ranks, nodes; old
    nccl-tests: the operation) or correct it (``backend`` for nccl-tests run with RCCL).
    """
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in FORMATS:
        raise CalibrationError(f"unknown results format {format!r}; allowed: auto, "
                               f"{', '.join(FORMATS)}")
    if ranks is not None and (int(ranks) != ranks or ranks < 1 or math.isnan(ranks)):
        raise CalibrationError(f"--ranks must be a positive integer, got {ranks!r}")
    if fmt == "ddlsim":
        return read_ddlsim_csv(path)
    if fmt == "ddlsim-compute":
        return read_compute_csv(path)
    if fmt == "osu":
        return read_osu(path, ranks=ranks, nodes=nodes, scope=scope, backend=backend)
    reader = read_nccl_tests_text if fmt == "nccl-tests" else read_nccl_tests_json
    return reader(path, op=op, backend=backend or "nccl", ranks=ranks, nodes=nodes, scope=scope)
