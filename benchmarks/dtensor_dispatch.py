"""The host cost of DTensors (FSDP2's parameters) in the optimizer step, measured on this CPU.

    PYTHONPATH=... python benchmarks/dtensor_dispatch.py [--reference] [--reps 30]

FSDP2 (``fully_shard``) turns every parameter, its gradient and Adam's state into a DTensor;
each ATen op on one goes through DTensor's ``__torch_dispatch__`` (sharding propagation, the
local tensors unwrapped and the result wrapped) before the kernel runs. On a CPU device the
host runs the kernel too, so that cost adds to the step's time; on a GPU it adds to the
host's time per launch, and shows only where the step is host-bound.

Two measurements on one rank (a Gloo group of one: the per-op host cost does not depend on
the shard's size, which a one-rank mesh leaves whole), each the least process CPU time over
``--reps`` rounds, one thread:

1. one op, ``x.add_(1.0)`` on a one-element tensor, plain and as a DTensor (``distribute_
   tensor`` over the one-rank mesh, ``Shard(0)``): the per-op dispatch cost of each and their
   difference;
2. ``torch.optim.Adam(foreach=False).step()`` (the single-tensor loop torch picks on a CPU:
   its default foreach is for CUDA tensors, torch/optim/optimizer.py
   ``_default_to_fused_or_foreach``) over as
   many parameters as the torch closed loop's model has (ddlsim/reference/torch_train.py,
   --small unless --reference), each of 8 elements so that the step is its host's work
   alone, plain and as DTensors with DTensor gradients: the extra per parameter tensor,
   that extra in (1)'s differences, and divided by the ATen ops per tensor of the plain
   step (counted under a ``TorchDispatchMode``): DTensor's extra per op of the step;
3. the same with ``foreach=True``, the multi-tensor step torchtitan runs on a GPU
   (torchtitan 9dec370 torchtitan/optimizer.py: ``foreach = not fused``): its host's cost per
   step over DTensors against plain tensors (here the CPU also runs the kernels, whose time
   is the same in both).

Prints one line per measurement. Needs the torch extra; nothing is fitted.
"""

from __future__ import annotations

import tempfile

import torchbench as tb


def _one_op(reps: int, calls: int = 2000) -> tuple[float, float]:
    """Seconds per ``add_`` on a one-element tensor, plain and as a one-rank DTensor."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (1,))
    plain = torch.zeros(1)
    dt = distribute_tensor(torch.zeros(1), mesh, [Shard(0)])

    def loop(x):
        def run():
            for _ in range(calls):
                x.add_(1.0)
        return run
    return (tb.least_cpu(loop(plain), reps, 3) / calls, tb.least_cpu(loop(dt), reps, 3) / calls)


def _adam(n: int, sharded: bool, reps: int, foreach: bool = False) -> float:
    """Least CPU seconds of one Adam step over ``n`` 8-element parameters (the host's cost
    alone: the kernels' work is nil), plain or as DTensors over the one-rank mesh
    (``Shard(0)``, as ``fully_shard`` leaves them) with DTensor gradients; ``foreach``: the
    multi-tensor step."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (1,))

    def tensor(value: float):
        t = torch.full((8,), value)
        return distribute_tensor(t, mesh, [Shard(0)]) if sharded else t
    params = [torch.nn.Parameter(tensor(0.0)) for _ in range(n)]
    for p in params:
        p.grad = tensor(1e-3)
    opt = torch.optim.Adam(params, lr=1e-3, foreach=foreach)
    return tb.least_cpu(opt.step, reps, 3)


def _ops_per_tensor(shape) -> float:
    """ATen ops per parameter tensor in one plain Adam step (``foreach=False``) over the
    model, counted under a ``TorchDispatchMode``: those on the parameter, its gradient and
    state (a first tensor argument with a dimension), not those on the 0-dim ``step``."""
    import torch
    from ddlsim.reference.torch_train import build_stage
    params = list(build_stage(shape, 0, 1).parameters())
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.Adam(params, lr=1e-3, foreach=False)
    opt.step()                                   # the state exists from here on
    return tb.count_ops(opt.step, tb.on_state)["state"] / len(params)


def main(argv: list[str] | None = None) -> int:
    args = tb.parse(tb.parser(__doc__, "reps", 30, "rounds; the least is kept"), argv,
                    ("reps",))
    model = tb.loop_model(args.reference)
    if model is None:
        return 2
    import torch.distributed as dist
    from ddlsim.reference.torch_train import build_stage
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0,
                                world_size=1)
        try:
            plain_op, dt_op = _one_op(args.reps)
            shape = model.shape
            n = sum(1 for _ in build_stage(shape, 0, 1).parameters())
            plain, dtensor = (_adam(n, sharded, args.reps) for sharded in (False, True))
            ops = _ops_per_tensor(shape)
            multi = [_adam(n, sharded, args.reps, foreach=True) for sharded in (False, True)]
        finally:
            dist.destroy_process_group()
    extra_op = dt_op - plain_op
    per_tensor = (dtensor - plain) / n
    print(f"one op (add_, 1 element): plain {plain_op * 1e6:.2f} us, DTensor "
          f"{dt_op * 1e6:.2f} us, DTensor's extra {extra_op * 1e6:.2f} us per op")
    print(f"Adam step (foreach=False) over {n} tensors: plain {plain * 1e3:.2f} ms, DTensor "
          f"{dtensor * 1e3:.2f} ms, extra {per_tensor * 1e3:.3f} ms per tensor = "
          f"{per_tensor / extra_op:.1f} one-element add_'s extra per tensor")
    print(f"Adam's ATen ops per tensor (plain step, counted): {ops:.1f}; DTensor's extra per "
          f"op of the step: {per_tensor / ops * 1e6:.1f} us")
    print(f"Adam step (foreach=True, torchtitan's on a GPU) over {n} tensors: plain "
          f"{multi[0] * 1e3:.2f} ms, DTensor {multi[1] * 1e3:.2f} ms, extra "
          f"{(multi[1] - multi[0]) / n * 1e3:.3f} ms per tensor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
