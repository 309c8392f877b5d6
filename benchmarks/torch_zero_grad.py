"""What ``zero_grad(set_to_none=False)`` costs the torch loop's trainer against torch's default
``zero_grad()`` (set to None, as torchtitan-2024 clears its gradients), in one process group
(issue 30, task H3).

    PYTHONPATH=... python -m torch.distributed.run --standalone --nproc-per-node N \\
        benchmarks/torch_zero_grad.py [--plan ddp|fsdp] [--iters 20] [--reference]

Each rank builds the loop's trainer twice (:func:`ddlsim.reference.torch_train.
data_parallel_step`, the plan at this world size: DDP wraps at N > 1, FSDP2 shards), and
runs them in turns, one thread: the trainer as it is, and the same with the optimizer's
``zero_grad`` keeping the gradients and zeroing them in place. Kept, they cost a ``zero_``
pass after the step and a ``+=`` of each new gradient into the old one in the next backward
(``AccumulateGrad``; under FSDP2 ``foreach_reduce``'s ``sharded_param.grad._local_tensor +=``).
Prints each variant's least process CPU time over ``--iters`` iterations (the most over
ranks), whole and per phase (:class:`~ddlsim.reference.torch_train.PhaseClock`). Nothing is
fitted.

Each rank keeps freed memory first, as the loop's job does
(:func:`ddlsim.reference.machine.cache_allocations`); ``--glibc-defaults`` leaves glibc's
allocator as it is, under which gradients set to None are freed after each step and faulted
in anew by the next backward.
"""

from __future__ import annotations

import os

import torchbench as tb


def _variants(plan: str, reference: bool):
    """(the trainer's step, the same step whose ``zero_grad`` keeps the gradients)."""
    model = tb.loop_model(reference)
    if model is None:
        raise SystemExit(2)
    import torch.distributed as dist
    from ddlsim.config import load_config
    from ddlsim.reference.torch_loop import torch_run_config
    from ddlsim.reference.torch_machine import TORCH_STACK
    from ddlsim.reference.torch_train import data_parallel_step
    dist.init_process_group("gloo")
    strategy = {"ddp": "torch-ddp", "fsdp": "torch-fsdp"}[plan]
    cfg = load_config(torch_run_config(model, dist.get_world_size(), strategy,
                                       {"preset": "cpu-10gbe", "software": TORCH_STACK}))
    return data_parallel_step(cfg, model.shape, plan), data_parallel_step(cfg, model.shape, plan)


def _kept(step):
    """``step`` with every optimizer's ``zero_grad`` zeroing in place (set_to_none False)."""
    import torch
    original = torch.optim.Optimizer.zero_grad

    def zero_in_place(self, set_to_none: bool = True) -> None:
        original(self, set_to_none=False)

    def call() -> float:
        torch.optim.Optimizer.zero_grad = zero_in_place
        try:
            return step()
        finally:
            torch.optim.Optimizer.zero_grad = original
    call.clock = step.clock
    return call


def _timed(step) -> tuple[float, dict[str, float]]:
    """One iteration's process CPU seconds, whole and per phase, the most over ranks."""
    import time

    import torch
    import torch.distributed as dist
    dist.barrier()
    t0 = time.process_time()
    step()
    spent = torch.tensor([time.process_time() - t0,
                          *(step.clock.spent[p] for p in step.clock.PHASES)],
                         dtype=torch.float64)
    dist.all_reduce(spent, op=dist.ReduceOp.MAX)
    return float(spent[0]), dict(zip(step.clock.PHASES, map(float, spent[1:])))


def main(argv: list[str] | None = None) -> int:
    ap = tb.parser(__doc__, "iters", 20, "iterations of each variant; the least is kept")
    ap.add_argument("--plan", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--glibc-defaults", action="store_true",
                    help="leave glibc's allocator as it is (no cache_allocations)")
    args = tb.parse(ap, argv, ("iters",))
    if not args.glibc_defaults:
        tb.loop_model(False)                            # the repository on the path
        from ddlsim.reference.machine import cache_allocations
        cache_allocations()
    as_set, kept = _variants(args.plan, args.reference)
    steps = {"set_to_none": as_set, "zeroed": _kept(kept)}
    for step in steps.values():                      # warm-up: Adam's state, FSDP2's init
        step(), step()
    best = {name: [float("inf"), {}] for name in steps}
    for r in range(args.iters):
        for name in (("set_to_none", "zeroed") if r % 2 else ("zeroed", "set_to_none")):
            total, phases = _timed(steps[name])
            if total < best[name][0]:
                best[name][0] = total
            for phase, s in phases.items():
                best[name][1][phase] = min(best[name][1].get(phase, s), s)
    import torch.distributed as dist
    if dist.get_rank() == 0:
        load = os.getloadavg()
        print(f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; {args.plan} on "
              f"{dist.get_world_size()} rank(s), least of {args.iters}, "
              f"{'glibc defaults' if args.glibc_defaults else 'freed memory kept'}")
        for name, (total, phases) in best.items():
            each = ", ".join(f"{p} {s * 1e3:.2f}" for p, s in phases.items())
            print(f"  {name:>11}: {total * 1e3:.2f} ms ({each})")
        print(f"  zeroed - set_to_none: {(best['zeroed'][0] - best['set_to_none'][0]) * 1e3:+.2f}"
              " ms")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
