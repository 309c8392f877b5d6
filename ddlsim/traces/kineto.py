"""Read a PyTorch profiler (Kineto) trace of one training step into measured compute times.

The trace is the Chrome JSON that ``torch.profiler.profile(with_stack=True)`` exports
(``prof.export_chrome_trace``): ``traceEvents`` of complete events (``ph: "X"``, ``ts`` and
``dur`` in microseconds) whose ``cat`` is ``cpu_op`` (ATen ops and autograd functions),
``user_annotation`` (``record_function`` ranges such as ``Optimizer.step#AdamW.step``) and
``python_function`` (with ``with_stack``: the Python call stack, ``nn.Module: Block_3`` for
module calls). Chrome JSON is plain JSON, so the standard ``json`` module reads it
(HolisticTraceAnalysis reads the same events into pandas for whole-trace analyses; ddlsim
needs the outermost ops and their module stack, which a single pass finds).

Every outermost op of the step is given a :class:`~.kineto_labels.Label` (phase, part of the
model, whether it lies inside a transformer layer) from its module stack; a backward op
(``autograd::engine::evaluate_function: …``) takes the label of the forward op that created it,
matched by the autograd ``Sequence number`` both carry (:mod:`.kineto_labels`). Each op is
charged its duration **plus the idle time before it** since the previous outermost op ended
(the host's dispatch gaps), so the charges add up to the measured step exactly. With device
activity (``kernel``, ``gpu_memcpy``, ``gpu_memset`` events) the device's timeline is charged
instead, each kernel labelled by the CPU op that launched it (``External id``). With a
:class:`~ddlsim.traces.kineto_overhead.ProfilerOverhead` (measured on microbenchmarks), each
op's charge is less the profiler's own cost of the events that started within it, so the
charges add up to the step as it runs unprofiled. A trace without module events (no
``with_stack``) whose blocks FSDP2 shards is placed by FSDP2's per-block ranges and the ops'
names instead (:mod:`.kineto_fsdp`). docs/traces.md describes the rules.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from ..errors import ConfigError
from .kineto_labels import EPS_US, Label, LabelSweep, ModuleRules, event_args, visit
from .kineto_overhead import EventCosts, ProfilerOverhead, check_settings, overhead_between

__all__ = ["MeasuredStep", "read_kineto", "parse_kineto"]

@dataclass(frozen=True)
class MeasuredStep:
    """The compute of one profiled training step, by :class:`Label`.

    Attributes
    ----------
    seconds : total seconds charged to each label over the step (s).
    layers : transformer-layer instances the forward pass called.
    microbatches : forward passes of the step (calls of the outermost module).
    window_s : the step's measured span, first op start to last op end (s).
    communication_s : seconds of communication ops seen (excluded from ``seconds``).
    unlabelled_s : seconds of ops that fit no label (carried into the next op's charge).
    input_shape : ``(batch, sequence)`` of the token embedding, when shapes were recorded.
    source : where the trace came from.
    ops : outermost ops of the step.
    overhead_s : the profiler's own cost removed from the charges (s; 0 without a
        :class:`~ddlsim.traces.kineto_overhead.ProfilerOverhead`).
    overhead_events : the events whose cost was removed.
    placement : the rule that placed the ops: ``modules`` (their ``nn.Module`` stack) or
        ``fsdp2-ranges`` (FSDP2's per-block ranges and op names, :mod:`.kineto_fsdp`).
    """

    seconds: MappingProxyType
    layers: int
    microbatches: int
    window_s: float
    communication_s: float = 0.0
    unlabelled_s: float = 0.0
    input_shape: tuple[int, int] | None = None
    source: str = ""
    ops: int = field(default=0)
    overhead_s: float = 0.0
    overhead_events: int = 0
    placement: str = "modules"

    @property
    def compute_s(self) -> float:
        """Seconds charged to labels (the step less its communication) (s)."""
        return float(sum(self.seconds.values()))

    @property
    def step_s(self) -> float:
        """The step's span less the profiler's own cost removed from it (s)."""
        return self.window_s - self.overhead_s


def read_kineto(path: str | Path, rules: ModuleRules | None = None,
                overhead: ProfilerOverhead | None = None) -> MeasuredStep:
    """Read a Kineto/Chrome JSON trace file of one training step.

    Parameters
    ----------
    path : the ``.json`` file ``torch.profiler`` exported (``.json.gz`` too).
    rules : module class patterns (:class:`ModuleRules`; the defaults cover GPT-2 and Llama).
    overhead : the profiler's cost per event on the profiled machine, removed from the
        charges (``benchmarks/kineto_overhead.py`` measures it); None keeps the durations
        as profiled.

    Returns
    -------
    MeasuredStep
        Seconds per label, layer and micro-batch counts.
    """
    path = Path(path)
    try:
        if path.suffix == ".gz":
            import gzip
            text = gzip.open(path, "rt", encoding="utf-8").read()
        else:
            text = path.read_text(encoding="utf-8")
        doc = json.loads(text)
    except OSError as e:
        raise ConfigError(f"Kineto trace {str(path)!r}: cannot be read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, EOFError) as e:
        raise ConfigError(f"Kineto trace {str(path)!r}: cannot be read as JSON ({e})") from None
    return parse_kineto(doc, rules, source=str(path), overhead=overhead)


def parse_kineto(doc: object, rules: ModuleRules | None = None, source: str = "the trace",
                 overhead: ProfilerOverhead | None = None) -> MeasuredStep:
    """:func:`read_kineto` on an already parsed JSON document.

    Parameters
    ----------
    doc : the trace's JSON: a mapping with ``traceEvents`` (or the event list itself).
    rules : module class patterns (:class:`ModuleRules`).
    source : how errors name the trace.
    overhead : as :func:`read_kineto`'s.

    Returns
    -------
    MeasuredStep
    """
    rules = rules or ModuleRules()
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ConfigError(f"Kineto trace {source}: no 'traceEvents' list; expected the JSON "
                          "that torch.profiler's export_chrome_trace writes")
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
             and _finite(e.get("ts")) and _finite(e.get("dur")) and e["dur"] >= 0]
    modules = [e for e in spans if e.get("cat") == "python_function"
               and str(e.get("name", "")).startswith("nn.Module: ")]
    placement = None
    if not modules:   # no with_stack: FSDP2's per-block ranges place the ops, or nothing does
        from .kineto_fsdp import place_by_fsdp
        placement = place_by_fsdp(spans, source)
    return _measure(spans, modules, rules, source, overhead, placement)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _overlap(lo: float, hi: float, intervals: list[tuple[float, float]]) -> float:
    """Length of ``[lo, hi]`` covered by ``intervals`` (sorted, disjoint)."""
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in intervals if a < hi and b > lo)


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _measure(spans: list, modules: list, rules: ModuleRules, source: str,
             overhead: ProfilerOverhead | None, placement=None) -> MeasuredStep:
    ops = [e for e in spans if e.get("cat") == "cpu_op"
           or (e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("Optimizer."))]
    if not ops:
        raise ConfigError(f"Kineto trace {source}: no cpu_op events; was the CPU activity "
                          "profiled (activities=[ProfilerActivity.CPU])?")
    main = Counter(e.get("tid") for e in ops).most_common(1)[0][0]
    comm = _merged([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in spans
                    if e.get("cat") in ("cpu_op", "user_annotation")
                    and rules.match("communication", str(e.get("name", "")))])
    sw = LabelSweep(rules, main=main)
    if placement is not None:
        sw.placed, sw.layers, sw.roots = placement.labels, set(placement.layers), placement.roots
    for e in sorted(modules + ops, key=lambda e: (float(e["ts"]), -float(e["dur"]),
                                                  e.get("cat") != "python_function")):
        visit(sw, e)
    if not sw.layers:
        raise ConfigError(f"Kineto trace {source}: no transformer layer among the module "
                          f"classes (layer pattern {rules.layer!r}); give the layer class "
                          "with --layer-module REGEX")
    kernels = [e for e in spans if e.get("cat") in _DEVICE]
    if kernels:
        if overhead is not None:
            raise ConfigError(f"Kineto trace {source}: it has device activity, whose kernel "
                              "times the host profiler's per-event cost does not stretch; "
                              "the profiler-overhead correction is for CPU-only traces")
        return _charge(sw, _device_units(sw, kernels, rules), source)
    if overhead is None:
        return _charge(sw, comm, source)
    check_settings(ops, overhead, source)
    return _charge(sw, comm, source, EventCosts((e for e in spans if e.get("tid") == main),
                                                overhead))


_DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")


def _device_units(sw: LabelSweep, kernels: list, rules: ModuleRules) -> list:
    """With device activity, the device's timeline is the step: every kernel, copy and
    memset takes the label of the CPU op that launched it (matched by ``External id``);
    communication kernels (NCCL's) are communication."""
    units, comm = [], []
    for k in sorted(kernels, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
        ts, end = float(k["ts"]), float(k["ts"]) + float(k["dur"])
        label = sw.ext_label.get(event_args(k).get("External id"))
        if label == "comm" or rules.match("communication", str(k.get("name", ""))):
            comm.append((ts, end))
        else:
            units.append((ts, end, label))
    if not units:
        raise ConfigError("Kineto trace: its device activity is communication only; nothing "
                          "to measure compute from")
    sw.units = units
    return _merged(comm)


def _charge(sw: LabelSweep, comm: list, source: str, costs: EventCosts | None = None
            ) -> MeasuredStep:
    """Charge each outermost op its duration and the idle time before it; idle time spent
    while a communication op runs (on any thread) is communication, not compute. With
    ``costs``, the profiler's cost of the events that started in an op's charged span is
    taken off its charge (never below zero)."""
    seconds: dict[Label, float] = defaultdict(float)
    comm_s = carry = removed = 0.0
    last = sw.units[0][0]
    lo = last - EPS_US
    for ts, end, label in sw.units:
        waiting = _overlap(last, ts, comm) if ts > last else 0.0
        charge = max(0.0, end - max(last, ts)) + max(0.0, ts - last) - waiting
        comm_s += waiting
        last = max(last, end)
        cut = min(charge, overhead_between(costs, lo, last))
        charge, removed, lo = charge - cut, removed + cut, last
        if label == "comm":
            comm_s, carry = comm_s + charge + carry, 0.0
        elif label is None:
            carry += charge
        else:
            seconds[label] += charge + carry
            carry = 0.0
    window = last - sw.units[0][0]
    events = 0 if costs is None else costs.between(sw.units[0][0] - EPS_US, last)[1]
    return MeasuredStep(MappingProxyType({k: v * 1e-6 for k, v in sorted(seconds.items())}),
                        len(sw.layers), max(sw.roots, 1), window * 1e-6, comm_s * 1e-6,
                        carry * 1e-6, sw.shape, source, len(sw.units), removed * 1e-6, events,
                        "modules" if sw.placed is None else "fsdp2-ranges")
