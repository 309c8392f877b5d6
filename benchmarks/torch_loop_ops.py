"""The torch loop's model op by op: each ATen op's CPU time inside a training iteration, and
each GEMM inside the iteration against the same call alone.

    PYTHONPATH=... python benchmarks/torch_loop_ops.py            # the --small model
    python benchmarks/torch_loop_ops.py --reference --iters 10

Runs the torch closed loop's model (ddlsim/reference/torch_train.py, one rank, no DDP) for
``--iters`` iterations on one thread under a ``TorchDispatchMode`` that times every ATen op
in process CPU time (the forward's, the backward's as autograd dispatches them, the
optimizer's and ``zero_grad``'s), and prints per phase and op the calls per iteration and the
least CPU time over the iterations of their sum. Then, for every GEMM (``mm``, ``addmm``,
``bmm``) of one iteration, the least CPU time inside the iterations against the same call
(the operands copied with their strides) timed alone after writing twice the last-level
cache (the torch job's ``flush_bytes``: operands from memory, as its calibration times them),
alternating with the iterations, so both see the same machine. Timing each op adds a Python
call per op, so the per-op sum exceeds the untimed iteration by about that (printed). Needs the torch extra.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from contextlib import nullcontext

import numpy as np

import torchbench as tb

GEMMS = ("mm", "addmm", "bmm")


def _timer(spent: dict, calls: dict, phase: list, gemms: list):
    """A dispatch mode charging each ATen op's CPU time to ``(phase[0], op)`` in ``spent``
    (its calls in ``calls``) and keeping each GEMM call's operands and time in ``gemms``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Timer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            t0 = time.process_time()
            out = func(*args, **(kwargs or {}))
            dt = time.process_time() - t0
            name = func.overloadpacket.__name__
            spent[(phase[0], name)] += dt
            calls[(phase[0], name)] += 1
            if name in GEMMS and not kwargs:
                gemms.append((name, [a.detach() if isinstance(a, torch.Tensor) else a
                                     for a in args], dt))
            return out
    return Timer()


def _alone(name: str, args: list, flush) -> float:
    """CPU seconds of one GEMM call alone on copies of its operands (strides kept), after
    writing ``flush``."""
    import torch
    fresh = [torch.empty_strided(a.shape, a.stride()).copy_(a) if isinstance(a, torch.Tensor)
             else a for a in args]
    getattr(torch, name)(*fresh)
    flush.zero_()
    t0 = time.process_time()
    getattr(torch, name)(*fresh)
    return time.process_time() - t0


def measure(shape, iters: int, warmup: int = 2):
    """Per (phase, op) the least CPU seconds per iteration and the calls, per GEMM call (in
    order) its least CPU seconds inside the iteration and alone, and the least of the
    untimed iterations (every second one), in CPU seconds."""
    import torch

    from ddlsim.reference.torch_samples import flush_buffer
    from ddlsim.reference.torch_train import _batch, build_stage
    model = build_stage(shape, 0, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx, tgt = _batch(shape, 0)
    flush = flush_buffer()
    phase, ops, inside, alone, plain = ["forward"], defaultdict(list), [], [], []
    for it in range(warmup + 2 * iters):
        spent, calls, gemms = defaultdict(float), defaultdict(int), []
        timed = it % 2 == 0
        t0 = time.process_time()
        with (_timer(spent, calls, phase, gemms) if timed else nullcontext()):
            tb.iteration(model, idx, tgt, opt, phase)
        if it < warmup:
            continue
        if not timed:
            plain.append(time.process_time() - t0)
            continue
        for key, value in spent.items():
            ops[key].append(value)
        inside.append([dt for _, _, dt in gemms])
        alone.append([_alone(name, args, flush) for name, args, _ in gemms])
        names = [(name, tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
                 for name, args, _ in gemms]
        counts = dict(calls)
    return ({k: (min(v), counts[k]) for k, v in ops.items()}, names, np.min(inside, 0),
            np.min(alone, 0), min(plain))


def report(ops: dict, names, inside, alone, plain_s: float, top: int) -> str:
    """The two tables as text (ms)."""
    lines = [f"{'phase':9s} {'op':34s} {'calls':>6s} {'ms':>8s}"]
    total = 0.0
    for (phase, op), (s, n) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{phase:9s} {op:34s} {n:6d} {s * 1e3:8.2f}")
    for phase in ("forward", "backward", "step", "zero_grad"):
        part = sum(s for (p, _), (s, _) in ops.items() if p == phase)
        total += part
        lines.append(f"{phase:9s} {'(all ops)':34s} {'':>6s} {part * 1e3:8.2f}")
    lines.append(f"per-op sum {total * 1e3:.1f} ms (each op's least: at most the least "
                 f"whole); the untimed iterations' least {plain_s * 1e3:.1f} ms")
    lines.append(f"\n{'GEMM':6s} {'operands':48s} {'inside':>8s} {'alone':>8s} {'':>6s}")
    for (name, shp), a, b in zip(names, inside, alone):
        lines.append(f"{name:6s} {str(shp):48s} {a * 1e3:8.2f} {b * 1e3:8.2f} {a / b - 1:+6.0%}")
    lines.append(f"GEMMs: {inside.sum() * 1e3:.1f} ms inside the iteration, "
                 f"{alone.sum() * 1e3:.1f} ms alone ({inside.sum() / alone.sum() - 1:+.1%})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = tb.parser(__doc__, "iters", 10, "timed iterations")
    ap.add_argument("--top", type=int, default=30, help="(phase, op) rows to print (>= 1)")
    args = tb.parse(ap, argv, ("iters", "top"))
    model = tb.loop_model(args.reference)
    if model is None:
        return 2
    shape = model.shape
    load = os.getloadavg()
    print(f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; {shape}")
    print(report(*measure(shape, args.iters), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
