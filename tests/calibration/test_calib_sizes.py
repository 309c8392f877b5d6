"""Collective times measured at a run's own message sizes are kept beside a profile's fitted
curve and time exactly those sizes (ddlsim/calibration/sizes.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from ddlsim.calibration.build import fit_comm_entries
from ddlsim.calibration.profile import CalibrationProfile
from ddlsim.calibration.schema import CalibrationError, comm_row, summarize, tidy_frame
from ddlsim.calibration.sizes import attach_size_times


def _rows(op: str, sizes_times: list[tuple[int, float]], ranks: int = 2) -> list[dict]:
    return [comm_row(backend="mpi", library="Open MPI", library_version="Open MPI v5",
                     op=op, ranks=ranks, nodes=1, ranks_per_node=ranks, scope="intra",
                     nbytes=b, stats=summarize([t, t * 1.01, t * 0.99]), source="test")
            for b, t in sizes_times]


#: a curve t = 1e-5 s + b / 2e9 B/s over 1-64 MiB
GRID = [(2 ** i, 1e-5 + 2 ** i / 2e9) for i in range(20, 27)]


def _profile() -> CalibrationProfile:
    entries = fit_comm_entries(tidy_frame(_rows("reduce_scatter", GRID)), bootstrap=0)[0]
    return CalibrationProfile.from_dict({"version": 1, "name": "t", "comm":
                                         [e.model_dump() for e in entries], "compute": []})


def test_a_measured_size_takes_its_time_and_other_sizes_the_curve():
    size = 33_873_920
    prof = attach_size_times(_profile(), tidy_frame(_rows("reduce_scatter", [(size, 0.0123)])))
    assert prof.time_s("mpi", "reduce_scatter", size, 2) == pytest.approx(0.0123)
    curve = 1e-5 + size / 2e9
    assert prof.time_s("mpi", "reduce_scatter", size + 4096, 2) == pytest.approx(curve,
                                                                                 rel=1e-3)
    # another rank count scales the curve, not the size measured on 2 ranks
    assert prof.time_s("mpi", "reduce_scatter", size, 4) != pytest.approx(0.0123)
    # the size survives a save and a load (7 significant digits)
    again = CalibrationProfile.from_dict(prof.to_dict())
    assert again.time_s("mpi", "reduce_scatter", size, 2) == pytest.approx(0.0123, rel=1e-6)


def test_a_size_without_a_fitted_entry_is_refused_naming_it():
    with pytest.raises(CalibrationError, match=r"mpi all_gather \(intra, 2 ranks\)"):
        attach_size_times(_profile(), tidy_frame(_rows("all_gather", [(1 << 24, 0.01)])))


def test_the_statistic_chooses_the_time_kept():
    table = tidy_frame(_rows("reduce_scatter", [(1 << 24, 0.01)]))
    low = attach_size_times(_profile(), table, "min")
    assert low.time_s("mpi", "reduce_scatter", 1 << 24, 2) == pytest.approx(0.0099)
    assert isinstance(table, pd.DataFrame)
