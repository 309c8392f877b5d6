"""Calibration samples and torch training iterations taking turns, in one ``torchrun`` job
(the torch half of the closed loop, :mod:`.torch_loop`; needs the ``torch`` extra)::

    torchrun --standalone --nproc-per-node N -m ddlsim.reference.torch_job OUT RUN.yaml \\
        [RUN2.yaml ...] --rounds 8 --warmup 2 --stack STACK.json [--clock wall|cpu]

Every rank does, round after round (a barrier before each step):

1. one sample per GEMM shape of the run and a few squares, torch ``matmul`` in fp32 on one
   thread, its operands out of the last-level cache as in the run (:func:`gemm_rows`: the
   median of 3 calls);
2. element-wise rates: torch ``add(x, y, out=z)`` on the gradient buffer's size (3 passes,
   the STREAM "Add" kernel, McCalpin 1995), and each kernel class ddlsim times apart
   (:func:`class_kernels`: ``F.layer_norm``, ``F.gelu(approximate="tanh")``, the attention
   scores' scale, mask and softmax, their backwards, ``torch.optim.Adam.step`` on the
   model's parameters) as the bytes ddlsim
   counts over the least time of three calls; under FSDP, FSDP2's own copies around a
   block's collectives (:func:`.fsdp_copies.fsdp_kernels`: the copy-in, the copy-out,
   ``_chunk_cat``), each call after a flush of the last-level cache; and the time torch's
   eager dispatch adds per op (:func:`op_overhead_s`);
3. on more than one rank, one sample of each collective the run configs' traces issue at
   its own size (``calibrate comm``'s benchmark on a Gloo adapter, the most over ranks,
   timed by ``--clock``), written to ``OUT/sizes{N}.csv``;
4. one iteration of each run config (:mod:`.torch_train`'s DDP, FSDP or pipeline step), in
   an order that turns by one each round, its wall and its process CPU time, and the CPU
   time of its forward, backward and step (:class:`~.torch_train.PhaseClock`), each the most
   over ranks.

Every rank first keeps freed memory for reuse (:func:`~.machine.cache_allocations`, as the
numpy loop's job does): torch's CPU allocator is glibc's ``malloc``, whose defaults give a
freed block above the mmap threshold back to the system, to be faulted in and zeroed again
the next iteration, where a GPU's caching allocator keeps it and ddlsim charges no
allocation. Under glibc's defaults the trainer's ``zero_grad()`` (gradients set to None,
freed after each step and faulted in anew by the next backward) ran the one-rank DDP
iteration 0.2-4.7 ms slower than zeroing them in place (four runs), with freed memory kept
0.0-3.1 ms faster (two runs with glibc's ``MALLOC_`` variables, two with this call)
(``benchmarks/torch_zero_grad.py``, 2026-11-30 08:02-08:17 UTC, load 1.8-4.7; between runs
the least CPU time moved 109.8-118.1 ms with the load, more than the variants differ).

Steps 1 and 2 are timed in process CPU time: a kernel runs on the calling thread and waits
for nothing, so its CPU time is its work, which other processes' turns on the core do not
inflate (on a quiet machine the two agree). The collectives and iterations can wait on
another rank (Gloo sleeps in ``epoll``; a pipeline stage waits for the other): idle time a
CPU clock does not count, so the loop compares wall time unless told otherwise.

Rank 0 writes ``OUT/compute{N}.csv`` (the ``calibrate compute`` format, statistics over the
rounds) and ``OUT/torch{N}.json`` (rank 0's rates per round, per config its times and
losses).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["class_kernels", "op_overhead_s", "flush_bytes", "flush_buffer", "gemm_rows", "rounds",
           "main"]

#: Square GEMMs beside the run's own shapes (as :data:`.interleaved.SQUARES`).
SQUARES = ((64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512))


def _least_s(call, reps: int = 3, before=None) -> float:
    """The least process CPU time of ``reps`` calls (s), ``before()`` untimed before each."""
    best = np.inf
    for _ in range(reps):
        if before is not None:
            before()
        t0 = time.process_time()
        call()
        best = min(best, time.process_time() - t0)
    return max(best, 1e-9)


def op_overhead_s(calls: int = 200) -> float:
    """CPU seconds torch's eager dispatch takes per op on this CPU: the least over three
    loops of ``calls`` additions of two 1-element tensors, over ``calls`` (the work itself
    is one float; what is left is Python, the dispatcher and the allocator, per op).

    Returns
    -------
    float
        Seconds per op.
    """
    a, b = torch.ones(1), torch.ones(1)

    def loop() -> None:
        for _ in range(calls):
            torch.add(a, b)
    loop()
    return _least_s(loop) / calls


#: Bytes written between two timed GEMM calls where the machine's last-level cache cannot be
#: read: Triton's ``do_bench`` (triton/testing.py, ``cache_size = 256 * 1024 * 1024``) zeroes
#: as much before each timed call, more than any device's last-level cache
DEFAULT_FLUSH_BYTES = 256 * 2 ** 20
#: the least flush: four times the 2 MiB L2 per core of the machine the loop was built on
#: (``lscpu``), the flush before the last-level cache was read
MIN_FLUSH_BYTES = 8 * 2 ** 20


def flush_bytes(llc_bytes: int | None) -> int:
    """Bytes to write before each timed GEMM call (:func:`gemm_rows`): twice the last-level
    cache, so that the call reads its operands from memory, as in a training iteration.

    There each weight is read once per pass, and between two uses of it the optimizer's step
    streams the parameters, their gradients and Adam's two moments (16 B per parameter in
    fp32: 80 MB for the ``--small`` model's 5.1 M parameters), more than the 32 MiB L3 of
    the machine the loop was built on; an 8 MiB flush (out of L2 only) left the operands in
    L3, and the run's GEMMs took 5.7 % longer inside the iteration than so timed, 0.5 % at
    a 64 MiB flush (``benchmarks/torch_loop_ops.py``, 2026-11-30 06:00 UTC, load 2.2: 84.0
    ms of GEMMs an iteration inside, 79.5 ms alone after 8 MiB, 83.6 ms after 64 MiB).

    Parameters
    ----------
    llc_bytes : int or None
        The last-level cache (:func:`.mpijobs.last_level_cache_bytes`); None where unknown.

    Returns
    -------
    int
        ``max(2 · llc_bytes, MIN_FLUSH_BYTES)``, or :data:`DEFAULT_FLUSH_BYTES` without a
        size.
    """
    if llc_bytes is None:
        return DEFAULT_FLUSH_BYTES
    return max(2 * llc_bytes, MIN_FLUSH_BYTES)


def flush_buffer() -> torch.Tensor:
    """An fp32 buffer of :func:`flush_bytes` of this machine's last-level cache
    (:func:`.mpijobs.last_level_cache_bytes`), which a sample zeroes before each timed call."""
    from .mpijobs import last_level_cache_bytes
    return torch.empty(flush_bytes(last_level_cache_bytes()) // 4)


def gemm_rows(shapes, seed: int, reps: int = 3) -> list[dict]:
    """Process-CPU-time samples of each GEMM ``(m, n, k)`` or stacked ``(m, n, k, batch)``
    (``batch`` GEMMs in one torch ``matmul``, as the attention core runs its heads), fp32,
    each call timed alone after writing :func:`flush_bytes` (twice the last-level cache),
    ``reps`` calls;
    rows in the ``calibrate compute`` format. (``calibrate compute --backend torch`` times
    wall time over back-to-back calls, whose operands stay in cache, and refuses stacks.)"""
    from ..calibration.compute_bench import _row, gemm_flops
    gen, rows = torch.Generator().manual_seed(seed), []
    flush = flush_buffer()
    for shape in shapes:
        m, n, k, *stack = shape
        a = torch.randn((*stack, m, k), generator=gen)
        b = torch.randn((*stack, k, n), generator=gen)
        a @ b  # warm-up (allocator, code)
        samples = np.empty(reps)
        for i in range(reps):
            flush.zero_()
            t0 = time.process_time()
            a @ b
            samples[i] = max(time.process_time() - t0, 1e-9)
        dims = {"m": m, "n": n, "k": k, **({"batch": stack[0]} if stack else {})}
        rows.append(_row("torch", f"torch {torch.__version__} (cpu)", "cpu", "gemm", "fp32",
                         dims, gemm_flops(m, n, k) * (stack[0] if stack else 1), samples))
    return rows


def _gemm_round(shape, seed: int):
    """One sample per GEMM shape of the run (:func:`~.machine.gemm_shapes`) and the squares."""
    from ..calibration.compute_bench import _frame
    from .machine import gemm_shapes
    return _frame(gemm_rows(sorted(set(SQUARES) | set(gemm_shapes(shape))), seed))


def _softmax_calls(shape, in_fp32: bool) -> dict:
    """The trainer's attention-score kernels (:class:`.torch_train.Block`: the scale by
    ``1/√d``, the causal mask and the softmax) forward, and their backward, on the run's
    ``b · heads · s²`` scores, with the bytes ddlsim's unfused softmax counts for them
    (:func:`~ddlsim.simulator.kernels.elementwise.unfused_softmax_passes`: the mask and the
    softmax; the trainer's scale is a pass of its own, which ddlsim places in the QKᵀ GEMM,
    so it is in the measured time and lowers the class's rate)."""
    from ..simulator.kernels.elementwise import unfused_softmax_passes
    b, a, s = shape.batch, shape.heads, shape.seq
    raw = torch.randn(b, a, s, s, requires_grad=True)
    mask, scale = torch.ones(s, s, dtype=torch.bool).triu(1), math.sqrt(shape.hidden // a)

    def forward(scores: torch.Tensor) -> torch.Tensor:
        return (scores / scale).masked_fill(mask, float("-inf")).softmax(-1)
    out = forward(raw)
    grad = torch.randn_like(out)
    counted = [sum(unfused_softmax_passes(4, in_fp32, backward)) * b * a * s * s
               for backward in (False, True)]
    return {"softmax": (lambda: forward(raw.detach()), counted[0]),
            "softmax_backward": (lambda: torch.autograd.grad(out, raw, grad,
                                                             retain_graph=True), counted[1])}


def class_kernels(shape, params, stack: dict) -> dict:
    """Each element-wise class's torch kernel as a call, with the bytes ddlsim counts for it
    under the torch stack's kernel flags (``stack``: :data:`.torch_loop.TORCH_STACK`).

    Parameters
    ----------
    shape : GPTShape
        The reference model and micro-batch.
    params : list of torch.Tensor
        The model's parameters (the optimizer class steps a copy of them).
    stack : dict
        The ``software`` section the loop predicts with.

    Returns
    -------
    dict
        Class name → (a call, bytes ddlsim counts for it).
    """
    from ..simulator.kernels.elementwise import (activation_passes, norm_passes,
                                                 optimizer_bytes_per_param)
    k = stack["kernels"]
    t, h = shape.batch * shape.seq, shape.hidden
    x = torch.randn(t, h, requires_grad=True)
    w, b = torch.ones(h, requires_grad=True), torch.zeros(h, requires_grad=True)
    y = torch.randn(t, 4 * h, requires_grad=True)
    norm_out, gelu_out = F.layer_norm(x, (h,), w, b), F.gelu(y, approximate="tanh")
    gn, gg = torch.randn_like(norm_out), torch.randn_like(gelu_out)
    copies = [p.detach().clone() for p in params]
    for c in copies:
        c.grad = torch.randn_like(c) * 1e-3
    adam = torch.optim.Adam(copies, lr=1e-3)
    n_params = sum(c.numel() for c in copies)
    norm = sum(norm_passes(k["fused_layernorm"], "layernorm", 4, h)) * t * h
    gelu = activation_passes(False, True, k["fused_bias_gelu"], 4)[-1] * t * 4 * h
    step = optimizer_bytes_per_param("adam", k["fused_optimizer"], 4, 4, False) * n_params
    calls = {
        "norm": (lambda: F.layer_norm(x.detach(), (h,), w.detach(), b.detach()), norm),
        "norm_backward": (lambda: torch.autograd.grad(norm_out, (x, w, b), gn,
                                                      retain_graph=True), 2 * norm),
        "activation": (lambda: F.gelu(y.detach(), approximate="tanh"), gelu),
        "activation_backward": (lambda: torch.autograd.grad(gelu_out, y, gg,
                                                            retain_graph=True), 2 * gelu),
        "optimizer": (adam.step, step)}
    from ..software import SoftwareSpec, resolve_software
    in_fp32 = resolve_software(SoftwareSpec.model_validate(stack)).softmax_in_fp32
    return {**calls, **_softmax_calls(shape, in_fp32)}


def _rates(arrays, kernels, cold=None, flush=None) -> dict[str, float]:
    """This rank's B/s of ``z = x + y`` (``gradients``), of each class (``class.<name>``:
    ``kernels``, and ``cold``'s each after zeroing ``flush``), and the per-op dispatch time
    (``op_overhead_s``, seconds)."""
    x, y, z = arrays
    out = {"gradients": 3.0 * x.numel() * x.element_size()
           / _least_s(lambda: torch.add(x, y, out=z))}
    for name, (call, counted) in kernels.items():
        out[f"class.{name}"] = counted / _least_s(call, 1 if name == "optimizer" else 3)
    for name, (call, counted) in (cold or {}).items():
        out[f"class.{name}"] = counted / _least_s(call, 3, flush.zero_)
    out["op_overhead_s"] = op_overhead_s()
    return out


def _collective_sampler(cfgs, clock):
    """A function taking one round's sample of each collective of the configs' traces on
    a Gloo adapter (:func:`.interleaved.trace_collectives`), or None on one rank."""
    from .interleaved import trace_collectives
    sizes = trace_collectives(cfgs) if dist.get_world_size() > 1 else []
    if not sizes:
        return None
    from ..calibration.adapters import TorchAdapter
    from ..calibration.comm_bench import placement, run_comm_benchmark
    adapter = TorchAdapter("gloo", None, range(dist.get_world_size()), torch.device("cpu"))
    where = placement(adapter)
    return lambda: [run_comm_benchmark(adapter, [op], [nbytes], 0, 1, where=where,
                                       clock=clock)[0] for op, nbytes in sizes]


def _timed(step) -> tuple[float, float, float, dict[str, float]]:
    """(loss, wall seconds of one iteration, its process CPU seconds, CPU seconds per phase
    of :class:`~.torch_train.PhaseClock`), each the most over ranks, after a barrier (the
    CPU time is kept to show how much of the wall time other processes' turns on the cores
    took; it does not count a rank's idle waits)."""
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    loss = step()
    span = torch.tensor([time.perf_counter() - t0, time.process_time() - c0,
                         *(step.clock.spent[p] for p in step.clock.PHASES)],
                        dtype=torch.float64)
    dist.all_reduce(span, op=dist.ReduceOp.MAX)
    return loss, float(span[0]), float(span[1]), dict(zip(step.clock.PHASES,
                                                          map(float, span[2:])))


def rounds(cfgs, names: list[str], n_rounds: int, warmup: int, stack: dict,
           clock=time.perf_counter, seed: int = 0):
    """Run the rounds (module docstring) over the configs; returns (GEMM frames of the timed
    rounds, rates per round by name, runs by name, collective rows per timed round)."""
    from .torch_train import build_stage, data_parallel_step, pipeline_step, plan_of
    from .train import shape_of
    shape = shape_of(cfgs[0])
    steps = []
    for cfg in cfgs:
        plan = plan_of(cfg, dist.get_world_size())
        steps.append(pipeline_step(cfg, shape) if plan == "pipeline"
                     else data_parallel_step(cfg, shape, plan))
    grad = torch.ones(shape.padded), torch.ones(shape.padded), torch.empty(shape.padded)
    model = build_stage(shape, 0, 1)
    kernels = class_kernels(shape, list(model.parameters()), stack)
    cold, flush = {}, None
    if any(plan_of(cfg, dist.get_world_size()) == "fsdp" for cfg in cfgs):
        from .fsdp_copies import fsdp_kernels
        cold = fsdp_kernels(list(model.blocks[0].parameters()), dist.get_world_size(),
                            dist.get_rank())
        flush = flush_buffer()
    sample = _collective_sampler(cfgs, clock)
    gemms, colls, rates = [], [], {}
    runs = {name: {"times_s": [], "cpu_s": [], "phases_cpu_s": [], "losses": []}
            for name in names}
    for r in range(warmup + n_rounds):
        dist.barrier()
        frame = _gemm_round(shape, seed + r)
        dist.barrier()
        got = _rates(grad, kernels, cold, flush)
        coll = sample() if sample else []
        for j in range(len(cfgs)):
            name = names[(j + r) % len(cfgs)]
            loss, wall, cpu, phases = _timed(steps[(j + r) % len(cfgs)])
            runs[name]["losses"].append(loss)
            if r >= warmup:
                runs[name]["times_s"].append(wall)
                runs[name]["cpu_s"].append(cpu)
                runs[name]["phases_cpu_s"].append(phases)
        if r >= warmup:
            gemms.append(frame)
            colls.append(coll)
            for key, value in got.items():
                rates.setdefault(key, []).append(value)
    return gemms, rates, runs, colls


def _parse(argv):
    ap = argparse.ArgumentParser(prog="torchrun ... -m ddlsim.reference.torch_job",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("output", type=Path, help="folder for compute{N}.csv, torch{N}.json")
    ap.add_argument("configs", type=Path, nargs="+", help="run configs, one model")
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds (>= 1)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first (>= 0)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="clock of the collective samples (step 3)")
    ap.add_argument("--stack", type=Path, required=True,
                    help="JSON of the software section the loop predicts with")
    return ap.parse_args(argv)


def _load(args, world: int):
    """The run configs (one model), checked by :func:`.torch_train.plan_of`."""
    from ..config import load_config
    from .torch_train import plan_of
    from .train import shape_of
    if args.rounds < 1 or args.warmup < 0:
        raise ValueError(f"--rounds must be >= 1 and --warmup >= 0, got {args.rounds}, "
                         f"{args.warmup}")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count()
    if local > cores:
        raise ValueError(f"{local} ranks on this node share {cores} usable CPU cores; run "
                         f"at most {cores}")
    cfgs = [load_config(p) for p in args.configs]
    for cfg in cfgs:
        plan_of(cfg, world)
    if len({shape_of(c) for c in cfgs}) != 1:
        raise ValueError("every run config of one job must have the same model, sequence "
                         "and micro-batch")
    return cfgs


def _write(args, world: int, gemms, rates, runs, colls, cached: bool) -> None:
    from ..calibration.outputs import write_csv
    from .interleaved import _merge_collectives, _merge_rounds
    write_csv(args.output / f"compute{world}.csv", _merge_rounds(gemms), force=True)
    if colls and colls[0]:
        from ..calibration.schema import tidy_frame
        write_csv(args.output / f"sizes{world}.csv", tidy_frame(_merge_collectives(colls)),
                  force=True)
    out = {"ranks": world, "rounds": args.rounds, "warmup": args.warmup,
           "torch": torch.__version__, "cached_allocations": cached, "rates_by_round": rates,
           "runs": {name: {**run, "config": str(p)}
                    for (name, run), p in zip(runs.items(), args.configs)}}
    (args.output / f"torch{world}.json").write_text(json.dumps(out, indent=1))


def main(argv: list[str] | None = None) -> int:
    """Entry point under ``torchrun``; returns the exit status (2: refused input)."""
    from ..errors import ConfigError
    from .machine import cache_allocations
    args = _parse(argv)
    cached = cache_allocations()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    try:
        cfgs = _load(args, world)
    except (ValueError, ConfigError) as exc:
        if dist.get_rank() == 0:
            print(f"error: {exc}", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    stack = json.loads(args.stack.read_text())
    names = [p.stem for p in args.configs]
    from ..calibration.comm_bench import CLOCKS
    gemms, rates, runs, colls = rounds(cfgs, names, args.rounds, args.warmup, stack,
                                       CLOCKS[args.clock])
    if dist.get_rank() == 0:
        _write(args, world, gemms, rates, runs, colls, cached)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
