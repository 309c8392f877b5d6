"""From measurements to a profile: check what the readers skipped, group the tidy table, fit
each group, record provenance (the inputs and every row skipped)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ValidationError

from .efficiency import fit_compute_results
from .fit import fit_alpha_beta
from ..textio import MAX_DATA_BYTES, InputFileError, read_bytes
from .outputs import machine_info, utc_now
from .profile import PROFILE_VERSION, CalibrationProfile, CommEntry, ComputeEntry
from .schema import (DEFAULT_MAX_REL_RMSE, DEFAULT_MAX_SKIPPED_SHARE, OPS, CalibrationError,
                     ReadResult, SkippedRow,
                     representative_time_s)

__all__ = ["GROUP_KEYS", "fit_comm_entries", "fit_compute_entries", "build_profile",
           "describe_inputs", "check_skipped_share", "check_fit_error", "fit_profile",
           "DEFAULT_MAX_REL_RMSE"]


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
    """Fit every group of a tidy communication table; returns (entries, notes).

    Groups are :data:`GROUP_KEYS` (``mode`` is ``streaming`` for osu_bw rows, else empty);
    each gets its own deterministic seed ``(seed, group index)``. ``statistic`` chooses which
    time of each row is fitted (:func:`~ddlsim.calibration.schema.representative_time_s`).
    A group that cannot be fitted (too few points or sizes for ``min_points``) or whose fit
    is non-physical (:func:`~ddlsim.calibration.fit.check_physical`) stops the fit with a
    :class:`CalibrationError` naming every such group; no group is dropped.
    """
    df = df.assign(mode=np.where(df["variant"] == "streaming", "streaming", ""),
                   t=representative_time_s(df, statistic))
    bad = ~(np.isfinite(df["t"]) & (df["t"] > 0))
    if bad.any():
        raise CalibrationError(f"{int(bad.sum())} of {len(df)} rows have no finite time > 0 "
                               f"(first: {df['source'][bad].iloc[0]!r}, "
                               f"{int(df['bytes'][bad].iloc[0])} B); the readers skip such rows")
    entries, notes, failed = [], [], []
    for i, (key, g) in enumerate(df.groupby(list(GROUP_KEYS), sort=True)):
        label = {k: v.item() if hasattr(v, "item") else v for k, v in zip(GROUP_KEYS, key)}
        g = g.sort_values("bytes", kind="stable")
        try:
            fit = fit_alpha_beta(g["bytes"], g["t"], max_segments=max_segments,
                                 min_points=min_points, bootstrap=bootstrap,
                                 seed=int(np.random.SeedSequence([seed, i]).generate_state(1)[0]),
                                 level=level)
        except (CalibrationError, ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            failed.append(f"{_group_name(label)}: {exc}")
            continue
        entries.append(_comm_entry(label, g, fit))
    if failed:
        raise CalibrationError(f"cannot fit {len(failed)} communicator group(s), so no profile "
                               f"is written: {'; '.join(failed)}. Measure more sizes for them, "
                               "or leave their rows out")
    entries.sort(key=lambda e: (e.backend, OPS.index(e.op), e.scope, e.ranks, e.variant))
    return entries, notes


def _comm_entry(label: dict, g: pd.DataFrame, fit) -> CommEntry:
    try:
        return CommEntry(
            backend=label["backend"], op=label["op"], scope=label["scope"],
            ranks=int(label["ranks"]), nodes=int(label["nodes"]),
            ranks_per_node=int(label["ranks_per_node"]), variant=label["mode"],
            library=_versions(g["library"]), library_version=_versions(g["library_version"]),
            rel_rmse=fit.rel_rmse, bic=fit.bic,
            segments=[_segment_dict(s) for s in fit.segments],
            points={"bytes": [float(b) for b in g["bytes"]],
                    "time_s": [float(t) for t in g["t"]]})
    except ValidationError as exc:
        raise CalibrationError(f"{_group_name(label)}: cannot make a profile entry: "
                               f"{exc.errors()[0]['msg']}") from None


def _group_name(label: dict) -> str:
    mode = ", streaming" if label["mode"] else ""
    return (f"{label['backend']} {label['op']} {label['scope']} ({label['ranks']} ranks, "
            f"{label['nodes']} nodes{mode})")


def fit_compute_entries(df: pd.DataFrame, peaks: dict[str, float] | None = None,
                        statistic: str = "median") -> list[ComputeEntry]:
    """One compute entry per (backend, device, kind, dtype) of a compute table; a group
    that cannot be fitted, or fits to a non-physical curve, stops the fit naming it.
    ``statistic`` chooses the time per row whose rate ``flops / time`` is fitted
    (:func:`~ddlsim.calibration.schema.representative_time_s`), as for communication."""
    if statistic != "median" and "time_median_s" in df:
        df = df.assign(flops_per_s=df["flops"] / representative_time_s(df, statistic))
    fits, failed = [], []
    for key, g in single_calls(df).groupby(["backend", "device", "kind", "dtype"], sort=True):
        try:
            (f,) = fit_compute_results(g, peaks)
        except (CalibrationError, ValueError, ArithmeticError) as exc:
            failed.append(f"{'/'.join(map(str, key))}: {exc}")
            continue
        if not (np.isfinite(f.rate_max_flops_per_s) and f.rate_max_flops_per_s > 0
                and np.isfinite(f.x_half_flops) and f.x_half_flops >= 0):
            failed.append(f"{'/'.join(map(str, key))}: non-physical fit, R_max = "
                          f"{f.rate_max_flops_per_s!r} FLOP/s, x_half = {f.x_half_flops!r}")
            continue
        fits.append(f)
    if failed:
        raise CalibrationError(f"cannot fit {len(failed)} compute group(s): "
                               f"{'; '.join(failed)}")
    try:
        return [ComputeEntry(backend=f.backend, device=f.device, kind=f.kind, dtype=f.dtype,
                             rate_max_flops_per_s=f.rate_max_flops_per_s,
                             x_half_flops=f.x_half_flops, peak_flops_per_s=f.peak_flops_per_s,
                             rel_rmse=f.rel_rmse, n_points=f.n_points,
                             points={"flops": list(f.flops),
                                     "flops_per_s": list(f.flops_per_s)},
                             shapes=_shapes(df, f))
                for f in fits]
    except ValidationError as exc:
        raise CalibrationError(f"cannot make a compute profile entry: "
                               f"{exc.errors()[0]['msg']}") from None


def single_calls(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a compute table that time one call each: a batched GEMM row (``batch`` >
    1, a stack of calls) gives its shape's time (:func:`_shapes`) but no point of the
    saturation curve of single calls."""
    if "batch" not in df or df["kind"].ne("gemm").all():
        return df
    return df[(df["kind"] != "gemm") | (df["batch"].fillna(0) <= 1)]


