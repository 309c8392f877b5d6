"""What torch's DistributedDataParallel costs on one rank, measured on this CPU: the torch
loop's model trained bare and wrapped, in one process, iterations alternating.

    PYTHONPATH=... python benchmarks/torch_ddp_one_rank.py [--reference] [--iters 20]

The torch closed loop's trainer (ddlsim/reference/torch_train.py) wraps its model in
``DistributedDataParallel`` on one rank too, where the stack it declares (torchtitan-2024,
which wraps DDP only at ``dp_replicate > 1``) charges none of the Reducer's passes
(software.yaml ``ddp.bucket_passes``: each gradient copied into its bucket scaled by 1/world,
``ddp.grad_copy_passes``: the bucket copied back after the all-reduce; torch
``reducer.cpp``, ``gradient_as_bucket_view=False``). This measures them: two copies of the
model with the same initial weights, one bare and one under DDP on a Gloo group of one
rank, each with its own ``torch.optim.Adam`` and ``zero_grad(set_to_none=False)`` as the
trainer runs them, one iteration of each in turn (the order swapped every round, so both
see the same machine), one thread; per phase (forward, backward, step) and whole, the
least process CPU time over ``--iters`` rounds, and their difference, beside the bytes of
the Reducer's four passes over the gradients and the time they take at this CPU's
``torch.add(x, y, out=z)`` rate on the gradients' size (the torch job's stream rate).

Prints one line per measurement; nothing is fitted.
"""

from __future__ import annotations

import os
import tempfile
import time

import torchbench as tb

PHASES = ("forward", "backward", "step")


def _step(model, opt, idx, tgt):
    """One iteration; process CPU seconds per phase."""
    t0 = time.process_time()
    loss = model(idx, tgt)
    t1 = time.process_time()
    loss.backward()
    t2 = time.process_time()
    opt.step()
    opt.zero_grad(set_to_none=False)
    t3 = time.process_time()
    return {"forward": t1 - t0, "backward": t2 - t1, "step": t3 - t2}


def _stream_s(n_elems: int, reps: int = 5) -> float:
    """Least CPU seconds of ``torch.add(x, y, out=z)`` over ``n_elems`` fp32 (3 passes)."""
    import torch
    x, y, z = torch.ones(n_elems), torch.ones(n_elems), torch.empty(n_elems)
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        torch.add(x, y, out=z)
        best = min(best, time.process_time() - t0)
    return best


def measure(shape, iters: int, warmup: int = 3) -> tuple[dict, dict, int, float]:
    """(least CPU s per phase bare, the same wrapped, gradient elements, s of one pass over
    the gradients at the stream rate)."""
    from torch.nn.parallel import DistributedDataParallel

    import torch
    from ddlsim.reference.torch_train import _batch, build_stage
    bare, inner = build_stage(shape, 0, 1), build_stage(shape, 0, 1)
    wrapped = DistributedDataParallel(inner, bucket_cap_mb=25)
    runs = {"bare": (bare, torch.optim.Adam(bare.parameters(), lr=1e-3)),
            "ddp": (wrapped, torch.optim.Adam(wrapped.parameters(), lr=1e-3))}
    idx, tgt = _batch(shape, 0)
    best = {name: dict.fromkeys((*PHASES, "whole"), float("inf")) for name in runs}
    for r in range(warmup + iters):
        for name in (("bare", "ddp") if r % 2 else ("ddp", "bare")):
            spent = _step(*runs[name], idx, tgt)
            spent["whole"] = sum(spent.values())
            if r >= warmup:
                for k, v in spent.items():
                    best[name][k] = min(best[name][k], v)
    n = sum(p.numel() for p in bare.parameters())
    return best["bare"], best["ddp"], n, _stream_s(n) / 3


def main(argv: list[str] | None = None) -> int:
    args = tb.parse(tb.parser(__doc__, "iters", 20, "rounds; the least is kept"), argv,
                    ("iters",))
    model = tb.loop_model(args.reference)
    if model is None:
        return 2
    import torch.distributed as dist
    shape = model.shape
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0,
                                world_size=1)
        try:
            bare, ddp, n, pass_s = measure(shape, args.iters)
        finally:
            dist.destroy_process_group()
    print(f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; {shape}; "
          f"{n} parameters ({4 * n / 1e6:.1f} MB of fp32 gradients)")
    for k in (*PHASES, "whole"):
        print(f"{k:8s}: bare {bare[k] * 1e3:7.2f} ms, DDP {ddp[k] * 1e3:7.2f} ms, "
              f"DDP's extra {(ddp[k] - bare[k]) * 1e3:+6.2f} ms")
    print(f"one pass over the gradients at torch.add's rate: {pass_s * 1e3:.2f} ms; the "
          f"Reducer's 4 passes (bucket_passes 2 + grad_copy_passes 2): {4 * pass_s * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
