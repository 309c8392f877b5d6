"""Timelines of the analytical engine: the spans of each class's representative rank.

The recorder only observes: the scheduler calls it with the start and end it has just
computed for an instruction, so recording changes no timing. Steps the max-plus solver timed
are replayed through the scheduler from the start the solver gave them, to record their
spans (and nothing else). One span per instruction that holds its stream for a while; its
received and sent transfers are spans of their own (kind ``recv``/``send``, as in the DES).

Span names are block names (``F0``, ``B0``, ``update``); kinds are ``compute``,
``optimizer``, the group kind of a collective (``dp``, ``tp``, ``pp``, ``ep``, …), ``send``
and ``recv``.
"""

from __future__ import annotations

from ...workloads.trace import Workload
from ..result import Span

__all__ = ["SpanRecorder"]


class SpanRecorder:
    """Collects ``(stream id, name, start, end, kind)`` per class while the engine runs.

    Parameters
    ----------
    n_classes : how many rank classes the engine times.
    """

    def __init__(self, n_classes: int):
        self.out: list[list[tuple]] = [[] for _ in range(n_classes)]

    def add(self, ci: int, sid: int, name: str, start: float, end: float, kind: str) -> None:
        """One span of class ``ci`` (empty ones are dropped)."""
        if end > start:
            self.out[ci].append((sid, name, start, end, kind))

    def spans(self, workload: Workload, streams: dict[str, int]) -> tuple[Span, ...]:
        """Every recorded span as :class:`Span` of the class's first rank, sorted by rank,
        stream, start."""
        names = {sid: s for s, sid in streams.items()}
        out = []
        for cls, rows in sorted(zip(workload.classes, self.out), key=lambda x: x[0].ranks[0]):
            r, c = int(cls.ranks[0]), cls.name
            rows = sorted((names[sid], start, end, name, kind)
                          for sid, name, start, end, kind in rows)
            out += [Span(r, stream, name, start, end, kind, c)
                    for stream, start, end, name, kind in rows]
        return tuple(out)
