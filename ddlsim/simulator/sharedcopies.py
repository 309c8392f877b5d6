"""Point-to-point transfers of one node at once share the node's memory (CPU hosts, MPI).

Between two ranks of one CPU host a message is a copy through shared memory; past the
last-level cache the copy streams through the host's memory, which every copy of the node
running at the same time shares. ``ddlsim calibrate comm`` measures both sides of it on the
same ranks: ``sendrecv``, one transfer alone (a ping-pong), and ``exchange``, every rank
sending to the next and receiving from the previous at once (``n_x`` transfers together, on
2 ranks both directions of one pair; :mod:`ddlsim.calibration.adapters`). The node then moves
at most

    M(b) = n_x · b / t_x(b)

bytes of transfers per second at message size ``b`` (``t_x``: the profile's ``exchange``
curve, one transfer's seconds), so ``k`` transfers of ``b`` bytes on one node at once each
take at least ``k · b / M(b) = (k / n_x) · t_x(b)``, and never less than alone:

    t = max(t_link, (k / n_x) · t_x(b))

``k`` is what the trace says runs together, the same in both engines: a rank class's send
moves every rank's transfer at once (class lockstep, docs/engines.md), so ``k`` is the most
of its ranks' transfers inside one node. Transfers of other classes that happen to overlap
in time are not counted (in either engine). Measured on this rule's machine
(benchmarks/proxies_exchange.py, docs/validation.md): 2 ranks, 48 MiB, one way 3.85 ms,
both ways 6.23 ms a transfer (2026-11-30 14:17 UTC); at 12-64 MiB the exchange took 0.7-2.3x
the ping-pong's time in calibrations 2-20 minutes apart the same afternoon, so it is
measured right before the run it times, as ``benchmarks/proxies_check.py`` does.

Applies only where the calibration profile has an ``exchange`` fit of the backend in use at
scope ``intra`` and the size lies in its measured range: GPUs, presets and every profile
without it are timed as before.
"""

from __future__ import annotations

import numpy as np

__all__ = ["node_copies", "SharedCopies"]


def node_copies(node_of_rank: np.ndarray, src: np.ndarray, dst: np.ndarray) -> int:
    """The most transfers ``src[i] → dst[i]`` (ranks) with both ends on one node.

    Parameters
    ----------
    node_of_rank : numpy.ndarray
        Node of every rank.
    src, dst : numpy.ndarray
        Ranks sending and receiving, one transfer each.

    Returns
    -------
    int
        The count on the node with the most node-local transfers; 0 when none is.
    """
    nodes = node_of_rank[np.asarray(src, dtype=np.int64)]
    inside = nodes == node_of_rank[np.asarray(dst, dtype=np.int64)]
    if not inside.any():
        return 0
    return int(np.unique(nodes[inside], return_counts=True)[1].max())


class SharedCopies:
    """The rule of the module docstring over one calibration profile and backend.

    Parameters
    ----------
    profile : CalibrationProfile or None
        The run's calibration profile.
    backend : str or None
        Its backend (``"auto"`` or None: the fastest ``exchange`` of the profile's backends).
    """

    def __init__(self, profile, backend: str | None):
        self.profile = profile
        self.backends: tuple[str, ...] = ()
        if profile is not None:
            have = {e.backend for e in profile.doc.comm
                    if e.op == "exchange" and e.scope == "intra" and e.variant == ""}
            pick = None if backend in (None, "auto") else backend
            self.backends = tuple(sorted(b for b in have if pick in (None, b)))
        self._memo: dict[tuple[float, int], float | None] = {}

    def __bool__(self) -> bool:
        return bool(self.backends)

    def floor_s(self, nbytes: float, copies: int) -> float | None:
        """``(k / n_x) · t_x(b)``: the seconds each of ``copies`` transfers of ``nbytes``
        on one node at once takes at least, or None where the profile has no ``exchange``
        fit measured at that size (the rule does not apply).

        Parameters
        ----------
        nbytes : float
            Bytes of each transfer, B.
        copies : int
            Transfers on the node at once (``k``, :func:`node_copies`).

        Returns
        -------
        float or None
            Seconds, or None.
        """
        if copies < 1 or not self.backends:
            return None
        key = (float(nbytes), int(copies))
        if key not in self._memo:
            self._memo[key] = self._floor(float(nbytes), int(copies))
        return self._memo[key]

    def _floor(self, nbytes: float, copies: int) -> float | None:
        times = []
        for b in self.backends:   # (each has an intra exchange entry: no lookup can miss)
            lo, hi = self.profile.measured_range(b, "exchange", copies, scope="intra")
            if lo <= nbytes <= hi:
                p = self.profile.predict(b, "exchange", nbytes, copies, scope="intra")
                times.append(p.time_s * copies / p.measured_ranks)
        return min(times) if times else None
