"""A :class:`~.result.Result` as a flat table row, and back from its saved JSON mapping."""

from __future__ import annotations

from typing import Any

from ..workloads.memory import PARTS as _MEMORY, MemoryBreakdown

#: parts a result saved before they were modelled may lack (they were 0 then)
_LATER_PARTS = ("buffers", "context")


def result_row(r) -> dict[str, Any]:
    """Flat columns with units in their names (see :meth:`Result.to_row`)."""
    cfg = r.config or {}
    par, sysc = cfg.get("parallel") or {}, cfg.get("system") or {}
    row: dict[str, Any] = {
        "engine": r.engine,
        "model": (cfg.get("model") or {}).get("name"),
        "system": sysc.get("name"),
        "world_size": r.world_size,
        "tensor_model_parallel_size": par.get("tensor_model_parallel_size"),
        "pipeline_model_parallel_size": par.get("pipeline_model_parallel_size"),
        "data_parallel_size": par.get("data_parallel_size"),
        "parameter_count": r.parameter_count,
        "iteration_time_s": r.iteration_time_s,
    }
    if r.interval_s is not None:
        row["iteration_time_low_s"], row["iteration_time_high_s"] = r.interval_s
    row.update({"samples_per_s": r.samples_per_s, "tokens_per_s": r.tokens_per_s,
                "mfu": r.mfu, "flops_per_device": r.flops_per_device,
                "compute_s": r.breakdown.compute_s, "optimizer_s": r.breakdown.optimizer_s})
    for k, v in r.breakdown.exposed_comm_s.items():
        row[f"exposed_comm_{k}_s"] = v
    row["exposed_comm_total_s"] = sum(r.breakdown.exposed_comm_s.values())
    row["bubble_s"] = r.breakdown.bubble_s
    row["host_s"] = r.breakdown.host_s
    for k, v in r.comm_bytes.items():
        row[f"comm_{k}_bytes"] = v
    for k in (*_MEMORY, "reserved", "total", "capacity"):   # None: memory unknown
        row[f"memory_{k}_bytes"] = None if r.memory is None else getattr(r.memory, k)
    row.update({"memory_stage": None if r.memory is None else r.memory.stage, "fits": r.fits,
                "critical_class": r.critical_class, "ddlsim_version": r.ddlsim_version})
    return row


def result_from_dict(cls, d: dict[str, Any]):
    """Rebuild a Result from :meth:`Result.to_dict`'s mapping.

    Files written before the raw counts were saved (``samples``, ``model_flops``…) are
    rebuilt from the rates: every derived figure (MFU, FLOP/s, tokens/s) comes out the same.
    Files written before 2026-11-29 give the FLOP/s per device as ``tflops_per_device`` in
    TFLOP/s; it is read as such.
    """
    from .result import Breakdown

    T = float(d["iteration_time_s"])
    world = int(d["world_size"])
    b = d["breakdown"]
    m = d["memory_per_device_bytes"]
    peak = float(d.get("peak_flops_per_device", 1.0))
    interval = d.get("iteration_time_interval_s")
    known = {"engine", "iteration_time_s", "samples_per_s", "tokens_per_s", "mfu",
             "flops_per_device", "tflops_per_device", "breakdown", "comm_bytes",
             "memory_per_device_bytes", "world_size", "critical_class", "per_class_time_s",
             "algorithms", "iteration_time_interval_s", "links", "fits", "parameter_count", "samples",
             "tokens", "model_flops", "hardware_flops", "peak_flops_per_device",
             "ddlsim_version", "settings", "config"}
    return cls(
        engine=str(d["engine"]),
        iteration_time_s=T,
        breakdown=Breakdown(float(b["compute_s"]), float(b["optimizer_s"]),
                            {k: float(v) for k, v in b["exposed_comm_s"].items()},
                            float(b["bubble_s"]), float(b.get("host_s", 0.0))),
        comm_bytes={k: float(v) for k, v in d.get("comm_bytes", {}).items()},
        memory=None if m is None else MemoryBreakdown(
            **{k: float(m[k] if k in m or k not in _LATER_PARTS else 0.0) for k in _MEMORY},
            capacity=float(m["capacity"]), stage=int(m.get("stage", 0))),
        samples=int(d.get("samples", round(float(d["samples_per_s"]) * T))),
        tokens=int(d.get("tokens", round(float(d["tokens_per_s"]) * T))),
        model_flops=float(d.get("model_flops", float(d["mfu"]) * T * world * peak)),
        hardware_flops=float(d["hardware_flops"] if "hardware_flops" in d
                             else _flops_per_device(d) * T * world),
        world_size=world,
        peak_flops_per_device=peak,
        critical_class=str(d.get("critical_class", "")),
        per_class_time_s=dict(d.get("per_class_time_s", {})),
        algorithms=dict(d.get("algorithms", {})),
        links=tuple(d.get("links", ())),
        interval_s=tuple(interval) if interval else None,
        extra={k: v for k, v in d.items() if k not in known},
        parameter_count=int(d.get("parameter_count", 0)),
        config=d.get("config"),
        settings=dict(d.get("settings", {})),
        ddlsim_version=str(d.get("ddlsim_version", "unknown")),
    )


def _flops_per_device(d: dict[str, Any]) -> float:
    """FLOP/s per device of a saved result: ``flops_per_device``, or the ``tflops_per_device``
    (TFLOP/s) of files saved before 2026-11-29."""
    if "flops_per_device" in d:
        return float(d["flops_per_device"])
    return float(d["tflops_per_device"]) * 1e12
