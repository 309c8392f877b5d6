"""Progress of a long DES run: an up-front estimate and a progress bar on standard error.

The engine calls a :class:`Progress` at the start (:meth:`Progress.start`, with the trace),
every few thousand events (:meth:`Progress.update`, simulated seconds and events so far) and
at the end (:meth:`Progress.stop`). :class:`ConsoleProgress`, what ``ddlsim predict --engine
des`` uses, prints nothing for runs that end within :data:`QUIET_S` seconds; a run estimated
to take longer than :data:`ESTIMATE_ABOVE_S` is announced with its estimate first; a run
still going after :data:`QUIET_S` seconds shows a rich progress bar (simulated time, events,
elapsed) on a terminal, and on a pipe or a CI log one line each tenth of the estimate (at
least every :data:`LINE_EVERY_S` seconds). The estimate is the trace's rank-ops (:func:`ddlsim.limits.trace_ops`) times
:data:`SECONDS_PER_RANK_OP`.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

__all__ = ["Progress", "ConsoleProgress", "estimate_seconds", "SECONDS_PER_RANK_OP",
           "FASTEST_SECONDS_PER_RANK_OP"]

#: Seconds per rank-op (Σ ranks × ops per step) of the DES on one core, measured on
#: 2026-11-28 (``python -c pass`` 0.08–0.10 s): issue 13's targets, GPT-3 175B on 1,024 A100s
#: (3.76·10^6 rank-ops in 2.0 s of CPU, 0.53 µs), on 16,384 (6.02·10^7 in 24.4 s, 0.41 µs),
#: Megatron-LM 1T on 3,072 (7.55·10^7 in 45.7 s, 0.61 µs), and ``examples/
#: llama2-70b-64-h100.yaml`` (TP4 inside 8-GPU nodes, 20 virtual stages: 7.22·10^6 in 28.0 s,
#: 3.9 µs). A run is estimated between the fastest and the slowest of them.
SECONDS_PER_RANK_OP = 4e-6
FASTEST_SECONDS_PER_RANK_OP = 0.4e-6
#: A run that has not ended after this many wall seconds shows a progress bar.
QUIET_S = 3.0
#: A run estimated to take longer than this is announced before it starts.
ESTIMATE_ABOVE_S = 10.0
#: Off a terminal, the most wall seconds between two progress lines.
LINE_EVERY_S = 30.0


class Progress(Protocol):
    def start(self, workload: Any) -> None: ...
    def update(self, sim_time_s: float, events: int) -> None: ...
    def stop(self) -> None: ...


def estimate_seconds(workload: Any) -> tuple[float, int]:
    """(estimated wall seconds of the DES run at the slowest measured pace, rank-ops of
    ``workload``)."""
    from ...limits import trace_ops

    rank_ops = trace_ops(workload)[1]
    return rank_ops * SECONDS_PER_RANK_OP, rank_ops


class ConsoleProgress:
    """An estimate and a progress bar on ``stream`` (standard error by default)."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self._t0 = 0.0
        self._bar = None
        self._task = None
        self._estimate = 0.0
        self._next_line = QUIET_S

    def start(self, workload: Any) -> None:
        self._t0 = time.perf_counter()
        self._estimate, rank_ops = estimate_seconds(workload)
        if self._estimate > ESTIMATE_ABOVE_S:
            fast = _duration(rank_ops * FASTEST_SECONDS_PER_RANK_OP)
            print(f"note: the discrete-event run of {workload.world_size:,} ranks executes "
                  f"{rank_ops:,} rank-ops; estimated {fast} to {_duration(self._estimate)} on "
                  "one core", file=self.stream, flush=True)

    def update(self, sim_time_s: float, events: int) -> None:
        elapsed = time.perf_counter() - self._t0
        if self._bar is None and not self.stream.isatty():
            if elapsed >= self._next_line:
                self._line(elapsed, sim_time_s, events)
            return
        if self._bar is None:
            if elapsed < QUIET_S:
                return
            from rich.console import Console
            from rich.progress import (BarColumn, Progress as Bar, TextColumn,
                                       TimeElapsedColumn)
            self._bar = Bar(TextColumn("DES"), BarColumn(), TextColumn("{task.description}"),
                            TimeElapsedColumn(), console=Console(file=self.stream),
                            transient=True)
            self._bar.start()
            self._task = self._bar.add_task("", total=max(self._estimate, elapsed))
        self._bar.update(self._task, completed=min(elapsed, 0.99 * max(self._estimate, elapsed)),
                         total=max(self._estimate, elapsed),
                         description=f"simulated {sim_time_s:.3f} s, {events:,} events")

    def _line(self, elapsed: float, sim_time_s: float, events: int) -> None:
        """One plain progress line (off a terminal), then the time of the next one."""
        of = f" of an estimated {_duration(self._estimate)}" if self._estimate else ""
        print(f"DES: {_duration(elapsed)} elapsed{of}; simulated {sim_time_s:.3f} s, "
              f"{events:,} events", file=self.stream, flush=True)
        step = min(max(self._estimate / 10, QUIET_S), LINE_EVERY_S)
        self._next_line = elapsed + step

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"
