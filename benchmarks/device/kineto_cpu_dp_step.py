"""Time ``benchmarks/kineto_gpt2.py``'s GPT-2 on CPU, each rank on cores of its own, and
profile one step of one rank with the leanest profiler ddlsim's Kineto import can read.

The issue-30 check "the same model at twice the data-parallel ranks within 15 % of its own
measured run" needs ranks that share nothing but memory: on the 2-core development machine they
shared cores (docs/traces.md, Figures). Here every rank is pinned (``os.sched_setaffinity``,
before torch starts its thread pool) to ``--cpus-per-rank`` CPUs of its own and runs
``--threads`` intra-op threads on them; the CPUs left over in its set run DDP's and Gloo's
threads (the all-reduce) beside the compute, as a system with ``device.spare_cores`` says.

    python benchmarks/device/kineto_cpu_dp_step.py --ranks 1 --profile --out dp1.json
    python benchmarks/device/kineto_cpu_dp_step.py --ranks 2 --out dp2.json

Writes ``OUT.steps.json`` (rank 0: wall, process CPU and main-thread CPU time of every timed
step, the medians, the pinning) and, with ``--profile``, the Kineto trace ``OUT`` of one step
after one profiler warm-up step. The profiler records CPU activity with ``with_stack=True``
(ddlsim places ops by the ``nn.Module`` events only the Python tracer writes) and nothing else
(no shapes, memory or FLOPs), so its cost is the per-event cost that
``benchmarks/kineto_overhead.py`` measures (``record_shapes=False``). Needs torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kineto_gpt2 import add_model_args, make_step, run_ranks  # noqa: E402  (one model)


def cpu_order() -> list[int]:
    """The CPUs this process may run on, hyperthread siblings side by side (sorted by Linux's
    ``topology/physical_package_id`` and ``core_id``), so that consecutive blocks of an even
    size are whole physical cores and two ranks' blocks never share one."""
    def key(cpu: int) -> tuple[int, int, int]:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            return (int((topo / "physical_package_id").read_text()),
                    int((topo / "core_id").read_text()), cpu)
        except (OSError, ValueError):
            return (0, cpu, cpu)

    return sorted(os.sched_getaffinity(0), key=key)


def rank_cpus(rank: int, args) -> list[int]:
    """Rank ``rank``'s CPUs: the ``rank``-th block of ``--cpus-per-rank`` in :func:`cpu_order`
    (``main`` has checked that the blocks fit)."""
    return cpu_order()[rank * args.cpus_per_rank:(rank + 1) * args.cpus_per_rank]


def _timed(step, ranks: int) -> tuple[float, float, float]:
    """One step after a barrier: its wall, process CPU and main-thread CPU time (s)."""
    if ranks > 1:
        torch.distributed.barrier()
    t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    step()
    return time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - m0


def _profile(step, args) -> list[tuple[float, float, float]]:
    """One profiler warm-up step (traced and discarded: pytorch/kineto#328) and the traced
    step, exported to ``args.out``; the times of both."""
    times = []
    with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True,
            record_shapes=False, profile_memory=False, with_flops=False,
            on_trace_ready=lambda prof: prof.export_chrome_trace(args.out),
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)) as prof:
        for _ in range(2):
            times.append(_timed(step, 1))
            prof.step()
    return times


def _median(rows, i: int) -> float:
    return statistics.median(r[i] for r in rows)


def _run(rank: int, args) -> None:
    cpus = rank_cpus(rank, args)
    os.sched_setaffinity(0, cpus)          # before torch's thread pool starts
    # --alone: each process trains its own copy, no process group (the co-location alone)
    mine = argparse.Namespace(**{**vars(args), "ranks": 1}) if args.alone else args
    step = make_step(rank, mine, args.threads)   # flushes subnormals, as kineto_gpt2.py
    for _ in range(args.warmup):
        step()
    timed = [_timed(step, mine.ranks) for _ in range(args.steps)]
    profiled = _profile(step, args) if args.profile else []
    after = [_timed(step, mine.ranks) for _ in range(args.steps)]
    if rank == 0:
        _write(args, cpus, timed, profiled, after)
    if mine.ranks > 1:
        torch.distributed.destroy_process_group()


def _write(args, cpus, timed, profiled, after) -> None:
    """Rank 0's ``OUT.steps.json`` and a one-line summary."""
    median, traced = _median(timed, 0), profiled[-1][0] if profiled else None
    doc = {"ranks": args.ranks, "alone": args.alone, "threads": args.threads, "cpus_per_rank": args.cpus_per_rank,
           "rank0_cpus": cpus, "config": vars(args), "torch": torch.__version__,
           "torch_threads": torch.get_num_threads(), "load_average": os.getloadavg(),
           "step_seconds": [r[0] for r in timed], "median_s": median,
           "step_cpu_seconds": [r[1] for r in timed], "median_cpu_s": _median(timed, 1),
           "step_main_thread_seconds": [r[2] for r in timed],
           "median_main_thread_s": _median(timed, 2),
           "after_step_seconds": [r[0] for r in after], "after_median_s": _median(after, 0),
           "profiled_step_seconds": [r[0] for r in profiled],
           "profiled_cpu_seconds": [r[1] for r in profiled],
           "profiled_over_median": traced / median if profiled else None}
    with open(args.out + ".steps.json", "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{args.ranks} rank(s) x {args.threads} thread(s) on {args.cpus_per_rank} CPUs each "
          f"(rank 0: {cpus}): median step {median * 1e3:.2f} ms over {len(timed)} "
          f"(CPU {doc['median_cpu_s'] * 1e3:.2f} ms, main thread "
          f"{doc['median_main_thread_s'] * 1e3:.2f} ms); after: median "
          f"{doc['after_median_s'] * 1e3:.2f} ms"
          + (f"; traced step {traced * 1e3:.2f} ms ({doc['profiled_over_median']:.3f} x the "
             f"median), profiler warm-up {profiled[0][0] * 1e3:.2f} ms" if profiled else ""),
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p, 8)
    p.add_argument("--threads", type=int, default=3, help="torch intra-op threads per rank")
    p.add_argument("--cpus-per-rank", type=int, default=4,
                   help="CPUs each rank is pinned to (threads + the spare for Gloo/DDP)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--alone", action="store_true",
                   help="with --ranks N: N independent one-rank trainings at once, each on its "
                        "own CPUs, no DDP (what sharing the host costs, without communication)")
    p.add_argument("--profile", action="store_true",
                   help="trace one step (rank 0 of a 1-rank run) after a profiler warm-up step")
    p.add_argument("--port", type=int, default=29531)
    p.add_argument("--out", required=True, help="trace path; OUT.steps.json holds the times")
    args = p.parse_args()
    for name in ("threads", "cpus_per_rank", "ranks", "steps", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)} is not allowed; "
                    "allowed: an integer >= 1")
    if args.profile and args.ranks != 1:
        p.error(f"--profile with --ranks {args.ranks} is not allowed; allowed: --ranks 1 "
                "(the one-rank profile is the import's input)")
    if args.threads > args.cpus_per_rank:
        p.error(f"--threads {args.threads} is not allowed with --cpus-per-rank "
                f"{args.cpus_per_rank}; allowed: threads <= cpus-per-rank")
    pool = cpu_order()
    if args.ranks * args.cpus_per_rank > len(pool):
        p.error(f"--ranks {args.ranks} x --cpus-per-rank {args.cpus_per_rank} = "
                f"{args.ranks * args.cpus_per_rank} CPUs is not allowed: this process may use "
                f"{len(pool)} ({pool}); allowed: ranks x cpus-per-rank <= {len(pool)}")
    run_ranks(_run, args)


if __name__ == "__main__":
    main()
