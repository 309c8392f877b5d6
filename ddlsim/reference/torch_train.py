"""The reference GPT-2 in PyTorch on CPU over Gloo: DDP, FSDP (ZeRO-3) or a 2-stage pipeline,
as the run config says (needs the ``torch`` extra)::

    torchrun --standalone --nproc-per-node 2 -m ddlsim.reference.torch_train run.yaml

The model is :mod:`.gpt2`'s (the same layers, sizes and tied head; attention written out as
matmul, mask and softmax). The plan comes from the config, so that ``ddlsim predict`` of the
same file describes the same run:

* ``zero_stage: 0``, data parallel — ``DistributedDataParallel`` (its buckets are
  ``parallel.grad_bucket_size``; the all-reduces overlap the backward, as
  ``overlap_grad_reduce: true`` says) on more than one rank, the bare model on one, as the
  stack the loop declares (:data:`.torch_machine.TORCH_STACK`, torchtitan-2024) runs it:
  torchtitan wraps DDP only when ``dp_replicate > 1`` (9dec370 torchtitan/parallelisms/
  parallelize_llama.py lines 106-115), and on one rank DDP's Reducer would still copy every
  gradient into its bucket and back (software.yaml ``ddp.bucket_passes``,
  ``ddp.grad_copy_passes``), which that stack charges at DP > 1 only
  (``benchmarks/torch_ddp_one_rank.py``, the model bare and wrapped alternating in one
  process: +4.7 to +6.8 ms an iteration wrapped, all in the backward, 22:28 UTC);
* ``zero_stage: 3`` — ``fully_shard`` (FSDP2) per block, then the whole model;
* every plan clears the gradients after the step with ``zero_grad()`` (torch's default
  ``set_to_none=True``), as torchtitan-2024 does (``OptimizersContainer.zero_grad`` calls each
  optimizer's ``zero_grad()``: torchtitan 04a22a0 ``torchtitan/optimizer.py``): the next
  backward's ``AccumulateGrad`` takes each new gradient as it is, and FSDP2's
  ``foreach_reduce`` makes each new sharded gradient from its reduce-scatter's output. With
  ``set_to_none=False`` (the trainer until 2026-11-30) torch would zero every gradient after
  the step (a ``zero_`` pass) and add each new one into it in the backward (a ``+=`` pass:
  ``AccumulateGrad``, and FSDP2's ``sharded_param.grad._local_tensor += ...``), passes
  torchtitan-2024, whose trace ddlsim predicts, never runs;
* ``pipeline_model_parallel_size: 2``, ``schedule: gpipe`` — rank 0 holds the embeddings
  and the first half of the blocks, rank 1 the rest, the final norm and a copy of the token
  embedding for the tied head; every micro-batch forward, then every backward, activations
  and their gradients sent with ``send``/``recv``; the two embedding copies' gradients are
  all-reduced before the step, as Megatron-LM does.

Prints the median iteration (the slowest rank's, after a barrier) over ``--iters`` after
``--warmup``, as :mod:`.train` does. The closed loop (:mod:`.torch_loop`, ``python
benchmarks/closed_loop.py --torch``) runs the same steps (:func:`data_parallel_step`,
:func:`pipeline_step`) in turns with its calibration samples (:mod:`.torch_job`).
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
from torch import nn

from .train import shape_of

__all__ = ["Block", "build_stage", "plan_of", "PhaseClock", "data_parallel_step", "pipeline_step",
           "main"]


class Block(nn.Module):
    """One pre-LayerNorm GPT-2 block."""

    def __init__(self, h: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc, self.fcproj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads) \
            .permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(h // self.heads)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h)
        x = x + self.proj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Stage(nn.Module):
    """Blocks ``lo:hi`` of the model, with the embeddings (first stage) and the final norm
    and tied head (last stage)."""

    def __init__(self, shape, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first or last:
            self.wte = nn.Embedding(shape.vocab, shape.hidden)
        if first:
            self.wpe = nn.Embedding(shape.positions, shape.hidden)
        self.blocks = nn.ModuleList(Block(shape.hidden, shape.heads) for _ in range(lo, hi))
        if last:
            self.lnf = nn.LayerNorm(shape.hidden)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        if not self.last:
            return x
        logits = F.linear(self.lnf(x), self.wte.weight)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build_stage(shape, stage: int, stages: int) -> Stage:
    """Stage ``stage`` of ``stages`` (blocks split evenly), GPT-2's N(0, 0.02) init."""
    per = shape.layers // stages
    torch.manual_seed(stage)
    model = Stage(shape, stage * per, (stage + 1) * per, stage == 0, stage == stages - 1)
    for name, p in model.named_parameters():
        if p.dim() > 1:
            nn.init.normal_(p, 0.0, 0.02)
    return model


