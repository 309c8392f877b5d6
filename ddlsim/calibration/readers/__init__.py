"""Readers for results users already have; each returns a
:class:`~ddlsim.calibration.schema.ReadResult`: the tidy table of
:data:`~ddlsim.calibration.schema.COLUMNS` (compute CSVs: :data:`COMPUTE_COLUMNS`) and every
row it skipped, with the file, the line and the reason.

Formats: ``ddlsim`` (CSV written by ``ddlsim calibrate comm``), ``ddlsim-compute`` (CSV of
``ddlsim calibrate compute``), ``nccl-tests`` (text), ``nccl-tests-json`` (``-J`` output) and
``osu`` (OSU micro-benchmarks). :func:`detect_format` tells them apart from the content.
Files are read through :func:`ddlsim.textio.read_text`: regular UTF-8 text files of at most
:data:`~ddlsim.textio.MAX_DATA_BYTES`, never a FIFO, a device or a directory.
"""

from __future__ import annotations

import numbers
from pathlib import Path

from ...textio import MAX_DATA_BYTES, read_text
from ..schema import (COLUMNS, COMPUTE_COLUMNS, MAX_RANKS, SCOPES, CalibrationError, ReadResult,
                      SkippedRow)
from .nccl_json import parse_nccl_tests_json, read_nccl_tests_json
from .nccl_tests import parse_nccl_tests_text, read_nccl_tests_text
from .osu import parse_osu, read_osu
from .tables import parse_compute_csv, parse_ddlsim_csv, read_compute_csv, read_ddlsim_csv

__all__ = ["FORMATS", "ReadResult", "SkippedRow", "detect_format", "read_results",
           "read_ddlsim_csv", "read_compute_csv", "read_nccl_tests_text",
           "read_nccl_tests_json", "read_osu"]

FORMATS = ("ddlsim", "ddlsim-compute", "nccl-tests", "nccl-tests-json", "osu")


def _detect(text: str, path: Path) -> str:
    if not text.strip():
        raise CalibrationError(f"results file {str(path)!r} is empty")
    head = text.splitlines()[:200]
    first = next((ln.strip() for ln in head if ln.strip()), "")
    header = {c.strip() for c in first.split(",")}
    joined = "\n".join(head)
    if set(COLUMNS) <= header:
        return "ddlsim"
    if set(COMPUTE_COLUMNS) <= header:
        return "ddlsim-compute"
    if first.startswith(("{", "[")):
        return "nccl-tests-json"
    if "OSU " in joined and " Test" in joined:
        return "osu"
    if "algbw" in joined or "busbw" in joined or "nThread" in joined:
        return "nccl-tests"
    raise CalibrationError(f"cannot tell the format of {path}; pass --format, one of "
                           f"{', '.join(FORMATS)}")


def detect_format(path: str | Path) -> str:
    """Guess the format of a results file from its first 200 lines."""
    return _detect(read_text(path, what="results file", max_bytes=MAX_DATA_BYTES), Path(path))


def _count(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or \
            not 1 <= value <= MAX_RANKS:
        raise CalibrationError(f"--{name} must be an integer from 1 to {MAX_RANKS:,}, got "
                               f"{value!r}")
    return int(value)


def read_results(path: str | Path, format: str = "auto", *, op: str | None = None,
                 backend: str | None = None, ranks: int | None = None,
                 nodes: int | None = None, scope: str | None = None) -> ReadResult:
    """Read one results file of any supported format.

    The keyword overrides supply what a format does not record (OSU: ranks, nodes; old
    nccl-tests: the operation) or correct it (``backend`` for nccl-tests run with RCCL).

    Returns
    -------
    ReadResult
        ``table`` (the tidy table), ``skipped`` (a :class:`SkippedRow` per row left out, with
        file, line, reason and text), ``records`` (data rows seen), ``path``, ``format``.
    """
    if format != "auto" and format not in FORMATS:
        raise CalibrationError(f"unknown results format {format!r}; allowed: auto, "
                               f"{', '.join(FORMATS)}")
    ranks, nodes = _count(ranks, "ranks"), _count(nodes, "nodes")
    if scope is not None and scope not in SCOPES:
        raise CalibrationError(f"--scope {scope!r} is not allowed; choose from "
                               f"{', '.join(SCOPES)}")
    text = read_text(path, what="results file", max_bytes=MAX_DATA_BYTES)
    fmt = _detect(text, Path(path)) if format == "auto" else format
    if fmt == "ddlsim":
        return parse_ddlsim_csv(text, path)
    if fmt == "ddlsim-compute":
        return parse_compute_csv(text, path)
    if fmt == "osu":
        return parse_osu(text, path, ranks=ranks, nodes=nodes, scope=scope, backend=backend)
    parse = parse_nccl_tests_text if fmt == "nccl-tests" else parse_nccl_tests_json
    return parse(text, path, op=op, backend=backend or "nccl", ranks=ranks, nodes=nodes,
                 scope=scope)
