"""The Python API: config → trace → engine → result."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from .config import RunConfig, load_config
from .errors import ConfigError, DDLSimWarning, PlanDoesNotFitError
from .limits import Limits, check_work
from .simulator.result import Result, assemble_result
from .formatting import format_bytes
from .workloads.memory import PARTS as MEMORY_PARTS, MemoryBreakdown
from .workloads.trace import Workload

__all__ = ["build_workload", "predict", "memory_per_device", "check_memory",
           "memory_alternatives", "memory_owner"]

Engine = Literal["analytical", "des"]


def build_workload(cfg: RunConfig) -> Workload:
    """The workload trace of one iteration of ``cfg``, built by the family that
    ``model.architecture`` names (:mod:`ddlsim.workloads.registry`)."""
    from dataclasses import replace

    from .workloads.onerankcopy import one_rank_copies
    workload = one_rank_copies(cfg, cfg.family.build(cfg))  # MPI's one-rank copies, if any
    if not workload.memory:  # families may leave it to their memory method
        workload = replace(workload, memory=tuple(cfg.family.memory(cfg)))
    return workload


def memory_per_device(cfg: RunConfig) -> MemoryBreakdown:
    """The memory of the most loaded device: the largest total over the rank classes that the
    model's family reports (for a decoder, one per pipeline stage)."""
    return max(cfg.family.memory(cfg), key=lambda m: m.total)


def check_memory(cfg: RunConfig, mem: MemoryBreakdown) -> None:
    """Raise :class:`PlanDoesNotFitError` if the plan does not fit in device memory.

    The message gives the breakdown and the single changes of the plan that are valid for it
    (every config rule holds after the change) and lower the memory per device, each with the
    memory it would give, best first (see :func:`memory_alternatives`).
    """
    if mem.fits:
        return
    parts = ", ".join(f"{k} {format_bytes(getattr(mem, k))}"
                      for k in MEMORY_PARTS)
    options = memory_alternatives(cfg, mem)
    if options:
        advice = "; ".join(f"{change}: {format_bytes(total)} per device"
                           f"{' (fits)' if total <= mem.capacity else ''}"
                           for change, total in options)
        advice = f" Changes valid for this plan, best first: {advice}."
    else:
        advice = " No single change of the plan lowers it; use more devices or a smaller model."
    raise PlanDoesNotFitError(
        f"the plan does not fit in memory: {memory_owner(cfg, mem)} needs "
        f"{format_bytes(mem.total)} per device but {cfg.system.device.name} has "
        f"{format_bytes(mem.capacity)} ({parts}).{advice} Pass --allow-oom (check_fit=False) "
        "to predict anyway.", mem)


def memory_owner(cfg: RunConfig, mem: MemoryBreakdown) -> str:
    """The ranks whose memory ``mem`` is, in words, from the breakdowns ``cfg``'s family
    gives (one per rank class that differs): ``every rank`` when there is one,
    ``pipeline stage s`` when they are the pipeline's stages, otherwise ``the most loaded of
    the n kinds of rank`` (e.g. DLRM ranks holding different embedding shards)."""
    kinds = cfg.family.memory(cfg)
    if len(kinds) <= 1:
        return "every rank"
    if cfg.parallel.pp > 1 and len({m.stage for m in kinds}) == len(kinds):
        return f"pipeline stage {mem.stage}"
    return f"the most loaded of the {len(kinds)} kinds of rank"


def _candidate_changes(cfg: RunConfig) -> list[tuple[str, dict]]:
    """Single plan changes to try, as (description, {section: {key: value}})."""
    p, t = cfg.parallel, cfg.train
    out: list[tuple[str, dict]] = []
    for key, now, extra in _doublings(p):
        out += _doubled(cfg, key, now, extra)
    if p.dp_strategy == "ddp":
        out += [(f"zero_stage = {z} (now {p.zero_stage})", {"parallel": {"zero_stage": z}})
                for z in range(p.zero_stage + 1, 4)]
    elif cfg.dp > 1:
        out.append((f"dp_strategy = 'ddp' with zero_stage = 1 (now {p.dp_strategy!r})",
                    {"parallel": {"dp_strategy": "ddp", "zero_stage": 1}}))
    if p.tp > 1 and not p.sequence_parallel:
        out.append(("sequence_parallel = true", {"parallel": {"sequence_parallel": True}}))
    order = ("none", "selective", "full")
    out += [(f"recompute = {r!r} (now {t.recompute!r})", {"train": {"recompute": r}})
            for r in order[order.index(t.recompute) + 1:]]
    if t.micro_batch_size > 1:
        mbs = t.micro_batch_size // 2 if t.micro_batch_size % 2 == 0 else 1
        out.append((f"micro_batch_size = {mbs} (now {t.micro_batch_size})",
                    {"train": {"micro_batch_size": mbs}}))
    return out


