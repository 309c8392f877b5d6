"""Do non-blocking all-reduces overlap sleeps here, on the ranks' own timeline? The pattern of
the seed's resnet152 proxy (resnet152.cpp:44-53), run with mpi4py on this machine's MPI.

    mpirun -n 2 python benchmarks/proxies_progress.py
    mpirun -n 2 python benchmarks/proxies_progress.py --buckets 10 --bytes 24MB --sleep 23.8ms

Three ways, each ``--reps`` times (median printed by rank 0, wall time, a barrier before each):

* ``sleeps``: ``--buckets`` sleeps of ``--sleep`` each and nothing else;
* ``overlapped``: before each sleep but the first two an ``MPI_Testany`` over the requests so
  far, after each sleep an ``Iallreduce`` of ``--bytes`` (its own buffers), then ``Waitall``:
  resnet152.cpp's backward;
* ``serial``: the same sleeps, each followed by a blocking ``Allreduce`` of the same buffers.

``exposed = (overlapped - sleeps) / (serial - sleeps)``: 0 when the all-reduces hide behind
the sleeps (asynchronous progress), 1 when they take as long as if blocking. Open MPI moves
a non-blocking collective only inside MPI calls (no progress thread for its ``coll/libnbc``
schedules), so on shared memory, where the transfers and reductions are the ranks' own
copies, the work falls in the ``Testany`` and ``Waitall`` calls.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time


def _sleeps(comm, buckets: int, sleep_s: float, bufs, mode: str) -> float:
    """Seconds of one backward in ``mode`` (sleeps, overlapped or serial)."""
    from mpi4py import MPI
    comm.Barrier()
    t = time.perf_counter()
    reqs = []
    for i in range(buckets):
        if mode == "overlapped" and i > 1:
            MPI.Request.Testany(reqs)
        time.sleep(sleep_s)
        if mode == "overlapped":
            reqs.append(comm.Iallreduce(*bufs[i]))
        elif mode == "serial":
            comm.Allreduce(*bufs[i])
    if reqs:
        MPI.Request.Waitall(reqs)
    return time.perf_counter() - t


def measure(comm, buckets: int, nbytes: int, sleep_s: float, reps: int) -> dict[str, float]:
    """Median seconds of each mode (module docstring) over ``reps`` repetitions.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The ranks.
    buckets : int
        All-reduces (and sleeps) per repetition.
    nbytes : int
        Bytes per all-reduce (float32 elements).
    sleep_s : float
        Seconds of each sleep.
    reps : int
        Repetitions per mode, taken in turn (sleeps, overlapped, serial, sleeps, ...).

    Returns
    -------
    dict
        Mode -> median seconds, and ``exposed`` (dimensionless; NaN when the serial mode
        took no longer than the sleeps: nothing to expose, as on one rank).
    """
    import numpy as np
    bufs = [(np.ones(max(nbytes // 4, 1), np.float32), np.zeros(max(nbytes // 4, 1), np.float32))
            for _ in range(buckets)]
    got = {m: [] for m in ("sleeps", "overlapped", "serial")}
    for _ in range(reps):
        for mode in got:
            got[mode].append(_sleeps(comm, buckets, sleep_s, bufs, mode))
    out = {m: statistics.median(v) for m, v in got.items()}
    cost = out["serial"] - out["sleeps"]  # the blocking all-reduces' own time
    out["exposed"] = (out["overlapped"] - out["sleeps"]) / cost if cost > 0 else math.nan
    return out


def main(argv: list[str] | None = None) -> None:
    from ddlsim.units import parse_bytes, parse_time
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buckets", type=int, default=10, help="all-reduces per backward")
    ap.add_argument("--bytes", default="24MB", help="bytes per all-reduce")
    ap.add_argument("--sleep", default="23.8ms", help="sleep before each all-reduce")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per mode")
    args = ap.parse_args(argv)
    nbytes, sleep_s = int(parse_bytes(args.bytes)), float(parse_time(args.sleep))
    for name, value, ok, allowed in (("--buckets", args.buckets, args.buckets >= 1, ">= 1"),
                                     ("--reps", args.reps, args.reps >= 1, ">= 1"),
                                     ("--bytes", args.bytes, nbytes >= 4, ">= 4 B"),
                                     ("--sleep", args.sleep, sleep_s > 0, "> 0 s")):
        if not ok:
            ap.error(f"{name} {value} must be {allowed}")
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    got = measure(comm, args.buckets, nbytes, sleep_s, args.reps)
    if comm.rank == 0:
        print(f"{comm.size} ranks, {args.buckets} x {nbytes} B, sleeps of {sleep_s * 1e3:g} ms: "
              f"sleeps {got['sleeps'] * 1e3:.1f} ms, overlapped {got['overlapped'] * 1e3:.1f} "
              f"ms, serial {got['serial'] * 1e3:.1f} ms; exposed {got['exposed']:.0%}",
              flush=True)


if __name__ == "__main__":
    main()
