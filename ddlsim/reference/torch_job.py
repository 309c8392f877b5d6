"""Calibration samples and torch training iterations taking turns, in one ``torchrun`` job
(the torch half of the closed loop, :mod:`.torch_loop`; needs the ``torch`` extra)::

    torchrun --standalone --nproc-per-node N -m ddlsim.reference.torch_job OUT RUN.yaml \\
        [RUN2.yaml ...] --rounds 8 --warmup 2 --stack STACK.json [--clock wall|cpu]

Every rank does, round after round (a barrier before each step):

1. one sample per GEMM shape of the run and a few squares, torch ``matmul`` in fp32 on one
   thread, its operands out of the last-level cache as in the run
   (:func:`.torch_samples.gemm_rows`: the median of 3 calls);
2. element-wise rates: torch ``add(x, y, out=z)`` on the gradient buffer's size (3 passes,
   the STREAM "Add" kernel, McCalpin 1995), and each kernel class ddlsim times apart
   (:func:`.torch_samples.class_kernels`: ``F.layer_norm``, ``F.gelu(approximate="tanh")``,
   the attention scores' scale, mask and softmax, their backwards, ``torch.optim.Adam.step``
   on the model's parameters) as the bytes ddlsim
   counts over the least time of three calls; under FSDP, FSDP2's own copies around a
   block's collectives (:func:`.fsdp_copies.fsdp_kernels`: the copy-in, the copy-out,
   ``_chunk_cat``), each call after a flush of the last-level cache; and the time torch's
   eager dispatch adds per op (:func:`.torch_samples.op_overhead_s`);
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
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .torch_samples import _gemm_round, _rates, class_kernels, flush_buffer

__all__ = ["rounds", "main"]

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
    ap.add_argument("--allow-shared-cores", action="store_true",
                    help="run more ranks than the node's usable cores")
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
    if local > cores and not args.allow_shared_cores:
        raise ValueError(f"{local} ranks on this node share {cores} usable CPU cores; run "
                         f"at most {cores}, or pass --allow-shared-cores (time it in wall "
                         "time: a rank's CPU time leaves out its turns)")
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
