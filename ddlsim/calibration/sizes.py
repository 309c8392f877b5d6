"""Collective times at the very message sizes a run issues, kept beside a profile's fits.

A profile's communication curve is fitted to a grid of sizes measured in one sitting
(``ddlsim calibrate comm``). On a shared machine that sitting is not the run's: shared-memory
MPI in CPU time depends on what else holds the cores (a rank that waits for its peer polls,
and is charged for it only while it has its core: a 2-rank reduce-scatter of 33.9 MB took
12.6-18.8 ms of CPU inside the closed loop's iterations at load 11 and 38 ms in the
calibration's grid minutes earlier, docs/validation.md). The closed loop therefore also times
each collective its runs' traces issue, at the trace's own size, once a round between the
iterations (:mod:`ddlsim.reference.interleaved`), and :func:`attach_size_times` stores those
times in the profile's entry of the same backend, operation and rank count
(:attr:`~.profile.CommEntry.sizes`), which then times exactly those sizes; every other size
keeps the fitted curve.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .profile import CalibrationProfile, Points
from .schema import CalibrationError, representative_time_s

__all__ = ["attach_size_times", "attach_size_file"]


def attach_size_times(profile: CalibrationProfile, table: pd.DataFrame,
                      statistic: str = "median") -> CalibrationProfile:
    """``profile`` with each row of ``table`` (the tidy ``calibrate comm`` format) as a
    measured size of the entry of its backend, operation, scope and rank count.

    Parameters
    ----------
    profile : CalibrationProfile
        A fitted profile.
    table : pandas.DataFrame
        Rows of ``backend``, ``op``, ``scope``, ``ranks``, ``bytes`` and the time columns.
    statistic : {"median", "mean", "min"}
        Which time of each row (:func:`~.schema.representative_time_s`).

    Returns
    -------
    CalibrationProfile
        A new profile; the input is unchanged.

    Raises
    ------
    CalibrationError
        A row whose backend, operation, scope and rank count has no fitted entry (its
        size would have no curve to fall back on beside it).
    """
    doc = profile.doc
    comm = list(doc.comm)
    times = representative_time_s(table, statistic)
    for (backend, op, scope, ranks), rows in table.assign(t=times).groupby(
            ["backend", "op", "scope", "ranks"], sort=True):
        i = next((i for i, e in enumerate(comm) if (e.backend, e.op, e.scope, e.ranks,
                                                    e.variant)
                  == (backend, op, scope, int(ranks), "")), None)
        if i is None:
            raise CalibrationError(f"measured sizes of {backend} {op} ({scope}, {ranks} "
                                   "ranks) have no fitted entry in the profile to join")
        rows = rows.sort_values("bytes")
        comm[i] = comm[i].model_copy(update={"sizes": Points(
            bytes=[float(b) for b in rows["bytes"]], time_s=[float(t) for t in rows["t"]])})
    return CalibrationProfile(doc.model_copy(update={"comm": comm}))


def attach_size_file(profile_path: Path, csv_path: Path, statistic: str = "median") -> None:
    """:func:`attach_size_times` of a CSV into a profile file, in place."""
    prof = attach_size_times(CalibrationProfile.load(profile_path), pd.read_csv(csv_path),
                             statistic)
    prof.save(profile_path, force=True)
