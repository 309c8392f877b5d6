"""Eager PyTorch's host time per op on this CPU, and how much of it the torch closed loop's
prediction leaves out (issue 29 cause 1, issue 30's torch loop).

    PYTHONPATH=... python benchmarks/torch_host_costs.py [--reference] [--reps 30]

The torch loop gives ddlsim one per-kernel host time (``system.device.launch.stream_gap_s``,
:func:`ddlsim.reference.torch_samples.op_overhead_s`: a loop of 1-element ``torch.add``, no
autograd) and ddlsim charges it per kernel of its trace (:mod:`ddlsim.simulator.kernels.host`).
Torch's iteration runs more ATen ops than ddlsim counts kernels (views, transposes, autograd's
sums), and an op recorded by autograd costs its host more than a bare one. Measured here, on
one thread, each the least process CPU time over ``--reps`` rounds:

1. the bare op: ``torch.add`` of two 1-element tensors (the loop's figure);
2. an op under autograd: ``x = x * c`` on a 1-element tensor that requires grad, a chain of
   ``--chain`` of them, per op: the forward (dispatch and the graph node) and the backward
   (the autograd engine running each node's ``mul`` backward), apart;
3. the ATen ops of one iteration of the loop's model (:mod:`ddlsim.reference.torch_train`,
   one rank, bare), counted per phase under a ``TorchDispatchMode`` (views apart: an
   ``OpOverload`` whose ``is_view`` is set), against the kernels ddlsim's trace of the same run
   counts (its forward and backward blocks).

Then the host time the prediction leaves out, by the measurements alone: (forward ops ×
forward cost + backward ops × backward cost) − (ddlsim's kernels × the bare op), views
counted at the bare op's cost. Nothing is fitted; prints one line per figure.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import torchbench as tb


def bare_op_s(reps: int, calls: int = 500) -> float:
    """CPU seconds per ``torch.add`` of two 1-element tensors (no autograd)."""
    import torch
    a, b = torch.ones(1), torch.ones(1)

    def loop() -> None:
        for _ in range(calls):
            torch.add(a, b)
    return tb.least_cpu(loop, reps) / calls


def autograd_op_s(reps: int, chain: int) -> tuple[float, float]:
    """(forward, backward) CPU seconds per op of a chain of ``chain`` ``x * c`` on a
    1-element tensor that requires grad."""
    import torch
    x0 = torch.ones(1, requires_grad=True)
    fwd, bwd = float("inf"), float("inf")
    for _ in range(reps + 1):
        t0 = time.process_time()
        x = x0
        for _ in range(chain):
            x = x * 1.0001
        t1 = time.process_time()
        x.backward()
        t2 = time.process_time()
        fwd, bwd = min(fwd, t1 - t0), min(bwd, t2 - t1)
        x0.grad = None
    return fwd / chain, bwd / chain


def iteration_ops(shape) -> Counter:
    """ATen ops of one bare one-rank iteration of the loop's model, by (phase, kind):
    kind ``view`` or ``op``."""
    import torch

    from ddlsim.reference.torch_train import _batch, build_stage
    model = build_stage(shape, 0, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx, tgt = _batch(shape, 0)
    phase = ["forward"]
    tb.iteration(model, idx, tgt, opt, phase)        # Adam's state made
    return tb.count_ops(lambda: tb.iteration(model, idx, tgt, opt, phase),
                        lambda func, args: (phase[0], "view" if func.is_view else "op"))


def ddlsim_kernels(model) -> dict[str, int]:
    """Kernels ddlsim's trace of the loop's one-rank DDP run counts per block (F: forward,
    B: backward, update), each op's kernels or 1 for a roofline op."""
    from ddlsim.api import build_workload
    from ddlsim.config import load_config
    from ddlsim.reference.torch_loop import TORCH_STACK, torch_run_config
    from ddlsim.workloads.trace import Compute
    cfg = load_config(torch_run_config(model, 1, "torch-ddp",
                                       {"preset": "cpu-10gbe", "software": TORCH_STACK}))
    out: Counter = Counter()
    for name, block in build_workload(cfg).classes[0].program.blocks.items():
        for op in block.flat.ops:
            p = op.payload
            if isinstance(p, Compute):
                n = len(p.kernels) if p.kernels is not None else int(bool(p.flops or p.bytes))
                out[name[0]] += n * op.repeat
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    ap = tb.parser(__doc__, "reps", 30, "rounds; the least is kept")
    ap.add_argument("--chain", type=int, default=200, help="ops in the autograd chain (>= 1)")
    args = tb.parse(ap, argv, ("reps", "chain"))
    model = tb.loop_model(args.reference)
    if model is None:
        return 2
    import torch
    load = os.getloadavg()
    bare = bare_op_s(args.reps)
    fwd, bwd = autograd_op_s(args.reps, args.chain)
    ops, kernels = iteration_ops(model.shape), ddlsim_kernels(model)
    print(f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; torch {torch.__version__}")
    print(f"bare op (1-element torch.add, the loop's stream_gap_s): {bare * 1e6:.2f} us")
    print(f"op under autograd (x * c, 1 element, chain of {args.chain}): forward "
          f"{fwd * 1e6:.2f} us, backward {bwd * 1e6:.2f} us per op")
    for phase in ("forward", "backward", "step", "zero_grad"):
        print(f"{phase:8s} ATen ops per iteration: {ops[(phase, 'op')]} ops + "
              f"{ops[(phase, 'view')]} views")
    print(f"ddlsim's kernels per iteration: forward {kernels.get('F', 0)}, backward "
          f"{kernels.get('B', 0)}, update {kernels.get('u', 0)}")
    torch_s = (ops[("forward", "op")] * fwd + ops[("backward", "op")] * bwd
               + (ops[("forward", "view")] + ops[("backward", "view")]) * bare)
    charged = (kernels.get("F", 0) + kernels.get("B", 0)) * bare
    print(f"forward and backward host time: torch's ops at these costs {torch_s * 1e3:.2f} ms, "
          f"ddlsim's kernels at the bare op {charged * 1e3:.2f} ms: "
          f"{(torch_s - charged) * 1e3:.2f} ms not charged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
