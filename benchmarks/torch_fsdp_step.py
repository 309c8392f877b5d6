"""FSDP2's optimizer step on this CPU against the same step over plain tensors, in place: what
the DTensors cost the torch loop's ``torch-fsdp`` run (issue 30, task E).

    PYTHONPATH=... python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/torch_fsdp_step.py [--reference] [--iters 20]

Each rank builds the torch closed loop's model under ``fully_shard`` as its trainer does
(:func:`ddlsim.reference.torch_train.data_parallel_step`, FSDP2 per block and the root), runs
one forward and backward (so every sharded parameter has its sharded gradient and Adam its
state), and then times, alternating, one thread, each the least process CPU time over
``--iters`` rounds (the most over ranks):

* the trainer's step: ``torch.optim.Adam.step()`` (the single-tensor loop torch runs on a CPU)
  and ``zero_grad(set_to_none=False)`` over the DTensors;
* the same over plain tensors of the same local shards (each parameter's ``to_local()``
  copied, with a copy of its local gradient), a second ``Adam`` stepped once first so that
  its state exists too.

Their difference is DTensor's cost in the step (sharding propagation, wrapping and
unwrapping per op), beside the figure per parameter tensor and per ATen op of the step (the
plain step's ops per tensor counted under a ``TorchDispatchMode``, as
``benchmarks/dtensor_dispatch.py`` counts them; ``zero_`` one more). Nothing is fitted.
The gradients are zeroed in place so that each round steps them again; the loop's trainer
sets them to None since 2026-11-30 (torchtitan's ``zero_grad()``), whose step runs the 7 ops
of Adam alone (``fsdp2_host.STEP_OPS_PER_TENSOR``).
"""

from __future__ import annotations

import os

import torchbench as tb


def _ops_per_tensor(opt, params) -> float:
    """ATen ops per parameter tensor of one ``opt.step()`` and ``zero_grad`` over ``params``
    (ops on a parameter's state: :func:`torchbench.on_state`)."""
    def call():
        opt.step()
        opt.zero_grad(set_to_none=False)
    return tb.count_ops(call, tb.on_state)["state"] / len(params)


def main(argv: list[str] | None = None) -> int:
    args = tb.parse(tb.parser(__doc__, "iters", 20, "rounds; the least is kept"), argv,
                    ("iters",))
    step, model = tb.fsdp_step(args.reference)      # exits 2 without torch
    import torch
    import torch.distributed as dist
    world = dist.get_world_size()
    step()                                            # gradients and Adam's state
    sharded = list(step.model.parameters())
    fsdp_opt = torch.optim.Adam(sharded, lr=1e-3)
    loss = step.model(*_inputs(model.shape))
    loss.backward()
    fsdp_opt.step()
    plain = [torch.nn.Parameter(p.to_local().detach().clone()) for p in sharded]
    for p, q in zip(plain, sharded):
        p.grad = q.grad.to_local().detach().clone()
    plain_opt = torch.optim.Adam(plain, lr=1e-3)
    plain_opt.step()

    def run(opt):
        def call():
            opt.step()
            opt.zero_grad(set_to_none=False)
        return call
    best = {"dtensor": float("inf"), "plain": float("inf")}
    for r in range(args.iters):
        for name in (("dtensor", "plain") if r % 2 else ("plain", "dtensor")):
            best[name] = min(best[name], tb.least_max_cpu(run(fsdp_opt if name == "dtensor"
                                                        else plain_opt), 1))
    ops = _ops_per_tensor(plain_opt, plain)
    if dist.get_rank() == 0:
        load = os.getloadavg()
        n = len(sharded)
        extra = best["dtensor"] - best["plain"]
        print(f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; {world} ranks, "
              f"{n} parameter tensors, {sum(p.numel() for p in plain)} elements per rank")
        print(f"step + zero_grad: DTensors {best['dtensor'] * 1e3:.2f} ms, plain "
              f"{best['plain'] * 1e3:.2f} ms, DTensor's extra {extra * 1e3:+.2f} ms = "
              f"{extra / n * 1e3:+.3f} ms per tensor; {ops:.1f} ATen ops per tensor (counted): "
              f"{extra / n / ops * 1e6:+.1f} us per op")
    dist.destroy_process_group()
    return 0


def _inputs(shape):
    """The trainer's batch for this rank."""
    import torch.distributed as dist

    from ddlsim.reference.torch_train import _batch
    return _batch(shape, dist.get_rank())


if __name__ == "__main__":
    raise SystemExit(main())
