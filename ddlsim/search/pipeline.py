"""Closed forms shared by every family: the pipeline, the overlapped gradient tail, the update.

With per-micro-batch stage times ``t_s`` (forward + backward over the stage's ``v`` chunks),
``m`` micro-batches and ``p`` stages, the last backward of stage 0 ends at

    T_pipe = (m − 1)·λ + Σ_s t_s + 2·P2P,
    λ = max(max_s t_s, t_mid + 2·hop)  (1F1B, p ≥ 3; λ = max_s t_s otherwise)

(1F1B; GPipe: the forwards and the backwards each as a 1F1B pipeline of their own;
interleaved 1F1B, ``v`` chunks per stage: :func:`interleaved_ends` instead), where
``P2P`` is the point-to-point time summed over the ``p − 1`` hops ``h_s`` (stage s → s + 1)
and ``wrap`` the hop from the last stage back to the first. With blocking P2P a stage's
period gains the hops it receives over, its own:

    λ = max(t_0 + v·h_0 + (v − 1)·wrap, t_{p−1} + v·h_{p−2} + (v − 1)·wrap,
            t_mid + v·max_s (h_{s−1} + h_s)).

The iteration ends when the slowest of the first and last stages has run its data-parallel
tail and its update; the last stage's last backward ends a drain before stage 0's (the last
gradient crosses every hop and runs each earlier stage's backward: ``b_chunk`` on a middle
stage, ``b_0`` on the first, which also holds the embedding's):

    T = max(T_pipe + tail_0 + update_0, T_pipe − drain + tail_{p−1} + update_{p−1}),
    drain = (p − 2)·b_chunk + b_0 + P2P.

docs/engines.md ("The search tier's closed forms") states when each term is exact.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .plans import SCHEDULE, microbatches

__all__ = ["flow_shop_tail", "flow_shop_last", "earlier_chunks", "iteration_time",
           "interleaved_ends"]


def flow_shop_tail(layers, segments, layer_s, comm_s, backlog=None, extra=None) -> np.ndarray:
    """Seconds the gradient communication runs past the end of the backward's layers.

    The layers are cut into ``segments`` runs (the first ``layers % segments`` one layer
    longer, as the builder cuts them); after each run its buckets (``comm_s`` seconds) go on
    the data-parallel stream. A two-machine flow shop: the stream ends at
    ``max_k (compute of runs 1..k + comm of runs k..n)``, piecewise linear in k, so maximal at
    ``k ∈ {1, 2, r, r + 1, n}``. ``backlog``: when the stream is busy until then (seconds from
    the start of the layers) with earlier chunks' buckets, the first run's buckets wait for it.
    ``extra``: (long, short) seconds each run after the first gains beside the buckets before
    it (NCCL's SMs taken, :mod:`ddlsim.workloads.smcontention`), for a run of ``q + 1`` and of
    ``q`` layers; they are part of the tail (the layers' own seconds are not).
    """
    n = np.asarray(segments, dtype=float)
    q, r = np.floor_divide(layers, n), np.mod(layers, n)
    best = np.full(np.broadcast(n, layer_s, comm_s).shape, -np.inf)
    for k in (np.ones_like(n), np.minimum(2, n), np.maximum(r, 1), np.minimum(r + 1, n), n):
        f = (k * q + np.minimum(k, r)) * layer_s + _gained(k, r, extra) + (n - k + 1) * comm_s
        best = np.maximum(best, f)
    if backlog is not None:
        first = (q + np.minimum(r, 1)) * layer_s
        best = np.maximum(best, np.maximum(backlog, first) + n * comm_s)
    return np.maximum(best - layers * layer_s, 0.0)


def flow_shop_last(layers, segments, comm_s, extra=None) -> np.ndarray:
    """Seconds past the end of the backward's layers at which the last run's buckets end when
    nothing else holds them back: :func:`flow_shop_tail`'s ``k = n`` term (every run's
    ``extra``, then the last run's ``comm_s``). Compute that runs between the last run's
    layers and its buckets (the embedding's backward) delays this term alone.

    Parameters
    ----------
    layers : array_like
        Backward layers of the chunk, per plan.
    segments : array_like
        Runs the layers are cut into (the first ``layers % segments`` one layer longer).
    comm_s : array_like
        Seconds of one run's buckets on the data-parallel stream, per plan.
    extra : tuple of array_like, optional
        (long, short): seconds each run after the first gains beside the buckets before it,
        for a run of ``q + 1`` and of ``q`` layers (as in :func:`flow_shop_tail`); None: 0.

    Returns
    -------
    numpy.ndarray
        Seconds past the end of the layers at which the last run's buckets end, per plan.
    """
    n = np.asarray(segments, dtype=float)
    return _gained(n, np.mod(layers, n), extra) + comm_s


def _gained(k, r, extra):
    """Seconds runs 2..k gain beside the buckets before them (``extra`` = (long, short) per
    run of ``q + 1`` and of ``q`` layers, the first ``r`` runs long; None: 0)."""
    e_long, e_short = (0.0, 0.0) if extra is None else extra
    return (np.maximum(np.minimum(k, r) - 1, 0) * e_long
            + np.maximum(k - np.maximum(r, 1), 0) * e_short)


def earlier_chunks(v, spacing_s, chunk_comm_s, layers, segments, layer_s) -> np.ndarray:
    """When the data-parallel stream frees up from the buckets of chunks ``v − 1 … 1`` (the
    interleaved schedule issues each chunk's on its last backward, ``spacing_s`` apart: the
    ``p`` backwards of the next chunk run in between), in seconds from the start of chunk 0's
    last backward's layers; ``−inf`` with one chunk. Each chunk's buckets (``chunk_comm_s``)
    start once its first run of layers is done and the stream is free."""
    n = np.asarray(segments, dtype=float)
    first = (np.floor_divide(layers, n) + np.minimum(np.mod(layers, n), 1)) * layer_s
    free = np.full(np.shape(first), -np.inf)
    for c in range(int(np.max(v)) - 1, 0, -1):
        ready = np.maximum(free, -c * spacing_s + first) + chunk_comm_s
        free = np.where(v > c, ready, free)
    return free


def iteration_time(costs, plans) -> np.ndarray:
    """The iteration time of each plan from its :class:`~ddlsim.search.family.StageCosts`."""
    pp, v = plans["pp"], plans["v"]
    m = microbatches(plans)
    gpipe = plans["schedule"] == SCHEDULE.index("gpipe")
    middle = np.maximum(pp - 2, 0)

    c = costs
    hop = c.p2p_s / np.maximum(pp - 1, 1)
    own = _own_hops(c, pp, hop)

    def slowest(first, mid, last, stream=0.0, first_extra=0.0, last_extra=0.0):
        return np.maximum(np.maximum(first + first_extra, last + last_extra),
                          np.where(pp >= 3, mid + stream, first + first_extra))

    def pipe(first, mid, last, *waits):
        total = np.where(pp == 1, first, first + middle * mid + last)
        return (m - 1) * slowest(first, mid, last, *waits) + total

    # per micro-batch, a stage's steady-state period gains the transfers it waits for:
    # overlapped P2P, a 1F1B middle stage's activation send and gradient receive queue on
    # its one pipeline stream between its forward and its backward; blocking P2P, every
    # receive's transfer runs after the compute before it, over the stage's own hops: the
    # first stage's and the last's one, the slowest middle stage's two (docs/engines.md)
    blocking = np.broadcast_to(c.blocking, pp.shape) & (pp > 1)
    wrap = np.where(v > 1, c.wrap_s, 0.0)
    stream = np.where(blocking, v * own.mid, np.where(v == 1, 2 * hop, 0.0))
    edge_first = np.where(blocking, v * own.first + (v - 1) * wrap, 0.0)
    edge_last = np.where(blocking, v * own.last + (v - 1) * wrap, 0.0)
    stages = (c.fwd_first + c.bwd_first, c.fwd_mid + c.bwd_mid, c.fwd_last + c.bwd_last)
    one_f_one_b = pipe(*stages, stream, edge_first, edge_last)
    # GPipe: the forwards wait for activations (not the first stage's), the backwards for
    # gradients (not the last stage's), each over the hop it arrives by
    split = (pipe(c.fwd_first, c.fwd_mid, c.fwd_last, np.where(blocking, own.mid_in, 0.0),
                  0.0, np.where(blocking, own.last, 0.0))
             + pipe(c.bwd_first, c.bwd_mid, c.bwd_last, np.where(blocking, own.mid_out, 0.0),
                    np.where(blocking, own.first, 0.0), 0.0))
    t_pipe = np.where(gpipe, split, one_f_one_b) + 2 * c.p2p_s
    # the last micro-batch's gradient leaves the last stage's last backward, crosses every
    # hop and runs each earlier stage's backward: a middle stage's b_chunk, and the first
    # stage's own (b_chunk plus what only the first stage runs there, the embedding's)
    drain = (pp - 2) * c.bwd_chunk + c.bwd_first + c.p2p_s
    t_last = t_pipe - np.where(pp > 1, drain, 0.0)
    chunked = (v > 1) & ~gpipe & (pp > 1)
    if chunked.any():   # interleaved 1F1B: the critical path through the last stage
        period = slowest(*stages, stream, edge_first, edge_last)
        ends = interleaved_ends(c, pp, np.where(chunked, v, 2), m, period,
                                blocking & chunked, hop)
        t_pipe, t_last = (np.where(chunked, e, t) for e, t in zip(ends, (t_pipe, t_last)))
    first = t_pipe + c.tail_first
    last = t_last + c.tail_last
    # a collective between the first and last stages before their updates (what runs before
    # it is in the tails): both wait there for the later one
    sync = np.broadcast_to(c.tied_sync, pp.shape)
    met = np.maximum(first, last) + sync
    first = np.where(sync > 0, met, first) + c.update_first
    last = np.where(sync > 0, met, last) + c.update_last
    t = np.maximum(first, last)
    return np.where(np.isnan(c.whole), t, c.whole)


def interleaved_ends(c, pp, v, m, period, blocking, hop) -> tuple[np.ndarray, np.ndarray]:
    """(stage 0's, the last stage's) end of its last backward under Megatron's interleaved
    1F1B (``v > 1``), per plan, in seconds.

    The critical path runs through the last stage (it holds the head): the fill up to its
    first forward of chunk ``v − 1``, then everything it runs up to its last backward of
    chunk ``v − 1`` at the period ``λ`` (``period``), then the drain down to the stage's
    own last backward. Megatron's warm-up (``2(p − s − 1) + (v − 1)p`` forwards on stage
    s) makes every stage run the first group's ``p`` micro-batches chunk by chunk: the fill
    is a longest path over the ``p·v`` virtual stages on which a stage may run its chunk for
    the whole group (``p`` ops) before the group moves on (:func:`_longest_paths`), so the
    embedding's forward or a stage's slow receive counts up to ``p`` times; the drain
    likewise over the last group's backwards. In between, the last stage runs ``m·λ`` less
    its warm-up and cooldown (``p(v − 1)`` forwards and backwards of its other chunks) and
    that first forward. With overlapped P2P (a transfer delays the op it feeds only) the
    paths have a closed form (:func:`_overlapped_ends`); with blocking P2P (the receive
    posted after the compute before it: part of the op) each stage's own receive counts.

    Parameters
    ----------
    c : StageCosts
        The plans' costs (:class:`~.family.StageCosts`); ``stage_hop_s`` (each hop s → s + 1
        in order) or, without it, every hop ``hop``.
    pp, v, m : numpy.ndarray
        Stages (> 1), chunks per stage (> 1) and micro-batches per plan.
    period : numpy.ndarray
        Seconds per micro-batch of the slowest stage, the transfers it waits for included.
    blocking : numpy.ndarray
        Blocking P2P, per plan.
    hop : numpy.ndarray
        The mean hop's seconds (``p2p_s / (pp − 1)``), used without ``stage_hop_s``.

    Returns
    -------
    tuple of numpy.ndarray
        Seconds from the start of the pipeline to stage 0's and to the last stage's end of
        their last backward, per plan.

    References
    ----------
    NVIDIA/Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``
    (``forward_backward_pipelining_with_interleaving``: warm-up micro-batches
    ``(p − s − 1)·2 + (v − 1)·p``, chunk order), as :func:`ddlsim.workloads.schedules.
    schedule` lays it out; tested against the exact engine and against the schedule run op
    by op in ``tests/search/test_interleaved_exact.py``.
    """
    # a chunk's forward and backward on a middle stage, and what stage 0's chunk 0 (the
    # embedding) and the last stage's chunk v − 1 (the head) run beyond them
    f_c = np.where(pp >= 3, c.fwd_mid / v, c.fwd_mid / v if c.fwd_chunk is None else c.fwd_chunk)
    b_c = np.where(pp >= 3, c.bwd_mid / v, c.bwd_chunk)
    extra = (c.fwd_first - v * f_c, c.bwd_first - v * b_c, c.fwd_last - v * f_c,
             c.bwd_last - v * b_c)
    first, last = _overlapped_ends(c, pp, v, m, period, f_c, b_c, extra)
    chunked = np.flatnonzero(blocking)
    if len(chunked):
        hops = None if c.stage_hop_s is None else c.stage_hop_s[chunked]
        first, last = first.copy(), last.copy()
        first[chunked], last[chunked] = _blocking_ends(
            pp[chunked], v[chunked], m[chunked], period[chunked], f_c[chunked], b_c[chunked],
            [x[chunked] for x in extra], hops, c.wrap_s[chunked], hop[chunked])
    return first, last


def _overlapped_ends(c, pp, v, m, period, f_c, b_c, extra):
    """:func:`interleaved_ends` with overlapped P2P: the longest paths in closed form. Every
    chunk the path crosses costs its hops' sum ``P2P`` and the wrap; running a stage's chunk
    for the whole group skips ``p − 1`` virtual stages (one ring: ``P2P + wrap``) and pays
    that stage's chunk ``p − 1`` times more, which gains only on stage 0's chunk 0, slower
    by the embedding (``E_f``, ``E_b``):

        fill    = p·v·f_c + H_f + (v − 1)·P2P + (v − 2)·wrap + max(p·E_f, E_f + P2P + wrap)
        drain_0 = (p·v − 1)·b_c + (v − 1)·P2P + (v − 2)·wrap + max(p·E_b, E_b + P2P + wrap)
        drain_{p−1} = (v − 1)·(p·b_c + P2P + wrap)
    """
    e_f, e_b, h_f, _ = extra
    ring = c.p2p_s + c.wrap_s
    crossed = (v - 1) * c.p2p_s + (v - 2) * c.wrap_s
    fill = pp * v * f_c + h_f + crossed + np.maximum(pp * e_f, e_f + ring)
    busy = m * period - pp * (v - 1) * (f_c + b_c) - (f_c + h_f)
    drain = (pp * v - 1) * b_c + crossed + np.maximum(pp * e_b, e_b + ring)
    return fill + busy + drain, fill + busy + (v - 1) * (pp * b_c + ring)


def _blocking_ends(pp, v, m, period, f_c, b_c, extra, hops, wrap, hop):
    """:func:`interleaved_ends` with blocking P2P: a node of the chain of virtual stages
    costs its chunk's time plus the receive before it (forwards over the hop before the
    stage, the wrap into stage 0; backwards over the hop after it, the wrap into the last
    stage), edges cost nothing; the paths by :func:`_longest_paths`, the plans of each
    (PP, VPP) together."""
    first, last = np.empty(len(pp)), np.empty(len(pp))
    shapes, which = np.unique(np.stack([pp, v]), axis=1, return_inverse=True)
    for g, (p, vv) in enumerate(shapes.T.tolist()):
        at = np.flatnonzero(which.ravel() == g)
        ring = np.empty((p, len(at)))   # hop s → s + 1 in row s, the wrap in row p − 1
        ring[:p - 1] = hop[at] if hops is None else hops[at, :p - 1].T
        ring[p - 1] = wrap[at]
        e_f, e_b, h_f, h_b = (x[at] for x in extra)
        nodes, stage = p * vv, np.arange(p)
        # the receive into each stage: forwards (the wrap into stage 0), backwards (into the
        # last stage), repeated per chunk; the chain's first node receives nothing
        into_f = np.tile(ring[(stage - 1) % p], (vv, 1))
        into_b = np.tile(ring[p - 1 - stage], (vv, 1))
        into_f[0] = into_b[0] = 0.0
        w_f = f_c[at] + into_f
        w_f[0] += e_f
        w_f[-1] += h_f
        w_b = b_c[at] + into_b
        w_b[-1] += e_b
        w_b[0] += h_b
        fill = _longest_paths(w_f, p, start_high=False)[0][-1] + w_f[-1]
        busy = (m[at] * period[at] - p * (vv - 1) * (f_c[at] + b_c[at] + ring[p - 2] + ring[p - 1])
                - w_f[-1])
        low, high = _longest_paths(w_b, p, start_high=True)
        # the drain's end at a node with its group done: carried there, or landed by a
        # reset and run the whole group there
        done = np.maximum(high + w_b, low + p * w_b)
        first[at] = fill + busy + done[nodes - 1]
        last[at] = fill + busy + done[(vv - 1) * p]
    return first, last


def _longest_paths(w, p: int, start_high: bool) -> tuple[np.ndarray, np.ndarray]:
    """Longest paths over a chain of virtual stages each running one group of ``p``
    identical micro-batches in order (node k: ``w[k]`` seconds per micro-batch, one column
    per plan; edges cost nothing). A path at micro-batch j of the group moves to node k + 1
    with the same micro-batch, runs on at node k to micro-batch p − 1 ((p − 1)·w more: the
    node's whole group), or from micro-batch p − 1 goes on at node k + p with micro-batch 0
    (the same stage's next chunk).

    Returns (at j = 0, at j = p − 1): the longest path's seconds on reaching each node,
    before the node's op; the start is node 0 at j = 0 (``start_high``: at j = p − 1, the
    node's own op not counted).
    """
    nodes = len(w)
    low, high = np.full(w.shape, -np.inf), np.full(w.shape, -np.inf)
    if start_high:
        high[0] = -w[0]
    else:
        low[0] = 0.0
    for k in range(nodes):
        done = np.maximum(high[k] + w[k], low[k] + p * w[k])
        if k + 1 < nodes:
            np.maximum(low[k + 1], low[k] + w[k], out=low[k + 1])
            np.maximum(high[k + 1], done, out=high[k + 1])
        if k + p < nodes:
            np.maximum(low[k + p], done, out=low[k + p])
    return low, high


class _OwnHops(NamedTuple):
    """Seconds of the hops each stage waits for under blocking P2P, per plan: the first
    stage's (hop 0 → 1) and the last stage's (hop PP − 2 → PP − 1); of the middle stages,
    the largest of a stage's two summed (``mid``), of the hop before it (``mid_in``, its
    activations) and of the hop after it (``mid_out``, its gradients), these three −inf at
    PP ≤ 2 (no middle stage)."""

    first: np.ndarray
    last: np.ndarray
    mid: np.ndarray
    mid_in: np.ndarray
    mid_out: np.ndarray


def _own_hops(c, pp, hop) -> _OwnHops:
    """:class:`_OwnHops` from the costs' ``stage_hops`` (per plan, each stage's (activation
    hop, gradient hop): the first stage's, the last stage's, the distinct middle stages'), or
    every hop ``hop`` (their mean) where the family gives no per-hop seconds."""
    if c.stage_hops is None:
        return _OwnHops(hop, hop, 2 * hop, hop, hop)
    h = c.stage_hops
    into, out = h[:, 2:, 0], h[:, 2:, 1]   # the middle stages' (−inf rows: none)
    return _OwnHops(h[:, 0, 1], h[:, 1, 0], np.max(into + out, axis=1, initial=-np.inf),
                    np.max(into, axis=1, initial=-np.inf), np.max(out, axis=1, initial=-np.inf))
