"""benchmarks/proxies_p2p.py: the pipeline proxies' transfer sizes are those ddlsim's configs
send; every case prints one line per size, twice, on two ranks; one rank is refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchscripts import load_script
from mpienv import mpi_env, run_two_ranks

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "proxies_p2p.py"
p2p = load_script("proxies_p2p")


def test_the_sizes_are_the_proxies_stage_sends():
    import proxies_table as table
    for name, nbytes in p2p.PROXY_BYTES.items():
        sends = {b for op, b in table.comm_calls(table.PROXIES[name], 2) if op == "sendrecv"}
        assert sends == {nbytes}, name


def test_two_ranks_print_every_case_twice():
    proc = run_two_ranks(SCRIPT, "--bytes", "65536", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr
    got = re.findall(r"^65536 B (.+?): (\d+\.\d{3}) ms per transfer, CPU \d+\.\d{3} ms, "
                     r"waiting for a core (\d+\.\d{3}) ms \(\d+\.\d{2} GB/s; median of 1\)$",
                     proc.stdout, re.M)
    assert [case for case, _, _ in got] == list(p2p.CASES) * 2
    # a transfer cannot wait for a core longer than it lasts (one sample: no median mixing)
    assert all(float(queue) <= float(wall) + 0.002 for _, wall, queue in got)


def test_the_run_queue_wait_is_read_and_only_grows():
    """The reader returns /proc/self/schedstat's second field (ns waiting on a run queue) in
    seconds, bracketed by the same field read by hand before and after it (a reader that
    returned 0.0 or another field fails here once the process has waited at all); 0.0
    without sched-stats."""
    schedstat = Path("/proc/self/schedstat")
    if not schedstat.exists():
        assert p2p.runqueue_s() == 0.0
        return

    def by_hand() -> float:
        return int(schedstat.read_text().split()[1]) * 1e-9
    low = by_hand()
    got = p2p.runqueue_s()
    sum(range(200_000))
    assert low <= got <= by_hand() <= p2p.runqueue_s()


def test_one_rank_is_refused():
    pytest.importorskip("mpi4py")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "1"], capture_output=True,
                          text=True, env=mpi_env(), timeout=60)
    assert proc.returncode == 2 and "run on 2 ranks (mpirun -n 2), not 1" in proc.stderr
