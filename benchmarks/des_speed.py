"""How fast is the discrete-event engine? GPT-3 175B on 1,024 A100s, then a scaling table.

The main case is one training iteration of GPT-3 175B on 128 DGX A100 nodes (1,024 GPUs:
TP8 × PP16 × DP8, global batch 1,536, micro-batch 1, 1F1B; ``system: {preset: dgx-a100,
nodes: 128}``) through the DES: wall time, SimPy events, events per second. The scaling
table runs 64 … 8,192 GPUs: TP8 × PP16 × DP (TP8 × PP8 at 64, where PP16 does not fit), with
the global batch either growing with DP so every pipeline runs the same 192 micro-batches
(weak scaling, default) or fixed at 1,536 (``--strong``). Single process, one core.

    python benchmarks/des_speed.py                 # main case + weak-scaling table
    python benchmarks/des_speed.py --strong --sizes 1024,8192
    python benchmarks/des_speed.py --profile       # cProfile of the main case
    python benchmarks/des_speed.py --targets       # the issue's three targets, each timed in
                                                   # a fresh process, with its peak memory

Targets (issue 13, one core): GPT-3 175B on 1,024 GPUs ≤ 10 s; Megatron-LM 1T on 3,072 GPUs
(``examples/megatron-1t-3072-a100.yaml``) ≤ 60 s; 16,384 GPUs (GPT-3 175B, TP8 × PP16 ×
DP128, weak scaling: 192 micro-batches per pipeline as in the table) ≤ 2 min. Issue 27 adds
the 100k-GPU scale: GPT-3 175B on 131,072 H100s (16,384 DGX H100, TP8 × PP16 × DP1024, 192
micro-batches per pipeline as in the table) ≤ 60 s and ≤ 2 GB (``gpt3-175b-131072-h100``; its
analytical target, ≤ 2 s and ≤ 500 MB, is in ``benchmarks/analytical_speed.py``). Peak
memory is the process's maximum resident set size (``resource.getrusage``), workload and
topology build included; a target is met when its CPU time (``time.process_time``) is within
the limit (wall time on a shared machine measures the neighbours too), and its peak memory
within the memory limit where it has one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import ddlsim
from ddlsim.limits import Limits

ROOT = Path(__file__).resolve().parents[1]
#: name → (config, seconds allowed)
TARGETS = {"gpt3-175b-1024": ("config(1024, 1536)", 10.0),
           "megatron-1t-3072": (repr(str(ROOT / "examples" / "megatron-1t-3072-a100.yaml")), 60.0),
           "gpt3-175b-16384": ("config(16384)", 120.0),
           "gpt3-175b-131072-h100": ("config(131072, system='dgx-h100')", 60.0)}
#: name → peak resident memory allowed, MB (issue 27)
MEMORY_MB = {"gpt3-175b-131072-h100": 2000.0}
#: Work budgets of the targets: above the defaults, which refuse the largest before they start
#: (the 131,072-GPU cluster graph has 1.3·10^6 links, its trace 1.7·10^9 rank-ops)
TARGET_LIMITS = Limits(des_rank_ops=10**11, topology_links=10**7)

#: Smaller cases of the same plans for before/after comparisons that fit a working session
#: (run by name: ``--targets megatron-1t-1024``); the seconds are not targets, only a scale.
PROXIES = {"megatron-1t-1024": ("megatron_1t(2, 128)", 60.0),
           "qwen3-moe-256": ("qwen3_moe(8, 2, 256)", 60.0)}
CASES = {**TARGETS, **PROXIES}

SIZES = (64, 128, 256, 512, 1024, 2048, 4096, 8192)

#: The targets' processes, kept to one core: numpy's BLAS and OpenMP pools would otherwise
#: spread large vector operations over every core, and the CPU time would count them all.
ONE_CORE = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}


def megatron_1t(dp: int, global_batch: int) -> dict:
    """``examples/megatron-1t-3072-a100.yaml`` with DP ``dp`` on 64·``dp`` nodes and
    ``global_batch`` sequences (a multiple of 64·``dp`` for the interleaved schedule)."""
    from ddlsim.documents import parse_yaml
    path = ROOT / "examples" / "megatron-1t-3072-a100.yaml"
    cfg = parse_yaml(path.read_text(), str(path))
    cfg["parallel"]["data_parallel_size"] = dp
    cfg["train"]["global_batch_size"] = global_batch
    cfg["system"]["nodes"] = 64 * dp
    return cfg


def qwen3_moe(layers: int, pp: int, global_batch: int) -> dict:
    """``examples/qwen3-235b-moe-h100.yaml`` (256 H100s, EP 32 all-to-alls over 4 nodes: 992
    flows each) cut to ``layers`` layers, PP ``pp`` with 1F1B and ``global_batch`` sequences:
    an expert-parallel case small enough to time (issue 28)."""
    from ddlsim.documents import parse_yaml
    path = ROOT / "examples" / "qwen3-235b-moe-h100.yaml"
    cfg = parse_yaml(path.read_text(), str(path))
    cfg["model"] = {"preset": cfg["model"], "num_hidden_layers": layers}
    cfg["parallel"].pop("virtual_pipeline_model_parallel_size")
    cfg["parallel"].update(pipeline_model_parallel_size=pp, schedule="1f1b")
    cfg["train"]["global_batch_size"] = global_batch
    return cfg


def config(gpus: int, global_batch: int | None = None, system: str = "dgx-a100") -> dict:
    """GPT-3 175B on ``gpus`` GPUs of ``system`` (DGX nodes of 8; A100 by default): TP8 ×
    PP16 × DP, or TP8 × PP8 at 64."""
    pp = 16 if gpus >= 128 else 8
    dp = gpus // (8 * pp)
    return {"model": "gpt3-175b",
            "parallel": {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": pp,
                         "data_parallel_size": dp},
            "train": {"micro_batch_size": 1, "global_batch_size": global_batch or 192 * dp,
                      "seq_length": 2048},
            "system": {"preset": system, "nodes": gpus // 8}}


def time_des(cfg: dict) -> tuple[float, ddlsim.predict]:
    """One DES run of ``cfg`` and its wall time, with the targets' work budget
    (:data:`TARGET_LIMITS`): the table's 2,048-8,192 GPU rows are over the default budget,
    which refused them before they started."""
    t0 = time.perf_counter()
    result = ddlsim.predict(cfg, "des", check_fit=False, spans="representative",
                            limits=TARGET_LIMITS)
    return time.perf_counter() - t0, result


def one_target(name: str) -> dict:
    """Run target ``name`` in this process: wall and CPU seconds, events, peak RSS."""
    import resource
    cfg = eval(CASES[name][0])   # a literal path or a call of a config function above
    t0, c0 = time.perf_counter(), time.process_time()
    r = ddlsim.predict(cfg, "des", check_fit=False, spans="representative",
                       limits=TARGET_LIMITS)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"name": name, "wall_s": wall, "cpu_s": cpu, "events": r.extra["des"]["events"],
            "iteration_s": r.iteration_time_s, "world_size": r.world_size,
            "peak_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def targets(names: list[str]) -> None:
    """Each target in a fresh process (its own peak memory), one core each."""
    print(f"{'case':>22} {'GPUs':>7} {'wall s':>8} {'CPU s':>8} {'events':>11} {'peak MB':>8} "
          f"{'target':>13}  met (CPU, memory)")
    for name in names:
        out = subprocess.run([sys.executable, __file__, "--one", name], check=True,
                             capture_output=True, text=True, env=ONE_CORE).stdout
        r = json.loads(out.strip().splitlines()[-1])
        limit, mb = CASES[name][1], MEMORY_MB.get(name, float("inf"))
        target = f"{limit:.0f} s" + (f", {mb:.0f} MB" if mb < float("inf") else "")
        met = r["cpu_s"] <= limit and r["peak_rss_MB"] <= mb
        print(f"{name:>22} {r['world_size']:7d} {r['wall_s']:8.1f} {r['cpu_s']:8.1f} "
              f"{r['events']:11,d} {r['peak_rss_MB']:8.0f} {target:>13}  "
              f"{'yes' if met else 'NO'}", flush=True)


def main_case(profile: bool) -> None:
    cfg = config(1024, 1536)
    if profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
    wall, r = time_des(cfg)
    if profile:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    a = ddlsim.predict(cfg, "analytical", check_fit=False)
    s = r.extra["des"]
    print("GPT-3 175B, 1,024 A100 (TP8 PP16 DP8, global batch 1,536, micro-batch 1)")
    print(f"  wall time      {wall:8.2f} s")
    print(f"  events         {s['events']:8,d}   ({s['events'] / wall:,.0f} events/s)")
    print(f"  flows          {s['flows']:,d}   rate updates {s['rate_updates']:,d}")
    print(f"  iteration      DES {r.iteration_time_s:.3f} s, analytical {a.iteration_time_s:.3f} s "
          f"({100 * (r.iteration_time_s / a.iteration_time_s - 1):+.2f}%)")
    print(f"  busiest link   {r.links[0]['link']} ({100 * r.links[0]['utilisation']:.1f}%)")


def scaling(sizes: list[int], strong: bool) -> None:
    print(f"\n{'GPUs':>6} {'plan':>14} {'batch':>6} {'mb/pipe':>7} {'wall s':>8} {'events':>9} "
          f"{'events/s':>9} {'DES s':>8} {'analyt. s':>9}")
    for gpus in sizes:
        cfg = config(gpus, 1536 if strong else None)
        par = cfg["parallel"]
        gb = cfg["train"]["global_batch_size"]
        wall, r = time_des(cfg)
        a = ddlsim.predict(cfg, "analytical", check_fit=False)
        ev = r.extra["des"]["events"]
        plan = f"{par['tensor_model_parallel_size']}x{par['pipeline_model_parallel_size']}" \
               f"x{par['data_parallel_size']}"
        print(f"{gpus:6d} {plan:>14} {gb:6d} {gb // par['data_parallel_size']:7d} {wall:8.2f} "
              f"{ev:9,d} {ev / wall:9,.0f} {r.iteration_time_s:8.3f} {a.iteration_time_s:9.3f}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="GPU counts for the scaling table (comma-separated)")
    ap.add_argument("--strong", action="store_true", help="fix the global batch at 1,536")
    ap.add_argument("--profile", action="store_true", help="profile the main case")
    ap.add_argument("--no-table", action="store_true", help="only the main case")
    ap.add_argument("--targets", nargs="?", const=",".join(TARGETS), default=None,
                    help="time the issue's targets (comma-separated names: "
                         f"{', '.join(TARGETS)}; or the smaller {', '.join(PROXIES)}), "
                         "each in a fresh process")
    ap.add_argument("--one", choices=list(CASES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_target(args.one)))
        return
    if args.targets:
        targets(args.targets.split(","))
        return
    main_case(args.profile)
    if not args.no_table:
        scaling([int(x) for x in args.sizes.split(",")], args.strong)


if __name__ == "__main__":
    main()
