"""Chrome trace / Perfetto JSON of a simulated iteration (opens in https://ui.perfetto.dev).

Layout: one *process* per compute node, one *thread* (track) per rank stream
(``rank 5 · compute``, ``rank 5 · dp``…). Ops that hold a stream are complete (``X``)
events, which never overlap on a track. Point-to-point transfers (which do not hold their
stream and may overlap) and network flows are *async slices* (``b``/``e`` pairs with an id):
P2P on the rank's process, flows (one slice per group instance and phase) on the process of
the instance's first rank's node. Times are microseconds, as the format requires
(Chrome Trace Event Format, Google, 2016: "ts" and "dur" in µs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import DDLSimError
from .result import Span

__all__ = ["build_chrome_trace", "write_chrome_trace", "FlowSlice"]

#: (name, node, start_s, end_s, args)
FlowSlice = tuple[str, int, float, float, dict]

_ASYNC_KINDS = ("send", "recv")


def _us(t: float) -> float:
    return round(t * 1e6, 6)


def _tracks(spans: Sequence[Span], node_of_rank: Sequence[int]) -> dict[tuple[int, str], int]:
    keys = sorted({(s.rank, s.stream) for s in spans},
                  key=lambda k: (int(node_of_rank[k[0]]), k[0], k[1] != "compute", k[1]))
    return {k: i + 1 for i, k in enumerate(keys)}


def _metadata(tracks: dict[tuple[int, str], int], node_of_rank, flows) -> list[dict]:
    nodes = sorted({int(node_of_rank[r]) for r, _ in tracks} | {f[1] for f in flows})
    events: list[dict] = []
    for n in nodes:
        events.append({"ph": "M", "name": "process_name", "pid": n, "args": {"name": f"node {n}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": n, "args": {"sort_index": n}})
    for (rank, stream), tid in tracks.items():
        pid = int(node_of_rank[rank])
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": f"rank {rank} · {stream}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})
    return events


def build_chrome_trace(spans: Sequence[Span], node_of_rank: Sequence[int],
                       flows: Sequence[FlowSlice] = (), meta: dict[str, Any] | None = None) -> dict:
    """The trace as a JSON-ready mapping ``{"traceEvents": [...], ...}``."""
    tracks = _tracks(spans, node_of_rank)
    events = _metadata(tracks, node_of_rank, flows)
    next_id = 1
    for s in spans:
        pid, tid = int(node_of_rank[s.rank]), tracks[(s.rank, s.stream)]
        if s.kind in _ASYNC_KINDS:
            common = {"name": s.name, "cat": s.kind, "id": next_id, "pid": pid, "tid": tid}
            events.append({**common, "ph": "b", "ts": _us(s.start_s)})
            events.append({**common, "ph": "e", "ts": _us(s.end_s)})
            next_id += 1
            continue
        events.append({"name": s.name, "cat": s.kind or "op", "ph": "X", "ts": _us(s.start_s),
                       "dur": _us(s.end_s) - _us(s.start_s), "pid": pid, "tid": tid})
    for name, node, start, end, args in flows:
        common = {"name": name, "cat": "flow", "id": next_id, "pid": int(node), "tid": 0}
        events.append({**common, "ph": "b", "ts": _us(start), "args": args})
        events.append({**common, "ph": "e", "ts": _us(end)})
        next_id += 1
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(meta or {})}


def write_chrome_trace(path: str | Path, trace: dict, force: bool = False) -> Path:
    """Write ``trace`` as JSON to ``path`` with :func:`ddlsim.textio.write_output`: an
    existing file is replaced (atomically) only with ``force``; a symlink is followed, a FIFO
    or device written through, ``-`` is standard output.

    Raises
    ------
    DDLSimError
        When the path cannot be written, or the trace holds a non-finite time.
    """
    from ..textio import write_output

    try:
        text = json.dumps(trace, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise DDLSimError("the trace holds a non-finite time, which JSON cannot carry") from None
    write_output(path, text, force=force, what="--trace file")
    return Path(path)
