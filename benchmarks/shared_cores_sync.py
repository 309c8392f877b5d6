"""Ranks sharing cores between synchronisations: how much longer than a fair share a phase
of equal work takes when more ranks than cores meet at a barrier after it (issue #30).

    python benchmarks/shared_cores_sync.py                 # 2, 3 and 4 ranks on this machine
    python benchmarks/shared_cores_sync.py --ranks 3 --work-ms 5,50

Each rank spins for W of its own CPU time (``time.process_time``), then all meet at
``MPI_Barrier``; rounds of that for about a second per W. Printed per rank count and W: the
wall time per round, what a fair share of the cores gives (``ranks · W / cores``,
``ddlsim.topologies.sharedcores``), and the ratio of wall time to W (a fair share: ranks /
cores; every rank's core its own for the round: the most ranks on one core, ``⌈ranks /
cores⌉``). Linux keeps a run queue per CPU and moves tasks between them only when it
balances load, periodically (the kernel's CFS design document,
Documentation/scheduler/sched-design-CFS.rst, and its scheduler domains,
Documentation/scheduler/sched-domains.rst), so a phase short against that period runs at the
busiest core's pace. Under ``mpirun --oversubscribe --bind-to none`` with
``mpi_yield_when_idle`` (the closed loop's settings, ddlsim/reference/mpijobs.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

_RANK = '''
import sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
cores = int(sys.argv[1])
def spin(sec):
    c0 = time.process_time()
    while time.process_time() - c0 < sec:
        pass
for w_ms in map(float, sys.argv[2].split(",")):
    w = w_ms / 1e3
    rounds = max(10, int(1.0 / w))
    spin(0.05)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(rounds):
        spin(w)
        comm.Barrier()
    wall = (time.perf_counter() - t0) / rounds
    n = comm.Get_size()
    if comm.Get_rank() == 0:
        print(f"{n:5d} {w_ms:7.1f} {wall * 1e3:10.2f} {n * w / cores * 1e3:10.2f} "
              f"{wall / w:7.2f} {n / cores:6.2f} {-(-n // cores):6d}", flush=True)
'''


def main(argv: list[str] | None = None) -> int:
    from ddlsim.reference.mpijobs import cpu_cores, mpi_env, mpirun
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,3,4", help="comma list of rank counts")
    ap.add_argument("--work-ms", default="2,5,10,20,50,100",
                    help="comma list of each round's CPU work per rank, ms")
    args = ap.parse_args(argv)
    try:
        ranks = [int(r) for r in args.ranks.split(",")]
        work = [float(w) for w in args.work_ms.split(",")]
    except ValueError:
        ap.error(f"--ranks and --work-ms must be comma lists of numbers, got {args.ranks!r}, "
                 f"{args.work_ms!r}")
    if any(r < 1 for r in ranks) or any(w <= 0 for w in work):
        ap.error(f"--ranks must be >= 1 and --work-ms > 0, got {ranks}, {work}")
    cores = cpu_cores()
    load = os.getloadavg()
    now = time.strftime("%H:%M UTC", time.gmtime())
    print(f"{cores} usable cores; load average {load[0]:.2f} at {now}")
    print("ranks    W ms  wall/round  fair share  wall/W  ranks/cores  max per core")
    for n in ranks:
        proc = subprocess.run(mpirun(n) + [sys.executable, "-c", _RANK, str(cores),
                                           ",".join(map(str, work))],
                              capture_output=True, text=True, timeout=600, env=mpi_env())
        if proc.returncode != 0:
            print(f"error: {n} ranks failed (exit {proc.returncode}): {proc.stderr[-500:]}",
                  file=sys.stderr)
            return 2
        print(proc.stdout, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
