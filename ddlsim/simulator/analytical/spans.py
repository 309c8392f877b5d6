"""Timelines of the analytical engine: the spans of each class's representative rank.

The recorder only observes: the engine calls it with the start and end it has just computed
for an instruction (general loop, side-stream replay) or a step (sweep solver), so recording
changes no timing. Fused instructions are laid out inside the interval the engine gave them:

* a macro (a fused compute-stream run) by its parts' durations, consecutive parts of one kind
  joined, the last part ending exactly where the engine ended the macro;
* a pipe of k (backward segment, gradient bucket) pairs as k segments on the compute stream
  and k collectives on the bucket stream, ``D_i = max(D_{i-1}, S + i·c) + a`` (the recurrence
  whose closed form the engine uses; the last bucket ends where the engine's does);
* a swept step as its compute-stream instructions laid out from ``max(previous end,
  arrival)``, the last ending at the step's end; its received and sent transfers as spans of
  their own (kind ``recv``/``send``, as in the DES).

Span names are block names (``F0``, ``B0``, ``update``); kinds are ``compute``,
``optimizer``, the group kind of a collective (``dp``, ``tp``, ``pp``, ``ep``, …), ``send``
and ``recv``.
"""

from __future__ import annotations

import numpy as np

from ...workloads.trace import Workload
from ..result import Span
from .engine import _COLL, _COMPUTE, _MACRO, _PIPE, _pipe_buckets, _step_arrays

__all__ = ["SpanRecorder"]


class SpanRecorder:
    """Collects ``(stream id, name, start, end, kind)`` per class while the engine runs.

    Parameters
    ----------
    programs : the engine's resolved programs, per class ``(steps, blocks)``.
    """

    def __init__(self, programs: list):
        self.programs = programs
        self.out: list[list[tuple]] = [[] for _ in programs]
        self._names: dict[int, tuple[str, ...]] = {}
        self._layouts: dict[tuple[int, str], list[tuple]] = {}

    def add(self, ci: int, sid: int, name: str, start: float, end: float, kind: str) -> None:
        """One span of class ``ci`` (empty ones are dropped)."""
        if end > start:
            self.out[ci].append((sid, name, start, end, kind))

    def instr(self, ci: int, name: str, ins: tuple, start: float, end: float,
              free: list) -> None:
        """A non-point-to-point instruction the general loop timed at [start, end); ``free``:
        the class's stream free times before a pipe's buckets are booked."""
        code = ins[0]
        if code == _MACRO:
            self._macro(ci, name, ins, start, end)
        elif code == _PIPE:
            self._pipe_compute(ci, name, ins, start, end)
            self._buckets(ci, name, ins[5], start, free)
        elif code in (_COMPUTE, _COLL):
            self.add(ci, ins[1], name, start, end, ins[4])

    def side(self, nodes, n: int):
        """The hook the engine's side-stream replay of swept step ``n`` calls for each
        instruction off the compute stream (bucket pipes, local collectives)."""
        ci = int(nodes.cls[n])
        name = self._block_names(ci)[int(nodes.blk[n])]

        def hook(ins: tuple, start: float, end: float, free: list) -> None:
            if ins[0] == _PIPE:
                self._buckets(ci, name, ins[5], start, free)
            else:
                self.add(ci, ins[1], name, start, end, ins[4])
        return hook

    def swept(self, nodes, e: np.ndarray, prev: np.ndarray, arrive: np.ndarray,
              done: np.ndarray) -> None:
        """The compute stream and transfers of every step the sweep solver timed."""
        e_l, prev_l, arr_l = e.tolist(), prev.tolist(), arrive.tolist()
        src = nodes.src.tolist()
        cls, blk, key = nodes.cls.tolist(), nodes.blk.tolist(), nodes.key.tolist()
        for n in np.flatnonzero(done).tolist():
            ci = cls[n]
            name = self._block_names(ci)[blk[n]]
            fast = nodes.fast[key[n]]
            layout, recv_sid, send_sid = self._layout(ci, name)
            out, end = self.out[ci], e_l[n]
            if src[n] >= 0:
                out.append((recv_sid, name, e_l[src[n]], arr_l[n], "recv"))
            t = max(prev_l[n], arr_l[n])
            out += [(0, name, t + a, end if b is None else t + b, kind) for a, b, kind in layout]
            if fast[1] is not None and fast[1][1] > 0:
                out.append((send_sid, name, end, end + fast[1][1], "send"))

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

    # ------------------------------------------------------------------ layouts
    def _block_names(self, ci: int) -> tuple[str, ...]:
        names = self._names.get(ci)
        if names is None:
            names = self._names[ci] = _step_arrays(self.programs[ci][0])[0]
        return names

    def _layout(self, ci: int, name: str) -> tuple[list[tuple], int, int]:
        """The compute-stream spans of a swept block relative to its start — (start offset,
        end offset or None for the block's end, kind) — with its recv and send streams (laid
        out once per class and block, as :meth:`_macro` and :meth:`_pipe_compute` would)."""
        hit = self._layouts.get((ci, name))
        if hit is None:
            instrs = self.programs[ci][1][name][0]
            probe = SpanRecorder([None])
            t = 0.0
            for ins in instrs:
                if ins[1] == 0 and ins[0] in (_MACRO, _PIPE):
                    lay = probe._macro if ins[0] == _MACRO else probe._pipe_compute
                    lay(0, name, ins, t, t + ins[3])
                    t += ins[3]
            rows = [(a, b, kind) for _, _, a, b, kind in probe.out[0]]
            if rows:
                rows[-1] = rows[-1][:1] + (None,) + rows[-1][2:]
            hit = self._layouts[ci, name] = (rows, instrs[0][1], instrs[-1][1])
        return hit

    def _macro(self, ci: int, name: str, ins: tuple, start: float, end: float) -> None:
        """A fused run laid out by its parts, consecutive parts of one kind joined."""
        kind, t0, t = None, start, start
        for part in ins[7]:
            if part[4] != kind:
                if kind is not None:
                    self.add(ci, 0, name, t0, t, kind)
                kind, t0 = part[4], t
            t += part[3]
        if kind is not None:
            self.add(ci, 0, name, t0, end, kind)

    def _pipe_compute(self, ci: int, name: str, ins: tuple, start: float, end: float) -> None:
        m, _, k = ins[5]
        for i in range(k):
            seg_end = end if i == k - 1 else start + (i + 1) * m[3]
            self._macro(ci, name, m, start + i * m[3], seg_end)

    def _buckets(self, ci: int, name: str, x: tuple, start: float, free: list) -> None:
        """The k collectives of a pipe on its stream, ending where the engine's closed form
        (:func:`~.engine._pipe_buckets`) ends them."""
        m, c, k = x
        seg, a, cs = m[3], c[3], c[1]
        after = list(free)
        _pipe_buckets(x, start, after, [""] * len(free))
        d = free[cs]
        for i in range(1, k + 1):
            b = max(d, start + i * seg)
            d = after[cs] if i == k else b + a
            self.add(ci, cs, name, b, d, c[4])