def _doublings(p) -> list[tuple[str, int, dict]]:
    """Mesh axes whose size can double by one key: (key, size now, other keys to set).

    Tensor parallelism doubles as the 1-D scheme (its ``tensor_parallel`` grid follows) or as
    the depth of a 2.5-D grid; a 2-D or 3-D grid has no ×2 step and is left as it is."""
    spec = p.tensor_parallel
    axes = [("pipeline_model_parallel_size", p.pp, {}),
            ("context_parallel_size", p.cp, {})]
    if spec is None:
        axes.insert(0, ("tensor_model_parallel_size", p.tp, {}))
    elif spec.mode == "1d":
        axes.insert(0, ("tensor_model_parallel_size", p.tp,
                        {"tensor_parallel": {"mode": "1d", "size": 2 * p.tp}}))
    elif spec.d is not None:
        axes.insert(0, ("tensor_model_parallel_size", p.tp,
                        {"tensor_parallel": {"mode": spec.mode, "q": spec.q, "d": 2 * spec.d}}))
    return axes


def _doubled(cfg: RunConfig, key: str, now: int, extra: dict) -> list[tuple[str, dict]]:
    """Double the mesh axis ``key`` on the same devices (data parallelism shrinks to the
    ranks left: world / (tp·cp·pp), the mesh's own axes) and on twice the devices when the
    system has them (data parallelism kept)."""
    sizes = {"tensor_model_parallel_size": cfg.parallel.tp, "context_parallel_size":
             cfg.parallel.cp, "pipeline_model_parallel_size": cfg.parallel.pp}
    sizes[key] = new = 2 * now
    world, model = cfg.world_size, sizes["tensor_model_parallel_size"] * \
        sizes["context_parallel_size"] * sizes["pipeline_model_parallel_size"]
    out = []
    if world % model == 0:
        out.append((f"{key} = {new} (now {now}; data_parallel_size {world // model})",
                    {"parallel": {key: new, "data_parallel_size": world // model, **extra}}))
    if 2 * world <= cfg.system.num_devices:
        out.append((f"{key} = {new} (now {now}) on {2 * world} devices",
                    {"parallel": {key: new, "data_parallel_size": cfg.dp, **extra}}))
    return out


def memory_alternatives(cfg: RunConfig, mem: MemoryBreakdown | None = None,
                        limit: int = 5) -> list[tuple[str, float]]:
    """Single changes of ``cfg``'s plan that lower the memory of its most loaded device.

    Each candidate (doubling tensor, context or pipeline parallelism at the same world size,
    or on twice the devices when the system has them, a higher ZeRO stage, sequence
    parallelism, more recomputation, a smaller micro-batch) is built as
    a new config, so every rule of the config holds (no ZeRO-3 with pipelining, divisibility
    of heads, layers and batch); those the config rejects are dropped.

    Parameters
    ----------
    cfg : the plan.
    mem : its memory (computed when None).
    limit : most changes returned.

    Returns
    -------
    list of (description, bytes per device), lowest memory first.
    """
    from pydantic import ValidationError

    base = cfg.model_dump(mode="json")
    now = (mem or memory_per_device(cfg)).total
    found = []
    for text, change in _candidate_changes(cfg):
        data = {k: dict(v) for k, v in base.items()}
        for section, values in change.items():
            data[section].update(values)
        try:
            total = memory_per_device(RunConfig.model_validate(data)).total
        except (ValidationError, ValueError):
            continue
        if total < now:
            found.append((text, total))
    return sorted(found, key=lambda x: x[1])[:limit]


def predict(config: RunConfig | dict | str | Path, engine: Engine = "analytical", *,
            overrides: Sequence[str] = (), calibration=None, backend: str | None = None,
            check_fit: bool = True, record_spans: bool = False, limits: Limits | None = None,
            **engine_options) -> Result:
    """Predict one training iteration of ``config``.

    Parameters
    ----------
    config : a :class:`RunConfig`, a mapping, or a path to a YAML/JSON run config.
    overrides : ``path=value`` items applied to a mapping or file, as the CLI's ``--set``
        (``["parallel.zero_stage=1", "system=dgx-h100"]``); a :class:`RunConfig` is already
        validated: change it with ``model_copy`` instead.
    engine : ``"analytical"`` (closed forms, milliseconds) or ``"des"`` (flow-level discrete
        events with link sharing).
    calibration : a :class:`ddlsim.calibration.CalibrationProfile` (or a path to one) whose
        fitted costs replace the preset constants.
    backend : with a profile, the communication backend to use, or ``"auto"`` for the fastest
        per collective and message size.
    check_fit : raise :class:`PlanDoesNotFitError` if the plan exceeds device memory; when
        False the result is returned with ``fits`` False.
    record_spans : fill ``Result.spans`` with the timeline of each rank class's first rank
        (for ``ddlsim.plots.draw_timeline``; the DES records spans by default, see its
        ``spans`` option).
    limits : work budgets (default :class:`ddlsim.limits.Limits`()); a run over one is refused
        with :class:`~ddlsim.errors.WorkTooLargeError` before it starts.
    engine_options : DES options (``trace_path``, ``force``, ``spans``, ``audit``, ``topology``).

    Returns
    -------
    Result
        With ``config`` (the resolved config), ``settings`` (engine, calibration, options),
        ``parameter_count`` and ``fits`` filled.
    """
    if isinstance(config, RunConfig) and overrides:
        raise ConfigError("overrides apply to a run config given as a mapping or a file; a "
                          "RunConfig is already validated: give its source, or change it "
                          "with model_copy")
    cfg = config if isinstance(config, RunConfig) else load_config(config, list(overrides))
    check_work(cfg, engine, limits)
    if backend is not None and calibration is None:
        raise ConfigError(f"backend = {backend!r} needs a calibration profile (--calibration): "
                          "without one there is only the preset's cost model")
    source = calibration
    if isinstance(calibration, (str, Path)):
        from .calibration import CalibrationProfile
        calibration = CalibrationProfile.load(calibration)
    from .workloads.freshbuffers import resolve_first_touch
    cfg, first_touch = resolve_first_touch(cfg, calibration)  # a profile's host measurement
    workload = build_workload(cfg)
    check_work(cfg, engine, limits, workload)  # the trace's ops, counted before the run
    mem = workload.peak_memory
    if check_fit:
        check_memory(cfg, mem)
    if engine not in ("analytical", "des"):
        raise ConfigError(f"engine = {engine!r} is not an engine; allowed: analytical, des")
    if engine == "analytical" and engine_options:
        raise ConfigError(f"option {sorted(engine_options)[0]!r} is a DES option and needs "
                          "engine = 'des'; allowed for the analytical engine: calibration, "
                          "backend, check_fit, record_spans")
    devices = _placement(cfg, workload)
    result = _run_engine(engine, cfg, workload, calibration, backend, None, engine_options,
                         devices=devices, record_spans=record_spans)
    if record_spans and not result.spans:
        raise ConfigError(f"record_spans = True: the {engine} engine recorded no spans for this "
                          "plan, so there is no timeline to draw")
    for rec in result.extra.get("calibration_out_of_range", ()):
        warnings.warn(rec["message"], DDLSimWarning, stacklevel=2)
    if calibration is not None:
        result = _with_calibration(engine, cfg, workload, calibration, backend, result,
                                   engine_options, devices)
    if first_touch is not None:
        from dataclasses import replace
        result = replace(result, extra={**result.extra, "first_touch": first_touch})
    from .workloads.decoder.batch_input import uncharged_note
    if (batch_note := uncharged_note(cfg)) is not None:   # no host link: said, not silent
        from dataclasses import replace
        warnings.warn(batch_note, DDLSimWarning, stacklevel=2)
        result = replace(result, extra={**result.extra, "batch_input": batch_note})
    return _described(result, cfg, workload, engine, source, backend, check_fit, engine_options)


def _described(result: Result, cfg: RunConfig, workload: Workload, engine: str, calibration,
               backend: str | None, check_fit: bool, options: dict) -> Result:
    """``result`` with the resolved config, the engine settings and the parameter count."""
    from dataclasses import replace

    if calibration is not None and not isinstance(calibration, (str, Path)):
        calibration = getattr(getattr(calibration, "doc", None), "name", None) or "profile object"
    settings = {"engine": engine, "calibration": None if calibration is None else str(calibration),
                "backend": backend, "check_fit": check_fit}
    if engine == "des":
        settings["des_spans"] = result.extra.get("des", {}).get("spans")
        settings["des_audit"] = bool(options.get("audit", False))
        trace = options.get("trace_path")
        settings["trace_path"] = None if trace is None else str(trace)
    from .stackrules import what_if_note
    note = what_if_note(cfg)   # a plan its stack cannot run, predicted under what_if: true
    extra = result.extra if note is None else {**result.extra, "what_if": note}
    return replace(result, config=cfg.model_dump(mode="json"), settings=settings,
                   parameter_count=int(workload.meta.parameter_count), extra=extra)


def _placement(cfg: RunConfig, workload: Workload):
    """Device id of every rank: computed once per prediction, shared by every engine run."""
    from .simulator.costs import place_ranks_on_system
    return place_ranks_on_system(cfg.system, workload.world_size)


def _run_engine(engine: str, cfg: RunConfig, workload: Workload, profile, backend: str | None, bound: str | None, options: dict, *,
                devices, record_spans: bool = False) -> Result:
    """One engine run: the engines see the workload, the system (with its placement and the
    plan's collective algorithms, as a cost model) and nothing else of ``cfg``."""
    from .simulator.costs import CostModel
    cost = CostModel(cfg.system, workload, cfg.parallel.collective_algorithm, devices=devices,
                     profile=profile, backend=backend, bound=bound)
    if engine == "des":
        from .simulator.des import simulate_des
        if record_spans and options.get("spans") == "none":
            raise ConfigError("record_spans = True contradicts the DES option spans = 'none'")
        return _out_of_range(simulate_des(workload, cost, **options), cost)
    # record_spans: the analytical engine's representative-rank spans (ddlsim.plots' timeline)
    from .simulator.analytical.engine import simulate_analytical
    run = simulate_analytical(workload, cost, record_spans=record_spans)
    return _out_of_range(_result("analytical", workload, cost, run), cost)


def _out_of_range(result: Result, cost) -> Result:
    """``result`` with ``extra["calibration_out_of_range"]``: the sizes the profile did not
    measure, timed by the preset model instead (one record per backend, op and scope)."""
    from dataclasses import replace

    report = cost.out_of_range_report()
    if not report:
        return result
    return replace(result, extra={**result.extra, "calibration_out_of_range": report})


def _with_calibration(engine: str, cfg: RunConfig, workload: Workload, profile, backend: str | None, result: Result, options: dict,
                      devices) -> Result:
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
                                  "(backend, operation, intra/inter-node scope and measured "
                                  "message sizes): the preset's "
                                  f"constants were used; it has backends {list(profile.backends)}")
        return replace(result, extra=extra)
    try:
        lo = _run_engine(engine, cfg, workload, profile, backend, "lo", quiet, devices=devices)
        hi = _run_engine(engine, cfg, workload, profile, backend, "hi", quiet, devices=devices)
        interval = (lo.iteration_time_s, hi.iteration_time_s)
    except CalibrationError as exc:
        extra["interval_note"] = f"no interval: {exc}"
    if backend in (None, "auto") and len(profile.backends) > 1:
        single = {b: _run_engine(engine, cfg, workload, profile, b, None, quiet,
                                 devices=devices).iteration_time_s for b in profile.backends}
        best = min(single, key=single.get)
        extra["single_backend_time_s"] = single
        extra["gain_over_best_single_backend"] = single[best] / result.iteration_time_s - 1
        extra["best_single_backend"] = best
    extra["calibration"] = {"backends": list(profile.backends)}
    return replace(result, interval_s=interval, extra=extra)


def _result(engine: str, workload: Workload, cost, run) -> Result:
    """The shared assembler (:func:`ddlsim.simulator.result.assemble_result`) on an
    :class:`~ddlsim.simulator.result.EngineRun`."""
    peak = cost.peak_flops(workload.meta.dtype)
    return assemble_result(engine, workload, run.timings, workload.peak_memory, peak,
                           run.algorithms,
                           spans=run.spans)
