"""The tidy table every benchmark writes and every reader returns, and the nccl-tests factors.

One row is one (backend, operation, communicator, message size) measurement. Times are
seconds, sizes bytes, bandwidths bytes/s — SI inside, converted from µs and GB/s at the
readers' edge.

``bytes`` follows the nccl-tests convention (doc/PERFORMANCE.md in NVIDIA/nccl-tests): the
size *S* of the largest buffer of the operation — the whole output of ``all_gather``, the whole
input of ``reduce_scatter``, the whole per-rank send buffer of ``all_to_all``, the buffer of
``all_reduce``/``broadcast``/``reduce`` and the message of ``sendrecv`` and ``exchange`` (each
rank's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from ..errors import ConfigError, DDLSimError

__all__ = ["OPS", "SCOPES", "BACKENDS", "COLUMNS", "COMPUTE_COLUMNS", "CalibrationError",
           "CalibrationLookupError", "ResultParseError", "busbw_factor", "check_op", "summarize", "tidy_frame",
           "representative_time_s", "comm_row", "STATISTICS", "SkippedRow", "ReadResult",
           "MAX_TIME_S", "MIN_TIME_S", "MAX_BYTES", "MAX_RECORDS",
           "MAX_RANKS", "DEFAULT_MAX_SKIPPED_SHARE", "DEFAULT_MAX_REL_RMSE"]

#: Operations the benchmarks run and the profiles describe (``sendrecv`` is the ping-pong;
#: ``exchange``: every rank sends its message to the next rank and receives one from the
#: previous at once, a ring shift, on 2 ranks both directions of one pair: what concurrent
#: point-to-point transfers of one node cost, :mod:`ddlsim.simulator.sharedcopies`).
OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
       "sendrecv", "exchange")
#: ``intra``: every rank of the communicator on one node; ``inter``: it spans nodes.
SCOPES = ("intra", "inter")
BACKENDS = ("mpi", "nccl", "gloo", "rccl", "ucc")

#: Columns of the tidy communication table, in order.
COLUMNS = ("backend", "library", "library_version", "op", "variant", "ranks", "nodes",
           "ranks_per_node", "scope", "dtype", "bytes", "time_mean_s", "time_median_s",
           "time_min_s", "time_max_s", "time_std_s", "n", "algbw_Bps", "busbw_Bps", "source")
_INT_COLUMNS = ("ranks", "nodes", "ranks_per_node", "bytes", "n")
_FLOAT_COLUMNS = ("time_mean_s", "time_median_s", "time_min_s", "time_max_s", "time_std_s",
                  "algbw_Bps", "busbw_Bps")

#: Longest time one benchmarked call may take: a row reporting more is not a benchmark time
#: (a unit mix-up or a corrupted number) and is skipped.
MAX_TIME_S = 3600.0
#: Shortest time one benchmarked call may take (a nanosecond; a call and its timer take more).
MIN_TIME_S = 1e-9
#: Largest message size a row may report (1 PiB; nccl-tests sizes are bounded by device
#: memory): larger is a corrupted number, and would overflow the int64 table.
MAX_BYTES = 2 ** 50
#: Most ranks a communicator may have (10⁷ devices: beyond any machine built).
MAX_RANKS = 10 ** 7
#: Most data rows one results file may have (nccl-tests and OSU sweeps have tens to
#: thousands); reading stops and refuses the file beyond, which bounds the work to seconds.
MAX_RECORDS = 50_000
#: Default largest share of unusable rows in one results file before a fit refuses it. A few
#: damaged lines (log output interleaved with a row, a truncated last line) are normal in
#: captured output; more than one in ten suggests the wrong file, the wrong format or a broken
#: run, whose remaining rows should not be trusted either.
DEFAULT_MAX_SKIPPED_SHARE = 0.10
#: Largest relative RMS error a fitted curve may have against its own points before the
#: fit refuses it. A curve that misses its measurements by more than a quarter on average
#: (one CPU compute fit missed by 58 % and moved a prediction from 1.26 s to 9.48 s, issue
#: #30) predicts nothing; the noise of medians on a shared host is a few percent.
DEFAULT_MAX_REL_RMSE = 0.25

#: Columns of the compute (GEMM / attention) table, in order.
COMPUTE_COLUMNS = ("backend", "library_version", "device", "kind", "dtype", "m", "n", "k",
                   "batch", "heads", "seq", "head_dim", "flops", "time_mean_s",
                   "time_median_s", "time_min_s", "time_max_s", "time_std_s", "reps",
                   "flops_per_s")


class CalibrationError(DDLSimError, ValueError):
    """Calibration input (results, profile, query) cannot be used; the message says why."""


class CalibrationLookupError(CalibrationError, KeyError):
    """A profile has no calibration for what was asked (backend, op, scope, dtype).

    Also a :class:`KeyError`, so callers may treat "not calibrated" as a missing key and fall
    back to their own model.
    """

    __str__ = Exception.__str__  # the message, not KeyError's repr of it


class ResultParseError(CalibrationError):
    """A results file has a line that cannot be read; names the file and the line number."""

    def __init__(self, path: str | Path, line: int | None, message: str):
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}")
        self.path, self.line = str(path), line


@dataclass(frozen=True)
class SkippedRow:
    """A row of a results file that a reader did not use, and why.

    ``file`` and ``line`` (1-based) locate it, ``reason`` says what is wrong with it and
    ``text`` is the row as written (trimmed).
    """

    file: str
    line: int
    reason: str
    text: str = ""

    def __str__(self) -> str:
        text = self.text if len(self.text) <= 80 else self.text[:77] + "..."
        return f"{self.file}:{self.line}: skipped: {self.reason}" + (f": {text}" if text else "")

    def to_dict(self) -> dict:
        """The row as a plain mapping (for the profile's provenance)."""
        return {"file": self.file, "line": self.line, "reason": self.reason, "text": self.text}


@dataclass(frozen=True)
class ReadResult:
    """What a reader returns: the tidy table, the rows it skipped, and how many it saw.

    Attributes
    ----------
    table : pandas.DataFrame
        Rows of :data:`COLUMNS` (communication) or :data:`COMPUTE_COLUMNS` (compute).
    skipped : tuple of SkippedRow
        Every data row (or part of one, e.g. one nccl-tests variant) left out, in file order.
    records : int
        Data rows seen (kept or skipped): the denominator of :attr:`unusable_share`.
    path, format : str
        The file read and its format (:data:`~ddlsim.calibration.readers.FORMATS`).
    """

    table: pd.DataFrame
    skipped: tuple[SkippedRow, ...] = ()
    records: int = 0
    path: str = ""
    format: str = ""

    @property
    def kind(self) -> str:
        """``comm`` or ``compute``, from the table's columns."""
        return "comm" if tuple(self.table.columns) == COLUMNS else "compute"

    @property
    def unusable(self) -> int:
        """Data rows of which something was skipped."""
        return len({s.line for s in self.skipped})

    @property
    def unusable_share(self) -> float:
        """:attr:`unusable` / :attr:`records` (0 for no records)."""
        return self.unusable / self.records if self.records else 0.0


def check_op(op: str) -> str:
    """Return ``op`` if it is a known operation, else raise :class:`ConfigError` listing them."""
    if op not in OPS:
        raise ConfigError(f"unknown operation {op!r}; allowed: {', '.join(OPS)}")
    return op


def busbw_factor(op: str, ranks: int) -> float:
    """Bus-bandwidth factor *f(n)* with ``busbw = algbw · f(n)`` (nccl-tests convention).

    all_reduce ``2(n−1)/n``; all_gather, reduce_scatter, all_to_all ``(n−1)/n``; broadcast,
    reduce, sendrecv, exchange ``1``.

    References
    ----------
    NVIDIA/nccl-tests, doc/PERFORMANCE.md, "Bus bandwidth" (and ``*GetBw`` in src/*.cu).
    """
    check_op(op)
    if isinstance(ranks, bool) or int(ranks) != ranks or ranks < 1:
        raise ConfigError(f"ranks must be a positive integer, got {ranks!r}")
    n = float(ranks)
    if op == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1.0) / n
    return 1.0


