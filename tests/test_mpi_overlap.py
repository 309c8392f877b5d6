"""benchmarks/mpi_overlap.py: one rank (an MPI singleton), and its argument checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpienv import mpi_env

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "mpi_overlap.py"
ENV = mpi_env()


def test_one_rank_prints_blocking_wait_and_overlap():
    pytest.importorskip("mpi4py")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "4KiB", "--sleep", "0.01",
                           "--tests", "2", "--reps", "1"], capture_output=True, text=True,
                          env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"1 ranks, 4096 B: allreduce \d+\.\d\d ms, wait after 2 tests in 10 ms "
                        r"of sleep \d+\.\d\d ms, overlap -?\d+%\n", proc.stdout)


@pytest.mark.parametrize("args, message", [(["--reps", "0"], "--reps 0 must be >= 1"),
                                           (["--sleep", "-1"], "--sleep -1.0 must be > 0"),
                                           (["--tests", "-1"], "--tests -1 must be >= 0")])
def test_bad_arguments_are_named(args, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=ENV, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr
