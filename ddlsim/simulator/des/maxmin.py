"""Max-min fair rates of flows over shared links, by progressive filling (vectorised).

A flow crosses a fixed set of directed links; every link's bandwidth is shared so that no
flow can get more without taking from a flow that already has less (Bertsekas & Gallager,
*Data Networks*, 2nd ed., §6.5.2, the progressive-filling algorithm). Each round computes
every link's fair share ``remaining capacity / unfrozen flows crossing it``, gives the flows
whose tightest link has the smallest share exactly that share, freezes them, and takes their
rates out of the capacities of every link they cross. Rounds = distinct rate levels; frozen
flows leave the arrays, so later rounds are cheaper.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .uniq import unique_values

__all__ = ["max_min_rates", "RateMemo", "REL_TOL"]

#: Flows whose tightest share is within this relative distance of the round's minimum are
#: frozen together; their rate is the minimum, so no link is ever over-filled.
REL_TOL = 1e-12
#: Bytes of rates one memo may remember. A training iteration repeats the same few hundred
#: sets of concurrent flows (every micro-batch's sends, every bucket's ring), so a solve is
#: looked up far more often than computed; the budget bounds the memory where sets rarely
#: repeat.
MEMO_BYTES = 64 << 20
#: Flow sets larger than this are solved, not looked up: at 16,384 GPUs sets of thousands of
#: flows hardly ever repeat, and hashing them cost more than it saved (GPT-3 on 1,024 GPUs:
#: 165 sets of 2,049–8,192 flows, all distinct; on 16,384: 5,927 such solves).
MEMO_ROWS = 2048


def _localise(edges: np.ndarray, n_links: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct links of ``edges`` (ascending) and ``edges`` renumbered into them."""
    if edges.size * 8 < n_links:
        links = unique_values(edges)
    else:
        links = np.flatnonzero(np.bincount(edges.ravel(), minlength=n_links))
    lut = np.empty(n_links, dtype=np.int64)
    lut[links] = np.arange(len(links))
    return links, lut[edges]


def max_min_rates(edges: np.ndarray, mult: np.ndarray, capacity_Bps: np.ndarray) -> np.ndarray:
    """Max-min fair rate of each flow, bytes/s.

    Parameters
    ----------
    edges : (F, W) int array
        Link ids each flow crosses, padded with ``len(capacity_Bps) - 1``, a pad link of
        infinite capacity. A flow that crosses only the pad gets an infinite rate.
    mult : (F,) float array
        How many identical flows each row stands for (each gets the returned rate).
    capacity_Bps : (E + 1,) float array
        Bandwidth of every link, the pad last (``inf``).

    Returns
    -------
    np.ndarray
        (F,) rates; ``rate[f] * mult[f]`` summed over the flows of any link never exceeds its
        capacity.
    """
    n_flows, width = edges.shape
    rate = np.full(n_flows, np.inf)
    if n_flows == 0:
        return rate
    links, local = _localise(edges, len(capacity_Bps))
    cap = capacity_Bps[links].astype(np.float64)
    n_links = len(links)
    idx, m = np.arange(n_flows), np.asarray(mult, dtype=np.float64)
    # flow counts per link are sums of whole numbers, exact in floating point, so taking
    # the frozen flows out gives the same counts as recounting the rest
    users = np.bincount(local.ravel(), weights=np.repeat(m, width), minlength=n_links)
    while len(idx):
        with np.errstate(divide="ignore", invalid="ignore"):
            share = cap / users
        share[users == 0] = np.inf
        tightest = share[local].min(axis=1)
        level = tightest.min()
        if level == np.inf:
            break
        hit = tightest <= level * (1.0 + REL_TOL)
        rate[idx[hit]] = level
        cap -= np.bincount(local[hit].ravel(), weights=np.repeat(m[hit] * level, width),
                           minlength=n_links)
        np.maximum(cap, 0.0, out=cap)
        users -= np.bincount(local[hit].ravel(), weights=np.repeat(m[hit], width),
                             minlength=n_links)
        keep = ~hit
        idx, local, m = idx[keep], local[keep], m[keep]
    return rate


class RateMemo:
    """:func:`max_min_rates` over fixed capacities, remembered under a 128-bit BLAKE2b digest
    of the flows' exact routes and multiplicities: the same flows in the same order get the
    same rates, bit for bit, whether solved or recalled (two different sets would have to
    share a digest, p ≈ 2⁻¹²⁸). Holds at most :data:`MEMO_BYTES` of rates."""

    def __init__(self, capacity_Bps: np.ndarray):
        self.capacity_Bps = capacity_Bps
        self._memo: dict[tuple, np.ndarray] = {}
        self._bytes = 0

    def __call__(self, edges: np.ndarray, mult: np.ndarray) -> np.ndarray:
        """Rates (bytes/s) of flows ``edges`` × ``mult``, as :func:`max_min_rates`."""
        if len(edges) > MEMO_ROWS:   # large sets rarely repeat: solving beats hashing
            return max_min_rates(edges, mult, self.capacity_Bps)
        digest = hashlib.blake2b(edges.tobytes(), digest_size=16)
        digest.update(mult.tobytes())
        key = (edges.shape[1], digest.digest())
        rate = self._memo.get(key)
        if rate is None:
            rate = max_min_rates(edges, mult, self.capacity_Bps)
            if self._bytes + rate.nbytes <= MEMO_BYTES:
                self._memo[key] = rate
                self._bytes += rate.nbytes
        return rate
