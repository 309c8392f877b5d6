"""The PyTorch profiler's own cost per recorded event, removed from a profiled step.

A CPU profile's durations include the profiler's instrumentation: the RecordFunction
callbacks that open and close every ``cpu_op`` event, and with ``with_stack=True`` the
Python tracer's ``PyEval_SetProfile`` hook, which runs on every Python call and return
(pytorch/pytorch#67407; building the stack strings happens after the session). Each such
event costs a roughly constant time on a given machine and torch version, so a step's
profiler time is ``Σ_events cost(category)``. :class:`ProfilerOverhead` holds those costs,
measured on microbenchmarks by ``benchmarks/kineto_overhead.py`` (profiler off and on, with
the events counted), and :func:`overhead_between` charges them to the part of the step where
each event started (docs/traces.md).

The profiler's start-up cost (the first profiled iterations are many times slower,
pytorch/kineto#328; ``torch.profiler.schedule`` warms up for it) is not a per-event cost and
is not removed here: profile a step after a warm-up step.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from ..errors import ConfigError

__all__ = ["CATEGORIES", "ProfilerOverhead", "category_of", "load_overhead",
           "check_settings", "EventCosts", "overhead_between"]

#: event categories with a cost each: ``cpu_op`` (RecordFunction events: ATen ops and
#: ``record_function`` annotations), ``python_function`` (a Python frame's call, ``nn.Module``
#: calls included) and ``c_function`` (a call of a built-in, ``<built-in method …>``)
CATEGORIES = ("cpu_op", "python_function", "c_function")


def category_of(event: dict) -> str | None:
    """The cost category of a Chrome trace event, None for events with no host cost.

    Parameters
    ----------
    event : one ``traceEvents`` entry.

    Returns
    -------
    str or None
        One of :data:`CATEGORIES`.
    """
    cat = event.get("cat")
    if cat in ("cpu_op", "user_annotation"):
        return "cpu_op"
    if cat == "python_function":
        return "c_function" if str(event.get("name", "")).startswith("<built-in") \
            else "python_function"
    return None


@dataclass(frozen=True)
class ProfilerOverhead:
    """Seconds the profiler adds per recorded event, by category, and how it was measured.

    Attributes
    ----------
    seconds_per_event : category (:data:`CATEGORIES`) -> cost of one event (s).
    record_shapes : whether the microbenchmarks recorded shapes (it adds cost per op).
    torch : the torch version measured.
    source : where the figures came from (a file).
    """

    seconds_per_event: MappingProxyType
    record_shapes: bool = False
    torch: str = ""
    source: str = ""


def load_overhead(path: str | Path) -> ProfilerOverhead:
    """Read the JSON that ``benchmarks/kineto_overhead.py`` writes.

    Parameters
    ----------
    path : the file.

    Returns
    -------
    ProfilerOverhead
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"profiler overhead {str(path)!r}: cannot be read "
                          f"({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"profiler overhead {str(path)!r}: cannot be read as JSON ({e})") from None
    costs = doc.get("seconds_per_event") if isinstance(doc, dict) else None
    if not isinstance(costs, dict) or set(costs) != set(CATEGORIES):
        raise ConfigError(f"profiler overhead {str(path)!r}: seconds_per_event = {costs!r}; "
                          f"expected a cost for each of {', '.join(CATEGORIES)} (the file "
                          "benchmarks/kineto_overhead.py writes)")
    for k, v in costs.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not 0 <= v < 1e-3:
            raise ConfigError(f"profiler overhead {str(path)!r}: seconds_per_event.{k} = "
                              f"{v!r}; allowed: seconds from 0 to 1e-3 per event")
    settings = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    return ProfilerOverhead(MappingProxyType({k: float(costs[k]) for k in CATEGORIES}),
                            bool(settings.get("record_shapes", False)),
                            str(doc.get("torch", "")), str(path))


def check_settings(ops, overhead: ProfilerOverhead, source: str) -> None:
    """Refuse costs measured with other profiler settings than the trace's.

    Parameters
    ----------
    ops : the trace's ``cpu_op`` events (with ``record_shapes`` they carry ``Input Dims``).
    overhead : the costs to apply.
    source : how errors name the trace.
    """
    shapes = any(isinstance(e.get("args"), dict) and "Input Dims" in e["args"] for e in ops)
    if shapes != overhead.record_shapes:
        raise ConfigError(f"profiler overhead {overhead.source}: measured with record_shapes="
                          f"{overhead.record_shapes}, but the trace {source} was profiled with "
                          f"record_shapes={shapes}; measure the overhead with the trace's "
                          "settings (benchmarks/kineto_overhead.py"
                          f"{' --record-shapes' if shapes else ''})")


class EventCosts:
    """The profiler's cost of the events of one thread, looked up by time span.

    Parameters
    ----------
    events : the thread's trace events (any categories; those without a cost are skipped).
    overhead : the cost per event.
    """

    def __init__(self, events, overhead: ProfilerOverhead):
        stamped = sorted((float(e["ts"]), overhead.seconds_per_event[c] * 1e6)
                         for e in events if (c := category_of(e)) is not None)
        self.starts = [t for t, _ in stamped]
        self.prefix = [0.0]
        for _, us in stamped:
            self.prefix.append(self.prefix[-1] + us)

    def between(self, lo: float, hi: float) -> tuple[float, int]:
        """Cost (µs) and count of the events that start in ``(lo, hi]`` (µs)."""
        a, b = bisect.bisect_right(self.starts, lo), bisect.bisect_right(self.starts, hi)
        return self.prefix[b] - self.prefix[a], b - a


def overhead_between(costs: EventCosts | None, lo: float, hi: float) -> float:
    """The profiler's cost (µs) of the events starting in ``(lo, hi]``; 0 without costs."""
    return 0.0 if costs is None else costs.between(lo, hi)[0]
