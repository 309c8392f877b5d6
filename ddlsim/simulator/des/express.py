"""Isolated timelines of flow templates: the exact shortcut for runs that meet no traffic.

If every phase of a template, run alone, gives all its flows one and the same max-min rate
(a ring inside a node, recursive doubling over a switch…) and one and the same path latency,
then, as long as nothing else enters the links it uses, every instance moves in lockstep and
phase k takes exactly ``bytes_k / rate_k + latency_k``. A run in that situation reserves its
domains and sleeps until it ends (one event instead of several per phase); if other traffic
arrives first it is materialised as flows with exactly the bytes it has left, so the
shortcut never changes a result, only the number of events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .maxmin import max_min_rates
from .templates import FlowTemplate

__all__ = ["IsolatedPhase", "isolated_profile"]

_SAME = 1e-12


@dataclass(frozen=True, slots=True)
class IsolatedPhase:
    """A phase run alone: seconds per byte of each flow, latency of one step, links used."""

    seconds_per_byte: float
    step_latency_s: float
    links: np.ndarray
    load_ratio: float


def _uniform(x: np.ndarray) -> bool:
    return len(x) == 0 or bool(np.all(np.abs(x - x[0]) <= _SAME * abs(x[0])))


def isolated_profile(template: FlowTemplate, capacity_Bps: np.ndarray
                     ) -> tuple[IsolatedPhase, ...] | None:
    """Each phase of ``template`` alone on the links, or None if some phase's flows (or
    instances) would not all move at one rate with one latency."""
    pad = len(capacity_Bps) - 1
    out = []
    for ph in template.phases:
        if ph.weight is not None:  # flows of unequal sizes finish at different times
            return None
        counts = np.diff(ph.starts)
        if not _uniform(counts.astype(np.float64)) or not _uniform(ph.latency_s):
            return None
        latency = float(ph.latency_s[0]) if len(ph.latency_s) else 0.0
        if len(ph.edges) == 0:
            out.append(IsolatedPhase(0.0, latency, np.empty(0, dtype=np.int64), 0.0))
            continue
        rate = max_min_rates(ph.edges, ph.mult, capacity_Bps)
        if not _uniform(rate):
            return None
        links = np.unique(ph.edges)
        links = links[links != pad]
        r = float(rate[0])
        if not np.isfinite(r):
            out.append(IsolatedPhase(0.0, latency, links, 0.0))
            continue
        load = np.bincount(ph.edges.ravel(), weights=np.repeat(ph.mult * r, ph.edges.shape[1]),
                           minlength=pad + 1)[links]
        out.append(IsolatedPhase(1.0 / r, latency, links,
                                 float((load / capacity_Bps[links]).max()) if len(links) else 0.0))
    return tuple(out)