def _shapes(df: pd.DataFrame, fit) -> list[dict] | None:
    """Each measured GEMM shape of ``fit``'s group and its time (``flops / flops_per_s``,
    the statistic :func:`fit_compute_entries` fitted), for a profile's exact-shape lookup;
    None for attention or a table without shapes."""
    if fit.kind != "gemm" or not {"m", "n", "k"} <= set(df.columns):
        return None
    g = df[(df["backend"] == fit.backend) & (df["device"] == fit.device)
           & (df["kind"] == fit.kind) & (df["dtype"] == fit.dtype)]
    batch = g["batch"].fillna(0).clip(lower=1) if "batch" in g else pd.Series(1, g.index)
    out: dict[tuple[int, int, int, int], list[float]] = {}
    for (m, n, k), b, flops, rate in zip(g[["m", "n", "k"]].itertuples(index=False), batch,
                                         g["flops"], g["flops_per_s"]):
        if min(m, n, k) >= 1 and rate > 0:
            out.setdefault((int(m), int(n), int(k), int(b)), []).append(flops / rate)
    return [{"m": m, "n": n, "k": k, "batch": b, "seconds": float(np.median(t))}
            for (m, n, k, b), t in sorted(out.items())] or None  # a shape met twice: median


def check_fit_error(comm: Sequence[CommEntry], compute: Sequence[ComputeEntry],
                    max_rel_rmse: float = DEFAULT_MAX_REL_RMSE) -> None:
    """Refuse (:class:`CalibrationError`) every fitted curve whose relative RMS error
    ``sqrt(mean((fit/measured − 1)²))`` over its own points exceeds ``max_rel_rmse``,
    naming each one with its figure; ``math.inf`` accepts every fit."""
    if isinstance(max_rel_rmse, bool) or not (isinstance(max_rel_rmse, (int, float))
                                              and max_rel_rmse > 0):
        raise CalibrationError(f"the largest relative RMS error of a fit must be a number "
                               f"> 0, got {max_rel_rmse!r}")
    bad = [f"{e.backend} {e.op} {e.scope} ({e.ranks} ranks): {e.rel_rmse:.1%}" for e in comm
           if e.rel_rmse is not None and e.rel_rmse > max_rel_rmse]
    bad += [f"{c.backend}/{c.device} {c.kind} {c.dtype}: {c.rel_rmse:.1%}" for c in compute
            if c.rel_rmse is not None and c.rel_rmse > max_rel_rmse]
    if bad:
        raise CalibrationError(
            f"{len(bad)} fitted curve(s) miss their own measurements by more than the "
            f"{max_rel_rmse:.0%} allowed (relative RMS error), so no profile is written: "
            f"{'; '.join(bad)}. Such a curve would move predictions arbitrarily; measure "
            "again on a quieter machine or with more repetitions, fit the minimum "
            "(--statistic min), or raise --max-rel-rmse to accept it")


