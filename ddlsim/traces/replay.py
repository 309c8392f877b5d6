"""Predict a plan with compute measured by a profile: the profiled step, then the target."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .kineto import MeasuredStep
from .measured import Binding, apply_measured, bind_measured, check_profiled_plan

__all__ = ["MeasuredPrediction", "predict_measured"]


@dataclass(frozen=True)
class MeasuredPrediction:
    """The profiled plan re-predicted and the target plan predicted with measured compute.

    Attributes
    ----------
    measured : the profile read.
    binding : how its labels were bound to ddlsim's op names.
    profiled : :class:`ddlsim.Result` of the profiled plan (its compute from the profile).
    target : :class:`ddlsim.Result` of the target plan (the profiled plan with the overrides).
    """

    measured: MeasuredStep
    binding: Binding
    profiled: object
    target: object

    @property
    def profiled_error(self) -> float:
        """(predicted − measured) / measured for the profiled step, the measured step being
        its span less the profiler's own cost when that was removed (a ratio)."""
        return self.profiled.iteration_time_s / self.measured.step_s - 1.0


def _cost(cfg, workload):
    from ..api import _placement
    from ..simulator.costs import CostModel
    return CostModel(cfg.system, workload, cfg.parallel.collective_algorithm,
                     devices=_placement(cfg, workload))


def _predict(cfg, workload, engine: str, calibration=None):
    from ..api import _described, _placement, check_memory, _run_engine
    check_memory(cfg, workload.peak_memory)
    result = _run_engine(engine, cfg, workload, calibration, None, None, {},
                         devices=_placement(cfg, workload))
    return _described(result, cfg, workload, engine, calibration, None, True, {})


def predict_measured(config, measured: MeasuredStep, overrides: list[str] | tuple = (),
                     engine: str = "analytical", calibration=None) -> MeasuredPrediction:
    """Re-predict the profiled step and predict a changed plan with the measured compute.

    Parameters
    ----------
    config : the run config of the profiled run (path, mapping or ``RunConfig``): the same
        model, micro-batch size, sequence length and parallel plan the profile ran.
    measured : the profile (:func:`ddlsim.traces.kineto.read_kineto`).
    overrides : ``FIELD=VALUE`` changes that make the target plan (more data-parallel ranks,
        another system), as ``ddlsim predict --set`` takes them.
    engine : ``"analytical"`` or ``"des"``.
    calibration : a calibration profile (or its path) whose fitted collective costs replace
        the system's constants in both predictions (``ddlsim calibrate``).

    Returns
    -------
    MeasuredPrediction
    """
    from ..api import build_workload
    from ..config import RunConfig, load_config

    if engine not in ("analytical", "des"):
        raise ConfigError(f"engine = {engine!r} is not an engine; allowed: analytical, des")
    base = config if isinstance(config, RunConfig) else load_config(config)
    check_profiled_plan(measured, base)
    reference = build_workload(base)
    binding = bind_measured(measured, reference, _cost(base, reference))
    if isinstance(calibration, (str, Path)):
        from ..calibration import CalibrationProfile
        calibration = CalibrationProfile.load(calibration)
    profiled = _predict(base, apply_measured(reference, binding, _cost(base, reference)), engine,
                        calibration)
    cfg = load_config(base.model_dump(mode="json"), overrides=list(overrides)) if overrides \
        else base
    target = build_workload(cfg)
    result = _predict(cfg, apply_measured(target, binding, _cost(cfg, target)), engine,
                      calibration)
    return MeasuredPrediction(measured, binding, profiled, result)


def predict_workload(workload, system, engine: str = "analytical",
                     collective_algorithm: dict | None = None, calibration=None):
    """Predict a workload read from a trace file (no run config) on ``system``.

    Parameters
    ----------
    workload : e.g. :func:`ddlsim.traces.chakra_read.read_chakra`'s.
    system : a :class:`ddlsim.config.SystemConfig`, a preset name or a mapping; it must have
        a device for every rank.
    engine : ``"analytical"`` or ``"des"``.
    collective_algorithm : op -> algorithm, as ``parallel.collective_algorithm``.
    calibration : a calibration profile (or its path) whose fitted collective costs replace
        the system's constants, as ``ddlsim predict --calibration``.

    Returns
    -------
    Result
    """
    from ..api import _result
    from ..config import SystemConfig
    from ..simulator.costs import CostModel

    if engine not in ("analytical", "des"):
        raise ConfigError(f"engine = {engine!r} is not an engine; allowed: analytical, des")
    if not isinstance(system, SystemConfig):
        from ..configload import resolve_section
        system = SystemConfig.model_validate(resolve_section("system", system))
    devices = system.nodes * system.devices_per_node
    if devices < workload.world_size:
        raise ConfigError(f"system has {devices} devices ({system.nodes} nodes × "
                          f"{system.devices_per_node}); the trace has {workload.world_size} "
                          "ranks: give a system with at least as many devices (nodes, --nodes N)")
    if isinstance(calibration, (str, Path)):
        from ..calibration import CalibrationProfile
        calibration = CalibrationProfile.load(calibration)
    cost = CostModel(system, workload, collective_algorithm or {}, profile=calibration)
    if engine == "des":
        from ..simulator.des import simulate_des
        return simulate_des(workload, cost)
    from ..simulator.analytical.engine import simulate_analytical
    return _result("analytical", workload, cost, simulate_analytical(workload, cost))
