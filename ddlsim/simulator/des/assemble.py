"""Turn a raw :class:`~.engine.DESRun` into the engines' common :class:`~..result.Result`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...workloads.trace import Workload
from ..result import Result, Span, assemble_result
from .engine import DESRun

__all__ = ["des_result", "link_table", "rank_spans"]


def rank_spans(run: DESRun, workload: Workload, every_rank: bool) -> tuple[Span, ...]:
    """Spans of every rank (``every_rank``) or of each class's first rank, sorted by rank,
    stream, start (then end and name; ties in the order the engine recorded them)."""
    names = {v: k for k, v in run.streams.items()}
    rows = []  # (rank, class index): a rank belongs to one class, so ranks sort the classes
    for c, (cls, spans) in enumerate(zip(workload.classes, run.spans)):
        if spans:
            rows += [(int(r), c) for r in (cls.ranks if every_rank else cls.ranks[:1])]
    rows.sort()
    ordered: dict[int, list] = {}  # per class, its spans sorted once (the same for each rank)
    out = []
    for r, c in rows:
        spans = ordered.get(c)
        if spans is None:
            spans = ordered[c] = sorted(
                ((names[sid], name, start, end, kind) for sid, name, start, end, kind
                 in run.spans[c]), key=lambda t: (t[0], t[2], t[3], t[1]))
        cname = workload.classes[c].name
        out += [Span(r, stream, name, start, end, kind, cname)
                for stream, name, start, end, kind in spans]
    return tuple(out)


def link_table(run: DESRun, topology, iteration_time_s: float) -> tuple[dict[str, Any], ...]:
    """Every link that carried bytes, busiest (highest utilisation) first.

    ``busy_s`` is the time the link carried at least one flow; ``utilisation`` is its bytes
    over what it could have carried in the iteration (``bytes / (bandwidth · T)``).
    """
    carried = run.network.links.bytes()
    busy = run.network.links.busy_s[:-1]
    bw = topology.edge_bandwidth_Bps
    used = np.flatnonzero(carried > 0)
    util = carried[used] / (bw[used] * iteration_time_s) if iteration_time_s > 0 else 0 * used
    order = np.lexsort((used, -carried[used], -util))
    rows = []
    for i in order:
        e = int(used[i])
        u, v = topology.edge_name(e)
        rows.append({"link": f"{u}->{v}", "kind": topology.edge_kind[e],
                     "bandwidth_Bps": float(bw[e]), "busy_s": float(busy[e]),
                     "utilisation": float(util[i]), "bytes": float(carried[e])})
    return tuple(rows)


def des_result(workload: Workload, memory, peak_flops_per_device: float, run: DESRun,
               topology, spans: tuple[Span, ...], span_mode: str, audit: bool) -> Result:
    """The :class:`Result` of a DES run (:func:`~..result.assemble_result`, as the analytical
    engine's), with the spans, the busiest links and the run's event and flow counts."""
    net = run.network
    stats: dict[str, Any] = {"events": run.events, "flows": net.flows_started,
                             "rate_updates": net.rate_updates, "bytes_sent": net.bytes_sent,
                             "bytes_delivered": net.bytes_delivered, "spans": span_mode,
                             "lockstep": "class"}
    if audit:
        stats["max_link_load_ratio"] = net.max_load_ratio
    end = max(t.end for t in run.timings)
    return assemble_result("des", workload, run.timings, memory, peak_flops_per_device,
                           run.algorithms, spans=spans, links=link_table(run, topology, end),
                           extra={"des": stats})
