"""Communication benchmarks that really run: the timing loop over a :class:`CommAdapter`.

Method (per operation and message size, on every rank of the communicator):

1. ``warmup`` untimed calls (connection set-up, protocol selection, caches);
2. ``reps`` timed batches; before each, a barrier so all ranks start together; a batch is
   ``batch`` back-to-back calls followed by a device synchronisation, its time divided by
   ``batch`` (and by 2 for a ping-pong round trip). Sizes up to
   :data:`INTERLEAVE_MAX_BYTES` are timed in :data:`ROUNDS` interleaved rounds (a quarter of
   each size's batches per round, every size in turn), so that a slow spell of the host (a
   busy neighbour, a frequency change) spreads over all sizes instead of shifting one size's
   figures; larger sizes, which last long enough to average such spells, one after another;
3. the per-batch times are reduced as the **max over ranks** (an operation is finished when
   its slowest rank is — the convention of nccl-tests and the OSU benchmarks), then summarised
   (mean, median, min, max, std, n).

When the ranks span several nodes (host names differ) the benchmark also runs on
sub-communicators: ``intra`` (the ranks of one node; every node's group runs at once) and
``inter`` (one rank per node, grouped by local rank, all groups at once — the traffic pattern
of hierarchical collectives, each group sharing the nodes' NICs with the others).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .adapters import CommAdapter
from .schema import OPS, CalibrationError, check_op, comm_row, summarize

__all__ = ["CLOCKS", "check_cores", "default_sizes", "reps_at", "DEFAULT_MAX_BYTES",
           "TAPER_FROM_BYTES", "Placement", "placement", "run_comm_benchmark",
           "run_scoped_benchmarks", "scoped_communicators"]

Progress = Callable[[str], None]

#: Sizes up to this many bytes are timed in interleaved rounds (module docstring); their
#: buffers are alive together, at most about twice this per operation.
INTERLEAVE_MAX_BYTES = 16 * 2**20
#: Interleaved rounds (fewer when ``reps`` is smaller).
ROUNDS = 4


def default_sizes(max_bytes: float, min_bytes: float = 8, factor: float = 2.0) -> list[int]:
    """Message sizes ``min_bytes · factor^i`` up to ``max_bytes`` (powers of two by default)."""
    lo, hi = int(min_bytes), int(max_bytes)
    if lo < 1 or hi < lo:
        raise CalibrationError(f"need 1 <= min_bytes <= max_bytes, got min_bytes={min_bytes!r}, "
                               f"max_bytes={max_bytes!r}")
    if not factor > 1:
        raise CalibrationError(f"the size step factor must be > 1, got {factor!r}")
    sizes, s = [], float(lo)
    while s <= hi * (1 + 1e-12):
        sizes.append(int(round(s)))
        s *= factor
    return sorted(set(sizes))


#: Default largest message of ``ddlsim calibrate comm``: 512 MiB covers the gradient
#: collectives of training (GPT-2 124M in fp32 moves 475 MiB at once; a 25 MiB DDP bucket is
#: far below) and needs about 1 GiB of buffers per rank (all-reduce in + out).
DEFAULT_MAX_BYTES = 512 * 2**20
#: Above this size the timed batches are halved per doubling of the size (:func:`reps_at`).
TAPER_FROM_BYTES = 16 * 2**20
#: The fewest timed batches a tapered size keeps.
MIN_TAPERED_REPS = 5


def reps_at(size: int, reps: int, taper_from: float | None = TAPER_FROM_BYTES) -> int:
    """Timed batches at ``size`` bytes: ``reps`` up to ``taper_from``, then halved per doubling
    of the size, never below ``min(reps, MIN_TAPERED_REPS)`` (large messages take long and
    vary little: with the defaults 20 batches up to 16 MiB, 10 at 32 MiB, 5 from 64 MiB).
    ``taper_from`` None keeps ``reps`` everywhere."""
    if taper_from is None or size <= taper_from:
        return reps
    halvings = math.floor(math.log2(size / taper_from) + 1e-9)
    return max(min(reps, MIN_TAPERED_REPS), reps >> min(halvings, 62))


@dataclass(frozen=True)
class Placement:
    """Where the ranks of a communicator run: host of each rank, node index, local rank."""

    hosts: tuple[str, ...]
    node_of_rank: tuple[int, ...]
    local_rank: tuple[int, ...]

    @property
    def nodes(self) -> int:
        return len(set(self.node_of_rank))

    @property
    def uniform(self) -> bool:
        counts = np.bincount(self.node_of_rank)
        return bool((counts == counts[0]).all())

    @property
    def ranks_per_node(self) -> int:
        """Ranks on each node, or 0 when nodes hold different numbers of ranks."""
        return len(self.hosts) // self.nodes if self.uniform else 0

    @property
    def scope(self) -> str:
        return "intra" if self.nodes == 1 else "inter"


def check_cores(comm: CommAdapter, allow_shared: bool = False) -> dict[str, tuple[int, int]]:
    """Ranks and usable CPU cores per host (the union of its ranks' affinity masks: mpirun
    may bind each rank to one core); refuse (:class:`CalibrationError`, the same on every
    rank) a host whose ranks outnumber its cores unless ``allow_shared``. Ranks sharing a
    core take turns on it, inside MPI's busy polling too: the seed's MPI proxies on 2 cores
    spent 12, 23, 50 ms in MPI at 4, 6, 8 ranks (issue #30), which no system models."""
    import os
    try:
        mine = frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: the machine's count
        mine = frozenset(range(os.cpu_count() or 1))
    hosts: dict[str, tuple[int, set]] = {}
    for host, cores in comm.allgather_obj((comm.hostname(), mine)):
        n, union = hosts.get(host, (0, set()))
        hosts[host] = (n + 1, union | set(cores))
    shape = {h: (n, len(c)) for h, (n, c) in hosts.items()}
    over = {h: nc for h, nc in shape.items() if nc[0] > nc[1]}
    if over and not allow_shared:
        host, (n, cores) = sorted(over.items())[0]
        raise CalibrationError(f"{n} ranks on host {host!r} share {cores} usable CPU cores: "
                               "the figures would measure ranks taking turns on a core, which "
                               f"no system preset describes; run at most {cores} ranks per "
                               "node, or pass --allow-shared-cores to measure it anyway")
    return shape


def placement(comm: CommAdapter) -> Placement:
    """Gather every rank's host name; nodes are numbered in order of first appearance."""
    hosts = tuple(comm.allgather_obj(comm.hostname()))
    order: dict[str, int] = {}
    node = tuple(order.setdefault(h, len(order)) for h in hosts)
    seen: dict[int, int] = {}
    local = []
    for n in node:
        local.append(seen.get(n, 0))
        seen[n] = local[-1] + 1
    return Placement(hosts, node, tuple(local))


def _warm(comm: CommAdapter, call, warmup: int) -> None:
    for _ in range(warmup):
        call.run()
    comm.synchronize()


#: ``--clock`` → the timer: wall time, or the CPU time this process got (host-side
#: backends only: a rank's CPU time is not inflated while other processes hold its core,
#: and the max over ranks still counts a rank's polling while it waits for another)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _batches(comm: CommAdapter, call, reps: int, batch: int,
             clock: Callable[[], float] | None = None) -> np.ndarray:
    """``reps`` timed batches of ``call`` on this rank (seconds per call), timed by ``clock``
    (None: wall time, ``time.perf_counter``)."""
    clock = clock or time.perf_counter
    samples = np.empty(reps)
    for i in range(reps):
        comm.barrier()
        t0 = clock()
        for _ in range(batch):
            call.run()
        comm.synchronize()
        samples[i] = max(clock() - t0, 1e-9) / batch * call.time_scale
    return samples


