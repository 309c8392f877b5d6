"""From measurements to a profile: group the tidy table, fit each group, record provenance."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .efficiency import fit_compute_results
from .fit import fit_alpha_beta
from .outputs import machine_info, sha256_file, utc_now
from .profile import PROFILE_VERSION, CalibrationProfile, CommEntry, ComputeEntry
from .schema import OPS, CalibrationError, representative_time_s

__all__ = ["GROUP_KEYS", "fit_comm_entries", "fit_compute_entries", "build_profile",
           "describe_inputs"]

#: A profile entry per distinct communicator shape; in-place and out-of-place are pooled,
#: streaming bandwidth (osu_bw) stays apart.
GROUP_KEYS = ("backend", "op", "scope", "ranks", "nodes", "ranks_per_node", "mode")


def _versions(values: pd.Series) -> str:
    return "; ".join(sorted({v for v in values.astype(str) if v}))


def _segment_dict(s) -> dict:
    def clean(x):
        return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x

    ci = (lambda pair: None if any(not math.isfinite(v) for v in pair) else list(pair))
    return {"min_bytes": s.min_bytes, "max_bytes": s.max_bytes, "alpha_s": s.alpha_s,
            "beta_s_per_B": s.beta_s_per_B, "alpha_ci_s": ci(s.alpha_ci_s),
            "beta_ci_s_per_B": ci(s.beta_ci_s_per_B), "alpha_se_s": clean(s.alpha_se_s),
            "beta_se_s_per_B": clean(s.beta_se_s_per_B),
            "corr_alpha_beta": clean(s.corr_alpha_beta), "n_points": s.n_points,
            "rel_rmse": s.rel_rmse}


def fit_comm_entries(df: pd.DataFrame, *, max_segments: int = 3, min_points: int = 3,
                     bootstrap: int = 200, seed: int = 0, level: float = 0.95,
                     statistic: str = "median") -> tuple[list[CommEntry], list[str]]:
    """Fit every group of a tidy communication table; (entries, notes on skipped groups).

    Groups are :data:`GROUP_KEYS` (``mode`` is ``streaming`` for osu_bw rows, else empty);
    each gets its own deterministic seed ``(seed, group index)``. ``statistic`` chooses which
    time of each row is fitted (:func:`~ddlsim.calibration.schema.representative_time_s`).
    """
    df = df.assign(mode=np.where(df["variant"] == "streaming", "streaming", ""),
                   t=representative_time_s(df, statistic))
    df = df[np.isfinite(df["t"]) & (df["t"] > 0)]
    entries, notes = [], []
    for i, (key, g) in enumerate(df.groupby(list(GROUP_KEYS), sort=True)):
        label = {k: v.item() if hasattr(v, "item") else v for k, v in zip(GROUP_KEYS, key)}
        g = g.sort_values("bytes", kind="stable")
        try:
            fit = fit_alpha_beta(g["bytes"], g["t"], max_segments=max_segments,
                                 min_points=min_points, bootstrap=bootstrap,
                                 seed=int(np.random.SeedSequence([seed, i]).generate_state(1)[0]),
                                 level=level)
        except CalibrationError as exc:
            notes.append(f"skipped {label}: {exc}")
            continue
        entries.append(CommEntry(
            backend=label["backend"], op=label["op"], scope=label["scope"],
            ranks=int(label["ranks"]), nodes=int(label["nodes"]),
            ranks_per_node=int(label["ranks_per_node"]), variant=label["mode"],
            library=_versions(g["library"]), library_version=_versions(g["library_version"]),
            rel_rmse=fit.rel_rmse, bic=fit.bic,
            segments=[_segment_dict(s) for s in fit.segments],
            points={"bytes": [float(b) for b in g["bytes"]],
                    "time_s": [float(t) for t in g["t"]]}))
    entries.sort(key=lambda e: (e.backend, OPS.index(e.op), e.scope, e.ranks, e.variant))
    return entries, notes


def fit_compute_entries(df: pd.DataFrame, peaks: dict[str, float] | None = None
                        ) -> list[ComputeEntry]:
    """One compute entry per (backend, device, kind, dtype) of a compute table."""
    return [ComputeEntry(backend=f.backend, device=f.device, kind=f.kind, dtype=f.dtype,
                         rate_max_flops_per_s=f.rate_max_flops_per_s,
                         x_half_flops=f.x_half_flops, peak_flops_per_s=f.peak_flops_per_s,
                         rel_rmse=f.rel_rmse, n_points=f.n_points,
                         points={"flops": list(f.flops), "flops_per_s": list(f.flops_per_s)})
            for f in fit_compute_results(df, peaks)]


def describe_inputs(paths: Sequence[str | Path], formats: Sequence[str]) -> list[dict]:
    """Provenance of the input files: path, sha256, format."""
    return [{"path": str(p), "sha256": sha256_file(p), "format": f}
            for p, f in zip(paths, formats)]


def build_profile(comm: pd.DataFrame | None = None, compute: pd.DataFrame | None = None, *,
                  inputs: Sequence[dict] = (), max_segments: int = 3, min_points: int = 3,
                  bootstrap: int = 200, seed: int = 0, level: float = 0.95,
                  peaks: dict[str, float] | None = None, name: str | None = None,
                  statistic: str = "median") -> CalibrationProfile:
    """Fit communication and compute tables into a versioned :class:`CalibrationProfile`."""
    entries, notes = ([], []) if comm is None or comm.empty else fit_comm_entries(
        comm, max_segments=max_segments, min_points=min_points, bootstrap=bootstrap,
        seed=seed, level=level, statistic=statistic)
    comp = [] if compute is None or compute.empty else fit_compute_entries(compute, peaks)
    if not entries and not comp:
        raise CalibrationError("nothing could be fitted" + (": " + "; ".join(notes)
                                                            if notes else ""))
    machine = machine_info()
    provenance = {
        "created_utc": utc_now(), "ddlsim_version": machine.pop("ddlsim_version"),
        "machine": machine, "inputs": list(inputs),
        "fit": {"model": "piecewise alpha-beta, relative soft-L1 residuals",
                "max_segments": max_segments, "min_points": min_points,
                "criterion": "BIC, 2 parameters per segment and per breakpoint",
                "bootstrap": bootstrap, "seed": seed, "level": level,
                "statistic": statistic},
        "notes": notes}
    return CalibrationProfile.from_dict(
        {"version": PROFILE_VERSION, "name": name, "provenance": provenance,
         "comm": [e.model_dump(mode="json", exclude_none=True) for e in entries],
         "compute": [c.model_dump(mode="json", exclude_none=True) for c in comp]})
