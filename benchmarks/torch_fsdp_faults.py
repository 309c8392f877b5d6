"""Page faults in the torch loop's FSDP2 iteration on this CPU, and what they cost (issue 30,
task E): FSDP2 allocates its all-gather outputs and reduce-scatter buffers afresh for every
unshard and reduce, and glibc hands memory that large back to the system on free.

    PYTHONPATH=... python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/torch_fsdp_faults.py [--reference] [--iters 8]
    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 PYTHONPATH=... \\
        python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/torch_fsdp_faults.py            # the same, freed memory kept by glibc

Each rank runs the trainer's FSDP2 step (:func:`ddlsim.reference.torch_train.
data_parallel_step`, ``fully_shard`` per block and the root, one thread) for ``--iters``
timed iterations after two untimed ones, a barrier before each; rank 0 prints, for the
iteration of least process CPU time (the most over ranks), that time, its phases
(:class:`~ddlsim.reference.torch_train.PhaseClock`) and rank 0's minor page faults in it
(``getrusage``), with glibc's ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` as set.
Run once as is and once with both raised (glibc then serves the buffers from its heap and
keeps freed memory): the difference in CPU time is what the faults cost (the kernel's page
fault and zeroing of each fresh page, ``ddlsim calibrate first-touch``'s figure; docs/
calibration.md), which ddlsim's decoder trace does not charge. Nothing is fitted.
"""

from __future__ import annotations

import os
import resource
import time

import torchbench as tb


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(argv: list[str] | None = None) -> int:
    args = tb.parse(tb.parser(__doc__, "iters", 8, "timed iterations"), argv, ("iters",))
    step, _ = tb.fsdp_step(args.reference)          # exits 2 without torch
    import torch
    import torch.distributed as dist
    best = None
    for it in range(2 + args.iters):
        dist.barrier()
        f0, c0 = _faults(), time.process_time()
        step()
        spent = torch.tensor([time.process_time() - c0], dtype=torch.float64)
        faults = _faults() - f0
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)
        if it >= 2 and (best is None or float(spent) < best[0]):
            best = (float(spent), faults, dict(step.clock.spent))
    if dist.get_rank() == 0:
        load = os.getloadavg()
        env = {k: os.environ.get(k, "default") for k in ("MALLOC_MMAP_THRESHOLD_",
                                                         "MALLOC_TRIM_THRESHOLD_")}
        phases = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in best[2].items())
        print(f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; glibc {env}")
        print(f"FSDP2 iteration, least CPU over {args.iters}: {best[0] * 1e3:.1f} ms ({phases} "
              f"ms, rank 0); rank 0's minor page faults in it: {best[1]}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