def _time_batches(comm: CommAdapter, call, warmup: int, reps: int, batch: int,
                  clock: Callable[[], float] | None = None) -> np.ndarray:
    _warm(comm, call, warmup)
    return comm.reduce_max(_batches(comm, call, reps, batch, clock))


def _time_interleaved(comm: CommAdapter, calls: list, warmup: int, reps: list[int],
                      batch: int, clock: Callable[[], float] | None = None
                      ) -> list[np.ndarray]:
    """:func:`_time_batches` of several calls, their batches split into interleaved rounds."""
    for call in calls:
        _warm(comm, call, warmup)
    rounds = max(1, min(ROUNDS, min(reps, default=1)))
    parts: list[list[np.ndarray]] = [[] for _ in calls]
    for r in range(rounds):
        for i, call in enumerate(calls):
            n = reps[i] * (r + 1) // rounds - reps[i] * r // rounds
            parts[i].append(_batches(comm, call, n, batch, clock))
    return [comm.reduce_max(np.concatenate(p)) for p in parts]


def _check_counts(warmup: int, reps: int, batch: int) -> None:
    for name, value, low in (("warmup", warmup, 0), ("reps", reps, 1), ("batch", batch, 1)):
        if isinstance(value, bool) or int(value) != value or value < low:
            raise CalibrationError(f"{name} must be an integer >= {low}, got {value!r}")


