"""Both directions at once against one at a time, on 2 ranks of this machine
(docs/validation.md, "The seed's C++ proxies on this machine"): what ``comm_only/resnet50.cpp``'s
ring loop does at 2 ranks, against the ping-pong ``ddlsim calibrate comm`` times ``sendrecv`` by.

``run_ring`` (resnet50.cpp lines 223-237) posts ``MPI_Irecv`` from the previous rank, a blocking
``MPI_Send`` to the next and waits, message by message: at 2 ranks both ranks send to each other
at the same time. The calibration's ``sendrecv`` is a ping-pong (one direction at a time, half
the round trip: :mod:`ddlsim.calibration.adapters`). Over shared memory each direction is a
copy by one core; two copies at once share the memory they stream through, which one copy alone
does not. Cases, each the median over ``--repeats`` of rank 0's wall time from a barrier:

* ``one way``: a ping-pong, half its round trip;
* ``both ways``: ``Irecv`` + ``Send`` + ``Wait`` on both ranks at once (the ring at 2 ranks).

Run: ``mpirun -n 2 python benchmarks/proxies_exchange.py [--sizes-mib 1,8,48,96] [--repeats 15]``
(``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` as root). Prints one line per
size and case: ms per transfer and GB/s a direction. Needs mpi4py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def timed(comm, run, repeats: int, per: int) -> float:
    """Median seconds of ``run`` over ``repeats``, each from a barrier, divided by ``per``."""
    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) / per)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="1,8,48,96", help="comma-separated MiB per message")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    try:
        from mpi4py import MPI
    except ImportError:
        print("proxies_exchange.py needs mpi4py (pip install -e '.[mpi]')", file=sys.stderr)
        return 2
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        print(f"run on 2 ranks (mpirun -n 2), not {comm.Get_size()}", file=sys.stderr)
        return 2
    rank = comm.Get_rank()
    peer = 1 - rank
    for mib in (float(s) for s in args.sizes_mib.split(",")):
        n = int(mib * 2**20) // 4
        send, recv = np.ones(n, np.float32), np.zeros(n, np.float32)

        def one_way() -> None:
            if rank == 0:
                comm.Send(send, peer)
                comm.Recv(recv, peer)
            else:
                comm.Recv(recv, peer)
                comm.Send(send, peer)

        def both_ways() -> None:
            req = comm.Irecv(recv, peer)
            comm.Send(send, peer)
            req.Wait()

        for name, run, per in (("one way", one_way, 2), ("both ways", both_ways, 1)):
            t = timed(comm, run, args.repeats, per)
            if rank == 0:
                print(f"{mib:g} MiB {name:9s}: {t * 1e3:7.2f} ms a transfer, "
                      f"{n * 4 / t / 1e9:5.1f} GB/s a direction", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
