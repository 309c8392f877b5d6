"""Does an MPI non-blocking all-reduce progress while the ranks compute? (osu_iallreduce's
question, asked the way the seed's C++ proxies compute: ``usleep`` between ``MPI_Test`` calls.)

    mpirun -n 2 python benchmarks/mpi_overlap.py
    mpirun -n 4 --oversubscribe python benchmarks/mpi_overlap.py --sizes 3.5MB,14MB

For each size, ``--reps`` times: the blocking ``Allreduce``; then ``Iallreduce``, a sleep of
``--sleep`` seconds cut into ``--tests`` pieces with one ``Test`` after each, and the
``Wait``. Rank 0 prints the medians: blocking time, the time the ``Wait`` still takes, and
overlap = 1 - wait / blocking (1: all of it hidden behind the sleeps; 0: none). Each sleep
piece lasts longer than the blocking all-reduce so that the question is progress, not time.
"""

from __future__ import annotations

import argparse
import statistics
import time


def overlap(comm, nbytes: int, sleep_s: float, tests: int, reps: int) -> tuple[float, float]:
    """Median seconds of the blocking all-reduce of ``nbytes`` and of the ``Wait`` after an
    ``Iallreduce`` overlapped with ``tests`` sleeps of ``sleep_s / tests`` each followed by
    a ``Test``.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The ranks.
    nbytes : int
        Bytes per rank (float32 elements).
    sleep_s : float
        Seconds of sleep in all, per repetition.
    tests : int
        ``Test`` calls (one after each piece of the sleep); 0: one sleep, no call.
    reps : int
        Repetitions (the median is returned).

    Returns
    -------
    (float, float)
        Blocking all-reduce seconds, remaining ``Wait`` seconds.
    """
    import numpy as np
    x = np.ones(max(nbytes // 4, 1), np.float32)
    y = np.empty_like(x)
    blocking, wait = [], []
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        comm.Allreduce(x, y)
        blocking.append(time.perf_counter() - t)
        comm.Barrier()
        req = comm.Iallreduce(x, y)
        if tests == 0:
            time.sleep(sleep_s)  # no MPI call: only a progress of MPI's own would help
        for _ in range(tests):
            time.sleep(sleep_s / tests)
            req.Test()
        t = time.perf_counter()
        req.Wait()
        wait.append(time.perf_counter() - t)
    return statistics.median(blocking), statistics.median(wait)


def main(argv: list[str] | None = None) -> None:
    from ddlsim.units import parse_bytes
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1MiB,8MiB,24MiB", help="comma-separated bytes")
    ap.add_argument("--sleep", type=float, default=0.4, help="seconds of sleep per repetition")
    ap.add_argument("--tests", type=int, default=10, help="Test calls during the sleep")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per size")
    args = ap.parse_args(argv)
    for name, value, ok, allowed in (("--sleep", args.sleep, args.sleep > 0, "> 0"),
                                     ("--tests", args.tests, args.tests >= 0, ">= 0"),
                                     ("--reps", args.reps, args.reps >= 1, ">= 1")):
        if not ok:
            ap.error(f"{name} {value} must be {allowed}")
    sizes = [int(parse_bytes(size)) for size in args.sizes.split(",")]
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    for nbytes in sizes:
        blocking, wait = overlap(comm, nbytes, args.sleep, args.tests, args.reps)
        if comm.rank == 0:
            print(f"{comm.size} ranks, {nbytes} B: allreduce {blocking * 1e3:.2f} ms, wait after "
                  f"{args.tests} tests in {args.sleep * 1e3:.0f} ms of sleep {wait * 1e3:.2f} ms, "
                  f"overlap {1 - wait / blocking:.0%}", flush=True)


if __name__ == "__main__":
    main()
