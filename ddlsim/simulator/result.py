"""What an engine returns: iteration time with its explanation. Same shape for every engine.

JSON keys (``Result.to_dict``) are stable; see the README's "Output" section.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..workloads.memory import MemoryBreakdown

if TYPE_CHECKING:
    from ..workloads.trace import Workload

__all__ = ["Breakdown", "Result", "Span", "ClassTiming", "EngineRun", "assemble_result",
           "results_frame"]

_KINDS = ("dp", "tp", "pp", "ep")


class ClassTiming:
    """What an engine accumulates for one rank class; :class:`Breakdown` is built from the
    critical class's."""

    __slots__ = ("end", "compute", "optimizer", "exposed", "bubble", "host", "comm_bytes",
                 "flops")

    def __init__(self) -> None:
        self.end = 0.0
        self.compute = 0.0
        self.optimizer = 0.0
        self.exposed: dict[str, float] = defaultdict(float)
        self.bubble = 0.0
        self.host = 0.0
        self.comm_bytes: dict[str, float] = defaultdict(float)
        self.flops = 0.0


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Where the critical rank's iteration time goes. ``compute_s + optimizer_s +
    sum(exposed_comm_s.values()) + bubble_s + host_s == iteration_time_s``; ``host_s`` is
    the device's idle time waiting for the host (its launches, Python and syncs running
    behind the device: the ``host`` stream's ops, docs/compute.md), ``bubble_s`` the rest of
    the idle time (the pipeline's fill and drain, waits for peers)."""

    compute_s: float
    optimizer_s: float
    exposed_comm_s: dict[str, float]
    bubble_s: float
    host_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"compute_s": self.compute_s, "optimizer_s": self.optimizer_s,
                "exposed_comm_s": dict(self.exposed_comm_s),
                "exposed_comm_total_s": sum(self.exposed_comm_s.values()),
                "bubble_s": self.bubble_s, "host_s": self.host_s}


@dataclass(frozen=True, slots=True)
class Span:
    """One op on one rank's stream (DES timelines; the analytical engine's representative
    ranks), with the name of the rank's class."""

    rank: int
    stream: str
    name: str
    start_s: float
    end_s: float
    kind: str = ""
    class_name: str = ""


