"""benchmarks/proxies_progress.py: one rank (an MPI singleton) and its argument checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpienv import mpi_env

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "proxies_progress.py"
ENV = mpi_env()


def test_one_rank_prints_the_three_modes():
    pytest.importorskip("mpi4py")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--buckets", "3", "--bytes", "4KiB",
                           "--sleep", "2ms", "--reps", "1"], capture_output=True, text=True,
                          env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # three sleeps of 2 ms take at least 6 ms in every mode
    got = re.fullmatch(r"1 ranks, 3 x 4096 B, sleeps of 2 ms: sleeps (\d+\.\d) ms, overlapped "
                       r"(\d+\.\d) ms, serial (\d+\.\d) ms; exposed (-?\d+%|nan%)\n", proc.stdout)
    assert got and all(float(got.group(k)) >= 6.0 for k in (1, 2, 3))


@pytest.mark.parametrize("args, message", [(["--reps", "0"], "--reps 0 must be >= 1"),
                                           (["--buckets", "0"], "--buckets 0 must be >= 1"),
                                           (["--sleep", "0 s"], "--sleep 0 s must be > 0 s"),
                                           (["--bytes", "2"], "--bytes 2 must be >= 4 B")])
def test_bad_arguments_are_named(args, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=ENV, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr
