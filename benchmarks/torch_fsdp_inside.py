"""FSDP2's collectives inside the torch loop's iteration against the same calls alone, in wall
time: what the ranks' arrivals and their neighbours' work add to each collective (issue 30).

    PYTHONPATH=... python -m torch.distributed.run --standalone --nproc-per-node 4 \\
        benchmarks/torch_fsdp_inside.py [--reference] [--iters 8]

The torch loop (``benchmarks/closed_loop.py --torch``) charges each collective the time of
the same call timed alone between iterations (``sizes{N}.csv``: after a barrier, every rank
idle but for it). Here each rank runs the loop's ``torch-fsdp`` step
(:func:`torchbench.fsdp_step`, a barrier before each iteration) with FSDP2's
``all_gather_single`` and ``reduce_scatter_single`` wrapped to log, per call, its entry and
exit (``time.perf_counter``, one clock for every process on this machine) and its process CPU
time; after each iteration every logged call is made again alone (after a barrier). Printed:

* per rank, the least and the median over ``--iters`` of the iteration's wall and CPU time,
  the collectives' summed wall and CPU time inside it, and the same calls' alone;
* per iteration, over the collectives in order: ``skew`` (the mean over ranks of the wait
  for the last rank to arrive), ``span`` (the last arrival to the last exit: the collective's
  time once every rank is in it) and ``first`` (the last arrival to the first exit), ms.

Nothing is fitted; nothing here is charged by ddlsim. Needs the torch extra.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict

import torchbench as tb


def measure(reference: bool, iters: int, warmup: int = 2) -> tuple[dict, list]:
    """(figure → seconds per iteration, each iteration's calls as (entry, exit) pairs)."""
    import torch.distributed as dist
    log: list = []
    tb.log_fsdp_collectives(log)
    step, _ = tb.fsdp_step(reference)
    figures: dict[str, list[float]] = defaultdict(list)
    times = []
    for it in range(warmup + iters):
        log.clear()
        dist.barrier()
        c0, w0 = time.process_time(), time.perf_counter()
        step()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        calls = list(log)
        alone = [tb.call_alone(c) for c in calls]
        if it < warmup:
            continue
        figures["iteration wall"].append(wall)
        figures["iteration CPU"].append(cpu)
        figures["collectives inside, wall"].append(sum(c.exit - c.entry for c in calls))
        figures["collectives inside, CPU"].append(sum(c.cpu_s for c in calls))
        figures["collectives alone, wall"].append(sum(w for w, _ in alone))
        figures["collectives alone, CPU"].append(sum(c for _, c in alone))
        times.append([(c.entry, c.exit) for c in calls])
    return figures, times


def arrivals(every: list[list]) -> list[tuple[float, float, float]]:
    """Per iteration, summed over its collectives: (skew, span, first) in seconds (module
    docstring), from every rank's (entry, exit) pairs."""
    out = []
    for it in range(len(every[0])):
        skew = span = first = 0.0
        for c in range(len(every[0][it])):
            entries = [r[it][c][0] for r in every]
            exits = [r[it][c][1] for r in every]
            last = max(entries)
            skew += sum(last - e for e in entries) / len(entries)
            span += max(exits) - last
            first += min(exits) - last
        out.append((skew, span, first))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = tb.parser(__doc__, "iters", 8, "timed iterations")
    args = tb.parse(ap, argv, ("iters",))
    import numpy as np
    import torch.distributed as dist
    figures, times = measure(args.reference, args.iters)
    n = dist.get_world_size()
    every_fig, every_time = [None] * n, [None] * n
    dist.all_gather_object(every_fig, {k: (min(v), float(np.median(v)))
                                       for k, v in figures.items()})
    dist.all_gather_object(every_time, times)
    if dist.get_rank() == 0:
        load = os.getloadavg()
        print(f"{n} ranks on {len(os.sched_getaffinity(0))} cores, load average "
              f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; the "
              f"{'reference' if args.reference else 'small'} model, {args.iters} iterations; "
              f"ms, least / median per rank")
        for k in every_fig[0]:
            print(f"{k:26s} " + " | ".join(f"{f[k][0] * 1e3:7.1f} {f[k][1] * 1e3:7.1f}"
                                           for f in every_fig))
        print("per iteration, summed over its collectives (ms): skew, span, first")
        for it, (skew, span, first) in enumerate(arrivals(every_time)):
            print(f"  {it:2d}  {skew * 1e3:7.1f} {span * 1e3:7.1f} {first * 1e3:7.1f}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
