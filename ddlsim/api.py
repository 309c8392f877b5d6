"""The Python API: config → trace → engine → result."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from .config import RunConfig, load_config
from .errors import ConfigError, PlanDoesNotFitError
from .limits import Limits, check_work
from .simulator.result import Breakdown, Result
from .units import format_bytes
from .workloads.memory import MemoryBreakdown
from .workloads.trace import Workload

__all__ = ["build_workload", "predict", "memory_per_device", "check_memory"]

Engine = Literal["analytical", "des"]


def build_workload(cfg: RunConfig) -> Workload:
    """The workload trace of one iteration of ``cfg``."""
    if cfg.model.architecture == "gpt":
        from .workloads.gpt import build_gpt_workload
        return build_gpt_workload(cfg)
    raise ConfigError(f"model.architecture = {cfg.model.architecture!r} has no workload generator; "
                      "allowed: gpt")


def memory_per_device(cfg: RunConfig) -> MemoryBreakdown:
    """The memory of the most loaded device (largest total over pipeline stages)."""
    from .workloads.gpt import gpt_memory
    return max(gpt_memory(cfg), key=lambda m: m.total)


def check_memory(cfg: RunConfig, mem: MemoryBreakdown) -> None:
    """Raise :class:`PlanDoesNotFitError` with the breakdown if the plan does not fit."""
    if mem.fits:
        return
    p = cfg.parallel
    parts = ", ".join(f"{k} {format_bytes(getattr(mem, k))}"
                      for k in ("weights", "gradients", "optimizer", "activations", "other"))
    raise PlanDoesNotFitError(
        f"the plan does not fit in memory: pipeline stage {mem.stage} needs "
        f"{format_bytes(mem.total)} per device but {cfg.system.device.name} has "
        f"{format_bytes(mem.capacity)} ({parts}). Try a larger tensor_model_parallel_size "
        f"(now {p.tp}) or pipeline_model_parallel_size (now {p.pp}), zero_stage > {p.zero_stage}, "
        f"recompute = 'selective' or 'full' (now {cfg.train.recompute!r}), or a smaller "
        f"micro_batch_size (now {cfg.train.micro_batch_size}).", mem)


def predict(config: RunConfig | dict | str | Path, engine: Engine = "analytical", *,
            calibration=None, backend: str | None = None, check_fit: bool = True,
            limits: Limits | None = None, **engine_options) -> Result:
    """Predict one training iteration of ``config``.

    Parameters
    ----------
    config : a :class:`RunConfig`, a mapping, or a path to a YAML/JSON run config.
    engine : ``"analytical"`` (closed forms, milliseconds) or ``"des"`` (flow-level discrete
        events with link sharing).
    calibration : a :class:`ddlsim.calibration.CalibrationProfile` (or a path to one) whose
        fitted costs replace the preset constants.
    backend : with a profile, the communication backend to use, or ``"auto"`` for the fastest
        per collective and message size.
    check_fit : raise :class:`PlanDoesNotFitError` if the plan exceeds device memory.
    limits : work budgets (default :class:`ddlsim.limits.Limits`()); a run over one is refused
        with :class:`~ddlsim.errors.WorkTooLargeError` before it starts.
    """
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    check_work(cfg, engine, limits)
    mem = memory_per_device(cfg)
    if check_fit:
        check_memory(cfg, mem)
    if isinstance(calibration, (str, Path)):
        from .calibration import CalibrationProfile
        calibration = CalibrationProfile.load(calibration)
    if engine not in ("analytical", "des"):
        raise ConfigError(f"engine = {engine!r} is not an engine; allowed: analytical, des")
    workload = build_workload(cfg)
    check_work(cfg, engine, limits, workload)  # the trace's ops, counted before the run
    result = _run_engine(engine, cfg, workload, mem, calibration, backend, None, engine_options)
    if calibration is None:
        return result
    return _with_calibration(engine, cfg, workload, mem, calibration, backend, result,
                             engine_options)


def _run_engine(engine: str, cfg: RunConfig, workload: Workload, mem: MemoryBreakdown,
                profile, backend: str | None, bound: str | None, options: dict) -> Result:
    from .simulator.costs import CostModel
    cost = CostModel(cfg.system, workload, cfg.parallel, profile=profile, backend=backend,
                     bound=bound)
    if engine == "des":
        from .simulator.des import simulate_des
        return simulate_des(cfg, workload, cost, mem, **options)
    from .simulator.analytical.engine import simulate_analytical
    timings = simulate_analytical(workload, cost)
    return _result("analytical", cfg, workload, cost, timings, mem)


def _with_calibration(engine: str, cfg: RunConfig, workload: Workload, mem: MemoryBreakdown,
                      profile, backend: str | None, result: Result, options: dict) -> Result:
    """Add the prediction interval propagated from the profile's parameter intervals, and,
    with several backends and ``backend: auto``, each single backend's time and the gain of
    mixing them (MCR-DL)."""
    from dataclasses import replace

    from .calibration.schema import CalibrationError

    quiet = {k: v for k, v in options.items() if k != "trace_path"}
    extra = dict(result.extra)
    interval = None
    if not any("calibrated" in v for v in result.algorithms.values()):
        extra["interval_note"] = ("the profile covers none of this workload's collectives "
                                  "(backend, operation and intra/inter-node scope): the preset's "
                                  f"constants were used; it has backends {list(profile.backends)}")
        return replace(result, extra=extra)
    try:
        lo = _run_engine(engine, cfg, workload, mem, profile, backend, "lo", quiet)
        hi = _run_engine(engine, cfg, workload, mem, profile, backend, "hi", quiet)
        interval = (lo.iteration_time_s, hi.iteration_time_s)
    except CalibrationError as exc:
        extra["interval_note"] = f"no interval: {exc}"
    if backend in (None, "auto") and len(profile.backends) > 1:
        single = {b: _run_engine(engine, cfg, workload, mem, profile, b, None, quiet).iteration_time_s
                  for b in profile.backends}
        best = min(single, key=single.get)
        extra["single_backend_time_s"] = single
        extra["gain_over_best_single_backend"] = single[best] / result.iteration_time_s - 1
        extra["best_single_backend"] = best
    extra["calibration"] = {"backends": list(profile.backends)}
    return replace(result, interval_s=interval, extra=extra)


def _result(engine: str, cfg: RunConfig, workload: Workload, cost, timings, mem) -> Result:
    crit = max(range(len(timings)), key=lambda i: timings[i].end)
    T = timings[crit]
    kinds = ("dp", "tp", "pp", "ep")
    exposed = {k: T.exposed.get(k, 0.0) for k in kinds}
    exposed.update({k: v for k, v in T.exposed.items() if k not in kinds and v})
    hw_flops = sum(t.flops * len(c.ranks) for t, c in zip(timings, workload.classes))
    comm = {k: T.comm_bytes.get(k, 0.0) for k in kinds}
    dtype = cfg.train.dtype
    return Result(
        engine=engine,
        iteration_time_s=T.end,
        breakdown=Breakdown(T.compute, T.optimizer, exposed, T.bubble),
        comm_bytes=comm,
        memory=mem,
        samples=int(workload.meta["samples"]),
        tokens=int(workload.meta["tokens"]),
        model_flops=float(workload.meta["model_flops"]),
        hardware_flops=hw_flops,
        world_size=workload.world_size,
        peak_flops_per_device=cfg.system.device.peak_flops[dtype],
        critical_class=workload.classes[crit].name,
        per_class_time_s={c.name: t.end for c, t in zip(workload.classes, timings)},
        algorithms=dict(cost.algorithms),
    )
