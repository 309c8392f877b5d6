"""A calibration profile times a GEMM shape it measured by that measurement (exact-shape
lookup), every other by its fitted saturation curve; batched rows are shapes, not curve
points."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ddlsim.calibration.build import fit_compute_entries
from ddlsim.calibration.compute_bench import run_gemm_benchmark
from ddlsim.calibration.profile import CalibrationProfile
from ddlsim.calibration.schema import COMPUTE_COLUMNS, CalibrationError

PEAK = 1e11


def _table(rows: list[tuple[int, int, int, int, float]]) -> pd.DataFrame:
    """A compute table of (m, n, k, batch, seconds) rows, numpy fp32."""
    out = []
    for m, n, k, batch, t in rows:
        flops = 2.0 * m * n * k * max(batch, 1)
        out.append({"backend": "numpy", "library_version": "numpy x", "device": "cpu",
                    "kind": "gemm", "dtype": "fp32", "m": m, "n": n, "k": k, "batch": batch,
                    "heads": 0, "seq": 0, "head_dim": 0, "flops": flops, "time_mean_s": t,
                    "time_median_s": t, "time_min_s": t, "time_max_s": t, "time_std_s": 0.0,
                    "reps": 1, "flops_per_s": flops / t})
    return pd.DataFrame(out, columns=list(COMPUTE_COLUMNS))


#: squares on R(x) = 8e10 · x / (x + 1e6), and one stack of 32 thin GEMMs at half that rate
SQUARES = [(s, s, s, 0, 2.0 * s ** 3 / (8e10 * 2.0 * s ** 3 / (2.0 * s ** 3 + 1e6)))
           for s in (64, 128, 256, 512)]
THIN = (128, 128, 64, 32, 2.0 * 128 * 128 * 64 * 32 / 4e10)


def _profile(rows) -> CalibrationProfile:
    entries = fit_compute_entries(_table(rows), {"fp32": PEAK})
    return CalibrationProfile.from_dict({"version": 1, "name": "t", "comm": [],
                                         "compute": [e.model_dump() for e in entries]})


def test_a_measured_shape_takes_its_measured_time_and_others_the_curve():
    prof = _profile([*SQUARES, THIN])
    flops = 2.0 * 128 * 128 * 64 * 32
    got = prof.compute_efficiency(flops, "fp32", shape=(128, 128.0, 64), batch=32.0)
    assert got * PEAK == pytest.approx(4e10)                 # the stack's own rate
    curve = 8e10 * flops / (flops + 1e6) / PEAK
    assert prof.compute_efficiency(flops, "fp32") == pytest.approx(curve, rel=1e-3)
    # the same FLOPs in another shape, or the same shape in another batch: the curve
    other = prof.compute_efficiency(flops, "fp32", shape=(128, 64, 128), batch=32)
    assert other == pytest.approx(curve, rel=1e-3)
    assert prof.compute_efficiency(flops / 2, "fp32", shape=(128, 128, 64), batch=16) \
        == pytest.approx(8e10 * (flops / 2) / (flops / 2 + 1e6) / PEAK, rel=1e-3)


def test_batched_rows_are_not_points_of_the_single_call_curve():
    (with_thin,) = fit_compute_entries(_table([*SQUARES, THIN]), {"fp32": PEAK})
    (without,) = fit_compute_entries(_table(SQUARES), {"fp32": PEAK})
    assert with_thin.n_points == without.n_points == len(SQUARES)
    assert with_thin.rate_max_flops_per_s == without.rate_max_flops_per_s
    assert [(s.m, s.n, s.k, s.batch) for s in with_thin.shapes] == \
        [(64, 64, 64, 1), (128, 128, 64, 32), (128, 128, 128, 1), (256, 256, 256, 1),
         (512, 512, 512, 1)]


def test_a_cost_model_with_the_profile_times_the_trace_kernel_by_its_shape():
    from ddlsim.simulator.kernels.device import op_time
    from ddlsim.workloads.trace import Compute, Kernel
    prof = _profile([*SQUARES, THIN])
    thin = Kernel("gemm", (128, 128, 64), 32, dtype="fp32", variant="scores")
    square = Kernel("gemm", (256, 256, 256), 1, dtype="fp32")

    from ddlsim.config import SystemConfig
    from ddlsim.reference.machine import local_system
    from ddlsim.simulator.kernels.device import kernel_device
    dev = kernel_device(SystemConfig.model_validate(
        local_system(1, PEAK, 1e15, (1e-6, 1e10), 1e9, "a test")))

    def measured(flops, dtype, shape=None, batch=1):
        return prof.compute_efficiency(flops, dtype, shape=shape, batch=batch)

    for k, want in ((thin, THIN[-1]), (square, SQUARES[2][-1])):
        op = Compute("x", 0.0, kind="gemm", dtype="fp32", kernels=(k,))
        assert op_time(op, dev, measured) == pytest.approx(want, rel=1e-9)


def test_the_numpy_benchmark_times_a_stack_as_one_row_of_its_flops():
    df = run_gemm_benchmark("numpy", "cpu", ["fp32"], [(16, 8, 4, 3), (8, 8, 8)], warmup=0,
                            reps=1)
    assert df["batch"].tolist() == [3, 0]
    assert df["flops"].tolist() == [2.0 * 16 * 8 * 4 * 3, 2.0 * 8 ** 3]
    assert np.all(df["time_median_s"] > 0)
    with pytest.raises(CalibrationError, match=r"\(m, n, k\) or \(m, n, k, batch\)"):
        run_gemm_benchmark("numpy", "cpu", ["fp32"], [(8, 8)], warmup=0, reps=1)


def test_a_clock_with_the_torch_backend_is_refused_not_ignored():
    """The torch backend times the device in wall time: a ``clock`` is an error naming it
    (checked before torch is imported, so it runs without torch)."""
    import time
    with pytest.raises(CalibrationError, match="clock .* is for the numpy backend only"):
        run_gemm_benchmark("torch", "cpu", shapes=[(8, 8, 8)], clock=time.process_time)
