"""Speed and agreement of the search tier (issue 13), measured side by side in one run.

    python benchmarks/search_speed.py            # speed + agreement on the three full grids
    python benchmarks/search_speed.py --quick    # agreement on 60 plans per grid
    python benchmarks/search_speed.py --no-agreement --clock cpu   # speed alone, CPU time
    python benchmarks/search_speed.py --no-agreement --repeats 15   # more runs of each

Speed, on one core, over a GPT-3 175B / 1,024-A100 grid varying TP, PP, DP, virtual stages,
micro-batch, ZeRO stage, recomputation and sequence parallelism:

* ddlsim: the whole of ``evaluate_grid`` (enumerate, reject with reasons, evaluate, rank),
  caches cleared (the collective forms and the group networks measured on the topology; the
  topology graph, built once per system, is kept), best of ``--repeats`` (5); plans in the
  grid per second, and valid plans per second.
* ddlsim, marginal: :func:`ddlsim.search.evaluate_plans` on the valid plans repeated 50×
  (what one more plan costs once the grid's networks are built).
* llm-analysis (PyPI ``llm-analysis``, which ignores schedules and communication overlap):
  ``LLMAnalysis.training`` on the first 300 of the same valid plans, best of as many runs,
  each run right after one of ddlsim's (the two tools see the same load: on a shared machine
  it drifts within a minute). It is imported if installed, else installed here into a
  temporary folder (``pip install --no-deps --target``, with its two pure-Python
  dependencies ``fire`` and ``termcolor``); if that fails (no index reachable) the column
  says so and is skipped.

Agreement with the exact analytical engine (``ddlsim.predict``) on three grids: GPT-3 175B on
1,024 A100s, Llama-2 70B on 256 H100s, GPT-2 124M on the 10 GbE CPU cluster (16 nodes).
Every valid plan (or ``--quick``'s sample) is predicted exactly; p90 and max |error| and the
overlap of the two top-10 sets are printed. Targets: p90 ≤ 1 %, max ≤ 3 %, same top 10.

``--clock cpu`` times both tools by this process's CPU time instead of the wall clock: on a
machine shared with other jobs it is disturbed less (both tools alike, so the ratio holds).

``--profile`` times nothing against llm-analysis: it runs the speed grid cold (as above) under
:mod:`cProfile` and prints the functions with the most time per grid, with and without what
they call (the profiler's own overhead inflates small Python functions: read shares, not
milliseconds).

``--phases`` times nothing against llm-analysis either: it runs the speed grid cold
``--repeats`` times with the search's phases wrapped in CPU-time counters (no profiler) and
prints each phase's median milliseconds per grid: the stage pieces (their builders, the
builder's ops, the lowering, the collectives and the timing rule), the meshes' networks, the
config's rules (the configs validated for them), memory, the update and ZeRO-3 terms, and what
the garbage collector took; last, the sum of the phases that run the exact engine's own code
(:data:`SHARED_PHASES`), a floor for the grid while that code is as fast as it is.

``--bundled`` times the bundled search's own grid (``examples/search-gpt3-175b-1024.yaml``:
its axes, its fixed global batch, plans that must fit) cold against llm-analysis on its valid
plans, and prints the ratio per valid plan and per plan that needs the model (the valid ones
and those memory rejects; the rules reject the rest before any model is built).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ddlsim  # noqa: E402
from ddlsim.config import build_config  # noqa: E402
from ddlsim.search.evaluate import evaluate_grid, evaluate_plans  # noqa: E402
from ddlsim.search.netcost import cache_clear  # noqa: E402
from ddlsim.search.run import plan_overrides  # noqa: E402
from ddlsim.search.spec import Constraints  # noqa: E402

#: What the speed is timed with (``--clock``).
CLOCK = [time.perf_counter]

GPT3 = {"model": "gpt3-175b", "parallel": {}, "system": {"preset": "dgx-a100", "nodes": 128},
        "train": {"micro_batch_size": 1, "global_batch_size": 1536, "seq_length": 2048}}
SPEED_AXES = {"parallel.tensor_model_parallel_size": [1, 2, 4, 8],
              "parallel.pipeline_model_parallel_size": [1, 2, 4, 8, 16, 32, 64],
              "parallel.data_parallel_size": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
              "parallel.virtual_pipeline_model_parallel_size": [None, 2, 3, 4, 6, 8],
              "train.micro_batch_size": [1, 2, 4, 8, 16],
              "parallel.zero_stage": [0, 1, 2, 3],
              "train.recompute": ["none", "selective", "full"],
              "parallel.sequence_parallel": [False, True]}
PLAN = {"parallel.tensor_model_parallel_size": [1, 2, 4, 8],
        "parallel.pipeline_model_parallel_size": [1, 2, 4, 8, 16, 32],
        "parallel.virtual_pipeline_model_parallel_size": [None, 2, 3, 4],
        "parallel.sequence_parallel": [False, True], "parallel.zero_stage": [0, 1, 2, 3],
        "train.micro_batch_size": [1, 2, 4], "train.recompute": ["none", "selective", "full"]}
GRIDS = {
    "GPT-3 175B, 1,024 A100": (GPT3, PLAN),
    "Llama-2 70B, 256 H100": (
        {"model": {"hf_config": str(ROOT / "examples/hf/llama-2-70b/config.json")},
         "parallel": {}, "system": {"preset": "dgx-h100", "nodes": 32},
         "train": {"micro_batch_size": 1, "global_batch_size": 1024, "seq_length": 4096}},
        {**PLAN, "parallel.virtual_pipeline_model_parallel_size": [None, 2, 4, 5]}),
    "GPT-2 124M, 10 GbE CPU cluster (32 ranks)": (
        {"model": "gpt2-124m", "parallel": {}, "system": {"preset": "cpu-10gbe", "nodes": 16},
         "train": {"micro_batch_size": 1, "global_batch_size": 128, "seq_length": 1024,
                   "dtype": "fp32"}},
        {**PLAN, "parallel.tensor_model_parallel_size": [1, 2, 4],
         "parallel.pipeline_model_parallel_size": [1, 2, 4],
         "parallel.virtual_pipeline_model_parallel_size": [None, 3],
         "train.micro_batch_size": [1, 2, 4], "parallel.overlap_grad_reduce": [True, False]}),
}


def grid_seconds() -> tuple[float, object]:
    """One cold run of the whole grid: (seconds, the Grid)."""
    cache_clear()
    t0 = CLOCK[0]()
    grid = evaluate_grid(GPT3, None, [], SPEED_AXES, Constraints())
    return CLOCK[0]() - t0, grid


def bundled(repeats: int) -> None:
    """The bundled GPT-3 search (``examples/search-gpt3-175b-1024.yaml``, its own axes and
    constraints: the plans must fit) cold, the best of ``repeats`` runs, against llm-analysis
    on its valid plans (the first 300), one of each in turn. Per valid plan, and per plan that
    needs the model: the valid ones and those whose memory rejects them (rules reject the
    others before any model is built)."""
    from ddlsim.search.ranking import DOES_NOT_FIT
    from ddlsim.search.run import load_search

    path = ROOT / "examples" / "search-gpt3-175b-1024.yaml"
    data, base_dir, spec = load_search(str(path))
    data = {k: v for k, v in data.items() if k != "search"}

    def run():
        cache_clear()
        t0 = CLOCK[0]()
        grid = evaluate_grid(data, base_dir, [], dict(spec.axes), spec.constraints)
        return CLOCK[0]() - t0, grid
    best, grid = run()
    llm, llm_best = _llm_analysis_setup(grid.frame), math.inf
    for k in range(repeats):
        if k:
            best = min(best, run()[0])
        if "run" in llm:
            llm_best = min(llm_best, llm["run"]())
    valid = len(grid.frame)
    model = valid + grid.rejected.get(DOES_NOT_FIT, 0)
    print(f"{path.name}: {grid.total:,} plans, {valid:,} valid, {model - valid:,} more rejected "
          f"for memory; whole grid {1e3 * best:.0f} ms cold (best of {repeats}, "
          f"{'CPU' if CLOCK[0] is time.process_time else 'wall'})")
    if "run" not in llm:
        print(f"llm-analysis 0.2.2 skipped ({llm['skipped']})")
        return
    per = llm_best / llm["plans"]
    print(f"llm-analysis 0.2.2: {1e6 * per:.0f} µs a plan (LLMAnalysis.training on "
          f"{llm['plans']} valid plans)")
    print(f"ratio per valid plan {per * valid / best:.1f}×; per plan that needs the model "
          f"{per * model / best:.1f}×")


def speeds(repeats: int) -> tuple[dict, object, dict]:
    """ddlsim's whole grid and llm-analysis's 300 plans, each the best of ``repeats`` runs,
    one of each in turn: (ddlsim's figures, its frame, llm-analysis's)."""
    best, grid = grid_seconds()
    llm = _llm_analysis_setup(grid.frame)
    llm_best = math.inf
    for k in range(repeats):
        if k:
            el, grid = grid_seconds()
            best = min(best, el)
        if "run" in llm:
            llm_best = min(llm_best, llm["run"]())
    llm = ({"plans": llm["plans"], "plans_per_s": llm["plans"] / llm_best} if "run" in llm
           else llm)
    out, frame = ddlsim_speed(grid, best)
    return out, frame, llm


def profile_grid(runs: int = 3, top: int = 25) -> None:
    """Print :mod:`cProfile`'s top ``top`` functions of ``runs`` cold runs of the speed grid
    (one warm-up run first, not profiled), by cumulative and by own time per grid."""
    import cProfile
    import io
    import pstats

    evaluate_grid(GPT3, None, [], SPEED_AXES, Constraints())
    prof = cProfile.Profile()
    for _ in range(runs):
        cache_clear()
        prof.enable()
        evaluate_grid(GPT3, None, [], SPEED_AXES, Constraints())
        prof.disable()
    stats = pstats.Stats(prof)
    for order, what in (("cumulative", "with what they call"), ("tottime", "own time")):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(order).print_stats(top)
        lines = out.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
        print(f"\n{runs} cold grid(s), {stats.total_tt / runs * 1e3:.0f} ms each under the "
              f"profiler; top {top} by {what} (times over all runs)")
        print("\n".join(line.replace(str(ROOT) + "/", "") for line in lines[start:] if line))


#: The phases ``--phases`` times: (label, module, attribute path), outermost first. A phase
#: nested in another is indented under it (NCCL's forms are asked by the collectives of
#: several phases above: part of them); the pieces' builders are timed in
#: :func:`~ddlsim.workloads.decoder.builder.StageBuilder.from_config`, their ops in the
#: search's own piece registry (``ddlsim.search.blocks._PIECES``).
PHASES = [
    ("stage pieces", "ddlsim.search.decoder", "stage_pieces"),
    ("  builders (resolve_plan)", "ddlsim.workloads.decoder.builder", "StageBuilder.from_config"),
    ("  kernels timed (kernel_times)", "ddlsim.search.blocks", "kernel_times"),
    ("  lowering (lower_ops)", "ddlsim.search.blocks", "lower_ops"),
    ("  collectives on the networks", "ddlsim.search.piececolls", "piece_collectives"),
    ("  timing rule (stream_ends)", "ddlsim.search.blocks", "stream_ends_together"),
    ("meshes' networks", "ddlsim.search.decoder", "mesh_networks"),
    ("  group networks (family_net)", "ddlsim.simulator.netmodel", "family_net"),
    ("  hops' rails (p2p_node_bw)", "ddlsim.simulator.netmodel", "p2p_node_bw"),
    ("config rules (group_rules)", "ddlsim.search.evaluate", "group_rules"),
    ("  configs validated (plan_config)", "ddlsim.search.planconfig", "plan_config"),
    ("memory", "ddlsim.search.decoder", "plans_memory"),
    ("memory floor (must fit)", "ddlsim.search.decoder", "plans_memory_floor"),
    ("update and tail", "ddlsim.search.decoder_dp", "DataParallelTerms._update"),
    ("ZeRO-3", "ddlsim.search.decoder", "zero3_seconds"),
    ("NCCL forms (nccl_form; in the above)", "ddlsim.simulator.collectives.nccl.model",
     "nccl_form"),
    # the search's own calls, through collforms' module-level name (a label twice: both
    # callers' time under it, a call timed once)
    ("NCCL forms (nccl_form; in the above)", "ddlsim.search.collforms", "nccl_form"),
]


def phase_times(repeats: int) -> dict[str, float]:
    """Median CPU milliseconds per cold grid of each of :data:`PHASES`, of the builder's piece
    ops (``  builder's ops``), of the garbage collector, and of the whole grid."""
    import gc
    import importlib

    spent: dict[str, float] = {}

    def timed(label, f):
        def wrapper(*args, **kwargs):
            t0 = time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.process_time() - t0
        return wrapper

    undo = []
    for label, module, path in PHASES:
        owner = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        raw = owner.__dict__[name]
        f = raw.__func__ if isinstance(raw, classmethod) else raw
        wrapped = timed(label, f)
        if hasattr(f, "cache_clear"):   # an lru_cache: netcost.cache_clear still forgets it
            wrapped.cache_clear = f.cache_clear
        setattr(owner, name, classmethod(wrapped) if isinstance(raw, classmethod) else wrapped)
        undo.append((owner, name, raw))
    from ddlsim.search import blocks
    pieces = dict(blocks._PIECES)
    for name, make in pieces.items():
        blocks._PIECES[name] = timed("  builder's ops", make)
    start: list[float] = []

    def gc_clock(phase, info):
        if phase == "start":
            start.append(time.process_time())
        elif start:
            spent["garbage collector"] = (spent.get("garbage collector", 0.0)
                                          + time.process_time() - start.pop())
    gc.callbacks.append(gc_clock)
    runs: list[dict[str, float]] = []
    try:
        evaluate_grid(GPT3, None, [], SPEED_AXES, Constraints())   # warm-up, not counted
        for _ in range(repeats):
            spent.clear()
            spent["whole grid"] = grid_seconds()[0]
            runs.append(dict(spent))
    finally:
        gc.callbacks.remove(gc_clock)
        blocks._PIECES.update(pieces)
        for owner, name, raw in undo:
            setattr(owner, name, raw)
    labels = list(dict.fromkeys(["whole grid", *(p[0] for p in PHASES[:2]), "  builder's ops",
                                 *(p[0] for p in PHASES[2:]), "garbage collector"]))
    out = {k: 1e3 * float(np.median([r.get(k, 0.0) for r in runs])) for k in labels}
    out[SHARED] = sum(out[k] for k in SHARED_PHASES)
    return out


#: The phases that run the exact engine's own code (the family's builder, the lowering and
#: timing rule, the topology's fair shares, NCCL's tuning model, the config's validation),
#: none inside another: what the grid would cost were the search's own arithmetic free.
SHARED_PHASES = ("  builders (resolve_plan)", "  builder's ops",
                 "  kernels timed (kernel_times)", "  lowering (lower_ops)",
                 "  timing rule (stream_ends)", "  group networks (family_net)",
                 "  hops' rails (p2p_node_bw)", "NCCL forms (nccl_form; in the above)",
                 "  configs validated (plan_config)")
SHARED = "the exact engine's code (sum of 9 above)"


def ddlsim_speed(grid, best: float) -> tuple[dict, object]:
    """The figures of the grid's best run, and the marginal speed (evaluate_plans on the
    valid plans × 50)."""
    frame = grid.frame
    out = {"plans": grid.total, "valid": len(frame), "seconds": best,
           "plans_per_s": grid.total / best, "valid_per_s": len(frame) / best}
    from ddlsim.search.plans import enumerate_plans
    cfg = build_config(GPT3, ["parallel.data_parallel_size=8", "parallel.tensor_model_parallel_size=8",
                              "parallel.pipeline_model_parallel_size=16"])
    plans = enumerate_plans(SPEED_AXES, _fields(cfg), 1024).take(frame["plan"].to_numpy())
    tiled = plans.take(np.tile(np.arange(len(plans)), 50))
    t0 = CLOCK[0]()
    evaluate_plans(cfg, tiled)
    out["marginal_per_s"] = len(tiled) / (CLOCK[0]() - t0)
    return out, frame


def _fields(cfg) -> dict:
    from ddlsim.search.plans import VECTOR_FIELDS
    f = {p: getattr(getattr(cfg, p.split(".")[0]), p.split(".")[1]) for p in VECTOR_FIELDS}
    f["parallel.schedule"] = cfg.parallel.schedule
    return f


def _llm_analysis():
    """The llm_analysis package, installed into a temporary folder if missing; or the reason."""
    try:
        return importlib.import_module("llm_analysis.analysis"), None
    except ImportError:
        pass
    target = Path(tempfile.mkdtemp(prefix="llm-analysis-"))
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
           str(target), "llm-analysis==0.2.2", "fire", "termcolor"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        return None, f"pip could not install llm-analysis ({r.stderr.strip().splitlines()[-1:]})"
    sys.path.insert(0, str(target))
    import logging
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module("llm_analysis.analysis"), None


def _llm_analysis_setup(frame, n: int = 300) -> dict:
    """``{"plans": n, "run": one timed run (seconds)}`` of llm-analysis on the first ``n``
    plans of ``frame``, or ``{"skipped": why}``."""
    mod, why = _llm_analysis()
    if mod is None:
        return {"skipped": why}
    from llm_analysis.config import ModelConfig, ParallelismConfig, get_gpu_config_by_name
    import logging
    logging.disable(logging.CRITICAL)
    model = ModelConfig(name="gpt3-175b", num_layers=96, n_head=96, hidden_dim=12288,
                        vocab_size=51200, max_seq_len=2048)
    gpu = get_gpu_config_by_name("a100-sxm-80gb")
    rows = frame.head(n).to_dict(orient="records")

    def run() -> float:
        t0 = CLOCK[0]()
        _llm_analysis_run(mod, model, gpu, rows, ParallelismConfig)
        return CLOCK[0]() - t0
    return {"plans": len(rows), "run": run}


def _llm_analysis_run(mod, model, gpu, rows, ParallelismConfig) -> None:
    rec = {"none": 0, "selective": 1, "full": 2}
    for row in rows:
        par = ParallelismConfig(tp_size=row["parallel.tensor_model_parallel_size"],
                                pp_size=row["parallel.pipeline_model_parallel_size"],
                                dp_size=row["parallel.data_parallel_size"],
                                sp_size=row["parallel.tensor_model_parallel_size"]
                                if row["parallel.sequence_parallel"] else 1)
        a = mod.LLMAnalysis(model, gpu, parallelism_config=par, flops_efficiency=0.5,
                            hbm_memory_efficiency=0.9)
        a.training(batch_size_per_gpu=row["train.micro_batch_size"], seq_len=2048,
                   global_batch_size=1536, total_num_tokens=1536 * 2048,
                   activation_recomputation=mod.ActivationRecomputation(rec[row["train.recompute"]]),
                   ds_zero=mod.DSZeRO(row["parallel.zero_stage"]), flash_attn=False)


def agreement(name: str, data: dict, axes: dict, quick: bool) -> dict:
    grid = evaluate_grid(data, None, [], axes, Constraints())
    frame = grid.frame
    rows = range(len(frame))
    if quick:
        rng = np.random.default_rng(0)
        rows = sorted(set(range(12)) | set(rng.choice(len(frame), 48, replace=False).tolist()))
    columns = [c for c in frame.columns if "." in c]
    exact = np.full(len(frame), np.nan)
    t0 = time.perf_counter()
    for i in rows:
        cfg = build_config(data, plan_overrides(frame.iloc[i], columns))
        exact[i] = ddlsim.predict(cfg, check_fit=False).iteration_time_s
    el = time.perf_counter() - t0
    done = ~np.isnan(exact)
    err = np.abs(frame["iteration_time_s"].to_numpy()[done] / exact[done] - 1)
    top_exact = set(np.flatnonzero(done)[np.argsort(exact[done], kind="stable")[:10]].tolist())
    return {"grid": name, "plans": grid.total, "valid": len(frame), "checked": int(done.sum()),
            "p90": float(np.percentile(err, 90)), "max": float(err.max()),
            "top10_overlap": len(top_exact & set(range(10))),
            "exact_plans_per_s": done.sum() / el}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="agreement on a sample")
    parser.add_argument("--no-agreement", action="store_true", help="the speed alone")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time both tools by the wall clock (default) or by this "
                             "process's CPU time (steadier on a shared machine)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs of each tool, one of each in turn; the best counts (5)")
    parser.add_argument("--profile", action="store_true",
                        help="profile --repeats cold runs of the speed grid (cProfile) instead")
    parser.add_argument("--bundled", action="store_true",
                        help="the bundled GPT-3 search's own grid against llm-analysis instead")
    parser.add_argument("--phases", action="store_true",
                        help="CPU time per phase of --repeats cold runs of the speed grid "
                             "(medians, no profiler) instead")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats = {args.repeats}: give 1 or more runs")
    CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter
    warnings.filterwarnings("ignore", ".*not modelled by ddlsim")
    if args.profile:
        profile_grid(args.repeats)
        return
    if args.bundled:
        bundled(args.repeats)
        return
    if args.phases:
        CLOCK[0] = time.process_time
        times = phase_times(args.repeats)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"CPU ms per cold grid, median of {args.repeats} (load {load}); a phase "
              "indented under another is part of it")
        for label, ms in times.items():
            print(f"  {label:38}{ms:8.1f}")
        return
    speed, frame, llm = speeds(args.repeats)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"GPT-3 175B on 1,024 A100s: {speed['plans']:,} plans in the grid, "
          f"{speed['valid']:,} valid")
    print(f"{'':32}{'plans/s':>14}   (by the {args.clock} clock, best of {args.repeats}; "
          f"load {load})")
    print(f"{'ddlsim search, whole grid':32}{speed['plans_per_s']:>14,.0f}   "
          f"({speed['seconds']:.2f} s; {speed['valid_per_s']:,.0f} valid plans/s)")
    print(f"{'ddlsim search, marginal':32}{speed['marginal_per_s']:>14,.0f}   "
          "(evaluate_plans on the valid plans × 50)")
    if "skipped" in llm:
        print(f"{'llm-analysis 0.2.2':32}{'skipped':>14}   ({llm['skipped']})")
    else:
        print(f"{'llm-analysis 0.2.2':32}{llm['plans_per_s']:>14,.0f}   "
              f"(LLMAnalysis.training on {llm['plans']} valid plans)")
        print(f"ratio, ddlsim valid plans/s (whole grid) / llm-analysis: "
              f"{speed['valid_per_s'] / llm['plans_per_s']:.1f}×; plans in the grid/s: "
              f"{speed['plans_per_s'] / llm['plans_per_s']:.0f}×")
    if args.no_agreement:
        return
    print("\nagreement with the exact analytical engine"
          + (" (sample)" if args.quick else " (every valid plan)"))
    print(f"{'grid':44}{'plans':>8}{'valid':>7}{'checked':>8}{'p90':>9}{'max':>8}{'top-10':>8}")
    for name, (data, axes) in GRIDS.items():
        a = agreement(name, data, axes, args.quick)
        print(f"{name:44}{a['plans']:>8,}{a['valid']:>7,}{a['checked']:>8,}{a['p90']:>9.3%}"
              f"{a['max']:>8.2%}{a['top10_overlap']:>6}/10", flush=True)


if __name__ == "__main__":
    main()