def plan_of(cfg, world: int) -> str:
    """``ddp``, ``fsdp`` or ``pipeline`` from the run config; refuses anything else."""
    p, t = cfg.parallel, cfg.train
    if t.dtype != "fp32" or cfg.model.architecture != "gpt":
        raise ValueError(f"the torch reference runs gpt models in fp32; got "
                         f"{cfg.model.architecture!r} in {t.dtype!r}")
    if p.pipeline_model_parallel_size == 2 and p.data_parallel_size == 1 and world == 2:
        if p.schedule != "gpipe" or cfg.model.num_hidden_layers % 2:
            raise ValueError(f"parallel.schedule = {p.schedule!r} with "
                             f"{cfg.model.num_hidden_layers} layers; allowed: 'gpipe' and an "
                             "even number of layers")
        return "pipeline"
    if p.pipeline_model_parallel_size == 1 and p.data_parallel_size == world \
            and p.tensor_model_parallel_size == 1 and p.dp_strategy == "ddp" \
            and t.global_batch_size == t.micro_batch_size * world:
        if p.zero_stage in (0, 3):
            return "ddp" if p.zero_stage == 0 else "fsdp"
    raise ValueError(f"the torch reference runs DDP (zero_stage 0), FSDP (zero_stage 3) on "
                     f"{world} data-parallel ranks with one micro-batch each, or a 2-stage "
                     "gpipe pipeline on 2 ranks; got TP"
                     f"{p.tensor_model_parallel_size} PP{p.pipeline_model_parallel_size} "
                     f"DP{p.data_parallel_size} ZeRO-{p.zero_stage} {p.dp_strategy}")


def _batch(shape, rank: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng([seed, rank])
    idx = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    tgt = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    return torch.from_numpy(idx), torch.from_numpy(tgt)


class PhaseClock:
    """Process CPU seconds of each phase of the last iteration: ``forward``, ``backward``
    (for DDP and FSDP with the collectives their hooks run; for the pipeline with its sends
    and receives) and ``step`` (the pipeline's all-reduces, the optimizer, ``zero_grad``).
    Process CPU time counts Gloo's threads too, so a collective's copies and reductions are
    charged to the phase that waits for them."""

    PHASES = ("forward", "backward", "step")

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._t = 0.0

    def start(self) -> None:
        """Begin an iteration: forget the last one's phases."""
        self.spent = dict.fromkeys(self.PHASES, 0.0)
        self._t = time.process_time()

    def __call__(self, phase: str) -> None:
        """Charge the CPU time since the last mark to ``phase``."""
        now = time.process_time()
        self.spent[phase] += now - self._t
        self._t = now


def data_parallel_step(cfg, shape, plan: str):
    """A closure running one DDP or FSDP iteration on this rank; its ``clock`` attribute (a
    :class:`PhaseClock`) holds the last iteration's phases, its ``model`` the module it
    trains (wrapped or sharded as the plan says)."""
    model = build_stage(shape, 0, 1)
    if plan == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif dist.get_world_size() > 1:   # DDP as torchtitan-2024 wraps it (the docstring)
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, bucket_cap_mb=cfg.parallel.grad_bucket_size
                                        / 2 ** 20)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx, tgt = _batch(shape, dist.get_rank())
    clock = PhaseClock()

    def step() -> float:
        clock.start()
        loss = model(idx, tgt)
        clock("forward")
        loss.backward()
        clock("backward")
        opt.step()
        opt.zero_grad()     # set_to_none, as torchtitan-2024 (the module docstring)
        clock("step")
        return float(loss.detach())
    step.clock, step.model = clock, model
    return step