def summarize(samples_s: Iterable[float]) -> dict[str, float | int]:
    """Mean, median, min, max, sample standard deviation (ddof=1; 0 for one sample) and n."""
    x = np.asarray(list(samples_s), dtype=float)
    if x.size == 0:
        raise CalibrationError("no timing samples to summarize")
    return {"time_mean_s": float(x.mean()), "time_median_s": float(np.median(x)),
            "time_min_s": float(x.min()), "time_max_s": float(x.max()),
            "time_std_s": float(x.std(ddof=1)) if x.size > 1 else 0.0, "n": int(x.size)}


def comm_row(*, backend: str, library: str, library_version: str, op: str, ranks: int,
             nodes: int, ranks_per_node: int, scope: str, nbytes: int,
             stats: Mapping[str, float], dtype: str = "float32", variant: str = "",
             source: str = "") -> dict:
    """One tidy row; algbw = bytes / t and busbw = algbw · f(n) with t the median (else mean)."""
    t = stats["time_median_s"] if math.isfinite(stats["time_median_s"]) else stats["time_mean_s"]
    algbw = nbytes / t if t > 0 else math.nan
    return {"backend": backend, "library": library, "library_version": library_version,
            "op": check_op(op), "variant": variant, "ranks": int(ranks), "nodes": int(nodes),
            "ranks_per_node": int(ranks_per_node), "scope": scope, "dtype": dtype,
            "bytes": int(nbytes), **{k: stats[k] for k in _FLOAT_COLUMNS if k in stats},
            "n": int(stats["n"]), "algbw_Bps": algbw,
            "busbw_Bps": algbw * busbw_factor(op, ranks), "source": source}


