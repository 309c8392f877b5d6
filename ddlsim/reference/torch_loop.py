"""The closed loop with PyTorch on this machine's CPUs over Gloo: calibrate, predict, run,
compare (issue #30, item 1's torch workloads; needs the ``torch`` extra).

For each rank count N, with N ranks at once under ``torchrun --standalone``:

1. for N > 1, ``ddlsim calibrate comm --backend gloo`` over the sizes the runs'
   collectives and point-to-point messages move (:func:`gloo_sizes`), in the loop's clock;
2. one job, ``python -m ddlsim.reference.torch_job``, in which calibration samples and the
   runs take turns, round after round (torch GEMMs of the run's shapes, torch's element-wise
   kernels by class and its eager dispatch time per op, in process CPU time; each
   collective of the traces at its own size, in the loop's clock; then one iteration of
   each run, in wall and CPU time);
3. ``ddlsim calibrate fit`` of the GEMM samples and the Gloo curves (the numpy loop's
   :func:`.loop.fit`), the traces' own collective sizes kept beside the curves, and
   ``ddlsim predict --engine both`` of each run on a system made of those measurements
   (:func:`torch_system`);
4. the error ``predicted / measured − 1`` per strategy, rank count and engine, the
   measured time being the iterations' wall time (``clock="wall"``, the default) or their
   CPU time (``clock="cpu"``), the chosen statistic over the rounds.

A rank count past the usable cores that is not a multiple of them (3 ranks on 2 cores) is
refused before it runs, as the numpy loop refuses it (:func:`.mpijobs.uneven_share`).

The runs (:mod:`.torch_train`, the same file ``ddlsim predict`` reads):

* ``torch-ddp`` — ``DistributedDataParallel`` (zero_stage 0), 25 MiB buckets (its
  ``bucket_cap_mb`` default, passed from ``parallel.grad_bucket_size``), the all-reduces
  overlapping the backward (``overlap_grad_reduce: true``). Given explicitly, the cap holds
  for the first bucket too (torch 2.14 ``nn/parallel/distributed.py``: the 1 MiB first
  bucket, ``dist._DEFAULT_FIRST_BUCKET_BYTES``, only when ``bucket_cap_mb`` is None), so the
  buckets are ddlsim's even ones.
* ``torch-fsdp`` — FSDP2 ``fully_shard`` per block, then the root (zero_stage 3 on the
  torchtitan stack: one all-gather and one reduce-scatter per block, one block prefetched);
  every block reshards after its forward (``fully_shard``'s default; the stack's
  ``zero3_reshard_after_forward: always``).
* ``torch-pp`` — two stages, GPipe over :data:`PP_MICRO_BATCHES` micro-batches, blocking
  ``send``/``recv`` and the tied embedding's all-reduce before the step (2 ranks only).

Why wall time, where the numpy loop uses CPU time: the pipeline's bubble and a rank waiting
in Gloo (which blocks, unlike Open MPI's polling) are idle time, which a CPU clock does not
count. On a busy machine the iterations' wall time includes other processes' turns on the
cores, which the kernels' CPU-time samples do not: there ``clock="cpu"`` compares the
iterations' CPU time (the most over ranks) with collectives calibrated in CPU time, which
leaves out a wait for the other rank; the pipeline, whose bubble is such a wait, is then
refused.

What ddlsim does not express here: torch runs a ``Linear``'s bias inside its GEMM
(``addmm``), where ddlsim counts a bias-add pass before the GeLU (``fused_bias_gelu:
false``) and in the attention projection; ``F.cross_entropy`` is counted as the stack's
unfused loss.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import yaml

from .loop import REFERENCE, LoopModel
from .mpijobs import allow_shared, check_job, cpu_cores, run_job, uneven_share
from .torch_machine import TORCH_STACK, calibrate_gloo, gloo_sizes, torch_system, torchrun

__all__ = ["TORCH_STRATEGIES", "TORCH_STACK", "PP_MICRO_BATCHES", "torch_available",
           "torch_model", "torch_run_config", "gloo_sizes", "torch_system", "strategies_for",
           "run_torch_loop"]

TORCH_STRATEGIES = ("torch-ddp", "torch-fsdp", "torch-pp")
#: micro-batches of the 2-stage GPipe run (bubble (p − 1) / (m + p − 1) = 1/5)
PP_MICRO_BATCHES = 4
#: DDP's ``bucket_cap_mb`` default (torch/nn/parallel/distributed.py: 25 MiB)
DDP_BUCKET_BYTES = 25 * 2 ** 20

def torch_available() -> bool:
    """Whether torch with Gloo imports in this Python.

    Returns
    -------
    bool
        True where ``torch.distributed`` imports and has the Gloo backend.
    """
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_gloo_available()


def torch_model(model: LoopModel = REFERENCE) -> LoopModel:
    """The model of the torch runs: ``model`` with an even layer count (the 2-stage
    pipeline splits the blocks evenly; one rule, so that every run is the same model).

    Parameters
    ----------
    model : LoopModel
        The reference model.

    Returns
    -------
    LoopModel
        ``model``, with one more layer where its count is odd.
    """
    return dataclasses.replace(model, layers=model.layers + model.layers % 2)


def torch_run_config(model: LoopModel, ranks: int, strategy: str, system: dict | str) -> dict:
    """The run config ddlsim predicts and :mod:`.torch_train` runs, for one of
    :data:`TORCH_STRATEGIES` on ``ranks`` ranks.

    Parameters
    ----------
    model : LoopModel
        The run's model (:func:`torch_model`).
    ranks : int
        Ranks, one per core.
    strategy : str
        One of :data:`TORCH_STRATEGIES`.
    system : dict or str
        The system section or a preset's name.

    Returns
    -------
    dict
        The run config, as ``ddlsim predict`` reads it.

    Raises
    ------
    ValueError
        If ``strategy`` is not one of :data:`TORCH_STRATEGIES`.
    """
    if strategy not in TORCH_STRATEGIES:
        raise ValueError(f"torch strategy must be one of {', '.join(TORCH_STRATEGIES)}, got "
                         f"{strategy!r}")
    cfg = model.run_config(ranks, "ddp", system)
    par = cfg["parallel"]
    if strategy == "torch-ddp":
        par.update(zero_stage=0, overlap_grad_reduce=True, grad_bucket_size=DDP_BUCKET_BYTES)
    elif strategy == "torch-fsdp":
        par.update(zero_stage=3)
    else:
        par.update(data_parallel_size=1, pipeline_model_parallel_size=2, schedule="gpipe")
        cfg["train"]["global_batch_size"] = model.batch * PP_MICRO_BATCHES
    if strategy != "torch-fsdp":
        cfg["system"] = _without_zero3(cfg["system"])
    return cfg


def _without_zero3(system: dict | str) -> dict | str:
    """``system`` (a copy) without its software block's ``zero3_*`` fields: a plan without
    ZeRO-3 never reads them, and one that sets them is refused
    (:func:`ddlsim.software.check_zero3_fields`); the torch job still runs FSDP with them."""
    sw = system.get("software") if isinstance(system, dict) else None
    if not isinstance(sw, dict) or "overlap" not in sw:
        return system
    overlap = {k: v for k, v in sw["overlap"].items() if not k.startswith("zero3_")}
    return {**system, "software": {**sw, "overlap": overlap}}


def strategies_for(ranks: int, strategies: tuple[str, ...]) -> tuple[str, ...]:
    """The strategies that run on ``ranks`` ranks: DDP on any count, FSDP on two or more,
    the pipeline on exactly two.

    Parameters
    ----------
    ranks : int
        The rank count.
    strategies : tuple of str
        Among :data:`TORCH_STRATEGIES`.

    Returns
    -------
    tuple of str
        Those of ``strategies`` that run on ``ranks`` ranks, in their order.
    """
    runs = {"torch-ddp": True, "torch-fsdp": ranks > 1, "torch-pp": ranks == 2}
    return tuple(s for s in strategies if runs[s])


def job(work: Path, model: LoopModel, n: int, cfg_paths: list[Path],
        clock: str = "wall") -> dict:
    """Run :mod:`.torch_job` on ``n`` ranks (module docstring, step 2).

    Parameters
    ----------
    work : Path
        The loop's folder (the job writes ``torch{n}.json`` there).
    model : LoopModel
        The run's model (its ``rounds`` and ``warmup``).
    n : int
        Ranks.
    cfg_paths : list of Path
        The run configs the job trains.
    clock : {"wall", "cpu"}
        The clock the rounds are timed with.

    Returns
    -------
    dict
        The job's JSON (seconds per round per run, losses, rates).
    """
    stack = work / "torch_stack.json"
    stack.write_text(json.dumps(TORCH_STACK))
    check_job(run_job(torchrun(n) + [
        "-m", "ddlsim.reference.torch_job", str(work), *map(str, cfg_paths), "--rounds",
        str(model.rounds), "--warmup", str(model.warmup), "--stack", str(stack), "--clock",
        clock, *allow_shared(n)], 1800),
        f"the torch job on {n} ranks")
    return json.loads((work / f"torch{n}.json").read_text())


def _configs(work: Path, model: LoopModel, n: int, runs: tuple[str, ...],
             system: dict | str) -> list[Path]:
    paths = []
    for strategy in runs:
        paths.append(work / f"run-{strategy}-{n}.yaml")
        paths[-1].write_text(yaml.safe_dump(torch_run_config(model, n, strategy, system),
                                            sort_keys=False))
    return paths


def _measured(times: list[float], statistic: str) -> float:
    return float(np.min(times) if statistic == "min" else np.median(times))


def _phases(run: dict, statistic: str) -> dict[str, float]:
    """Each phase's CPU seconds (forward, backward, step: :class:`.torch_train.PhaseClock`),
    the ``statistic`` over the rounds of the most over ranks; empty for a job that did not
    time them."""
    rounds = run.get("phases_cpu_s") or []
    return {phase: _measured([r[phase] for r in rounds], statistic)
            for phase in (rounds[0] if rounds else ())}


def loop_ranks(work: Path, model: LoopModel, n: int, runs: tuple[str, ...], statistic: str,
               max_rel_rmse: float | None, when: str, log, clock: str = "wall") -> list[dict]:
    """Steps 1-4 of the module docstring for ``n`` ranks: one row per strategy.

    Parameters
    ----------
    work, model, n : the loop's folder, the run's model, ranks.
    runs : tuple of str
        The strategies run on ``n`` ranks (:func:`strategies_for`).
    statistic, max_rel_rmse, clock : as :func:`run_torch_loop` takes them.
    when : str
        When the rates were measured, for the sources.
    log : callable
        Progress lines.

    Returns
    -------
    list of dict
        One row per strategy: measured and predicted seconds, errors, the fit's quality.
    """
    from .loop import COMM_STATISTIC, fit, fit_errors, predict
    t0 = time.perf_counter()
    placeholder = {"preset": "cpu-10gbe", "software": TORCH_STACK}
    cfg_paths = _configs(work, model, n, runs, placeholder)
    comm = [calibrate_gloo(work, n, cfg_paths, clock)] if n > 1 else []
    doc = job(work, model, n, cfg_paths, clock)
    profile, r_max = fit(work, [work / f"compute{n}.csv", *comm], n, statistic, max_rel_rmse)
    if (work / f"sizes{n}.csv").exists():
        from ..calibration.sizes import attach_size_file
        attach_size_file(profile, work / f"sizes{n}.csv", COMM_STATISTIC)
    system = torch_system(n, doc, r_max, profile, statistic, when)
    log(f"  {n} rank(s), torch: measured in {time.perf_counter() - t0:.0f} s; GEMM plateau "
        f"{r_max / 1e9:.1f} GFLOP/s, element-wise "
        f"{system['device']['memory_bandwidth_Bps'] / 1e9:.2f} GB/s, dispatch "
        f"{system['device']['launch']['stream_gap_s'] * 1e6:.1f} us per op, classes "
        f"{system['device'].get('elementwise_efficiency')}")
    rows = []
    for strategy, cfg_path in zip(runs, _configs(work, model, n, runs, system)):
        run = doc["runs"][cfg_path.stem]
        pred = predict(cfg_path, profile, work / f"predicted-{strategy}-{n}.json")
        row = {"strategy": strategy, "ranks": n, "statistic": statistic, "clock": clock,
               "cores": cpu_cores(),
               "measured_s": _measured(run["times_s" if clock == "wall" else "cpu_s"],
                                       statistic),
               "measured_wall_s": _measured(run["times_s"], statistic),
               "measured_cpu_s": _measured(run["cpu_s"], statistic),
               "measured_phases_cpu_s": _phases(run, statistic),
               "times_s": run["times_s"], "loss_first": run["losses"][0],
               "loss_last": run["losses"][-1], "gemm_plateau_flops_per_s": r_max,
               "fit_rel_rmse": fit_errors(profile)}
        for engine, res in sorted(pred.items()):
            row[f"predicted_{engine}_s"] = res["iteration_time_s"]
            row[f"error_{engine}"] = res["iteration_time_s"] / row["measured_s"] - 1.0
        row["predicted_breakdown"] = pred["analytical"]["breakdown"]
        rows.append(row)
        log(row_line(row))
    return rows


def row_line(row: dict) -> str:
    """One run's line: measured (wall) and predicted per engine, or its refusal.

    Parameters
    ----------
    row : dict
        A row of :func:`loop_ranks` (or a refused one).

    Returns
    -------
    str
        Times in ms, errors in %.
    """
    head = f"{row['strategy']:>24} {row['ranks']} rank(s): "
    if "refused" in row:
        return head + f"refused: {row['refused']}"
    errs = ", ".join(f"{k[6:]} {row[f'predicted_{k[6:]}_s'] * 1e3:.1f} ms ({row[k]:+.1%})"
                     for k in sorted(row) if k.startswith("error_"))
    b = row["predicted_breakdown"]
    phases = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in
                       row.get("measured_phases_cpu_s", {}).items())
    return (head + f"measured {row['measured_s'] * 1e3:.1f} ms ({row['statistic']} "
            f"{row['clock']}; wall {row['measured_wall_s'] * 1e3:.1f}, CPU "
            f"{row['measured_cpu_s'] * 1e3:.1f}" + (f": {phases}" if phases else "") + "); "
            f"predicted {errs}; predicted compute {b['compute_s'] * 1e3:.1f} ms, exposed "
            f"comm {b['exposed_comm_total_s'] * 1e3:.1f} ms, bubble {b['bubble_s'] * 1e3:.1f}")


def run_torch_loop(work: Path, model: LoopModel = REFERENCE, ranks: tuple[int, ...] = (1, 2),
                   strategies: tuple[str, ...] = TORCH_STRATEGIES, statistic: str = "median",
                   max_rel_rmse: float | None = None, log=print,
                   clock: str = "wall") -> list[dict]:
    """Calibrate, predict, run and compare the torch runs (module docstring) in ``work``.

    Parameters
    ----------
    work : Path
        Folder for every file the loop writes.
    model : LoopModel
        The reference run (made even in layers by :func:`torch_model`).
    ranks : tuple of int
        Rank counts; those above the usable cores share them (wall time only: each rank a
        device of cores / ranks of a core, :func:`~.torch_machine.torch_system`).
    strategies : tuple of str
        Among :data:`TORCH_STRATEGIES` (:func:`strategies_for` keeps those a rank count runs).
    statistic : {"median", "min"}
        Which wall time of the rounds is calibrated and compared (the collectives' curves
        take the numpy loop's :data:`~.loop.COMM_STATISTIC`).
    max_rel_rmse : float, optional
        ``calibrate fit --max-rel-rmse``; None keeps its default bound.
    log : callable
        Progress lines.
    clock : {"wall", "cpu"}
        What is compared and how the collectives are calibrated (module docstring); with
        ``cpu`` the pipeline is refused.

    Returns
    -------
    list of dict
        One row per run, as :func:`.loop.run_loop`'s (``error_analytical``, ``error_des``),
        or ``refused`` with the reason.
    """
    bad = [s for s in strategies if s not in TORCH_STRATEGIES]
    if bad:
        raise ValueError(f"torch strategies must be among {', '.join(TORCH_STRATEGIES)}, got "
                         f"{bad}")
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if clock == "cpu" and "torch-pp" in strategies:
        raise ValueError("clock 'cpu' leaves out the pipeline's bubble (idle time), so "
                         "torch-pp needs clock 'wall'; with 'cpu' run torch-ddp,torch-fsdp")
    if clock == "cpu" and max(ranks, default=0) > cpu_cores():
        raise ValueError(f"clock 'cpu' leaves out the turns of ranks sharing cores, so ranks "
                         f"above this machine's {cpu_cores()} usable cores need clock 'wall' "
                         f"(got ranks {', '.join(map(str, ranks))})")
    if not torch_available():
        raise RuntimeError("the torch closed loop needs PyTorch with Gloo: pip install "
                           "'ddlsim[torch]'")
    work.mkdir(parents=True, exist_ok=True)
    model = torch_model(model)
    load = os.getloadavg()
    log(f"load average (1, 5, 15 min) at the start: {load[0]:.2f}, {load[1]:.2f}, "
        f"{load[2]:.2f} on {cpu_cores()} cores")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows: list[dict] = []
    for n in ranks:
        runs = strategies_for(n, strategies)
        if not runs:
            continue
        uneven = uneven_share(n)
        if uneven:
            rows += [{"strategy": s, "ranks": n, "refused": uneven} for s in runs]
            for row in rows[-len(runs):]:
                log(row_line(row))
        else:
            rows += loop_ranks(work, model, n, runs, statistic, max_rel_rmse, when, log,
                               clock)
        (work / "closed_loop_torch.json").write_text(json.dumps(rows, indent=1))
    return rows
