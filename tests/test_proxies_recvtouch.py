"""benchmarks/proxies_recvtouch.py: four cases on two ranks, one line each, twice; one rank
is refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpienv import mpi_env, run_two_ranks

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "proxies_recvtouch.py"
ENV = mpi_env()


def test_two_ranks_print_every_case_twice():
    proc = run_two_ranks(SCRIPT, "--bytes", "262144", "--repeats", "2")
    assert proc.returncode == 0, proc.stderr
    cases = re.findall(r"^(recv fresh|recv warm|send fresh|send written): 262144 B, Recv wall "
                       r"\d+\.\d{3} ms, CPU \d+\.\d{3} ms \(median of 2\)$", proc.stdout, re.M)
    assert cases == ["recv fresh", "recv warm", "send fresh", "send written"] * 2


def test_one_rank_is_refused():
    pytest.importorskip("mpi4py")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "1"], capture_output=True,
                          text=True, env=ENV, timeout=60)
    assert proc.returncode == 2 and "run on 2 ranks (mpirun -n 2), not 1" in proc.stderr
