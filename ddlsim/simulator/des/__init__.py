"""The flow-level discrete-event engine (SimPy): rank classes over a routed, shared network.

Entry points:

* :func:`simulate_des` — what ``ddlsim.predict(..., engine="des")`` calls: a
  :class:`~ddlsim.simulator.result.Result` of the same shape as the analytical engine's, plus
  per-rank spans and per-link utilisation, and optionally a Chrome/Perfetto trace file.
* :func:`run_des` — the raw simulation of a workload on a topology (tests, benchmarks).

See ``docs/engines.md`` for the flow model, what it captures and what it does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from ...errors import ConfigError
from ...topologies import Topology, from_system
from ...workloads.trace import Workload
from ..costs import CostModel
from .assemble import des_result, rank_spans
from .engine import ClassTiming, DESRun, run_des_engine

__all__ = ["simulate_des", "run_des", "DESRun", "ClassTiming", "SPAN_BUDGET"]

#: ``spans="auto"`` records every rank's spans while there are at most this many, else one
#: representative rank per class (every rank of a class has the same timeline).
SPAN_BUDGET = 200_000

SpanMode = Literal["auto", "all", "representative", "none"]


def _placement(cost: CostModel, topology: Topology) -> np.ndarray:
    """Device of every rank: the cost model's placement (the analytical engine's)."""
    devices = cost.devices
    if len(devices) and int(devices.max()) >= topology.num_devices:
        raise ConfigError(f"rank placement uses device {int(devices.max())} but the topology "
                          f"{topology.name!r} has devices 0..{topology.num_devices - 1}")
    return devices


def run_des(workload: Workload, cost: CostModel, topology: Topology | None = None, *,
            record_spans: bool = True, record_flows: bool = False,
            audit: bool = False, shortcuts: bool = True,
            progress=None) -> tuple[DESRun, Topology]:
    """Simulate one iteration of ``workload``; returns the raw run and the topology used.

    ``topology`` defaults to the graph of ``cost.system``; ``audit`` records the largest
    link load/bandwidth ratio ever reached (``run.network.max_load_ratio``); ``shortcuts``
    lets runs on idle links skip the flow machinery (exact, see :mod:`.express`);
    ``progress`` (a :class:`~.progress.Progress`) follows the run.
    """
    from ..hostcollectives import on_compute_cores
    workload = on_compute_cores(workload, cost.system)  # a CPU rank's collectives: its cores
    topo = topology if topology is not None else from_system(cost.system)
    devices = _placement(cost, topo)
    run = run_des_engine(workload, cost, topo, devices, record_spans=record_spans,
                         record_flows=record_flows, audit=audit, shortcuts=shortcuts,
                         progress=progress)
    return run, topo


def _span_mode(mode: str, workload: Workload) -> str:
    allowed = ("auto", "all", "representative", "none")
    if mode not in allowed:
        raise ConfigError(f"spans = {mode!r} is not a span mode; allowed: {', '.join(allowed)}")
    if mode != "auto":
        return mode
    total = sum(len(c.ranks) * sum(len(c.program.blocks[s.block].flat.ops) for s in c.program.steps)
                for c in workload.classes)
    return "all" if total <= SPAN_BUDGET else "representative"


def simulate_des(workload: Workload, cost: CostModel, *,
                 trace_path: str | Path | None = None, force: bool = False,
                 spans: SpanMode = "auto", audit: bool = False,
                 topology: Topology | None = None, progress=None, **unknown):
    """Predict one iteration with the discrete-event engine.

    Parameters
    ----------
    workload, cost : the trace (with its memory per rank class) and its cost model (system,
        placement, algorithms): the engine sees nothing else.
    trace_path : write a Chrome trace / Perfetto JSON here (refused if the file exists,
        unless ``force``).
    spans : ``auto`` (every rank while at most :data:`SPAN_BUDGET` spans, else one rank per
        class), ``all``, ``representative`` or ``none``.
    audit : check link loads after every rate change (slower); reported in
        ``result.extra["des"]["max_link_load_ratio"]``.
    topology : a prebuilt :class:`~ddlsim.topologies.Topology` instead of ``cost.system``'s.
    progress : a :class:`~.progress.Progress` (``ConsoleProgress()``: an estimate before a
        long run, a progress bar during it, on standard error).

    Returns
    -------
    Result
        Same shape as the analytical engine's, with ``spans`` (per rank) and ``links``
        (busiest first) filled and ``extra["des"]`` holding event and flow counts.
    """
    if unknown:
        raise ConfigError(f"unknown DES option {sorted(unknown)[0]!r}; allowed: trace_path, "
                          "force, spans, audit, topology, progress")
    if trace_path is not None:
        from ...textio import check_output
        check_output(trace_path, force, what="trace file")
    mode = _span_mode(spans, workload)
    run, topo = run_des(workload, cost, topology, record_spans=mode != "none" or bool(trace_path),
                        record_flows=trace_path is not None, audit=audit, progress=progress)
    span_list = rank_spans(run, workload, mode == "all") if mode != "none" else ()
    result = des_result(workload, workload.peak_memory, cost.peak_flops(workload.meta.dtype), run, topo,
                        span_list, mode, audit)
    if trace_path is not None:
        _write_trace(trace_path, force, run, workload, topo,
                     span_list or rank_spans(run, workload, False), result)
    return result


def _write_trace(path, force: bool, run: DESRun, workload: Workload, topo: Topology, spans,
                 result) -> None:
    from ..chrome_trace import build_chrome_trace, write_chrome_trace

    node_of_rank = topo.node_of_device[run.devices]
    every = len({s.rank for s in spans}) == workload.world_size
    flows = [(f"{name} phase {k} #{inst}", int(node_of_rank[rank]), start, end,
              {"bytes_per_flow": nbytes, "first_rank": rank})
             for name, k, inst, start, end, nbytes, rank in (run.flow_records or ())
             if every or inst == 0]  # one instance per collective when spans are sampled
    meta = {"workload": workload.name, "engine": "des",
            "iteration_time_s": result.iteration_time_s}
    write_chrome_trace(path, build_chrome_trace(spans, node_of_rank, flows, meta), force=force)
