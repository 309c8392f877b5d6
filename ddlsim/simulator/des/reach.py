"""Which flows a change of the flow set can move, so that :class:`~.network.FlowNetwork`
re-solves only those: none but the new flows where no other flow shares a link with the
change (:func:`isolated`), else the flows reached from the changed links through saturated
links, grown until their solve fills no link that other flows cross (:func:`affected`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .flowtable import FlowTable, link_counts
from .uniq import unique_inverse

__all__ = ["affected", "isolated", "SATURATED"]

#: A link whose load is within this relative distance of its capacity counts as saturated
#: when choosing which flows to re-solve (counting a link too many only re-solves more).
SATURATED = 1e-9


def affected(slots: FlowTable, pool: np.ndarray, seeds: list[np.ndarray],
             capacity_Bps: np.ndarray, pad: int, users: np.ndarray,
             linked: Callable[..., np.ndarray], rates: Callable[..., np.ndarray],
             lut: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The flows of ``pool`` (slots) whose rates the change can move, and their new rates.

    Start from the flows crossing a changed link and grow through *saturated* links
    only (under the current rates): a flow's rate is set by its bottleneck, a
    saturated link, so a change reaches another flow only through links that are or
    become saturated. The set's max-min rates are solved alone, at full capacities; if
    that fills a link that flows outside the set also cross, the set grows from that
    link and is solved again. When no such link is left, the set's rates with the
    others' unchanged are the max-min fair rates of all the flows: every link's load
    is within its capacity, and every flow still has a bottleneck link on which it has
    the largest rate (for the flows outside the set, a link none of the set crosses).

    Parameters
    ----------
    slots : FlowTable
        The network's flows.
    pool : ndarray
        Slots of the flows of the touched domains.
    seeds : list of ndarray
        Link ids of each change (routes of the flows that entered or left).
    capacity_Bps : ndarray
        Bandwidth of every link, the pad's infinite last (B/s).
    pad : int
        The pad's link id.
    users : ndarray
        Flows crossing each link (:attr:`.flowtable.LinkLedger.users`).
    linked : callable
        ``linked(edges, seeds, full)``: the rows reached from ``seeds`` through links
        ``full`` (:class:`.components.LinkedFlows`).
    rates : callable
        ``rates(edges, mult)``: max-min fair rates at full capacities (:class:`.maxmin.RateMemo`).
    lut : ndarray
        Scratch, link id -> local index.

    Returns
    -------
    tuple of ndarray
        The slots to re-solve and their rates (B/s).
    """
    s, cap = slots, capacity_Bps
    edges, mults = s.edges[pool], s.mult[pool]
    width = edges.shape[1]
    held = s.rate[pool] * mults
    load = np.bincount(edges.ravel(), weights=np.repeat(held, width), minlength=pad + 1)
    full = load >= cap * (1.0 - SATURATED)
    full[pad] = False
    while True:
        taken = np.flatnonzero(linked(edges, seeds, full))
        sub, mult = edges[taken], mults[taken]
        rate = rates(sub, mult)
        links, at = unique_inverse(sub.ravel(), lut)
        mine = np.bincount(at, minlength=len(links))
        was = np.bincount(at, weights=np.repeat(held[taken], width), minlength=len(links))
        now = np.bincount(at, weights=np.repeat(rate * mult, width), minlength=len(links))
        with np.errstate(invalid="ignore"):  # the pad: infinite rates, infinite capacity
            filled = (users[links] > mine) & (load[links] - was + now
                                              >= cap[links] * (1.0 - SATURATED))
        filled &= links != pad
        if not filled.any():
            return pool[taken], rate
        seeds = seeds + [links[filled]]


def isolated(users: np.ndarray, pad: int, added: list, removed: list[np.ndarray]) -> bool:
    """No flow other than the new ones crosses any link a flow entered or left: then
    only the new flows need rates (the common case: max-min components are small).

    Parameters
    ----------
    users : ndarray
        Flows crossing each link, the new ones counted, the ended ones not.
    pad : int
        The pad's link id.
    added : list of (ndarray, ndarray)
        Each admission's padded routes and slots.
    removed : list of ndarray
        The padded routes of the flows that ended.
    """
    for edges in removed:
        links = edges.ravel()
        if users[links[links != pad]].any():
            return False
    if added:
        flat = np.concatenate([edges.ravel() for edges, _ in added])
        links, count = link_counts(flat, pad + 1)
        count[links == pad] = users[pad]
        return bool(np.array_equal(users[links], count))
    return True
