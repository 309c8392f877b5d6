"""Piecewise α-β fits of communication times, with breakpoints and bootstrap intervals.

Model, per segment *j* of message sizes: ``t(S) = α_j + β_j·S`` (α in s, β in s/B; Hockney's
model, R. Hockney, "The communication challenge for MPP", Parallel Computing 20(3), 1994).
Libraries switch protocol or algorithm at some sizes (NCCL LL → LL128 → Simple; MPI eager →
rendezvous), which shows as a jump or a change of slope; so the sizes are split into *k*
contiguous segments.

* **Loss.** Sizes span bytes to gigabytes and times microseconds to seconds, so residuals are
  relative, ``r_i = (α + β·S_i)/t_i − 1``, and robust: ``scipy.optimize.least_squares`` with
  the soft-L1 loss, scale = 1.4826·MAD of the least-squares residuals (floor 10⁻³).
  α, β ≥ 0.
* **Breakpoints.** Candidate breakpoints are the measured sizes. For each *k* ≤ ``max_segments``
  the best partition under relative least squares is found exactly by dynamic programming;
  *k* minimises BIC = n·ln(RSS/n) + (4k − 2)·ln n (G. Schwarz, Ann. Statist. 6(2), 1978):
  2 parameters per segment, and each breakpoint charged as 2 because its location is searched
  over all measured sizes, which inflates the fit gain (the idea of the modified BIC of
  N. Zhang & D. Siegmund, Biometrics 63(1), 2007). On synthetic data with 3–10 % noise this
  keeps spurious breakpoints to a few percent. A breakpoint is located to within one
  measured size step; a segment covers sizes from its first measured size up to the next
  segment's first.
* **Intervals.** Case-resampling bootstrap within each segment (B resamples, fixed seed;
  B. Efron & R. Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 9), each resample
  refitted with the same loss by iteratively reweighted least squares, spread widened by
  √(n/(n−2)); percentile intervals, plus standard errors and the α–β correlation for
  propagating to a time. Intervals are conditional on the chosen breakpoints; on synthetic
  data their coverage of the truth is 0.89–0.96 at the nominal 0.95.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from .schema import CalibrationError

__all__ = ["SegmentFit", "AlphaBetaFit", "fit_alpha_beta", "fit_segment", "best_partition",
           "check_physical", "MAX_BANDWIDTH_BPS"]

_MAD_TO_SIGMA = 1.4826  # σ = 1.4826·MAD for a normal distribution
_MIN_SCALE = 1e-3
_RSS_FLOOR = 1e-10  # relative variance floor, keeps ln(RSS/n) finite on exact data
#: Most distinct sizes (the breakpoint search is quadratic in them) and points (the bootstrap
#: holds resamples × points) one curve may have; a geometric sweep (nccl-tests -f 2) has ~30
#: sizes.
MAX_FIT_SIZES, MAX_FIT_POINTS = 500, 20_000
#: Highest bandwidth 1/β a fit may extrapolate to large messages: 1 PB/s, over 500× the
#: 1.8 TB/s of a GPU's NVLink 5 (NVIDIA Blackwell datasheet); a fit above it has not seen
#: the size term at all.
MAX_BANDWIDTH_BPS = 1e15


@dataclass(frozen=True)
class SegmentFit:
    """One α-β segment: parameters, bootstrap intervals and the measured sizes it covers."""

    min_bytes: float
    max_bytes: float
    alpha_s: float
    beta_s_per_B: float
    alpha_ci_s: tuple[float, float]
    beta_ci_s_per_B: tuple[float, float]
    alpha_se_s: float
    beta_se_s_per_B: float
    corr_alpha_beta: float
    n_points: int
    rel_rmse: float

    def time_s(self, nbytes: np.ndarray | float) -> np.ndarray | float:
        """α + β·S."""
        return self.alpha_s + self.beta_s_per_B * np.asarray(nbytes, dtype=float)


@dataclass(frozen=True)
class AlphaBetaFit:
    """A piecewise α-β fit: segments in increasing size order, the BIC and fit quality."""

    segments: tuple[SegmentFit, ...]
    bic: float
    rel_rmse: float
    n_points: int

    def segment_index(self, nbytes: np.ndarray | float) -> np.ndarray:
        """Index of the segment used for each size (first segment below, last above)."""
        starts = np.array([s.min_bytes for s in self.segments[1:]])
        return np.searchsorted(starts, np.asarray(nbytes, dtype=float), side="right")

    def predict_s(self, nbytes: np.ndarray | float) -> np.ndarray:
        """Predicted time(s) in seconds."""
        x = np.asarray(nbytes, dtype=float)
        idx = self.segment_index(x)
        alpha = np.array([s.alpha_s for s in self.segments])[idx]
        beta = np.array([s.beta_s_per_B for s in self.segments])[idx]
        return alpha + beta * x


# ----------------------------------------------------------------------- least squares core
def _solve_2x2(suu, suv, svv, su, sv):
    """Non-negative minimiser of Σw(a·u + b·v − 1)² from its sums (vectorised)."""
    suu, suv, svv, su, sv = np.broadcast_arrays(*map(np.asarray, (suu, suv, svv, su, sv)))
    det = suu * svv - suv * suv
    ok = det > 1e-14 * np.maximum(suu * svv, 1e-300)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(ok, (su * svv - sv * suv) / det, np.nan)
        b = np.where(ok, (sv * suu - su * suv) / det, np.nan)
        a_only, b_only = su / suu, sv / svv
    # constrained: one parameter at zero, whichever leaves the smaller residual sum
    gain_a, gain_b = su * a_only, sv * b_only
    use_a = gain_a >= gain_b
    bad = ok & ((a < 0) | (b < 0))
    a = np.where(bad, np.where(use_a, a_only, 0.0), a)
    b = np.where(bad, np.where(use_a, 0.0, b_only), b)
    return a, b


def _rss(s1, suu, suv, svv, su, sv):
    a, b = _solve_2x2(suu, suv, svv, su, sv)
    return s1 - 2 * (a * su + b * sv) + a * a * suu + 2 * a * b * suv + b * b * svv


def _scaled(nbytes: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """u = a0/t, v = b0·S/t with a0, b0 chosen so u, v ≤ 1 (conditioning)."""
    a0 = float(times.min())
    pos = nbytes > 0
    b0 = float((times[pos] / nbytes[pos]).min()) if pos.any() else 1.0
    return a0 / times, b0 * nbytes / times, a0, b0


# ------------------------------------------------------------------------------ breakpoints
def _n_params(segments: int) -> int:
    """Parameters charged by the BIC: 2 per segment and 2 per breakpoint (see module doc)."""
    return 2 * segments + 2 * (segments - 1)


def best_partition(nbytes: np.ndarray, times: np.ndarray, max_segments: int,
                   min_points: int = 3) -> tuple[list[int], float]:
    """Start indices (into the size-sorted points) of each segment, and the partition's BIC.

    Exact dynamic programming over partitions at distinct sizes; costs are relative least
    squares (see the module docstring), BIC selects the number of segments.
    """
    u, v, _, _ = _scaled(nbytes, times)
    edges = np.flatnonzero(np.r_[True, np.diff(nbytes) > 0, True])  # block starts + end
    m, n = len(edges) - 1, len(nbytes)
    cums = [np.r_[0.0, np.cumsum(x)] for x in (np.ones(n), u * u, u * v, v * v, u, v)]

    # c[i, j]: relative RSS of one segment over blocks i..j-1 (all pairs at once)
    lo, hi = np.meshgrid(edges, edges, indexing="ij")
    blocks = np.arange(m + 1)
    valid = (hi - lo >= min_points) & (blocks[None, :] - blocks[:, None] >= 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.maximum(_rss(*(cs[hi] - cs[lo] for cs in cums)), 0.0)
    c = np.where(valid, c, np.inf)
    best, choice = c[0].copy(), {1: [[0] for _ in range(m + 1)]}
    results = [(best[m], [0])]
    for k in range(2, max_segments + 1):
        prev, prev_choice = best, choice[k - 1]
        best, choice[k] = np.full(m + 1, np.inf), [[] for _ in range(m + 1)]
        for j in range(m + 1):
            totals = prev[:j] + c[:j, j]
            if totals.size and np.isfinite(totals.min()):
                i = int(np.argmin(totals))
                best[j], choice[k][j] = totals[i], prev_choice[i] + [i]
        results.append((best[m], choice[k][m]))
    bics = [n * np.log(max(rss / n, _RSS_FLOOR)) + _n_params(k + 1) * np.log(n)
            if np.isfinite(rss) else np.inf for k, (rss, _) in enumerate(results)]
    k = int(np.argmin(bics))
    if not np.isfinite(bics[k]):
        raise CalibrationError(f"cannot fit α-β: need at least {min_points} points at 2 or "
                               f"more distinct sizes, got {n} points at {m} sizes")
    return [int(edges[b]) for b in results[k][1]], float(bics[k])


# --------------------------------------------------------------------------- segment fitting
def _irls(u: np.ndarray, v: np.ndarray, scale: float, iters: int = 40):
    """Soft-L1 fit of a·u + b·v ≈ 1 by iteratively reweighted least squares, row-wise."""
    w = np.ones_like(u)
    for _ in range(iters):
        a, b = _solve_2x2(*(np.sum(w * x, axis=-1) for x in (u * u, u * v, v * v, u, v)))
        r = a[..., None] * u + b[..., None] * v - 1.0
        w = 1.0 / np.sqrt(1.0 + (r / scale) ** 2)
    return a, b


def _robust(u: np.ndarray, v: np.ndarray) -> tuple[float, float, float]:
    a, b = _solve_2x2(*(np.sum(x) for x in (u * u, u * v, v * v, u, v)))
    r = a * u + b * v - 1.0
    scale = max(_MAD_TO_SIGMA * float(np.median(np.abs(r - np.median(r)))), _MIN_SCALE)
    x0 = np.maximum([a, b], 1e-12)
    sol = least_squares(lambda x: x[0] * u + x[1] * v - 1.0, x0, bounds=(0.0, np.inf),
                        loss="soft_l1", f_scale=scale, x_scale="jac", method="trf",
                        xtol=1e-12, ftol=1e-12, gtol=1e-12)
    return float(sol.x[0]), float(sol.x[1]), scale


def _bootstrap(nbytes, times, alpha, beta, scale, a0, b0, reps, rng) -> np.ndarray:
    """(reps, 2) bootstrap replicates of (α, β): resample the segment's points with
    replacement, refit, and widen the spread about the estimate by √(n/(n−2)) (the usual
    small-sample correction for 2 fitted parameters; cf. Davison & Hinkley 1997, §6.2),
    keeping α, β ≥ 0."""
    if reps <= 0:
        return np.full((0, 2), np.nan)
    n = len(nbytes)
    idx = rng.integers(0, n, size=(reps, n))
    tb, xb = times[idx], nbytes[idx]
    ba, bb = _irls(a0 / tb, b0 * xb / tb, scale)
    boot = np.column_stack([ba * a0, bb * b0])
    boot = boot[np.isfinite(boot).all(axis=1)]
    est = np.array([alpha, beta])
    return np.maximum(est + (boot - est) * np.sqrt(n / max(n - 2, 1)), 0.0)


def fit_segment(nbytes: np.ndarray, times: np.ndarray, *, bootstrap: int = 200,
                rng: np.random.Generator | None = None, level: float = 0.95) -> SegmentFit:
    """Robust α-β fit of one segment, with bootstrap percentile intervals at ``level``."""
    nbytes, times = np.asarray(nbytes, float), np.asarray(times, float)
    u, v, a0, b0 = _scaled(nbytes, times)
    a, b, scale = _robust(u, v)
    alpha, beta = a * a0, b * b0
    rel = (alpha + beta * nbytes) / times - 1.0
    rng = rng if rng is not None else np.random.default_rng(0)
    boot = _bootstrap(nbytes, times, alpha, beta, scale, a0, b0, bootstrap, rng)
    q = [50 * (1 - level), 50 * (1 + level)]
    ci = np.percentile(boot, q, axis=0) if len(boot) > 1 else np.full((2, 2), np.nan)
    se = boot.std(axis=0, ddof=1) if len(boot) > 1 else np.full(2, np.nan)
    corr = float(np.corrcoef(boot.T)[0, 1]) if len(boot) > 1 and (se > 0).all() else 0.0
    return SegmentFit(float(nbytes.min()), float(nbytes.max()), alpha, beta,
                      (float(ci[0, 0]), float(ci[1, 0])), (float(ci[0, 1]), float(ci[1, 1])),
                      float(se[0]), float(se[1]), corr, int(len(u)),
                      float(np.sqrt(np.mean(rel ** 2))))


def fit_alpha_beta(nbytes, times_s, *, max_segments: int = 3, min_points: int = 3,
                   bootstrap: int = 200, seed: int = 0, level: float = 0.95) -> AlphaBetaFit:
    """Fit ``t = α_j + β_j·S`` piecewise over message sizes (see the module docstring).

    Parameters
    ----------
    nbytes, times_s : array-like
        Message sizes (bytes, ≥ 0) and measured times (s, > 0); repeated sizes are allowed.
    max_segments : int
        Largest number of segments tried (BIC picks 1…max_segments).
    min_points : int
        Fewest points a segment may have (at least 2 distinct sizes are always required).
    bootstrap : int
        Resamples per segment for the intervals (0: no intervals).
    seed : int
        Seed of the resampling (deterministic output).
    level : float
        Confidence level of the intervals, in (0, 1).

    Returns
    -------
    AlphaBetaFit
    """
    x, t = np.asarray(nbytes, dtype=float), np.asarray(times_s, dtype=float)
    _validate(x, t, max_segments, min_points, bootstrap, level)
    order = np.argsort(x, kind="stable")
    x, t = x[order], t[order]
    starts, bic = best_partition(x, t, max_segments, min_points)
    rng = np.random.default_rng(seed)
    bounds = starts + [len(x)]
    segs = tuple(fit_segment(x[lo:hi], t[lo:hi], bootstrap=bootstrap, rng=rng, level=level)
                 for lo, hi in zip(bounds[:-1], bounds[1:]))
    check_physical(segs)
    fit = AlphaBetaFit(segs, bic, 0.0, len(x))
    rel = fit.predict_s(x) / t - 1.0
    return AlphaBetaFit(segs, bic, float(np.sqrt(np.mean(rel ** 2))), len(x))


def check_physical(segments: tuple[SegmentFit, ...]) -> None:
    """Raise :class:`CalibrationError` unless every segment has a finite latency α >= 0 and
    a finite β >= 0, and the last segment, which extrapolates to every larger size, a
    bandwidth 1/β of at most :data:`MAX_BANDWIDTH_BPS`: times that hardly grow with size up
    to the largest one measured say nothing about the bandwidth."""
    for i, s in enumerate(segments):
        where = f"segment {i + 1} ({s.min_bytes:.0f}–{s.max_bytes:.0f} B)"
        if not (math.isfinite(s.alpha_s) and s.alpha_s >= 0):
            raise CalibrationError(f"non-physical fit: {where} has latency α = {s.alpha_s!r} "
                                   "s; it must be finite and >= 0")
        if not (math.isfinite(s.beta_s_per_B) and s.beta_s_per_B >= 0):
            raise CalibrationError(f"non-physical fit: {where} has β = {s.beta_s_per_B!r} s/B "
                                   "(bandwidth 1/β); it must be finite and >= 0")
    last = segments[-1]
    if not last.beta_s_per_B * MAX_BANDWIDTH_BPS >= 1:
        bw = f"{1 / last.beta_s_per_B:.3g} B/s" if last.beta_s_per_B > 0 else "infinite"
        raise CalibrationError(f"non-physical fit: the times hardly grow with the message size "
                               f"from {last.min_bytes:.0f} B to {last.max_bytes:.0f} B, the "
                               f"largest measured, so the bandwidth 1/β is {bw} (more than "
                               f"{MAX_BANDWIDTH_BPS:.0e} B/s); measure larger messages")


def _validate(x: np.ndarray, t: np.ndarray, max_segments: int, min_points: int,
              bootstrap: int, level: float) -> None:
    if x.shape != t.shape or x.ndim != 1:
        raise CalibrationError(f"sizes and times must be 1-D and of equal length, got shapes "
                               f"{x.shape} and {t.shape}")
    if not (np.isfinite(x).all() and (x >= 0).all()):
        raise CalibrationError("message sizes must be finite and >= 0")
    if not (np.isfinite(t).all() and (t > 0).all()):
        raise CalibrationError("measured times must be finite and > 0 seconds")
    if int(max_segments) != max_segments or max_segments < 1:
        raise CalibrationError(f"max_segments must be an integer >= 1, got {max_segments!r}")
    if int(min_points) != min_points or min_points < 2:
        raise CalibrationError(f"min_points must be an integer >= 2, got {min_points!r}")
    if int(bootstrap) != bootstrap or bootstrap < 0:
        raise CalibrationError(f"bootstrap must be an integer >= 0, got {bootstrap!r}")
    if not 0 < level < 1:
        raise CalibrationError(f"level must be in (0, 1), got {level!r}")
    sizes = np.unique(x).size
    if sizes > MAX_FIT_SIZES or x.size > MAX_FIT_POINTS:
        raise CalibrationError(f"{x.size} points at {sizes} distinct sizes: more than the "
                               f"{MAX_FIT_POINTS:,} points or {MAX_FIT_SIZES} sizes one curve may "
                               "have (the breakpoint search grows with sizes squared); measure "
                               "a geometric sweep of sizes (nccl-tests -f 2)")
