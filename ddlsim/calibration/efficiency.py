"""Compute efficiency as a function of problem size, fitted to GEMM (or attention) timings.

Model: achieved rate ``R(x) = R_max · x / (x + x_half)`` with ``x`` the FLOPs of one call —
small GEMMs are dominated by a fixed overhead (launch, dispatch), large ones approach a
plateau: ``x/R(x) = x/R_max + x_half/R_max`` is exactly an α-β model in FLOPs with
α = x_half/R_max. Efficiency ``η(x) = R(x)/peak = η_max · x/(x + x_half)`` when the peak is
known. Fitted with ``scipy.optimize.least_squares`` (soft-L1 loss) on relative residuals of the
rate, parameters in log space (both positive) and bounded to what the sweep can tell: R_max in
0.5…10× the best measured rate, x_half in 10⁻³…10× the measured FLOPs. A sweep that never
approaches its plateau leaves R_max at a bound; the relative RMS error reports the misfit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from .schema import CalibrationError

__all__ = ["EfficiencyFit", "fit_efficiency", "fit_compute_results"]


@dataclass(frozen=True)
class EfficiencyFit:
    """Fitted saturation curve of one (backend, device, kind, dtype)."""

    backend: str
    device: str
    kind: str
    dtype: str
    rate_max_flops_per_s: float
    x_half_flops: float
    peak_flops_per_s: float | None
    rel_rmse: float
    n_points: int
    flops: tuple[float, ...]
    flops_per_s: tuple[float, ...]

    @property
    def eta_max(self) -> float | None:
        """R_max / peak, or None without a peak."""
        return self.rate_max_flops_per_s / self.peak_flops_per_s if self.peak_flops_per_s else None

    def rate(self, flops: np.ndarray | float) -> np.ndarray | float:
        """Achieved FLOP/s for calls of ``flops`` FLOPs."""
        x = np.asarray(flops, dtype=float)
        return self.rate_max_flops_per_s * x / (x + self.x_half_flops)


def fit_efficiency(flops, flops_per_s) -> tuple[float, float, float]:
    """(R_max FLOP/s, x_half FLOPs, relative RMS error) of the saturation model."""
    x, r = np.asarray(flops, dtype=float), np.asarray(flops_per_s, dtype=float)
    if x.shape != r.shape or x.size < 2 or not ((x > 0) & (r > 0)).all():
        raise CalibrationError("an efficiency fit needs >= 2 points with FLOPs > 0 and "
                               "FLOP/s > 0")
    if np.unique(x).size < 2:
        raise CalibrationError("an efficiency fit needs at least 2 distinct problem sizes")
    # initial guess from the linear form t = x/R_max + x_half/R_max (least squares on t)
    t = x / r
    slope, intercept = np.polyfit(x, t, 1, w=1.0 / t)
    r0 = 1.0 / slope if slope > 0 else r.max()
    h0 = intercept * r0 if intercept > 0 else float(np.median(x))
    # bounds: the plateau lies between half and 10× the best measured rate, x_half within
    # 10⁻³…10× the measured FLOPs range — beyond that the sweep says nothing about it
    lo = np.log([r.max() * 0.5, x.min() * 1e-3])
    hi = np.log([r.max() * 10.0, x.max() * 10.0])
    p0 = np.clip(np.log([r0, h0]), lo + 1e-9, hi - 1e-9)

    def resid(p: np.ndarray) -> np.ndarray:
        rm, xh = np.exp(p)
        return rm * x / (x + xh) / r - 1.0

    sol = least_squares(resid, p0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05,
                        xtol=1e-12, ftol=1e-12)
    rm, xh = np.exp(sol.x)
    return float(rm), float(xh), float(np.sqrt(np.mean(resid(sol.x) ** 2)))


def fit_compute_results(df: pd.DataFrame, peaks: dict[str, float] | None = None
                        ) -> list[EfficiencyFit]:
    """One :class:`EfficiencyFit` per (backend, device, kind, dtype) of a compute table.

    ``peaks`` maps dtype (``fp32``, ``bf16``, …) to the device's peak FLOP/s, for η.
    """
    peaks = peaks or {}
    out = []
    for key, g in df.groupby(["backend", "device", "kind", "dtype"], sort=True):
        g = g.sort_values("flops", kind="stable")
        rm, xh, err = fit_efficiency(g["flops"], g["flops_per_s"])
        out.append(EfficiencyFit(*map(str, key), rm, xh, peaks.get(str(key[3])), err, len(g),
                                 tuple(map(float, g["flops"])),
                                 tuple(map(float, g["flops_per_s"]))))
    return out
