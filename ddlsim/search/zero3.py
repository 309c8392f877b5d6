"""ZeRO-3's two streams on arrays of plans: the exact schedule of the trace
:func:`ddlsim.workloads.decoder.zero3.zero3_blocks` builds, run op by op.

Per micro-batch: the forward starts (time ``T``) with ``k + 1`` gathers on the ``dp`` stream
and the embedding on the compute stream; layer ``j`` starts when the compute stream is free
and its gather has ended; after layer ``j`` the gather of layer ``j + k + 1`` is queued on the
``dp`` stream (it starts when the stream is free and layer ``j`` has ended). The backward
runs the same way from the end of the forward's head, with each layer's reduce-scatter queued
after it, before the next gather. The update waits for both streams. Both engines time the
trace so (a collective's duration does not depend on what runs beside it on another stream),
so this recurrence is exact; micro-batches after the third repeat its period (the state a
micro-batch starts from — how far the ``dp`` stream runs past the compute stream — is the
same from the second one on).
"""

from __future__ import annotations

import numpy as np

__all__ = ["zero3_time", "zero3_units_time"]


def _pass(c, d, head, layer, a, r, L: int, k: int, backward: bool):
    """One pass from compute-stream time ``c`` (the block's start) and ``dp`` free at ``d``."""
    ready = []
    for _ in range(min(k + 1, L)):
        d = np.maximum(d, c) + a
        ready.append(d)
    c = c + head
    for j in range(L):
        c = np.maximum(c, ready[j]) + layer
        if backward:
            d = np.maximum(d, c) + r
        if j + k + 1 < L:
            d = np.maximum(d, c) + a
            ready.append(d)
    return c, d


def zero3_time(L: int, k: int, m, parts, a, r) -> np.ndarray:
    """When the last micro-batch's compute and reduce-scatters have both ended, per plan.

    Parameters
    ----------
    L, k : int
        Layers, and layers gathered ahead (``software.zero3_prefetch_layers``).
    m : array
        Micro-batches per iteration.
    parts : tuple of arrays
        Seconds of the embedding, a layer's forward, the head's forward, the head's backward
        and a layer's backward (compute stream).
    a, r : arrays
        Seconds of one layer's all-gather and reduce-scatter.
    """
    e, f, hf, hb, bw = parts

    def micro_batch(c, d):
        c, d = _pass(c, d, e, f, a, r, L, k, False)
        return _pass(c + hf, d, hb, bw, a, r, L, k, True)

    return _over_micro_batches(m, np.zeros_like(np.asarray(a, dtype=float)), micro_batch)


def _over_micro_batches(m, zero, micro_batch) -> np.ndarray:
    """When both streams have ended after ``m`` micro-batches, each run by ``micro_batch``
    (the compute and ``dp`` streams' times in, the same after it out): three are run, later
    ones repeat the third's period."""
    c, d = zero, zero.copy()
    ends = []
    for _ in range(3):
        c, d = micro_batch(c, d)
        ends.append((c, d))
    (c1, d1), (c2, d2), (c3, d3) = ends
    mm = np.asarray(m, dtype=float)
    extra = np.maximum(mm - 3, 0)
    c = np.select([mm <= 1, mm == 2], [c1, c2], c3 + extra * (c3 - c2))
    d = np.select([mm <= 1, mm == 2], [d1, d2], d3 + extra * (d3 - d2))
    return np.maximum(c, d)


def _units_pass(c, d, head, units, L: int, k: int, synced: bool):
    """One pass over ``L`` layers of ``units`` (per unit: compute, gathers' seconds and
    whether it has any, reduce-scatters' seconds and whether it has any), as
    :func:`ddlsim.workloads.decoder.zero3._pass` issues them: a unit without gathers waits
    for nothing on the ``dp`` stream; under ``synced`` a unit also waits for the
    reduce-scatters of the unit before it."""
    seq = units * L
    n = len(seq)
    ready = []

    def gather(d, after, unit):
        _, a, has, _, _ = unit
        d2 = np.where(has, np.maximum(d, after) + a, d)
        return d2, np.where(has, d2, -np.inf)

    for j in range(min(k + 1, n)):
        d, r = gather(d, c, seq[j])
        ready.append(r)
    c = c + head
    rs_end = np.full_like(c, -np.inf)
    for j in range(n):
        comp, _, _, r, has_r = seq[j]
        start = np.maximum(c, ready[j])
        if synced:
            start = np.maximum(start, rs_end)
        c = start + comp
        d = np.where(has_r, np.maximum(d, c) + r, d)
        rs_end = np.where(has_r, d, -np.inf)
        if j + k + 1 < n:
            d, rd = gather(d, c, seq[j + k + 1])
            ready.append(rd)
    return c, d


def zero3_units_time(L: int, k: int, m, e, hf, hb, fwd_units, bwd_units,
                     synced: bool) -> np.ndarray:
    """:func:`zero3_time` for ZeRO-3 from module hooks: the passes run over units (a module's
    part of a layer) instead of layers, ``k`` units gathered ahead. ``fwd_units``/
    ``bwd_units``: one layer's units, each (compute, gather seconds, has gathers,
    reduce-scatter seconds, has reduce-scatters), arrays over the plans."""
    def micro_batch(c, d):
        c, d = _units_pass(c, d, e, fwd_units, L, k, synced)
        return _units_pass(c + hf, d, hb, bwd_units, L, k, synced)

    return _over_micro_batches(m, np.zeros_like(np.asarray(fwd_units[0][0], dtype=float)),
                               micro_batch)