def describe_inputs(paths: Sequence[str | Path], formats: Sequence[str]) -> list[dict]:
    """Provenance of the input files: path, sha256 (None when the file cannot be read now,
    e.g. a table parsed from text), format."""
    return [{"path": str(p), "sha256": _sha256(p), "format": f}
            for p, f in zip(paths, formats)]


def _sha256(path: str | Path) -> str | None:
    try:
        return hashlib.sha256(read_bytes(path, what="results file",
                                         max_bytes=MAX_DATA_BYTES)).hexdigest()
    except InputFileError:
        return None


def check_skipped_share(results: Sequence[ReadResult],
                        max_share: float = DEFAULT_MAX_SKIPPED_SHARE) -> None:
    """Refuse (:class:`CalibrationError`) any file of which more than ``max_share`` of the
    data rows could not be used (:attr:`ReadResult.unusable_share`).

    The default, :data:`~ddlsim.calibration.schema.DEFAULT_MAX_SKIPPED_SHARE` (10 %), lets
    through the few damaged lines captured output often has, and stops a file that is mostly
    unusable, whose remaining rows should not be trusted either.
    """
    if isinstance(max_share, bool) or not (isinstance(max_share, (int, float))
                                           and 0 <= max_share <= 1):
        raise CalibrationError(f"the largest share of skipped rows must be a number in [0, 1], "
                               f"got {max_share!r}")
    bad = [f"{r.path}: {r.unusable} of {r.records} rows ({r.unusable_share:.0%})"
           for r in results if r.unusable_share > max_share]
    if bad:
        raise CalibrationError(f"too many unusable rows, so no profile is written: "
                               f"{'; '.join(bad)} could not be used, more than the "
                               f"{max_share:.0%} allowed (--max-skipped-share). Each one is "
                               "reported with its line and reason; fix or remove them, or "
                               "raise the limit to fit the rest")


