"""The size at which a calibration profile times a collective (:func:`profile_size`), for
:class:`~ddlsim.simulator.costs.CostModel`'s profile lookups.
"""

from __future__ import annotations

from ..units import format_bytes

__all__ = ["profile_size"]


def profile_size(nbytes: float, split: tuple[float, ...] | None) -> tuple[float, str]:
    """The size at which a calibration profile times a collective, and what the label adds.

    A profile measures even operations (nccl-tests' and ``calibrate comm``'s size convention:
    an all-to-all's *S* is the whole per-rank send buffer, ``S / n`` to each of ``n``
    members). An all-to-all with per-peer splits is timed as the even one whose every
    exchange is its largest: ``max(split) · n``. With an even split that is its own size
    ``nbytes``, exactly the measured operation. With an uneven one it is an approximation,
    an upper bound (the even operation moves at least as many bytes between every pair):
    an all-to-all(v) lasts as long as its largest exchange. That holds where one member's
    own link sets the pace: a pairwise exchange in ``n - 1`` steps, each as long as its
    largest transfer (every step has one of ``max(split)``), or concurrent sends limited by
    the most loaded member's port (it moves ``n · max(split)`` in both). It overestimates
    where members share a link (a node's ranks behind one NIC), which the even operation
    loads with every member's ``n · max(split)``.

    Parameters
    ----------
    nbytes : the collective's size (bytes; the sum of ``split`` when it has one).
    split : its per-member bytes (``Collective.split_bytes``), or None for an even one.

    Returns
    -------
    tuple[float, str]
        The size to look up on the profile's curve (bytes) and ``""``, or, for an uneven
        split, the note the result's ``algorithms`` label carries.
    """
    if split is None or max(split) == min(split):
        return nbytes, ""
    size = max(split) * len(split)
    return size, f" at {format_bytes(size)} = {len(split)} x largest split"
