"""What the torch loop's microbenchmarks share: their command line, the reference model, the
FSDP2 step on Gloo, counting the ATen ops a call runs, and the least CPU time of a call.

``torch_ddp_one_rank.py``, ``torch_fsdp_faults.py``, ``torch_fsdp_step.py``,
``torch_host_costs.py``, ``torch_loop_ops.py`` and ``dtensor_dispatch.py`` measure one cost
each of the PyTorch reference (``ddlsim/reference/torch_*.py``, docs/validation.md "The torch
loop"); torch stays an optional extra, so nothing here imports it at module level.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from typing import Callable, NamedTuple


def parser(doc: str, count: str, default: int, help_text: str) -> argparse.ArgumentParser:
    """The command line every such script has: ``--reference`` and one count of rounds.

    Parameters
    ----------
    doc : str
        The script's module docstring (its first paragraph is the description).
    count : str
        The count's option name without dashes (``iters``, ``reps``).
    default : int
        Its default.
    help_text : str
        What the count is.

    Returns
    -------
    argparse.ArgumentParser
        Parse with :func:`parse`, which checks the count is at least 1.
    """
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--reference", action="store_true", help="the reference model, not --small")
    ap.add_argument(f"--{count}", type=int, default=default, help=f"{help_text} (>= 1)")
    return ap


def parse(ap: argparse.ArgumentParser, argv: list[str] | None,
          counts: tuple[str, ...]) -> argparse.Namespace:
    """Parse ``argv``, refusing any of ``counts`` below 1 with argparse's own error (exit 2)."""
    args = ap.parse_args(argv)
    low = [f"--{c} {getattr(args, c)}" for c in counts if getattr(args, c) < 1]
    if low:
        ap.error(f"{', '.join(low)}: must be >= 1")
    return args


def loop_model(reference: bool):
    """The torch loop's model (``--reference`` or the small one), torch on one thread.

    Returns
    -------
    ddlsim.reference.torch_loop model, or None where torch is not installed (a message is
    printed: the caller returns 2).
    """
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from ddlsim.reference.torch_loop import torch_available, torch_model
    if not torch_available():
        print("error: needs torch with Gloo (pip install 'ddlsim[torch]')", file=sys.stderr)
        return None
    import torch
    from ddlsim.reference.loop import REFERENCE, SMALL
    torch.set_num_threads(1)
    return torch_model(REFERENCE if reference else SMALL)


def fsdp_step(reference: bool):
    """The torch loop's FSDP2 training step on this process group (Gloo, joined here).

    Returns
    -------
    tuple
        ``data_parallel_step``'s step (one iteration per call; ``.clock`` and ``.model``) and
        the loop's model (``.shape``).
    """
    model = loop_model(reference)
    if model is None:
        raise SystemExit(2)
    import torch.distributed as dist
    from ddlsim.config import load_config
    from ddlsim.reference.torch_loop import torch_run_config
    from ddlsim.reference.torch_machine import TORCH_STACK
    from ddlsim.reference.torch_train import data_parallel_step
    dist.init_process_group("gloo")
    cfg = load_config(torch_run_config(model, dist.get_world_size(), "torch-fsdp",
                                       {"preset": "cpu-10gbe", "software": TORCH_STACK}))
    return data_parallel_step(cfg, model.shape, "fsdp"), model


def count_ops(call: Callable[[], object], key: Callable) -> Counter:
    """ATen ops ``call()`` runs, counted by ``key(func, args)`` (a dispatch mode); ops whose
    key is None are not counted."""
    from torch.utils._python_dispatch import TorchDispatchMode
    seen = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            k = key(func, args)
            if k is not None:
                seen[k] += 1
            return func(*args, **(kwargs or {}))
    with Count():
        call()
    return seen


def on_state(func, args) -> str | None:
    """``"state"`` for an op on a parameter's state (its first tensor argument has a
    dimension: not the optimizer's 0-dim ``step`` counter), else None."""
    import torch
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return "state" if first is not None and first.dim() > 0 else None


def iteration(model, idx, tgt, opt, phase: list) -> None:
    """One training iteration of the eager model, naming each part in ``phase[0]`` as it runs:
    forward, backward, step, zero_grad (gradients kept, zeroed in place)."""
    phase[0] = "forward"
    loss = model(idx, tgt)
    phase[0] = "backward"
    loss.backward()
    phase[0] = "step"
    opt.step()
    phase[0] = "zero_grad"
    opt.zero_grad(set_to_none=False)


def least_cpu(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    """Least process CPU seconds of ``fn()`` over ``reps`` calls, after ``warmup`` untimed
    calls (the least: the call with the fewest interruptions from other work)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def least_max_cpu(fn: Callable[[], object], iters: int) -> float:
    """Least over ``iters`` calls of the most process CPU seconds over the ranks of the
    default process group (a barrier before each call, an all-reduce of the times after)."""
    import torch
    import torch.distributed as dist
    best = float("inf")
    for _ in range(iters):
        dist.barrier()
        t0 = time.process_time()
        fn()
        t = torch.tensor([time.process_time() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        best = min(best, float(t))
    return best


class Call(NamedTuple):
    """One FSDP2 collective as :func:`log_fsdp_collectives` logs it."""
    name: str            # all_gather or reduce_scatter
    nbytes: int          # the bytes nccl-tests counts: the larger of output and input
    output: object       # the call's tensors, to make it again alone (:func:`call_alone`)
    inp: object
    cpu_s: float         # process CPU seconds of the whole call (Gloo's threads too)
    entry: float         # time.perf_counter at entry and exit (one clock for every process
    exit: float          # on this machine)


def log_fsdp_collectives(log: list) -> None:
    """Wrap FSDP2's two collectives (``dist.all_gather_single``, ``dist.reduce_scatter_single``:
    its ``DefaultAllGather`` and ``DefaultReduceScatter``) so that each call, timed whole
    (issue, Gloo's work on its threads, the wait: ``async_op=False``), appends a :class:`Call`
    to ``log``."""
    import inspect

    import torch.distributed as dist

    def wrap(name, fn):
        sig = inspect.signature(fn)

        def timed(*args, **kwargs):
            output, inp = list(sig.bind(*args, **kwargs).arguments.values())[:2]
            c0, w0 = time.process_time(), time.perf_counter()
            out = fn(*args, **kwargs)
            cpu, w1 = time.process_time() - c0, time.perf_counter()
            log.append(Call(name, max(output.numel(), inp.numel()) * inp.element_size(),
                            output, inp, cpu, w0, w1))
            return out
        return timed
    dist.all_gather_single = wrap("all_gather", dist.all_gather_single)
    dist.reduce_scatter_single = wrap("reduce_scatter", dist.reduce_scatter_single)


def call_alone(call: Call) -> tuple[float, float]:
    """(wall, process CPU) seconds of ``call`` made again alone, after a barrier, on fresh
    buffers of its sizes (as the torch loop's calibration times a collective)."""
    import torch
    import torch.distributed as dist
    o, i = torch.empty_like(call.output), call.inp.clone()
    dist.barrier()
    c0, w0 = time.process_time(), time.perf_counter()
    (dist.all_gather_single if call.name == "all_gather" else dist.reduce_scatter_single)(o, i)
    return time.perf_counter() - w0, time.process_time() - c0