def tidy_frame(rows: Iterable[Mapping]) -> pd.DataFrame:
    """Rows → the tidy DataFrame with every column of :data:`COLUMNS`, in order and typed."""
    import pandas as pd

    df = pd.DataFrame(list(rows))
    missing = [c for c in COLUMNS if c not in df.columns]
    for c in missing:
        df[c] = np.nan if c in _FLOAT_COLUMNS else ("" if c not in _INT_COLUMNS else 0)
    df = df[list(COLUMNS)]
    for c in _INT_COLUMNS:
        df[c] = df[c].astype("int64")
    for c in _FLOAT_COLUMNS:
        df[c] = df[c].astype("float64")
    for c in set(COLUMNS) - set(_INT_COLUMNS) - set(_FLOAT_COLUMNS):
        df[c] = df[c].fillna("").astype(str)
    bad = sorted(set(df["scope"]) - set(SCOPES))
    if bad:
        raise CalibrationError(f"scope {bad[0]!r} is not one of {', '.join(SCOPES)}")
    return df.reset_index(drop=True)


STATISTICS = ("median", "mean", "min")


def representative_time_s(df: pd.DataFrame, statistic: str = "median") -> np.ndarray:
    """The time a fit uses per row: ``statistic`` of the repetitions when the row has it, else
    the median, else the mean (all nccl-tests and OSU latency rows have a mean). ``min``
    resists interference on shared machines (noise only adds time); ``median`` is the
    default."""
    if statistic not in STATISTICS:
        raise CalibrationError(f"statistic must be one of {', '.join(STATISTICS)}, got "
                               f"{statistic!r}")
    chosen = df[f"time_{statistic}_s"].to_numpy(dtype=float)
    for fallback in ("time_median_s", "time_mean_s"):
        chosen = np.where(np.isfinite(chosen), chosen, df[fallback].to_numpy(dtype=float))
    return chosen
