"""``benchmarks/proxies_exchange.py``: both directions at once against the ping-pong, on 2
ranks (resnet50.cpp's ring loop at 2 ranks)."""

from __future__ import annotations

import re
import subprocess
import sys

from benchscripts import BENCH
from mpienv import mpi_env, run_two_ranks

SCRIPT = BENCH / "proxies_exchange.py"


def test_two_ranks_print_both_cases_per_size():
    done = run_two_ranks(SCRIPT, "--sizes-mib", "1,2", "--repeats", "3")
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stdout.splitlines() if "a direction" in ln]
    assert [re.match(r"(\S+) MiB (one way|both ways)", ln).groups() for ln in lines] == [
        ("1", "one way"), ("1", "both ways"), ("2", "one way"), ("2", "both ways")]
    assert all(float(re.search(r"([\d.]+) ms a transfer", ln).group(1)) > 0 for ln in lines)


def test_one_rank_is_refused_with_the_reason():
    done = subprocess.run([sys.executable, str(SCRIPT), "--sizes-mib", "1"], capture_output=True,
                          text=True, env=mpi_env(), timeout=120)
    assert done.returncode == 2
    assert "run on 2 ranks (mpirun -n 2), not 1" in done.stderr
