"""Closed forms shared by every family: the pipeline, the overlapped gradient tail, the update.

With per-micro-batch stage times ``t_s`` (forward + backward over the stage's ``v`` chunks),
``m`` micro-batches and ``p`` stages, the last backward of stage 0 ends at

    T_pipe = (m − 1)·λ + (Σ_s t_s + (v − 1)·λ) / v + 2·(v·P2P + (v − 1)·wrap),
    λ = max(max_s t_s, t_mid + 2·hop)  (1F1B, p ≥ 3; λ = max_s t_s otherwise)

(1F1B: ``v = 1``; interleaved 1F1B: ``v`` chunks; GPipe: the forwards and the backwards each
as a 1F1B pipeline of their own), where ``P2P`` is the point-to-point time summed over the
``p − 1`` hops ``h_s`` (stage s → s + 1) and ``wrap`` the hop from the last stage back to the
first: filling and draining, a micro-batch crosses all ``p·v − 1`` boundaries of the virtual
stages. With blocking P2P a stage's period gains the hops it receives over, its own:

    λ = max(t_0 + v·h_0 + (v − 1)·wrap, t_{p−1} + v·h_{p−2} + (v − 1)·wrap,
            t_mid + v·max_s (h_{s−1} + h_s)).

The iteration ends when the slowest of the first and last stages has run its data-parallel
tail and its update; the last stage's last backward ends a drain before stage 0's (the last
gradient crosses every hop and runs each earlier stage's chunk-0 backward: ``b_chunk`` on a
middle stage, ``b_0 − (v − 1)·b_chunk`` on the first, where ``b_0``, its backward over its
chunks, also holds the embedding's):

    T = max(T_pipe + tail_0 + update_0, T_pipe − drain + tail_{p−1} + update_{p−1}),
    drain = (p − 2)·b_chunk + (b_0 − (v − 1)·b_chunk) + P2P.

docs/engines.md ("The search tier's closed forms") states when each term is exact.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .plans import SCHEDULE

__all__ = ["flow_shop_tail", "flow_shop_last", "earlier_chunks", "iteration_time"]


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
    m = plans["gbs"] // np.maximum(plans["mbs"] * np.maximum(plans["dp"], 1), 1)
    gpipe = plans["schedule"] == SCHEDULE.index("gpipe")
    middle = np.maximum(pp - 2, 0)

    c = costs
    hop = c.p2p_s / np.maximum(pp - 1, 1)
    own = _own_hops(c, pp, hop)

    def pipe(first, mid, last, chunks, stream=0.0, first_extra=0.0, last_extra=0.0):
        total = np.where(pp == 1, first, first + middle * mid + last)
        worst = np.maximum(np.maximum(first + first_extra, last + last_extra),
                           np.where(pp >= 3, mid + stream, first + first_extra))
        return (m - 1) * worst + (total + (chunks - 1) * worst) / chunks

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
    one_f_one_b = pipe(c.fwd_first + c.bwd_first, c.fwd_mid + c.bwd_mid,
                       c.fwd_last + c.bwd_last, v, stream, edge_first, edge_last)
    # GPipe: the forwards wait for activations (not the first stage's), the backwards for
    # gradients (not the last stage's), each over the hop it arrives by
    split = (pipe(c.fwd_first, c.fwd_mid, c.fwd_last, 1, np.where(blocking, own.mid_in, 0.0),
                  0.0, np.where(blocking, own.last, 0.0))
             + pipe(c.bwd_first, c.bwd_mid, c.bwd_last, 1, np.where(blocking, own.mid_out, 0.0),
                    np.where(blocking, own.first, 0.0), 0.0))
    t_pipe = np.where(gpipe, split, one_f_one_b) + 2 * (v * c.p2p_s + (v - 1) * c.wrap_s)
    first = t_pipe + c.tail_first
    # the last micro-batch's gradient leaves the last stage's last backward, crosses every
    # hop and runs each earlier stage's chunk-0 backward: a middle stage's b_chunk, and the
    # first stage's own (its backward less its other v − 1 chunks: b_chunk plus what only
    # the first stage runs there, the embedding's backward)
    drain = (pp - 2) * c.bwd_chunk + (c.bwd_first - (v - 1) * c.bwd_chunk) + c.p2p_s
    last = t_pipe - np.where(pp > 1, drain, 0.0) + c.tail_last
    # a collective between the first and last stages before their updates (what runs before
    # it is in the tails): both wait there for the later one
    sync = np.broadcast_to(c.tied_sync, pp.shape)
    met = np.maximum(first, last) + sync
    first = np.where(sync > 0, met, first) + c.update_first
    last = np.where(sync > 0, met, last) + c.update_last
    t = np.maximum(first, last)
    return np.where(np.isnan(c.whole), t, c.whole)


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
