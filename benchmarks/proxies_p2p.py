"""The comm_only pipeline proxies' sends against the calibration's ping-pong, on 2 ranks
(docs/validation.md, "The seed's C++ proxies on this machine"): what a 3-4 MB transfer costs
in the proxy's own pattern, and what differs from the ``sendrecv`` curve ddlsim times it by.

``comm_only/gpt2_large.cpp`` and ``bert_large.cpp`` run as ``PROXY 4 2 2`` (2 stages, 2
micro-batches, ``run_pipeline``:62-104): stage 0 posts ``MPI_Isend`` + ``MPI_Wait`` twice,
then ``MPI_Irecv`` + ``MPI_Wait`` twice; stage 1 the mirror image; 4 transfers of
``P2PSIZE`` floats (808,960 / 1,049,600: 3,235,840 / 4,198,400 B) one after another, from a
send buffer and into a receive buffer that ``calloc`` returns fresh every iteration (never
written: reads map the zero page; the first receive faults its pages in). ``ddlsim calibrate
comm``'s ``sendrecv`` is a ping-pong of blocking ``Send``/``Recv`` between written, reused
numpy buffers, half the round trip (:mod:`ddlsim.calibration.adapters`). Cases, each timed on
rank 0 with the wall clock from a barrier (median of ``--repeats``):

* ``pingpong``: the calibration's op, half a round trip (s per transfer);
* ``pattern warm``: the proxy's 4 transfers between written, reused buffers (s per transfer);
* ``pattern zero-page send``: the same, each send buffer fresh from ``numpy.zeros``
  (``calloc``, never written), receives into reused buffers;
* ``pattern proxy``: send and receive buffers both fresh every iteration, as the proxy
  allocates them (the first touches included);
* ``sequence k``: k blocking transfers in alternating directions after one barrier, written
  and reused buffers (k = 2 is the ping-pong), for k = 2, 4, 8, 16: how the time per
  transfer grows with the transfers a timed stretch holds.

Each is reported per transfer in wall and in CPU time (rank 0's ``time.process_time``): the
CPU time is the copies and polls; the rest is rank 0 waiting, for its peer or for a core. The
run-queue wait (``/proc/self/schedstat``'s second field: time runnable but not running, the
kernel's sched-stats, Documentation/scheduler/sched-stats.rst) splits that rest: the part
spent waiting for a core that other tasks held (with ``mpi_yield_when_idle`` a polling rank
yields the core at every poll, so under load its waits land here), against the part spent
off the run queue (blocked or asleep).

    mpirun -n 2 python benchmarks/proxies_p2p.py
    mpirun -n 2 python benchmarks/proxies_p2p.py --bytes 4198400 --repeats 40
"""

from __future__ import annotations

import argparse
import statistics
import time

#: P2PSIZE × 4 B of the two pipeline proxies (gpt2_large.cpp:22, bert_large.cpp:22)
PROXY_BYTES = {"gpt2_large": 808960 * 4, "bert_large": 1049600 * 4}
CASES = ("pingpong", "pattern warm", "pattern zero-page send", "pattern proxy",
         "sequence 2", "sequence 4", "sequence 8", "sequence 16")


def _pingpong(comm, s, r) -> None:
    """One round trip of the calibration's ``sendrecv``: 0 sends, 1 sends back."""
    if comm.Get_rank() == 0:
        comm.Send(s, dest=1)
        comm.Recv(r, source=1)
    else:
        comm.Recv(r, source=0)
        comm.Send(s, dest=0)


def _pattern(comm, make_send, make_recv, micro: int = 2) -> None:
    """``run_pipeline``'s transfers on 2 stages: ``micro`` forward sends 0 → 1, then ``micro``
    backward sends 1 → 0, each ``Isend``/``Irecv`` + ``Wait``; buffers from the makers."""
    rank = comm.Get_rank()
    send, recv = make_send(), make_recv()
    for first, second in ((0, 1), (1, 0)):
        for i in range(micro):
            req = comm.Isend(send, dest=second, tag=i) if rank == first \
                else comm.Irecv(recv, source=first, tag=i)
            req.Wait()


def _sequence(comm, s, r, k: int) -> None:
    """k blocking transfers, 0 → 1, 1 → 0, … (k = 2: :func:`_pingpong`)."""
    rank = comm.Get_rank()
    for i in range(k):
        if rank == i % 2:
            comm.Send(s, dest=1 - rank, tag=i)
        else:
            comm.Recv(r, source=1 - rank, tag=i)


def runqueue_s() -> float:
    """Seconds this process has spent runnable but waiting for a core (``/proc/self/schedstat``
    field 2, ns; proc(5)); 0.0 where the kernel has no sched-stats."""
    try:
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return 0.0


def one_case(comm, case: str, nbytes: int, repeats: int) -> tuple[float, float, float]:
    """Median (wall, CPU, run-queue wait) seconds per transfer of ``case`` (module docstring),
    on rank 0."""
    import numpy as np
    n = nbytes // 4
    s, r = np.ones(n, np.float32), np.ones(n, np.float32)
    if case.startswith("sequence"):
        k = int(case.split()[1])
        run, per = (lambda: _sequence(comm, s, r, k)), k
    else:
        run, per = {
            "pingpong": (lambda: _pingpong(comm, s, r), 2),
            "pattern warm": (lambda: _pattern(comm, lambda: s, lambda: r), 4),
            "pattern zero-page send": (lambda: _pattern(
                comm, lambda: np.zeros(n, np.float32), lambda: r), 4),
            "pattern proxy": (lambda: _pattern(comm, lambda: np.zeros(n, np.float32),
                                               lambda: np.zeros(n, np.float32)), 4),
        }[case]
    wall, cpu, queue = [], [], []
    for _ in range(repeats + 2):   # 2 warm-up rounds
        comm.Barrier()
        t, c, q = time.perf_counter(), time.process_time(), runqueue_s()
        run()
        # read in the reverse order, so that a wait between two reads counts in the wall
        # time alone (a transfer's wait for a core never exceeds its wall time)
        queue.append((runqueue_s() - q) / per)
        cpu.append((time.process_time() - c) / per)
        wall.append((time.perf_counter() - t) / per)
    return tuple(statistics.median(x[2:]) for x in (wall, cpu, queue))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, nargs="+", default=sorted(PROXY_BYTES.values()),
                    help="bytes per transfer (default: the two proxies' P2PSIZE × 4 B)")
    ap.add_argument("--repeats", type=int, default=30, help="rounds per case (median)")
    args = ap.parse_args(argv)
    if args.repeats < 1 or min(args.bytes) < 4:
        ap.error(f"--repeats {args.repeats} must be >= 1 and --bytes {args.bytes} >= 4")
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        ap.error(f"run on 2 ranks (mpirun -n 2), not {comm.Get_size()}")
    for nbytes in args.bytes:
        for case in CASES * 2:    # each case twice, interleaved
            wall, cpu, queue = one_case(comm, case, nbytes, args.repeats)
            if comm.Get_rank() == 0:
                print(f"{nbytes} B {case}: {wall * 1e3:.3f} ms per transfer, CPU "
                      f"{cpu * 1e3:.3f} ms, waiting for a core {queue * 1e3:.3f} ms "
                      f"({nbytes / wall / 1e9:.2f} GB/s; median of {args.repeats})",
                      flush=True)


if __name__ == "__main__":
    main()
