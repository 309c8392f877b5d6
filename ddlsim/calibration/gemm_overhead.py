"""A device's fixed GEMM costs (``device.gemm_overhead``) from a measured kernel table.

The table is ``ddlsim/data/gemm_measured.csv`` (or a user's own sweep in its columns: a GPU run
of ``benchmarks/device/h100_kernels.py`` writes one): one row per measured GEMM, with its source
and its role. :func:`fit_gemm_overhead` fits ``floor_s`` and ``wave_s`` of
:class:`~ddlsim.simulator.kernels.gemm.GemmOverhead` to the rows given (least squares on the
log of predicted / measured time, the device's measured ceiling held fixed), and
:func:`gemm_errors` gives the model's error on any rows, so that rows kept out of the fit
validate it. Nothing here reads an end-to-end training figure.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config_types import DTYPE_BYTES
from ..simulator.kernels.gemm import GemmOverhead, gemm_time

__all__ = ["GemmPoint", "GEMM_TABLE", "read_gemm_table", "fit_gemm_overhead", "gemm_errors"]

#: the bundled table of published GEMM measurements
GEMM_TABLE = Path(__file__).resolve().parent.parent / "data" / "gemm_measured.csv"


@dataclass(frozen=True)
class GemmPoint:
    """One measured GEMM: ``batch`` × ``[m,k]·[k,n]`` at ``dtype`` in ``seconds``."""

    source: str
    device: str
    dtype: str
    batch: int
    m: int
    n: int
    k: int
    seconds: float
    role: str

    @property
    def flops(self) -> float:
        """``2·m·n·k·batch``."""
        return 2.0 * self.m * self.n * self.k * self.batch


def read_gemm_table(path: Path | str = GEMM_TABLE) -> list[GemmPoint]:
    """The GEMM rows of a measured table (``#`` lines are a provenance header), in any of three
    forms: ``ddlsim/data/gemm_measured.csv`` (``tflops``, ``source``, ``role``), the CSV of
    ``ddlsim calibrate compute`` (rows of ``kind`` gemm, ``time_median_s``) or the ``gemm.csv``
    of ``benchmarks/device/h100_kernels.py`` (``seconds``). The last two have no source or role:
    the file's name is the source and every row's role is ``measured``.

    Parameters
    ----------
    path : the CSV.

    Returns
    -------
    list of GemmPoint.
    """
    path = Path(path)
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    out = []
    for r in csv.DictReader(lines):
        if r.get("kind", "gemm") != "gemm":
            continue
        b, m, n, k = (int(float(r.get(c) or 1)) for c in ("batch", "m", "n", "k"))
        if "tflops" in r:
            seconds = 2.0 * m * n * k * b / (float(r["tflops"]) * 1e12)
        else:
            seconds = float(r["time_median_s"] if "time_median_s" in r else r["seconds"])
        if not np.isfinite(seconds) or seconds <= 0:
            continue                    # a shape the sweep could not run
        out.append(GemmPoint(r.get("source") or path.name, r.get("device") or "",
                             r["dtype"], b, m, n, k, seconds, r.get("role") or "measured"))
    return out


def _predict(p: GemmPoint, dev, overhead: GemmOverhead | None) -> float:
    return gemm_time(p.m, p.n, p.k, p.batch, DTYPE_BYTES.get(p.dtype, 2),
                     dev.peak_flops(p.dtype), dev.ceiling(p.dtype), dev.sm_count,
                     dev.memory_Bps, overhead)


def gemm_errors(points: list[GemmPoint], dev, overhead: GemmOverhead | None) -> np.ndarray:
    """Relative error (predicted / measured − 1) of each point's time.

    Parameters
    ----------
    points : measured GEMMs.
    dev : a :class:`~ddlsim.simulator.kernels.KernelDevice` (peak, ceiling, SMs, bandwidth).
    overhead : the fixed costs to predict with (None: none).

    Returns
    -------
    array : one error per point (positive: the model is too slow).
    """
    return np.array([_predict(p, dev, overhead) / p.seconds - 1.0 for p in points])


def fit_gemm_overhead(points: list[GemmPoint], dev) -> GemmOverhead:
    """``floor_s`` and ``wave_s`` minimising the squared log error of ``points``' times, the
    device's ceiling held fixed (scipy's bounded least squares, from 5 µs and 1 µs).

    Parameters
    ----------
    points : the measured GEMMs to fit (at least two).
    dev : the :class:`~ddlsim.simulator.kernels.KernelDevice` they ran on.

    Returns
    -------
    GemmOverhead : seconds, rounded to 0.01 µs.
    """
    from scipy.optimize import least_squares

    if len(points) < 2:
        raise ValueError(f"fit_gemm_overhead needs at least two GEMMs; got {len(points)}")

    def residual(x):
        over = GemmOverhead(x[0] * 1e-6, x[1] * 1e-6)
        return np.log1p(gemm_errors(points, dev, over))

    fit = least_squares(residual, [5.0, 1.0], bounds=([0.0, 0.0], [100.0, 100.0]))
    return GemmOverhead(round(float(fit.x[0]), 2) * 1e-6, round(float(fit.x[1]), 2) * 1e-6)
