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

from typing import NamedTuple

import numpy as np

__all__ = ["zero3_time", "zero3_units_time", "Unit"]


class Unit(NamedTuple):
    """One ZeRO-3 unit (a module's part of a layer) of a pass, arrays over the plans: its
    compute-stream seconds, its gathers' seconds on ``dp`` and whether it has any, its
    reduce-scatters' seconds and whether it has any, and the host's seconds to issue its
    gathers (until their launch) and its reduce-scatters
    (:func:`ddlsim.workloads.decoder.zero3._pass`)."""

    compute: np.ndarray
    gather: np.ndarray
    has_gather: np.ndarray
    reduce: np.ndarray
    has_reduce: np.ndarray
    host_gather: np.ndarray
    host_reduce: np.ndarray
    #: elements gathered while it computes, which gate the prefetch its pre-hook issues
    #: (:func:`ddlsim.workloads.decoder.zero3.unit_live_elements`)
    live: np.ndarray
    #: the host's seconds after its gathers' launch (PyTorch 1.8's copy-out loop), beside them
    host_copy_out: np.ndarray
    #: the host's seconds to issue the reduce-scatters that wait for its compute to end
    #: (:func:`ddlsim.workloads.decoder.zero3_fetch.reduce_host_split`)
    host_reduce_after: np.ndarray


def _pass(c, d, head, layer, a, r, L: int, k: int, backward: bool, sm=None, root=None,
          grads=None):
    """One pass from compute-stream time ``c`` (the block's start) and ``dp`` free at ``d``;
    ``sm(C)``: a layer's extra seconds beside ``C`` seconds of collectives (None: none);
    ``root``: seconds of FSDP's root-unit gather, the pass's first unit with ``head`` (the
    embedding) as its compute (:mod:`ddlsim.workloads.decoder.fsdp_edges`), or None;
    ``grads``: a :class:`Grads` (FSDP1's passes around each reduce-scatter on its
    post-backward stream), advanced in place, or None."""
    ready = []
    if root is not None:          # gathered first; the layers' prefetch counts its unit
        d = np.maximum(d, c) + root
        c = np.maximum(c, d)
    for _ in range(min(k + 1, L) if root is None else min(k, L)):
        d = np.maximum(d, c)
        d += a
        ready.append(d)
    c = np.array(c + head, dtype=float)   # a new array, advanced in place below (each d
    # is kept in ready: a new one each time)
    if root is not None and k < L:    # layer k's gather, once the root unit has ended
        d = np.maximum(d, c) + a
        ready.append(d)
    # what runs beside layer j takes three values in a pass (:func:`_beside`: the first
    # layer, a layer with a gather issued after it, one without), so sm is asked once each
    extra: dict[tuple[bool, bool], np.ndarray] = {}
    for j in range(L):
        np.maximum(c, ready[j], out=c)
        c += layer
        if sm is not None:
            kind = (j == 0 and root is None, j + k < L)
            if kind not in extra:
                extra[kind] = sm(_beside(j, L, k, a, r if backward else 0.0, kind[0]))
            c += extra[kind]
        if backward:
            d = np.maximum(d, c if grads is None else grads.before(c))
            d += r
            if grads is not None:
                grads.after(d)
        if j + k + 1 < L:
            d = np.maximum(d, c)
            d += a
            ready.append(d)
    return c, d


def _beside(j: int, L: int, k: int, a, r, first: bool = True):
    """Seconds of the collectives layer ``j`` runs beside (as
    :func:`ddlsim.workloads.decoder.zero3._pass` pairs them): those issued after the layer
    before it — its reduce-scatter ``r`` (none before layer 0) and the gather of layer
    ``j + k`` — or, for layer 0, the gathers of layers ``1..k``
    issued with its own (``first``; behind a root unit, layer 0 is as any other). Without a
    prefetch (``k = 0``) a layer's gather, which it waits for, queues behind everything
    before it on the stream: nothing runs beside a layer."""
    if k == 0:
        return 0.0
    if j == 0 and first:
        return min(k, L - 1) * a
    return r + (a if j + k < L else 0.0)


