"""Where the torch loop's FSDP2 iteration spends its CPU time, on 2 ranks over Gloo: per
phase, its collectives (inside the iteration, and the same calls alone between iterations),
FSDP2's own ATen ops and the model's, and what no ATen op accounts for (Python: hooks,
DTensor).

    PYTHONPATH=... torchrun --standalone --nproc-per-node 2 benchmarks/torch_fsdp_ops.py

The torch loop (``benchmarks/closed_loop.py --torch --clock cpu``) compares each iteration's
process CPU time (every thread: Gloo's too) with ddlsim's prediction, in which the
collectives' seconds are the same calls' CPU time timed alone (``sizes2.csv``). Here, on the
loop's ``torch-fsdp`` step (:func:`torchbench.fsdp_step`), every second iteration runs under
a ``TorchDispatchMode`` charging each ATen op's process CPU time to ``(phase, op)``, and
every iteration wraps ``dist.all_gather_single`` and ``dist.reduce_scatter_single`` (FSDP2's
``DefaultAllGather`` and ``DefaultReduceScatter``) to time each collective whole (issue,
Gloo's work on its threads and the wait: ``async_op=False``). After each iteration each
collective seen is called again alone on buffers of its size (after a barrier), as the
loop's calibration does. Prints rank 0's and rank 1's least and median over ``--iters`` of
each figure (CPU ms; the untimed phases from the iterations without the op timer, which adds
a Python call per op). Needs the torch extra.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from contextlib import nullcontext

import numpy as np

import torchbench as tb

#: FSDP2's own ATen ops on a CPU device (``_fsdp_collectives.py``: the all-gather's
#: copy-in, copy-out and the reduce-scatter's ``_chunk_cat`` copy-in; ``_fsdp_param.py``:
#: the unsharded views), not the model's
FSDP_OPS = ("all_gather_copy_in", "split_with_sizes_copy", "_chunk_cat", "chunk_cat",
            "as_strided", "set_", "resize_", "_foreach_copy_", "empty", "empty_strided")


def _phase(clock) -> str:
    """The phase a :class:`~ddlsim.reference.torch_train.PhaseClock` is in: the first not
    yet charged (it charges a phase at its end)."""
    return next((p for p in ("forward", "backward") if not clock.spent.get(p)), "step")


def _op_timer(spent: dict, clock):
    """A dispatch mode charging each ATen op's process CPU time to ``(phase, op)``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Timer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            t0 = time.process_time()
            out = func(*args, **(kwargs or {}))
            if func.namespace != "c10d":
                spent[(_phase(clock), func.overloadpacket.__name__)] += time.process_time() - t0
            return out
    return Timer()


def measure(iters: int, warmup: int = 2) -> dict:
    """Per figure, the least and the median over the iterations on this rank (CPU
    seconds)."""
    import torch.distributed as dist
    log: list = []
    tb.log_fsdp_collectives(log)
    step, _ = tb.fsdp_step(False)
    clock = step.clock
    figures: dict[str, list[float]] = defaultdict(list)
    for it in range(warmup + 2 * iters):
        log.clear()
        spent: dict = defaultdict(float)
        timed = it % 2 == 0
        dist.barrier()
        with (_op_timer(spent, clock) if timed else nullcontext()):
            step()
        if it < warmup:
            continue
        phases = dict(clock.spent)
        calls = list(log)
        for k, call in enumerate(calls):
            key = f"{call.name} {call.nbytes / 1e6:.1f} MB #{k}"
            figures[f"coll {key} inside"].append(call.cpu_s)
            figures[f"coll {key} alone"].append(tb.call_alone(call)[1])
        if not timed:
            for p, v in phases.items():
                figures[f"phase {p} (untimed)"].append(v)
            continue
        for p, v in phases.items():
            figures[f"phase {p}"].append(v)
        ops = defaultdict(float)
        for (p, op), v in spent.items():
            ops[(p, "fsdp" if op in FSDP_OPS else "model")] += v
            figures[f"op {p} {op}"].append(v)
        for (p, kind), v in ops.items():
            figures[f"ops {p} {kind}"].append(v)
    return {k: (min(v), float(np.median(v))) for k, v in figures.items() if v}


def main(argv: list[str] | None = None) -> int:
    ap = tb.parser(__doc__, "iters", 8, "timed iterations (each twice: with and without "
                   "the op timer)")
    ap.add_argument("--top", type=int, default=25, help="ATen op rows to print (>= 1)")
    args = tb.parse(ap, argv, ("iters", "top"))
    import torch.distributed as dist
    figs = measure(args.iters)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, figs)
    if dist.get_rank() == 0:
        load = os.getloadavg()
        print(f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; CPU ms over "
              f"{args.iters} iterations, least / median, rank 0 | rank 1")
        keys = [k for k in every[0] if not k.startswith("op ")]
        ops = sorted((k for k in every[0] if k.startswith("op ")),
                     key=lambda k: -every[0][k][0])
        nan = (float("nan"),) * 2
        for k in sorted(keys) + ops[:args.top]:
            print(f"{k:48s} " + " | ".join("{:8.2f} {:8.2f}".format(*(x * 1e3 for x in
                                                                       f.get(k, nan)))
                                           for f in every))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