def pipeline_step(cfg, shape):
    """A closure running one 2-stage GPipe iteration on this rank (module docstring); its
    ``clock`` attribute (a :class:`PhaseClock`) holds the last iteration's phases."""
    rank, m = dist.get_rank(), cfg.train.global_batch_size // cfg.train.micro_batch_size
    model = build_stage(shape, rank, 2)
    if rank == 1:  # the head's copy starts equal to the first stage's embedding
        model.wte.weight.data.copy_(build_stage(shape, 0, 2).wte.weight.data)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [_batch(shape, i) for i in range(m)]
    act_shape = (shape.batch, shape.seq, shape.hidden)
    clock = PhaseClock()

    def step() -> float:
        clock.start()
        kept, total = [], 0.0
        for idx, tgt in batches:
            if rank == 0:
                out = model(idx)
                dist.send(out.detach(), 1)
                kept.append(out)
            else:
                x = torch.empty(act_shape)
                dist.recv(x, 0)
                x.requires_grad_(True)
                loss = model(x, tgt) / m
                total += float(loss.detach())
                kept.append((x, loss))
        clock("forward")
        for item in kept:
            if rank == 0:
                grad = torch.empty(act_shape)
                dist.recv(grad, 1)
                item.backward(grad)
            else:
                x, loss = item
                loss.backward()
                dist.send(x.grad, 0)
        clock("backward")
        dist.all_reduce(model.wte.weight.grad)  # the tied embedding's two copies
        opt.step()
        opt.zero_grad()     # set_to_none, as torchtitan-2024 (the module docstring)
        loss = torch.tensor([total])
        dist.all_reduce(loss)  # the last stage's loss, on every rank
        clock("step")
        return float(loss.detach())
    step.clock = clock
    return step


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="torchrun ... -m ddlsim.reference.torch_train",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--allow-shared-cores", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point under ``torchrun``; returns the exit status (2: refused input)."""
    from ..config import load_config
    from ..errors import ConfigError
    from .machine import cache_allocations
    args = _parse(argv)
    cache_allocations()             # as the loop's job (torch_job.py's docstring)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        if args.iters < 1 or args.warmup < 0:
            raise ValueError(f"--iters must be >= 1 and --warmup >= 0, got {args.iters}, "
                             f"{args.warmup}")
        if local > cores and not args.allow_shared_cores:
            raise ValueError(f"{local} ranks on this node share {cores} usable CPU cores; run "
                             f"at most {cores}, or pass --allow-shared-cores")
        cfg = load_config(args.config)
        plan = plan_of(cfg, world)
    except (ValueError, ConfigError) as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    shape = shape_of(cfg)
    step = pipeline_step(cfg, shape) if plan == "pipeline" else data_parallel_step(cfg, shape,
                                                                                     plan)
    times, losses = [], []
    for it in range(args.warmup + args.iters):
        dist.barrier()
        t0 = time.perf_counter()
        losses.append(step())
        span = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(span, op=dist.ReduceOp.MAX)
        if it >= args.warmup:
            times.append(float(span))
    out = {"plan": plan, "ranks": world, "median_s": float(np.median(times)),
           "min_s": float(np.min(times)), "times_s": times, "loss_first": losses[0],
           "loss_last": losses[-1]}
    if rank == 0:
        print(f"reference (torch): {plan} on {world} rank(s): median iteration "
              f"{out['median_s'] * 1e3:.2f} ms over {args.iters}")
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
