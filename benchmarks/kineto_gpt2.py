"""Profile training steps of a small GPT-2 with the PyTorch profiler (Kineto), on CPU.

Writes the Chrome/Kineto JSON trace of one step and the measured wall time of every timed
step, so ``ddlsim traces kineto`` can be checked against a real profile (docs/traces.md).
The traced step follows a profiler warm-up step (``torch.profiler.schedule``), and
``benchmarks/kineto_overhead.py`` measures the profiler's cost per event on the same machine
for ``ddlsim traces kineto --profiler-overhead``:

    python benchmarks/kineto_gpt2.py --out tests/traces/data/gpt2_tiny_dp1.json
    python benchmarks/kineto_gpt2.py --ranks 2 --out dp2.json     # DDP over Gloo, 2 processes

The model is nanoGPT's / HuggingFace GPT-2's shape (pre-LayerNorm blocks of causal
self-attention and a GeLU MLP, learned positions, tied embeddings), written here in plain
PyTorch so that the module names (``transformer.h.N.attn``, ``…mlp``) are GPT-2's. Every
process runs one thread (``torch.set_num_threads(1)``), so a rank is one core. Subnormal
floats are flushed (``torch.set_flush_denormal``; ``--keep-denormals`` keeps them): the tied
head's gradient holds a drifting number of them, on which the backward's GEMMs ran 10-20x
slower (docs/traces.md, Figures). Needs ``pip install 'ddlsim[torch]'``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.ln_2, self.mlp = nn.LayerNorm(d), MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, vocab: int, seq: int):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(seq, d),
            h=nn.ModuleList(Block(d, heads) for _ in range(layers)), ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as GPT-2

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def _profile(step, rank: int, args) -> tuple[list[float], list[float]]:
    """Profile one step after ``args.profiler_warmup`` steps traced and discarded
    (``torch.profiler.schedule``: the first profiled steps carry the profiler's start-up cost,
    pytorch/kineto#328); rank 0 writes the active step's trace. Returns the wall time of
    every step run under the profiler, warm-up steps first, and its process CPU time (s)."""
    def export(prof):
        if rank == 0:
            prof.export_chrome_trace(args.out)

    times, cpu = [], []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                with_stack=True, record_shapes=False, on_trace_ready=export,
                                schedule=torch.profiler.schedule(
                                    wait=0, warmup=args.profiler_warmup, active=1,
                                    repeat=1)) as prof:
        for _ in range(args.profiler_warmup + 1):
            wall, used = _timed(step, args.ranks)
            times.append(wall)
            cpu.append(used)
            prof.step()
    return times, cpu


def _timed(step, ranks: int) -> tuple[float, float]:
    """One step after a barrier across the ranks: its wall time and process CPU time (s)."""
    if ranks > 1:
        torch.distributed.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - t0, time.process_time() - c0


def make_step(rank: int, args, threads: int = 1):
    """The training step of ``rank`` (of ``args.ranks``, DDP over Gloo when more than one):
    ``threads`` torch threads, the model, AdamW and one fixed batch built; returns the step
    (zero the gradients, forward, backward, optimizer step)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    # The tied head's gradient (softmax of saturated logits under PyTorch's N(0, 1) embedding
    # init) holds subnormal floats, on which x86 GEMMs are 10-20x slower; how many there are
    # drifts from step to step, so steps of one run were not comparable (a 512x8192x256 GEMM of
    # the backward: 45 ms or 0.6-2.4 s). torch.set_flush_denormal flushes them (FTZ/DAZ).
    torch.set_flush_denormal(not getattr(args, "keep_denormals", False))
    if args.ranks > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=args.ranks)
    model = GPT(args.layers, args.hidden, args.heads, args.vocab, args.seq)
    if args.ranks > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    x = torch.randint(args.vocab, (args.batch, args.seq))
    y = torch.randint(args.vocab, (args.batch, args.seq))

    def step():
        opt.zero_grad(set_to_none=True)
        model(x, y).backward()
        opt.step()

    return step


def _run(rank: int, args) -> None:
    step = make_step(rank, args)
    for _ in range(args.warmup):
        step()
    times, cpu = [], []
    for _ in range(args.steps):
        wall, used = _timed(step, args.ranks)
        times.append(wall)
        cpu.append(used)
    profiled, profiled_cpu = _profile(step, rank, args)
    # the same steps after the profiled one: is the run steady?
    after = [_timed(step, args.ranks)[0] for _ in range(args.steps)]
    if rank == 0:
        summary = {"step_seconds": times, "median_s": statistics.median(times),
                   "step_cpu_seconds": cpu, "median_cpu_s": statistics.median(cpu),
                   "profiled_step_seconds": profiled, "profiled_cpu_seconds": profiled_cpu,
                   "after_step_seconds": after, "after_median_s": statistics.median(after),
                   "ranks": args.ranks,
                   "torch": torch.__version__, "config": vars(args),
                   "load_average": os.getloadavg()}
        with open(args.out + ".steps.json", "w") as f:
            json.dump(summary, f, indent=1)
        print(f"{args.ranks} rank(s): median step {statistics.median(times) * 1e3:.2f} ms "
              f"over {len(times)} steps; under the profiler "
              + ", ".join(f"{t * 1e3:.2f}" for t in profiled)
              + f" ms (the last traced: {args.out}); process CPU time: median "
              f"{statistics.median(cpu) * 1e3:.2f} ms, under the profiler "
              + ", ".join(f"{t * 1e3:.2f}" for t in profiled_cpu) + " ms; after it: median "
              f"{statistics.median(after) * 1e3:.2f} ms")
    if args.ranks > 1:
        torch.distributed.destroy_process_group()


def add_model_args(p: argparse.ArgumentParser, batch: int) -> None:
    """The GPT-2's shape options (4 layers, d 256, 4 heads, vocab 8192, T 128; micro-batch
    ``batch`` per rank), for this script and ``benchmarks/device/kineto_cpu_dp_step.py``."""
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=batch, help="micro-batch per rank")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p, 4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--profiler-warmup", type=int, default=1,
                   help="steps the profiler traces and discards before the traced one "
                        "(0: trace the session's first step, start-up cost included)")
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--keep-denormals", action="store_true",
                   help="leave subnormal floats on (slow, drifting GEMMs: see _run)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    run_ranks(_run, args)


def run_ranks(run, args) -> None:
    """``run(rank, args)`` on each of ``args.ranks`` processes (spawned when more than one)."""
    if args.ranks > 1:
        torch.multiprocessing.spawn(run, args=(args,), nprocs=args.ranks)
    else:
        run(0, args)


if __name__ == "__main__":
    main()
