"""Where the comm_only pipeline proxies' first touches land in an MPI transfer: rank 1 times
``MPI_Recv`` of ``--bytes`` from rank 0 (wall and CPU clock, median of ``--repeats``) with

* ``recv fresh`` / ``recv warm``: rank 1 receives into a new private anonymous mapping (what
  ``calloc`` returns above glibc's mmap threshold: the proxies' ``recv_buffer``) or into one
  buffer reused (the calibration's);
* ``send fresh`` / ``send written``: rank 0 sends from a new mapping never written (the
  proxies' ``send_buffer``) or from one it has written, into rank 1's warm buffer.

    mpirun -n 2 python benchmarks/proxies_recvtouch.py
    mpirun -n 2 python benchmarks/proxies_recvtouch.py --bytes 3235840 --repeats 20

Each case runs twice, interleaved; each prints one line on rank 1. Compare ``recv fresh``
less ``recv warm`` per page with ``ddlsim calibrate first-touch``'s figure
(docs/validation.md, "First touch of the fresh receive buffers").
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import time

PAGE = mmap.PAGESIZE


def _fresh(nbytes: int):
    """A new private anonymous mapping and a numpy view of it."""
    import numpy as np
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return buf, np.frombuffer(buf, np.uint8)


def one_case(comm, case: str, nbytes: int, repeats: int) -> tuple[float, float] | None:
    """Median (wall, CPU) seconds of rank 1's ``Recv`` in ``case`` (module docstring); None
    on rank 0."""
    import numpy as np
    from mpi4py import MPI
    rank, warm, ack = comm.Get_rank(), np.ones(nbytes, np.uint8), np.zeros(1, np.uint8)
    wall, cpu = [], []
    for _ in range(repeats):
        mine = case == "recv fresh" if rank == 1 else case.startswith("send")
        buf, arr = _fresh(nbytes) if mine else (None, warm)
        if rank == 0 and case == "send written":
            arr[:] = 1
        comm.Barrier()
        if rank == 0:
            comm.Send([arr if case.startswith("send") else warm, MPI.BYTE], dest=1)
            comm.Recv([ack, MPI.BYTE], source=1)
        else:
            dst = arr if case == "recv fresh" else warm
            t, p = time.perf_counter(), time.process_time()
            comm.Recv([dst, MPI.BYTE], source=0)
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - p)
            comm.Send([ack, MPI.BYTE], dest=0)
            del dst
        del arr
        if buf is not None:
            buf.close()
    return (statistics.median(wall), statistics.median(cpu)) if rank == 1 else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=4 * 1024 * 1024, help="bytes per message")
    ap.add_argument("--repeats", type=int, default=40, help="receives per case (median)")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.bytes < PAGE:
        ap.error(f"--repeats {args.repeats} must be >= 1 and --bytes {args.bytes} at least "
                 f"one page ({PAGE} B)")
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        ap.error(f"run on 2 ranks (mpirun -n 2), not {comm.Get_size()}")
    for case in ("recv fresh", "recv warm", "send fresh", "send written") * 2:
        got = one_case(comm, case, args.bytes, args.repeats)
        if got is not None:
            print(f"{case}: {args.bytes} B, Recv wall {got[0] * 1e3:.3f} ms, CPU "
                  f"{got[1] * 1e3:.3f} ms (median of {args.repeats})", flush=True)


if __name__ == "__main__":
    main()