@dataclass(frozen=True)
class Result:
    """An engine's prediction for one iteration.

    ``comm_bytes`` are the bytes one device of the critical class passes to collectives and
    sends, by group kind (nccl-tests size convention, per iteration).
    """

    engine: str
    iteration_time_s: float
    breakdown: Breakdown
    comm_bytes: dict[str, float]
    memory: MemoryBreakdown | None
    samples: int
    tokens: int
    model_flops: float
    hardware_flops: float
    world_size: int
    peak_flops_per_device: float
    critical_class: str = ""
    per_class_time_s: dict[str, float] = field(default_factory=dict)
    algorithms: dict[str, str] = field(default_factory=dict)
    spans: tuple[Span, ...] = ()
    links: tuple[dict[str, Any], ...] = ()
    interval_s: tuple[float, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    parameter_count: int = 0
    config: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    ddlsim_version: str = __version__

    def __repr__(self) -> str:
        from .result_html import result_repr
        return result_repr(self)

    def _repr_html_(self) -> str:
        """Jupyter's view: a compact table and the breakdown as a stacked bar."""
        from .result_html import result_html
        return result_html(self)

    @property
    def fits(self) -> bool | None:
        """Whether the most loaded device's memory fits its capacity (``False`` for a plan
        predicted with ``check_fit=False`` / ``--allow-oom`` that does not fit; ``None`` when
        the memory is unknown, as for a trace read from Chakra files)."""
        return None if self.memory is None else self.memory.fits

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.iteration_time_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.iteration_time_s

    @property
    def flops_per_device(self) -> float:
        """Achieved hardware FLOP/s per device, recomputation included (Megatron-LM's
        convention, Narayanan et al. 2021 Table 1, which prints it in TFLOP/s)."""
        return self.hardware_flops / self.iteration_time_s / self.world_size

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (Chowdhery et al. 2022, PaLM, Appendix B): model FLOPs
        without recomputation / (time × devices × peak)."""
        return self.model_flops / (self.iteration_time_s * self.world_size * self.peak_flops_per_device)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "engine": self.engine,
            "iteration_time_s": self.iteration_time_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "flops_per_device": self.flops_per_device,
            "breakdown": self.breakdown.to_dict(),
            "comm_bytes": dict(self.comm_bytes),
            "memory_per_device_bytes": None if self.memory is None else self.memory.to_dict(),
            "world_size": self.world_size,
            "critical_class": self.critical_class,
            "per_class_time_s": dict(self.per_class_time_s),
            "algorithms": dict(self.algorithms),
        }
        if self.interval_s is not None:
            d["iteration_time_interval_s"] = list(self.interval_s)
        if self.links:
            d["links"] = list(self.links)
        d.update(self.extra)
        d.update({"fits": self.fits, "parameter_count": self.parameter_count,
                  "samples": self.samples, "tokens": self.tokens,
                  "model_flops": self.model_flops, "hardware_flops": self.hardware_flops,
                  "peak_flops_per_device": self.peak_flops_per_device,
                  "ddlsim_version": self.ddlsim_version, "settings": dict(self.settings),
                  "config": self.config})
        from ..planinfo import plan_of_dump   # the stack's kernels and overlaps, named
        plan = plan_of_dump(self.config)
        if plan is not None:
            d["plan"] = plan
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Result":
        """The result saved by :meth:`to_dict` (``ddlsim predict -f json``), without spans.

        Raises ``KeyError``/``TypeError``/``ValueError`` on a mapping that is not one; see
        :func:`ddlsim.compare.load_result_file` for checked reading.
        """
        from ._result_io import result_from_dict
        return result_from_dict(cls, d)

    def to_row(self) -> dict[str, Any]:
        """One flat row: the run's plan, its predictions and memory, units in column names
        (``iteration_time_s``, ``exposed_comm_dp_s``, ``memory_total_bytes``…)."""
        from ._result_io import result_row
        return result_row(self)

    def to_frame(self):
        """A one-row :class:`pandas.DataFrame` of :meth:`to_row`."""
        return results_frame([self])


@dataclass(frozen=True)
class EngineRun:
    """What the analytical engine returns (the DES's :class:`~.des.DESRun` has the same
    ``timings`` and ``algorithms``): one :class:`ClassTiming` per rank class in workload
    order, the collective algorithm chosen per group, op and size, and the representative
    ranks' spans when recorded."""

    timings: list[ClassTiming]
    algorithms: dict[str, str]
    spans: tuple[Span, ...] = ()


def assemble_result(engine: str, workload: "Workload", timings: Sequence[ClassTiming],
                    memory: MemoryBreakdown | None, peak_flops_per_device: float,
                    algorithms: dict[str, str], **fields: Any) -> Result:
    """The :class:`Result` of an engine's per-class timings; both engines call this.

    Parameters
    ----------
    engine : ``"analytical"`` or ``"des"``.
    workload : the trace that was timed (its classes name the timings; its
        :class:`~ddlsim.workloads.trace.WorkloadMeta` gives samples, tokens, model FLOPs).
    timings : one per rank class, in ``workload.classes`` order (seconds, FLOPs, bytes).
    memory : the most loaded device's memory (None when unknown: a trace read from files).
    peak_flops_per_device : FLOP/s of one device at the workload's dtype (MFU's denominator).
    algorithms : the engine's collective choices (``EngineRun.algorithms``,
        ``DESRun.algorithms``).
    fields : further :class:`Result` fields (``spans``, ``links``, ``extra``).

    Returns
    -------
    Result
        The critical (last-finishing) class's breakdown; exposed communication and
        communication bytes always have the ``dp``, ``tp``, ``pp`` and ``ep`` keys, other
        group kinds (``cp``, ``world``) only when non-zero.
    """
    crit = max(range(len(timings)), key=lambda i: timings[i].end)
    T = timings[crit]
    exposed = {k: T.exposed.get(k, 0.0) for k in _KINDS}
    exposed.update({k: v for k, v in T.exposed.items() if k not in _KINDS and v})
    meta = workload.meta
    return Result(
        engine=engine,
        iteration_time_s=T.end,
        breakdown=Breakdown(T.compute, T.optimizer, exposed, T.bubble, T.host),
        comm_bytes={**{k: T.comm_bytes.get(k, 0.0) for k in _KINDS},
                    **{k: v for k, v in T.comm_bytes.items() if k not in _KINDS and v}},
        memory=memory,
        samples=int(meta.samples),
        tokens=int(meta.tokens),
        model_flops=float(meta.model_flops),
        hardware_flops=sum(t.flops * len(c.ranks) for t, c in zip(timings, workload.classes)),
        world_size=workload.world_size,
        peak_flops_per_device=peak_flops_per_device,
        critical_class=workload.classes[crit].name,
        per_class_time_s={c.name: t.end for c, t in zip(workload.classes, timings)},
        algorithms=dict(algorithms),
        parameter_count=int(meta.parameter_count),
        **fields,
    )


def results_frame(results, labels: list[str] | None = None):
    """A :class:`pandas.DataFrame`, one row per result (:meth:`Result.to_row` columns), with
    a first ``label`` column when ``labels`` are given.

    Parameters
    ----------
    results : iterable of Result
    labels : one name per result, or None.
    """
    import pandas as pd

    results = list(results)
    rows = [r.to_row() for r in results]
    if labels is not None:
        if len(labels) != len(rows):
            raise ValueError(f"results_frame got {len(labels)} labels for {len(rows)} results")
        rows = [{"label": lab, **row} for lab, row in zip(labels, rows)]
    return pd.DataFrame(rows)
