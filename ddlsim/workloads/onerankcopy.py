"""One-rank collectives called with separate send and receive buffers: the copy an MPI library
makes on the calling rank.

A collective over a group of one rank moves nothing between ranks, and ddlsim times it 0 s.
But when the program passes a send buffer and a distinct receive buffer (not
``MPI_IN_PLACE``), the library still has to leave the result in the receive buffer, and it
copies the send buffer there, inside the call:

* Open MPI's blocking collectives on a one-rank communicator are its ``coll/self``
  component, e.g. ``mca_coll_self_allreduce_intra``: ``MPI_IN_PLACE == sbuf`` returns at
  once, anything else is ``ompi_datatype_copy_content_same_ddt(dtype, count, rbuf, sbuf)``
  (``ompi/mca/coll/self/coll_self_allreduce.c``; alltoall: ``ompi_datatype_sndrcv``);
* its non-blocking ones are ``coll/libnbc``, e.g. ``ompi_coll_libnbc_iallreduce``: "only one
  node -> copy data", ``NBC_Copy(sendbuf, ..., recvbuf, ...)`` unless in place, then a request
  that is already complete (``ompi/mca/coll/libnbc/nbc_iallreduce.c``).

So the copy costs the calling rank the time of a memory copy before the call returns: on a
host library it is the rank's own thread, the ``compute`` stream of the trace, in issue order
(an ``MPI_Iallreduce`` the program posts between two sleeps delays the second one).
Measured here (2026-11-29, Open MPI 5.0.11 via mpi4py, one rank, load 4.6, median of 30):
``Iallreduce`` of 1, 4 and 24 MiB not in place took 0.071, 0.430 and 6.46 ms, in place
0.001-0.002 ms, and ``numpy.copyto`` of the same buffers 0.066, 0.398 and 6.40 ms.

A copy of ``N`` bytes reads ``N`` and writes ``N``: ddlsim times it as an element-wise pass of
``2 N`` bytes at the device's memory bandwidth (:func:`~ddlsim.simulator.kernels.device.
op_time`), the convention of the ``z = x + y`` figure (``3 N`` bytes) the CPU presets quote
(``numpy.copyto`` of 4 and 24 MiB ran at 1.1× that pass's rate in the same minute here).
A copy that stays in the caches runs faster than one bandwidth says (``numpy.copyto`` of
1 MiB: 31.6 GB/s as ``2 N``, against 7.9 GB/s at 24 MiB), which is not modelled.

``parallel.collective_buffers: separate`` (a plan field of the families whose traces keep
one-rank collectives: resnet, cosmoflow, dlrm; the decoder and BERT families refuse it) says
the program calls its collectives that way (the seed's C++ proxies: every ``MPI_Allreduce``/
``MPI_Iallreduce``/``MPI_Alltoall``/``MPI_Allgather``/``MPI_Reduce_scatter_block`` there
names two buffers); ``in_place`` (the default) that it does not (PyTorch DDP's and
Megatron's gradient all-reduces run in place on their buckets; ``torch.distributed.
all_reduce`` has one tensor). Only groups of one rank change:
on more ranks the algorithm's own time, closed form or a calibration measured with separate
buffers, holds the library's copy. ``broadcast`` and ``barrier`` have one buffer or none and
never copy. NCCL also copies on one rank (``ncclLaunchOneRank``: ``cudaMemcpyAsync`` when
``dst != src``), but on its own stream, asynchronously; that is not modelled, and a plan that
would need it is refused.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import ConfigError
from .trace import Block, Collective, Compute, Loop, Op, Program, RankClass, Workload

__all__ = ["NO_COPY", "one_rank_copies", "copy_op"]

#: collective ops with one buffer (or none): nothing to copy on one rank
NO_COPY = frozenset({"broadcast", "barrier"})
#: the backends whose one-rank copy is modelled: host libraries, copying on the caller's thread
_HOST_LIBRARIES = ("mpi", "mpich", "openmpi")


def copy_op(coll: Collective) -> Compute:
    """The copy a one-rank ``coll`` with separate buffers makes: an element-wise pass that
    reads and writes its bytes.

    Parameters
    ----------
    coll : the collective, ``bytes`` in the trace's convention (B; on one rank its send and
        receive buffers are the same size).

    Returns
    -------
    Compute
        ``{coll.name}.one_rank_copy``: 0 FLOPs, ``2 × coll.bytes`` bytes moved (read + write).
    """
    return Compute(f"{coll.name}.one_rank_copy", 0.0, 2.0 * float(coll.bytes),
                   kind="elementwise", dtype="fp32")


def one_rank_copies(cfg, workload: Workload) -> Workload:
    """``workload`` with a copy on the calling rank's compute stream before every collective
    of a one-rank group, when ``cfg.parallel.collective_buffers`` is ``separate``.

    Parameters
    ----------
    cfg : the run configuration (``parallel.collective_buffers``, ``system.collectives``).
    workload : the family's trace.

    Returns
    -------
    Workload
        ``workload`` itself when nothing is copied; else the same workload whose blocks have
        each such collective preceded by :func:`copy_op` on the ``compute`` stream (with the
        collective's dependencies; the collective then waits for it).

    Raises
    ------
    ConfigError
        ``separate`` where a one-rank collective would run on NCCL (its copy is not modelled).
    """
    if getattr(cfg.parallel, "collective_buffers", "in_place") != "separate":
        return workload
    single = {name for name, fam in workload.groups.items() if fam.size == 1}
    if not single:
        return workload
    done: dict[int, Block] = {}
    classes = []
    for c in workload.classes:
        blocks = {name: _block(b, single, done) for name, b in c.program.blocks.items()}
        classes.append(RankClass(c.name, c.ranks, Program(blocks, c.program.steps)))
    if all(done[i] is b for i, b in _originals(workload).items()):
        return workload  # one-rank groups, but no collective on them copies
    _check_backend(cfg)
    return replace(workload, classes=tuple(classes))


def _originals(workload: Workload) -> dict[int, Block]:
    """Every block object of ``workload``, by id."""
    return {id(b): b for c in workload.classes for b in c.program.blocks.values()}


def _check_backend(cfg) -> None:
    """Refuse ``separate`` one-rank collectives on NCCL, whose copy is not modelled."""
    from ..simulator.backend_rules import resolve_backend
    backend, _ = resolve_backend(cfg.system, cfg.parallel.collective_algorithm)
    if backend not in _HOST_LIBRARIES:
        raise ConfigError(
            f"parallel.collective_buffers = 'separate' with one-rank groups on backend "
            f"{backend!r}: the one-rank copy is modelled for host MPI libraries only "
            f"({', '.join(_HOST_LIBRARIES)}: the calling rank copies, Open MPI coll/self and "
            "libnbc); NCCL copies on its own stream (ncclLaunchOneRank), not modelled. Set "
            "collective_buffers: in_place or system.collectives.backend to an MPI library")


def _block(block: Block, single: set[str], done: dict[int, Block]) -> Block:
    """``block`` with the copies inserted (one rewrite per block object)."""
    if id(block) not in done:
        ops = _with_copies(block.ops, single)
        done[id(block)] = block if ops is block.ops else Block(block.name, block.phase, ops)
    return done[id(block)]


def _with_copies(ops: tuple[Op, ...], single: set[str]) -> tuple[Op, ...]:
    """``ops`` with :func:`copy_op` before each one-rank collective (loop bodies too), the
    dependencies renumbered; ``ops`` itself when there is none."""
    out: list[Op] = []
    where: list[int] = []  # new position of each old op
    changed = False
    for op in ops:
        p, deps = op.payload, tuple(where[d] for d in op.deps)
        if type(p) is Loop:
            body = _with_copies(p.body, single)
            if body is not p.body:
                p, changed = Loop(p.name, body, p.count), True
        elif type(p) is Collective and p.group in single and p.op not in NO_COPY:
            out.append(Op(copy_op(p), "compute", deps, op.repeat))
            deps, changed = (*deps, len(out) - 1), True
        out.append(op if (p is op.payload and deps == op.deps)
                   else Op(p, op.stream, deps, op.repeat))
        where.append(len(out) - 1)
    return tuple(out) if changed else ops