def run_comm_benchmark(comm_adapter: CommAdapter, ops: Sequence[str], sizes: Sequence[int],
                       warmup: int, reps: int, *, batch: int = 1, scope: str | None = None,
                       where: Placement | None = None,
                       progress: Progress | None = None,
                       taper_from: float | None = None,
                       clock: Callable[[], float] | None = None) -> list[dict]:
    """Time each operation at each message size on ``comm_adapter``; one tidy row per pair.

    Parameters
    ----------
    comm_adapter : CommAdapter
        The communicator (every rank of it must call this with the same arguments).
    ops : sequence of str
        Operations from :data:`~ddlsim.calibration.schema.OPS`; unsupported ones are skipped.
    sizes : sequence of int
        Requested message sizes in bytes (rounded to whole elements/chunks; duplicates after
        rounding are measured once).
    warmup, reps : int
        Untimed calls, then timed batches.
    batch : int
        Calls per timed batch (raise it when one call is shorter than the timer resolution).
    scope, where : optional
        Override the scope label / reuse a placement already gathered.
    progress : callable, optional
        Called with a label after each (op, size).
    taper_from : float, optional
        Fewer timed batches above this size (:func:`reps_at`); None: ``reps`` at every size.
    clock : callable
        Timer in seconds (:data:`CLOCKS`); None: wall time.

    Returns
    -------
    list of dict
        Rows of the tidy table (:data:`~ddlsim.calibration.schema.COLUMNS`); identical on
        every rank, since the times are reduced with a max over ranks.
    """
    _check_counts(warmup, reps, batch)
    for op in ops:
        check_op(op)
    where = where or placement(comm_adapter)
    rows, n = [], comm_adapter.size

    def row(op: str, nbytes: int, samples: np.ndarray) -> dict:
        return comm_row(backend=comm_adapter.backend, library=comm_adapter.library,
                        library_version=comm_adapter.library_version, op=op, ranks=n,
                        nodes=where.nodes, ranks_per_node=where.ranks_per_node,
                        scope=scope or where.scope, nbytes=nbytes, stats=summarize(samples),
                        source="ddlsim calibrate comm")

    def tick(op: str, size: int) -> None:
        if progress is not None:
            progress(f"{scope or where.scope} {op} {size} B")

    for op in ops:
        skip = not comm_adapter.supports(op) or (op in ("sendrecv", "exchange") and n < 2)
        done: set[int] = set()
        small: list[tuple[int, object]] = []   # (requested size, call), interleaved below
        for size in sizes:
            if skip:
                tick(op, size)
                continue
            if int(size) <= INTERLEAVE_MAX_BYTES:
                call = comm_adapter.make_op(op, int(size))
                if call is not None and call.nbytes not in done:
                    done.add(call.nbytes)
                    small.append((size, call))
                else:
                    tick(op, size)
        if small:
            calls = [c for _, c in small]
            timed = _time_interleaved(comm_adapter, calls, warmup,
                                      [reps_at(c.nbytes, reps, taper_from) for c in calls],
                                      batch, clock)
            for (size, call), samples in zip(small, timed):
                rows.append(row(op, call.nbytes, samples))
                tick(op, size)
        for size in sizes:
            if skip or int(size) <= INTERLEAVE_MAX_BYTES:
                continue
            call = comm_adapter.make_op(op, int(size))
            if call is not None and call.nbytes not in done:
                done.add(call.nbytes)
                rows.append(row(op, call.nbytes, _time_batches(
                    comm_adapter, call, warmup, reps_at(call.nbytes, reps, taper_from),
                    batch, clock)))
            tick(op, size)
    return rows


def scoped_communicators(comm: CommAdapter, split: bool = True
                         ) -> list[tuple[str, CommAdapter, Placement]]:
    """The world communicator and, when ranks span nodes, its intra/inter sub-communicators.

    Returns (label, communicator, placement) triples; every rank gets the same labels in the
    same order (sub-communicators are created collectively).
    """
    world = placement(comm)
    out = [("world", comm, world)]
    if not split or world.nodes == 1 or world.ranks_per_node < 2:
        return out
    intra = comm.split(world.node_of_rank)
    inter = comm.split(world.local_rank)
    out.append(("intra", intra, placement(intra)))
    out.append(("inter", inter, placement(inter)))
    return out


def run_scoped_benchmarks(comm: CommAdapter, ops: Sequence[str], sizes: Sequence[int],
                          warmup: int, reps: int, *, batch: int = 1, split: bool = True,
                          comms: list[tuple[str, CommAdapter, Placement]] | None = None,
                          progress: Progress | None = None,
                          taper_from: float | None = None,
                          clock: Callable[[], float] | None = None) -> list[dict]:
    """:func:`run_comm_benchmark` on the world and (multi-node) on intra/inter sub-communicators.

    Rows from sub-communicators carry the sub-communicator's ranks, nodes and scope. All groups
    of a split run concurrently; the rows returned on world rank 0 are those of its own groups
    (the max over ranks is taken within each group); other ranks return the world rows only.
    ``comms`` reuses the result of :func:`scoped_communicators`.
    """
    rows: list[dict] = []
    for label, sub, where in comms or scoped_communicators(comm, split):
        got = run_comm_benchmark(sub, ops, sizes, warmup, reps, batch=batch, where=where,
                                 progress=progress, taper_from=taper_from, clock=clock)
        rows.extend(got if comm.rank == 0 or label == "world" else [])
    return rows


def planned_steps(ops: Sequence[str], sizes: Sequence[int], scopes: int) -> int:
    """How many progress ticks :func:`run_scoped_benchmarks` will emit (for a progress bar)."""
    return len([o for o in ops if o in OPS]) * len(sizes) * scopes

