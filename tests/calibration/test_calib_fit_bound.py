"""Calibration that cannot mislead (issue #30): a fit that misses its own points by more than
``--max-rel-rmse`` is refused with its figure; a compute fit a prediction cannot use says so;
``--statistic`` chooses the compute time fitted too."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from ddlsim.calibration import CalibrationProfile
from ddlsim.calibration.build import build_profile, check_fit_error
from ddlsim.calibration.cli import app
from ddlsim.calibration.schema import CalibrationError, comm_row, tidy_frame
from ddlsim.errors import DDLSimWarning

SIZES = [2 ** k for k in range(10, 24)]


def comm_table(scatter: float) -> pd.DataFrame:
    """An all-reduce of α 10 µs and 10 GB/s, each size off by ±``scatter`` in turn."""
    rows = []
    for i, size in enumerate(SIZES):
        t = (10e-6 + size / 10e9) * (1 + scatter * (-1) ** i)
        stats = {"time_mean_s": t, "time_median_s": t, "time_min_s": t, "time_max_s": t,
                 "time_std_s": 0.0, "n": 5}
        rows.append(comm_row(backend="mpi", library="Open MPI", library_version="5",
                             op="all_reduce", ranks=2, nodes=1, ranks_per_node=2,
                             scope="intra", nbytes=size, stats=stats))
    return tidy_frame(rows)


def compute_table(median_scale: float = 1.0) -> pd.DataFrame:
    """GEMMs on a saturation curve (R_max 100 GFLOP/s, x_half 1 MFLOP) at their minimum time;
    the median ``median_scale`` times slower."""
    dims = np.array([32, 64, 128, 256, 512])
    flops = 2.0 * dims.astype(float) ** 3
    t_min = flops / (1e11 * flops / (flops + 1e6))
    return pd.DataFrame({"backend": "numpy", "device": "cpu", "kind": "gemm", "dtype": "fp32",
                         "m": dims, "n": dims, "k": dims, "flops": flops, "time_min_s": t_min,
                         "time_median_s": t_min * median_scale,
                         "time_mean_s": t_min * median_scale,
                         "flops_per_s": flops / (t_min * median_scale)})


def test_a_fit_that_misses_its_points_by_more_than_the_bound_is_refused_with_its_figure():
    build_profile(comm_table(0.05), bootstrap=0)  # ±5 %: accepted
    with pytest.raises(CalibrationError, match=r"mpi all_reduce intra \(2 ranks\): \d+\.\d%\. "
                                               r".*--max-rel-rmse"):
        build_profile(comm_table(0.6), bootstrap=0)
    prof = build_profile(comm_table(0.6), bootstrap=0, max_rel_rmse=math.inf)
    assert prof.doc.comm[0].rel_rmse > 0.25
    assert prof.doc.provenance["fit"]["max_rel_rmse"] is None  # inf is not written as .inf


@pytest.mark.parametrize("bound", [0, -0.1, True, "0.2", math.nan])
def test_the_bound_must_be_a_positive_number(bound):
    with pytest.raises(CalibrationError, match="must be a number > 0"):
        check_fit_error([], [], bound)


def test_cli_refuses_and_names_the_option(tmp_path):
    csv = tmp_path / "mpi.csv"
    comm_table(0.6).to_csv(csv, index=False)
    res = CliRunner().invoke(app, ["fit", str(csv), "-o", str(tmp_path / "p.yaml"),
                                   "--bootstrap", "0"])
    assert res.exit_code == 2 and "--max-rel-rmse" in res.output
    assert not (tmp_path / "p.yaml").exists()
    res = CliRunner().invoke(app, ["fit", str(csv), "-o", str(tmp_path / "p.yaml"),
                                   "--bootstrap", "0", "--max-rel-rmse", "inf"])
    assert res.exit_code == 0, res.output


def test_compute_statistic_chooses_the_time_fitted():
    median = build_profile(compute=compute_table(2.0)).doc.compute[0]
    least = build_profile(compute=compute_table(2.0), statistic="min").doc.compute[0]
    assert least.rate_max_flops_per_s == pytest.approx(1e11, rel=0.02)
    assert median.rate_max_flops_per_s == pytest.approx(0.5e11, rel=0.02)


def test_a_compute_fit_without_peak_says_it_is_not_used_once(tmp_path):
    prof = build_profile(compute=compute_table())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with pytest.raises(CalibrationError, match="no peak FLOP/s"):
                prof.compute_efficiency(1e9, "fp32")
    said = [w for w in caught if issubclass(w.category, DDLSimWarning)]
    assert len(said) == 1 and "predictions keep the device model" in str(said[0].message)
    csv = tmp_path / "c.csv"
    full = compute_table().assign(library_version="numpy", batch=0, heads=0, seq=0,
                                  head_dim=0, time_max_s=lambda d: d.time_median_s,
                                  time_std_s=0.0, reps=5)
    full.to_csv(csv, index=False)
    res = CliRunner().invoke(app, ["fit", str(csv), "-o", str(tmp_path / "p.yaml")])
    assert res.exit_code == 0, res.output
    assert "warning: the numpy/cpu gemm fp32 compute fit has no peak FLOP/s" in res.output
    assert CalibrationProfile.load(tmp_path / "p.yaml").doc.compute[0].peak_flops_per_s is None