def fit_profile(results: Sequence[ReadResult], *,
                max_skipped_share: float = DEFAULT_MAX_SKIPPED_SHARE,
                **options) -> CalibrationProfile:
    """Fit what the readers returned into a profile: check the share of skipped rows per file
    (:func:`check_skipped_share`), fit (:func:`build_profile`), and record every input and
    every skipped row in the provenance.

    Parameters
    ----------
    results : sequence of ReadResult
        What :func:`~ddlsim.calibration.readers.read_results` returned, one per file;
        communication and compute tables may be mixed.
    max_skipped_share : float
        Largest share of one file's data rows that may be unusable, in [0, 1].
    **options
        ``max_segments``, ``min_points``, ``bootstrap``, ``seed``, ``level``, ``peaks``,
        ``name``, ``statistic``, ``compute_statistic``, ``max_rel_rmse`` of
        :func:`build_profile`.

    Returns
    -------
    CalibrationProfile
        With ``provenance.inputs`` (path, sha256, format, records, skipped) and
        ``provenance.skipped`` (file, line, reason, text of every row left out).
    """
    check_skipped_share(results, max_skipped_share)
    tables = {kind: [r.table for r in results if r.kind == kind and len(r.table)]
              for kind in ("comm", "compute")}
    joined = {k: pd.concat(v, ignore_index=True) if v else None for k, v in tables.items()}
    inputs = [{**d, "records": r.records, "skipped": len(r.skipped)} for r, d in
              zip(results, describe_inputs([r.path for r in results],
                                           [r.format for r in results]))]
    return build_profile(joined["comm"], joined["compute"], inputs=inputs,
                         skipped=[s for r in results for s in r.skipped],
                         max_skipped_share=max_skipped_share, **options)


def build_profile(comm: pd.DataFrame | None = None, compute: pd.DataFrame | None = None, *,
                  inputs: Sequence[dict] = (), max_segments: int = 3, min_points: int = 3,
                  bootstrap: int = 200, seed: int = 0, level: float = 0.95,
                  peaks: dict[str, float] | None = None, name: str | None = None,
                  statistic: str = "median", skipped: Sequence[SkippedRow] = (),
                  max_skipped_share: float | None = None,
                  max_rel_rmse: float = DEFAULT_MAX_REL_RMSE,
                  compute_statistic: str | None = None) -> CalibrationProfile:
    """Fit communication and compute tables into a versioned :class:`CalibrationProfile`.

    ``statistic`` is the time fitted per row (:func:`~.schema.representative_time_s`);
    ``compute_statistic``, when given, the one of the compute rows instead (the closed loop
    fits the least GEMM time of its rounds and the median of each collective's repetitions,
    docs/validation.md).

    ``skipped`` (the rows the readers left out) and ``max_skipped_share`` (the limit they
    were checked against) are recorded in the provenance; a curve whose relative RMS error
    exceeds ``max_rel_rmse`` stops the fit (:func:`check_fit_error`).
    """
    entries, notes = ([], []) if comm is None or comm.empty else fit_comm_entries(
        comm, max_segments=max_segments, min_points=min_points, bootstrap=bootstrap,
        seed=seed, level=level, statistic=statistic)
    compute_statistic = compute_statistic or statistic
    comp = [] if compute is None or compute.empty else fit_compute_entries(compute, peaks,
                                                                           compute_statistic)
    if not entries and not comp:
        raise CalibrationError("nothing could be fitted" + (": " + "; ".join(notes)
                                                            if notes else ""))
    check_fit_error(entries, comp, max_rel_rmse)
    machine = machine_info()
    provenance = {
        "created_utc": utc_now(), "ddlsim_version": machine.pop("ddlsim_version"),
        "machine": machine, "inputs": list(inputs),
        "fit": {"model": "piecewise alpha-beta, relative soft-L1 residuals",
                "max_segments": max_segments, "min_points": min_points,
                "criterion": "BIC, 2 parameters per segment and per breakpoint",
                "bootstrap": bootstrap, "seed": seed, "level": level,
                "statistic": statistic,
                **({} if compute_statistic == statistic else
                   {"compute_statistic": compute_statistic}),
                "max_rel_rmse": max_rel_rmse if math.isfinite(max_rel_rmse) else None,
                **({} if max_skipped_share is None else
                   {"max_skipped_share": max_skipped_share})},
        "skipped": [s.to_dict() for s in skipped],
        "notes": notes}
    return CalibrationProfile.from_dict(
        {"version": PROFILE_VERSION, "name": name, "provenance": provenance,
         "comm": [e.model_dump(mode="json", exclude_none=True) for e in entries],
         "compute": [c.model_dump(mode="json", exclude_none=True) for c in comp]})
