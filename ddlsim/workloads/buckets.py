"""PyTorch DDP gradient buckets, and a backward pass that all-reduces them as they fill.

PyTorch's ``DistributedDataParallel`` rebuilds its buckets after the first iteration from the
order in which gradients became ready (``Reducer::rebuild_buckets``), then keeps them: the
steady state that an iteration time describes. ``compute_bucket_assignment_by_size`` walks the
gradients in that order, adds each one to the open bucket and closes the bucket as soon as its
size reaches the current limit (``bucket.size >= bucket_size_limit``: the gradient that crosses
the limit stays in the bucket). The limits are ``[first_bucket_bytes, bucket_bytes_cap]``: the
first bucket closes at ``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB, every later one at
``bucket_cap_mb`` MiB (default 25). Gradients become ready in reverse order of use in the
forward pass, which for a sequential model is the reverse of parameter registration order.

References
----------
PyTorch, ``torch/nn/parallel/distributed.py`` (``DistributedDataParallel.__init__``:
``bucket_cap_mb`` default 25, ``bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)``;
``_ddp_init_helper``) and ``torch/csrc/distributed/c10d/reducer.cpp``
(``Reducer::rebuild_buckets``: ``bucket_size_limits = {first_bucket_bytes_cap_,
bucket_bytes_cap_}`` over ``rebuilt_params_`` in gradient-ready order;
``compute_bucket_assignment_by_size``), PyTorch 2.x. Li et al., "PyTorch Distributed:
Experiences on Accelerating Data Parallel Training", VLDB 2020, §3.2.3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from .smcontention import beside
from .trace import Collective, Compute, Op, Wait

__all__ = ["FIRST_BUCKET_BYTES", "ddp_buckets", "buckets_by_count", "BackwardUnit",
           "backward_with_buckets"]

#: ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (c10d ``kDefaultFirstBucketBytes``).
FIRST_BUCKET_BYTES = 1024 * 1024


def ddp_buckets(grad_bytes: Sequence[float], cap_bytes: float,
                first_cap_bytes: float = FIRST_BUCKET_BYTES) -> list[range]:
    """PyTorch DDP's buckets over gradients listed in gradient-ready order.

    Parameters
    ----------
    grad_bytes : sequence of float
        Size of each gradient tensor in bytes, in the order gradients become ready.
    cap_bytes : float
        ``bucket_cap_mb`` in bytes (25 MiB by default).
    first_cap_bytes : float
        The first bucket's limit (1 MiB).

    Returns
    -------
    list of range
        Index ranges into ``grad_bytes``, in issue order.
    """
    out, start, size, limit = [], 0, 0.0, first_cap_bytes
    for i, b in enumerate(grad_bytes):
        size += b
        if size >= limit:
            out.append(range(start, i + 1))
            start, size, limit = i + 1, 0.0, cap_bytes
    if start < len(grad_bytes):
        out.append(range(start, len(grad_bytes)))
    return out


def buckets_by_count(counts: Sequence[int], n_tensors: int, where: str) -> list[range]:
    """Buckets of ``counts[k]`` consecutive gradients each (a proxy's message aggregation).

    Raises
    ------
    ConfigError
        When the counts do not add up to the model's ``n_tensors`` gradients.
    """
    if sum(counts) != n_tensors:
        raise ConfigError(f"{where} = {list(counts)} groups {sum(counts)} gradient tensors, but "
                          f"the model has {n_tensors}; the counts (gradients per bucket, in "
                          f"gradient-ready order) must add up to {n_tensors}")
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


@dataclass(frozen=True, slots=True)
class BackwardUnit:
    """Backward compute that makes ``n_grads`` more gradients ready (in ready order)."""

    ops: tuple[Compute, ...]
    n_grads: int


def backward_with_buckets(units: Sequence[BackwardUnit], buckets: Sequence[range],
                          grad_bytes: Sequence[float], group: str, overlap: bool,
                          prefix: str = "grad") -> tuple[Op, ...]:
    """A backward pass whose gradient buckets are all-reduced on ``group``.

    With ``overlap`` (DDP), a bucket's all-reduce is issued on the ``group`` stream as soon as
    the unit that produces its last gradient has finished, and the block ends with a
    ``Wait`` on that stream (DDP's ``finalize_backward``). Without it, every all-reduce runs
    blocking on the compute stream after the whole backward, in bucket order.

    Overlapped, the buckets issued at one point hold NCCL's channels beside the backward
    compute up to the next issue point (or the end of the backward), whose GEMMs get a
    contention op (:func:`.smcontention.beside`; docs/overlap.md "SMs taken by
    communication"); the buckets issued after the last unit run beside nothing.
    """
    ops: list[Op] = []
    colls = [Collective(f"{prefix}.bucket{k}", "all_reduce", group,
                        float(sum(grad_bytes[i] for i in r))) for k, r in enumerate(buckets)]
    ends = [r.stop for r in buckets]
    ready, k, last = 0, 0, ()
    issued, window = [], []     # the last buckets issued; the compute issued after them
    for u in units:
        for c in u.ops:
            ops.append(Op(c))
            window.append(ops[-1])
            last = (len(ops) - 1,)
        ready += u.n_grads
        if overlap and k < len(ends) and ends[k] <= ready:
            extra = _contention(issued, window)
            if extra is not None:   # the window's GEMMs ran beside the buckets before them
                ops.append(extra)
                last = (len(ops) - 1,)
            issued, window = [], []
        while overlap and k < len(ends) and ends[k] <= ready:
            ops.append(Op(colls[k], stream=group, deps=last))
            issued.append(colls[k])
            k += 1
    if overlap and (extra := _contention(issued, window)) is not None:
        ops.append(extra)
    if overlap:
        ops += [Op(c, stream=group) for c in colls[k:]]
        ops.append(Op(Wait(f"{prefix}.wait", group)))
    else:
        ops += [Op(c) for c in colls]
    return tuple(ops)


def _contention(issued: list[Collective], window: list[Op]) -> Op | None:
    """The contention op of the compute ``window`` beside the buckets ``issued`` before it
    (in the dtype of its first compute op), None when either is empty."""
    if not issued or not window:
        return None
    first = issued[0].name.rsplit(".bucket", 1)[-1]
    return beside(f"ddp.after{first}", window, issued, window[0].payload.dtype)
