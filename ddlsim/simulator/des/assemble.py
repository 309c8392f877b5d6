"""Turn a raw :class:`~.engine.DESRun` into the engines' common :class:`~..result.Result`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config import RunConfig
from ...workloads.trace import Workload
from ..costs import CostModel
from ..result import Breakdown, Result, Span
from .engine import DESRun

__all__ = ["build_result", "link_table", "rank_spans"]

_KINDS = ("dp", "tp", "pp", "ep")


def rank_spans(run: DESRun, workload: Workload, every_rank: bool) -> tuple[Span, ...]:
    """Spans of every rank (``every_rank``) or of each class's first rank, sorted by rank,
    stream, start."""
    names = {v: k for k, v in run.streams.items()}
    out = []
    for cls, spans in zip(workload.classes, run.spans):
        if not spans:
            continue
        ranks = cls.ranks if every_rank else cls.ranks[:1]
        for r in ranks:
            out += [Span(int(r), names[sid], name, start, end, kind, cls.name)
                    for sid, name, start, end, kind in spans]
    out.sort(key=lambda s: (s.rank, s.stream, s.start_s, s.end_s, s.name))
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
        u, v = topology.edges[e]
        rows.append({"link": f"{u}->{v}", "kind": topology.edge_kind[e],
                     "bandwidth_Bps": float(bw[e]), "busy_s": float(busy[e]),
                     "utilisation": float(util[i]), "bytes": float(carried[e])})
    return tuple(rows)


def build_result(cfg: RunConfig, workload: Workload, cost: CostModel, mem, run: DESRun,
                 topology, spans: tuple[Span, ...], span_mode: str, audit: bool) -> Result:
    """The :class:`Result` of a DES run, with the analytical engine's breakdown rules."""
    timings = run.timings
    crit = max(range(len(timings)), key=lambda i: timings[i].end)
    T = timings[crit]
    exposed = {k: T.exposed.get(k, 0.0) for k in _KINDS}
    exposed.update({k: v for k, v in T.exposed.items() if k not in _KINDS and v})
    net = run.network
    stats: dict[str, Any] = {"events": run.events, "flows": net.flows_started,
                             "rate_updates": net.rate_updates, "bytes_sent": net.bytes_sent,
                             "bytes_delivered": net.bytes_delivered, "spans": span_mode,
                             "lockstep": "class"}
    if audit:
        stats["max_link_load_ratio"] = net.max_load_ratio
    return Result(
        engine="des",
        iteration_time_s=T.end,
        breakdown=Breakdown(T.compute, T.optimizer, exposed, T.bubble),
        comm_bytes={k: T.comm_bytes.get(k, 0.0) for k in _KINDS},
        memory=mem,
        samples=int(workload.meta["samples"]),
        tokens=int(workload.meta["tokens"]),
        model_flops=float(workload.meta["model_flops"]),
        hardware_flops=sum(t.flops * len(c.ranks) for t, c in zip(timings, workload.classes)),
        world_size=workload.world_size,
        peak_flops_per_device=cfg.system.device.peak_flops[cfg.train.dtype],
        critical_class=workload.classes[crit].name,
        per_class_time_s={c.name: t.end for c, t in zip(workload.classes, timings)},
        algorithms=dict(cost.algorithms),
        spans=spans,
        links=link_table(run, topology, T.end),
        extra={"des": stats},
    )