class Grads:
    """FSDP1's post-backward stream over a backward pass, arrays over the plans
    (:data:`ddlsim.workloads.decoder.fsdp1_passes.POST_BACKWARD_STREAM`): each unit's pass
    before its reduce-scatter (``pre``, after the unit and the stream's work before it) and
    after it (``post``); ``free``: when the stream is free."""

    def __init__(self, free, pre, post):
        self.free, self.pre, self.post = free, pre, post
        # where a layer's unit has each pass: the same for every layer, compared once, and
        # whether every plan or none has it (most grids: the choice of each element alike)
        self._has_pre, self._has_post = pre > 0, post > 0
        self._pre_all, self._post_all = (bool(np.all(h)) for h in (self._has_pre,
                                                                    self._has_post))
        self._pre_none, self._post_none = (not np.any(h) for h in (self._has_pre,
                                                                   self._has_post))

    def before(self, end, pre=None):
        """When the reduce-scatter may start, its unit having ended at ``end``: after the
        pass before it, where it has one."""
        if pre is None and self._pre_none:
            return end
        has = self._has_pre if pre is None else pre > 0
        pre = self.pre if pre is None else pre
        done = np.maximum(self.free, end) + pre
        if has is self._has_pre and self._pre_all:
            self.free = done
            return done
        self.free = np.where(has, done, self.free)
        return np.where(has, done, end)

    def after(self, rs_end, post=None) -> None:
        """The pass after a reduce-scatter that ended at ``rs_end``, where it has one."""
        if post is None and self._post_none:
            return
        has = self._has_post if post is None else post > 0
        post = self.post if post is None else post
        self.free = (rs_end + post if has is self._has_post and self._post_all
                     else np.where(has, rs_end + post, self.free))


