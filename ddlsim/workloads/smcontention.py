"""Contention ops for compute overlapped with data-parallel communication.

A collective issued on its own stream runs beside whatever the compute stream runs next; its
NCCL kernels hold one SM per channel, so the GEMMs beside it lose ``k/S`` of their rate while
both run. :func:`beside` writes that as a contention op after those ops (a compute op carrying
a :class:`~ddlsim.workloads.trace.Contention`), timed by the cost model as the GEMMs' extra
time ``(k/S)·min(C, G_k)`` (:mod:`ddlsim.simulator.kernels.contention`, docs/overlap.md "SMs
taken by communication"). Used by the decoder's gradient buckets and parameter gathers and
by PyTorch DDP's buckets (:mod:`.buckets`).
"""

from __future__ import annotations

from collections.abc import Iterable

from .trace import Collective, Compute, Contention, Loop, Op

__all__ = ["gemm_flops", "kernel_gemm_flops", "beside", "issued_since"]


def gemm_flops(ops: Iterable) -> float:
    """FLOPs of the GEMMs among ``ops`` (loops and repeats counted): a kernel-level op's GEMM
    kernels (``2·M·N·K`` per batch), an op without kernels of kind ``gemm`` whole.

    Parameters
    ----------
    ops : iterable of :class:`~ddlsim.workloads.trace.Op` (or bare payloads, once each).

    Returns
    -------
    float : FLOPs.
    """
    total = 0.0
    for o in ops:
        p, n = (o.payload, o.repeat) if isinstance(o, Op) else (o, 1)
        if isinstance(p, Loop):
            total += n * p.count * gemm_flops(p.body)
        elif isinstance(p, Compute) and p.contention is None and p.seconds is None:
            if p.kernels is None:
                total += n * p.flops * (p.kind == "gemm")
            else:
                total += n * kernel_gemm_flops(p.kernels)
    return total


def kernel_gemm_flops(kernels: Iterable) -> float:
    """FLOPs of the GEMM kernels among ``kernels``: ``2·M·N·K`` per batch."""
    return sum(2.0 * k.shape[0] * k.shape[1] * k.shape[2] * k.batch
               for k in kernels if k.kind == "gemm")


def beside(name: str, ops: Iterable[Op], collectives: Iterable[Collective],
           dtype: str) -> Op | None:
    """The contention op of the GEMMs of ``ops`` run while ``collectives`` (one after another,
    on their own stream) hold NCCL's channels, None when nothing overlaps.

    Parameters
    ----------
    name : the op's name is ``<name>.sm_contention``.
    ops : the compute-stream ops issued after the collectives.
    collectives : the collectives, in issue order.
    dtype : the GEMMs' arithmetic precision (a key of the device's ``peak_flops``).

    Returns
    -------
    Op or None : a compute-stream op to place after ``ops``.
    """
    flops, (colls, counts) = gemm_flops(ops), _runs(collectives)
    if not colls or flops <= 0.0:
        return None
    c = Contention(flops, collectives=colls, counts=counts)
    return Op(Compute(f"{name}.sm_contention", 0.0, dtype=dtype, contention=c))


def _runs(collectives) -> tuple[tuple[Collective, ...], tuple[int, ...]]:
    """``collectives`` (each a collective or a ``(collective, issues)`` pair) with their issue
    counts (a repeated op's ``issues`` joins an equal one before it); counts empty when every
    collective is issued once."""
    colls: list[Collective] = []
    counts: list[int] = []
    for item in collectives:
        c, k = item if isinstance(item, tuple) else (item, 1)
        if colls and k != 1 and colls[-1] == c:
            counts[-1] += k
        else:
            colls.append(c)
            counts.append(k)
    return tuple(colls), (tuple(counts) if any(k != 1 for k in counts) else ())


def issued_since(ops: list[Op], start: int, exclude: Iterable[int] = ()) -> list[Collective]:
    """The collectives issued off the compute stream among ``ops[start:]`` that can run beside
    the compute issued next: not the ops at the indices ``exclude`` (what that compute waits
    for) nor, on the same stream, anything issued before them (a stream runs in issue order,
    so those have ended before the compute starts).

    Parameters
    ----------
    ops : a block's ops so far.
    start : the first index to look at.
    exclude : indices of the ops the next compute waits for.

    Returns
    -------
    list of ``(Collective, issues)`` pairs, in issue order (an op's repeats as its count).
    """
    waited: dict[str, int] = {}
    for i in exclude:
        waited[ops[i].stream] = max(waited.get(ops[i].stream, -1), i)
    return [(o.payload, o.repeat) for i, o in enumerate(ops[start:], start)
            if isinstance(o.payload, Collective) and o.stream != "compute"
            and i > waited.get(o.stream, -1)]
