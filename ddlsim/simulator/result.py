"""What an engine returns: iteration time with its explanation. Same shape for every engine.

JSON keys (``Result.to_dict``) are stable; see the README's "Output" section.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..workloads.memory import MemoryBreakdown

__all__ = ["Breakdown", "Result", "Span", "ClassTiming"]


class ClassTiming:
    """What an engine accumulates for one rank class; :class:`Breakdown` is built from the
    critical class's."""

    __slots__ = ("end", "compute", "optimizer", "exposed", "bubble", "comm_bytes", "flops")

    def __init__(self) -> None:
        self.end = 0.0
        self.compute = 0.0
        self.optimizer = 0.0
        self.exposed: dict[str, float] = defaultdict(float)
        self.bubble = 0.0
        self.comm_bytes: dict[str, float] = defaultdict(float)
        self.flops = 0.0


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Where the critical rank's iteration time goes. ``compute_s + optimizer_s +
    sum(exposed_comm_s.values()) + bubble_s == iteration_time_s``."""

    compute_s: float
    optimizer_s: float
    exposed_comm_s: dict[str, float]
    bubble_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"compute_s": self.compute_s, "optimizer_s": self.optimizer_s,
                "exposed_comm_s": dict(self.exposed_comm_s),
                "exposed_comm_total_s": sum(self.exposed_comm_s.values()),
                "bubble_s": self.bubble_s}


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
    memory: MemoryBreakdown
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

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.iteration_time_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.iteration_time_s

    @property
    def tflops_per_device(self) -> float:
        """Achieved hardware TFLOP/s per device, recomputation included (Megatron-LM's
        convention, Narayanan et al. 2021 Table 1)."""
        return self.hardware_flops / self.iteration_time_s / self.world_size / 1e12

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
            "tflops_per_device": self.tflops_per_device,
            "breakdown": self.breakdown.to_dict(),
            "comm_bytes": dict(self.comm_bytes),
            "memory_per_device_bytes": self.memory.to_dict(),
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
        return d