def zero3_time(L: int, k: int, m, parts, a, r, sm=None, root=None,
               grads=None) -> np.ndarray:
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
    sm : (forward, backward) functions or None
        A layer's extra seconds beside ``C`` seconds of collectives (NCCL's SMs taken from
        its GEMMs, :mod:`ddlsim.workloads.smcontention`).
    root : (arrays, arrays, arrays) or None
        Seconds of FSDP's root unit's all-gather, before the embedding, and reduce-scatter,
        after the backward, and of the embedding's backward, the root unit's compute before
        its reduce-scatter (:mod:`ddlsim.workloads.decoder.fsdp_edges`); None: no root unit.
    grads : tuple of arrays or None
        FSDP1's passes on its post-backward stream (:mod:`ddlsim.workloads.decoder.
        fsdp1_passes`): seconds before and after a layer's reduce-scatter, and before and
        after the root unit's; the compute stream waits for that stream after each
        backward. None: no such stream.
    """
    e, f, hf, hb, bw = parts
    sm_f, sm_b = (None, None) if sm is None else sm

    def micro_batch(c, d, p=None):
        c, d = _pass(c, d, e, f, a, r, L, k, False, sm_f, None if root is None else root[0])
        g = None if grads is None else Grads(p, grads[0], grads[1])
        c, d = _pass(c + hf, d, hb, bw, a, r, L, k, True, sm_b, grads=g)
        if root is not None:
            c = c + root[2]
            d = np.maximum(d, c if g is None else g.before(c, grads[2])) + root[1]
            if g is not None:
                g.after(d, grads[3])
        if g is None:
            return c, d
        return np.maximum(c, g.free), d, g.free   # _post_backward_final_callback's wait

    zero = np.zeros_like(np.asarray(a, dtype=float))
    return _over_micro_batches(m, zero, micro_batch, 2 if grads is None else 3)


def _over_micro_batches(m, zero, micro_batch, streams: int) -> np.ndarray:
    """When every stream has ended after ``m`` micro-batches, each run by ``micro_batch``
    (the ``streams`` streams' times in, the same after it out): three are run, later ones
    repeat the third's period."""
    state = tuple(zero.copy() for _ in range(streams))
    ends = []
    for _ in range(3):
        state = micro_batch(*state)
        ends.append(state)
    mm = np.asarray(m, dtype=float)
    extra = np.maximum(mm - 3, 0)
    out = []
    for s1, s2, s3 in zip(*ends):
        out.append(np.select([mm <= 1, mm == 2], [s1, s2], s3 + extra * (s3 - s2)))
    return np.maximum.reduce(out)


def _units_pass(c, d, h, head, units: list[Unit], L: int, k: int, synced: bool,
                cap: float = 0.0, edges: tuple = ((), ())):
    """One pass over ``L`` layers of ``units``, as
    :func:`ddlsim.workloads.decoder.zero3._pass` issues them on the compute, ``dp`` and
    ``host`` streams (times ``c``, ``d``, ``h``): a unit without gathers waits for nothing
    on the ``dp`` stream; under ``synced`` a unit also waits for the reduce-scatters of the
    unit before it, and the host issues the next gather once both have ended; a unit waits
    for the host's issue of the gather launched before it. A prefetch refused by the cap on
    live parameters (``cap`` elements, 0: none) is issued on demand after the unit before
    its own, and the next prefetch after it has ended. ``edges``: the units before and
    after the layers' (DeepSpeed's edges, :mod:`ddlsim.workloads.decoder.zero3_edges`)."""
    seq = [*edges[0], *units * L, *edges[1]]
    n = len(seq)
    ready = []
    issue = []
    never = np.zeros_like(c, dtype=bool)

    def blocked(t: int) -> np.ndarray:
        if not (cap and k) or t < k:
            return never
        return np.asarray(seq[t - k].live) >= cap

    def gather(d, h, after, unit: Unit):
        hosted = unit.host_gather > 0
        h = np.where(hosted, np.maximum(h, after) + unit.host_gather, h)
        d2 = np.where(unit.has_gather,
                      np.maximum(d, np.where(hosted, h, after)) + unit.gather, d)
        h = np.where(hosted, h + unit.host_copy_out, h)
        return d2, h, np.where(unit.has_gather, d2, -np.inf), np.where(hosted, h, -np.inf)

    def prefetch(d, h, after, t: int):
        """The gather of unit ``t`` where its prefetch is not refused."""
        bl = blocked(t)
        d2, h2, r, i = gather(d, h, after, seq[t])
        return (np.where(bl, d, d2), np.where(bl, h, h2), np.where(bl, -np.inf, r),
                np.where(bl, -np.inf, i))

    first = np.full_like(c, -np.inf)
    for j in range(min(k + 1, n)):
        d, h, r, i = prefetch(d, h, c, j) if j else gather(d, h, c, seq[j])
        ready.append(r)
        first = np.maximum(first, i)
    issue.append(first)
    c = c + head
    rs_end = np.full_like(c, -np.inf)
    for j in range(n):
        u = seq[j]
        start = np.maximum(np.maximum(c, ready[j]), issue[j])
        if synced:
            start = np.maximum(start, rs_end)
        c = start + u.compute
        hosted = u.host_reduce > 0
        h = np.where(hosted, np.maximum(np.maximum(h, ready[j]), rs_end) + u.host_reduce, h)
        late = u.host_reduce_after > 0
        h = np.where(late, np.maximum(h, c) + u.host_reduce_after, h)
        hosted = hosted | late
        d = np.where(u.has_reduce,
                     np.maximum(d, np.where(hosted, np.maximum(c, h), c)) + u.reduce, d)
        rs_end = np.where(u.has_reduce, d, -np.inf)
        after = np.maximum(c, rs_end) if synced else c
        now = np.full_like(c, -np.inf)
        if j + 1 < n and (bl := blocked(j + 1)).any():   # gathered on demand
            d2, h2, rd, i = gather(d, h, after, seq[j + 1])
            d, h = np.where(bl, d2, d), np.where(bl, h2, h)
            ready[j + 1] = np.where(bl, rd, ready[j + 1])
            now = np.where(bl, i, now)
            after = np.where(bl, np.maximum(after, rd), after)
        if j + k + 1 < n:
            d, h, rd, i = prefetch(d, h, after, j + k + 1)
            ready.append(rd)
            now = np.maximum(now, i)
        issue.append(now)
    return c, d, h


def zero3_units_time(L: int, k: int, m, edges, fwd_units, bwd_units,
                     synced: bool, cap: float = 0.0) -> np.ndarray:
    """:func:`zero3_time` for ZeRO-3 from module hooks: the passes run over units (a module's
    part of a layer) instead of layers, ``k`` units gathered ahead. ``fwd_units``/
    ``bwd_units``: one layer's :class:`Unit` s, in pass order; ``edges``: the embedding's
    and the head's units of the forward, the head's and the embedding's of the backward
    (:func:`.zero3_edges.edge_units`); ``cap``: the stack's ``zero3_max_live_parameters``."""
    ef, hf, hb, eb = edges

    def micro_batch(c, d, h):
        c, d, h = _units_pass(c, d, h, 0.0, fwd_units, L, k, synced, cap, ((ef,), (hf,)))
        return _units_pass(c, d, h, 0.0, bwd_units, L, k, synced, cap, ((hb,), (eb,)))

    return _over_micro_batches(m, np.zeros_like(np.asarray(fwd_units[0].compute, dtype=float)),
                               micro_batch, 3)
