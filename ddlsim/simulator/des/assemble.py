"""Turn a raw :class:`~.engine.DESRun` into the engines' common :class:`~..result.Result`."""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np

from ...gcpause import collector_paused
from ...workloads.trace import Workload
from ..result import Result, Span, assemble_result
from .engine import DESRun

__all__ = ["des_result", "link_table", "rank_spans"]


def rank_spans(run: DESRun, workload: Workload, every_rank: bool) -> tuple[Span, ...]:
    """Spans of every rank (``every_rank``) or of each class's first rank, sorted by rank,
    stream, start (then end and name; ties in the order the engine recorded them).

    Parameters
    ----------
    run : the raw run (per class, its spans as recorded).
    workload : the trace (class names and ranks).
    every_rank : every rank of a class (the same timeline each), else its first rank.

    Returns
    -------
    tuple of Span
        Ordered as above; times in seconds.
    """
    names = {v: k for k, v in run.streams.items()}
    rows = []  # (rank, class index): a rank belongs to one class, so ranks sort the classes
    for c, (cls, spans) in enumerate(zip(workload.classes, run.spans)):
        if spans:
            rows += [(int(r), c) for r in (cls.ranks if every_rank else cls.ranks[:1])]
    rows.sort()
    columns: dict[int, tuple[list, ...]] = {}  # per class, its spans sorted once, by column
    out: list[Span] = []
    # spans are millions of new objects (1.4 million for Megatron-LM 1T on 3,072 GPUs), none
    # in a reference cycle; each full collection their allocation triggers scans the whole
    # heap again (about half the time of building them)
    with collector_paused():
        for r, c in rows:
            cols = columns.get(c)
            if cols is None:
                cols = columns[c] = _sorted_columns(run.spans[c], names)
            n = len(cols[0])
            out += map(Span, repeat(r, n), *cols[:4], cols[4], repeat(workload.classes[c].name, n))
    return tuple(out)


def _sorted_columns(spans: list[tuple[int, str, float, float, str]], stream_names: dict[int, str]
                    ) -> tuple[list, ...]:
    """One class's recorded spans ``(stream id, name, start, end, kind)`` as columns (stream
    name, name, start, end, kind) sorted by stream name, start, end and name, ties in
    recorded order: one stable ``numpy.lexsort`` over ranks of the names and the times
    (the same order as a stable sort of Python tuples: the ranks order as the strings do)."""
    sid, name, start, end, kind = zip(*spans)
    stream_rank = {s: i for i, s in enumerate(sorted(set(sid), key=stream_names.__getitem__))}
    name_rank = {s: i for i, s in enumerate(sorted(set(name)))}
    n = len(spans)
    order = np.lexsort((np.fromiter(map(name_rank.__getitem__, name), np.int64, n),
                        np.array(end), np.array(start),
                        np.fromiter(map(stream_rank.__getitem__, sid), np.int64, n))).tolist()
    take = lambda col: list(map(col.__getitem__, order))  # noqa: E731
    return ([stream_names[i] for i in take(sid)], take(name), take(start), take(end),
            take(kind))




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
